#!/usr/bin/env bash
# Gemma-2-9B within 22 GiB at seq 1024 on one H100 alone (device tool kind nvidia-h100-x1), issue 34's 1.15x over
# Unsloth's best: 2026-11-26_h100 measured fast's best of 2026-11-26_flex (searched beside three other lists on an
# H200) at 1.12x Unsloth's there. Here fast's search again, alone on the machine, after Unsloth's best layout of
# 2026-11-26_flex (b8, its checkpointing on) measured again in the same run:
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-26_gemma.sh <commit> c1     (carry .whl_b and .whl_unsloth: installs, measures)
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
g="gpu=a10 model=gemma-2-9b seq_len=1024"
sweep 0 gemma_unsloth -m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 $g backend=unsloth batch=8 \
  $ckpt=1 backend.unsloth_offload=false
sweep 0 gemma_fast $tune_cells $g backend=fast
pack_call $2
