#!/usr/bin/env bash
# What issues 35 and 34 still lacked after 2026-11-27_h100, on one H100 (device kind nvidia-h100-x1: only an
# H100 comes), one list, resumed call after call (the same hydra.sweep.dir: finished cells are read back):
#   1. fixed-length rows at seq 2048 within 22 GiB, the two bests of 2026-11-27_h100's search profiled one after
#      the other (fast b2 nothing recomputed, hf b6 every layer recomputed: 2.18x, 2.2x asked; where each step's
#      time goes);
#   2. the whole GPU at seq 1024, fast and Unsloth searched in one sweep (issue 35's 1.10x on an H100: fast's half
#      was searched in 2026-11-27_h100 on another machine, Unsloth's was cut by the call's limit);
#   3. issue 34's Llama-3.1-8B, fast's defaults against Unsloth's best (both b4, nothing recomputed), in rounds;
#   h4 (the lend's last minutes): Qwen2.5-7B's rounds likewise, alone on an H100.
#   LIMIT_S=560 bash docs/runs/scripts/2026-11-27_h100b.sh <commit> h1|h2|h3   (carry .whl .whl_unsloth .gpudata)
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, ShareGPT, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pinned, rounds, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
list() {
  sweep 0 prof_s2048_fast $profiled_cells seq_len=2048 backend=fast batch=2 train.gradient_checkpointing=false \
    || return
  sweep 0 prof_s2048_hf $profiled_cells seq_len=2048 backend=hf batch=6 $ckpt=1 || return
  sweep 0 whole_s1024 $tune_cells backend=fast,unsloth gpu=auto seq_len=1024 || return
  rounds 0 llama llama-3.1-8b 2 "fast: backend=fast batch=4 train.gradient_checkpointing=false | \
    unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false"; }
qwen() { rounds 0 qwen qwen2.5-7b 2 "fast: backend=fast batch=4 train.gradient_checkpointing=false | \
    unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false"; }
case $call in h4) qwen ;; *) list ;; esac
grep -h "^gpu 0 .*exit\|^\[search\] best\|^\[backend=.*best" $R/log_0.txt | tail -12
pack_call $2
