#!/usr/bin/env bash
# What 2026-11-26_h100.sh left (its first machine was held its 30 minutes), on a second H100 (device tool kind
# nvidia-h100-x1), in consecutive calls on the same warm machine:
#   source docs/runs/scripts/device_setup.sh <commit> c0     (carry .whl and .gpudata: installs them)
#   bash docs/runs/scripts/2026-11-26_h100b.sh <commit> c1   (carry .whl_b and .whl_unsloth: installs them, then
#                                                             measures)
#   bash docs/runs/scripts/2026-11-26_h100b.sh <commit> c2.. (carry nothing)
# xformers is not carried: the registry's 0.0.35 wheel was built for torch 2.10 + CUDA 12.8 and does not load
# its CUDA extensions on the device's torch 2.11 + CUDA 13.0 (2026-11-26_h100's first call).
# One list, its steps in order, each passed over once done (gpu_lists.sh):
#   1. what is alive at the L4 source cell's peak of allocated memory (issue 39: the projection says it does not
#      fit an L4, 23.15 GiB allocated, though the source trained it on one): docs/runs/scripts/memory_peak.py,
#      3 optimizer steps (the peak statistics reset where the timed window starts, after step 1)
#   2. Unsloth's and fast's packed bests at seq 512 profiled side by side, in one run (2026-11-26_h100 profiled
#      Unsloth's alone before its time ran out)
#   3. Mistral-7B at seq 1024 on the whole GPU: fast's and Unsloth's searches (issue 35's whole-GPU target)
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, ShareGPT, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
if [ ! -f $R/mem_trl_l4/peak.md ] && [ "$(left)" -gt 200 ]; then
  timeout $(( $(left) - 10 )) python3 docs/runs/scripts/memory_peak.py $R/mem_trl_l4 +experiment=trl_l4_check \
    train.max_steps=3 train.untimed_steps=1 hydra.sweep.dir=$R/mem_trl_l4 > $R/log_mem.txt 2>&1
  echo "mem_trl_l4: exit $? after $((SECONDS - t0)) s"; tail -30 $R/log_mem.txt
fi
sweep 0 prof_sg512_unsloth $profiled_cells $packed_rows seq_len=512 backend=unsloth batch=48 $ckpt=1 backend.unsloth_offload=false
sweep 0 prof_sg512_fast $profiled_cells $packed_rows seq_len=512 backend=fast batch=16 $ckpt=0.25 train.offload_fraction=0.25
for b in fast unsloth; do sweep 0 m7_s1024_auto_$b $tune_cells gpu=auto seq_len=1024 backend=$b; done
pack_call $2
