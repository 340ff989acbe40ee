#!/usr/bin/env bash
# What 2026-11-26_flex left, on one H100 (device tool kind nvidia-h100-x1: only an H100 comes), in consecutive
# calls on the same warm machine:
#   source docs/runs/scripts/device_setup.sh <commit> c0     (carry .whl, .whl_xf and .gpudata: installs them;
#                                                             .whl_xf is xformers 0.0.35 (torch >= 2.10), so that
#                                                             Unsloth's attention, on packed rows too, takes its
#                                                             xformers path, as Unsloth recommends; leave it
#                                                             out if xformers.txt says it does not run)
#   bash docs/runs/scripts/2026-11-26_h100.sh <commit> c1     (carry .whl_b and .whl_unsloth: installs them, then
#                                                             measures)
#   bash docs/runs/scripts/2026-11-26_h100.sh <commit> c2, c3 (carry nothing)
# (the tracked tree, 37 MiB on disk, and every wheel dir together are over the tool's 64 MiB).
# One list, its steps in order; every call runs it from the top, passing over a step that finished (its dir
# holds `done`) and resuming a sweep that the time left stopped. Dirs in /tmp/runs; each call packs what changed
# into $OUT/<call>.tgz.
#   1. Mistral-7B at seq 512 on the whole GPU: fast's and Unsloth's searches (issue 35's whole-GPU target on
#      an H100; every earlier whole-GPU search ran on H200s)
#   2. the L4 source cell (+experiment=trl_l4_check, issue 39) alone on the machine, profiled: 2026-11-26_flex's
#      ran beside three other lists and waited on the host for most of its step
#   3. Gemma-2-9B's bests of 2026-11-26_flex profiled side by side (issue 34's 1.15x over Unsloth, missed): fast
#      b6 half the layers recomputed with flex attention, Unsloth b8 with its checkpointing on
#   4. Qwen2.5-7B's bests of 2026-11-26_best profiled side by side, alone on the machine (issue 34's 1.15x over
#      Unsloth, missed at 1.04x on an H200): fast b8 0.25 recomputed / 0.25 offloaded, Unsloth b4 checkpointing off
#   5. Unsloth's packed best at seq 512 (b48, its checkpointing on) and fast's (b16, 0.25 recomputed / 0.25
#      offloaded) profiled: why Unsloth's packed rows run at about half its fixed-length rate here
#   6. Mistral-7B at seq 1024 on the whole GPU: fast's and Unsloth's searches
# Searches as in 2026-11-26_gaps (+experiment=tune, 14 steps of which 4 untimed, at most 10 measured cells);
# profiled cells 16 steps: 4 untimed, 2 profiled, 10 timed.
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, ShareGPT, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
# Whether xformers imports and runs here (Unsloth takes it where it does): once per machine, in xformers.txt
[ -f $R/xformers.txt ] || python3 -c "import torch, xformers, xformers.ops as xo
q = torch.randn(1, 64, 8, 64, device='cuda', dtype=torch.bfloat16)
xo.memory_efficient_attention(q, q, q); print('xformers', xformers.__version__, 'runs on', torch.cuda.get_device_name())" \
  > $R/xformers.txt 2>&1; tail -1 $R/xformers.txt
for b in fast unsloth; do sweep 0 m7_s512_auto_$b $tune_cells gpu=auto seq_len=512 backend=$b; done
sweep 0 trl_l4 +experiment=trl_l4_check train.profile_steps=2
sweep 0 prof_gemma2_fast $profiled_cells model=gemma-2-9b seq_len=1024 backend=fast batch=6 $ckpt=0.5 train.offload_fraction=0
sweep 0 prof_gemma2_unsloth $profiled_cells model=gemma-2-9b seq_len=1024 backend=unsloth batch=8 $ckpt=1 \
  backend.unsloth_offload=false
sweep 0 prof_qwen25_fast $profiled_cells model=qwen2.5-7b seq_len=1024 backend=fast batch=8 $ckpt=0.25 train.offload_fraction=0.25
sweep 0 prof_qwen25_unsloth $profiled_cells model=qwen2.5-7b seq_len=1024 backend=unsloth batch=4 train.gradient_checkpointing=false
sweep 0 prof_sg512_unsloth $profiled_cells $packed_rows seq_len=512 backend=unsloth batch=48 $ckpt=1 backend.unsloth_offload=false
sweep 0 prof_sg512_fast $profiled_cells $packed_rows seq_len=512 backend=fast batch=16 $ckpt=0.25 train.offload_fraction=0.25
for b in fast unsloth; do sweep 0 m7_s1024_auto_$b $tune_cells gpu=auto seq_len=1024 backend=$b; done
pack_call $2
