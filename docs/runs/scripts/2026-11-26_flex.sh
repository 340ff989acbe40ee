#!/usr/bin/env bash
# What 2026-11-26_gaps left: Gemma-2 with backend.flex_attention against Unsloth (issue 34), Unsloth on packed
# ShareGPT against fast (issue 35), the L4 source cells (issue 39), and on an H100 machine Mistral-7B on the whole
# GPU (issue 35). One list per GPU of one 4-GPU machine of the device tool, in consecutive calls on the same warm
# machine:
#   source docs/runs/scripts/device_setup.sh <commit> c0     (carry .whl, .whl_unsloth, .gpudata: installs them)
#   bash docs/runs/scripts/2026-11-26_flex.sh <commit> c1    (carry .whl_b: installs it, then measures)
#   bash docs/runs/scripts/2026-11-26_flex.sh <commit> c2, c3 ...   (carry nothing)
# (the tracked tree and every wheel dir together are over the tool's 64 MiB). Each list runs its steps in order;
# every call runs each list from the top, passing over a step that finished (its dir holds `done`) and resuming a
# sweep that the time left stopped. Dirs in /tmp/runs; each call packs what changed into $OUT/<call>.tgz.
#   gpu 0  the GPU tests of flex attention (Gemma-2's gradients against hf's) and of Unsloth on packed rows; then
#          Gemma-2-9B within 22 GiB at seq 1024: fast's search with flex attention, Unsloth's search, fast's
#          search without it (the A/B of the same run)
#   gpu 1  the L4 source cells (+experiment=trl_l4_check, profiled); then packed ShareGPT at seq 1024: fast's and
#          Unsloth's searches
#   gpu 2  packed ShareGPT at seq 512: fast's and Unsloth's searches; then hf's and fast's bests of
#          2026-11-26_gaps profiled side by side (issue 35's 2.2x over hf, missed): seq 2048 fixed-length rows
#          (hf b6 every layer recomputed, fast b4 0.25 recomputed / 0.25 offloaded)
#   gpu 3  packed ShareGPT at seq 2048: fast's and Unsloth's searches; then on an H100 machine Mistral-7B at seq
#          512 on the whole GPU (fast's and Unsloth's searches), on H200s the profiles of packed ShareGPT at seq
#          1024 (hf b12 every layer, fast b6 0.25 recomputed)
# Searches as in 2026-11-26_gaps (+experiment=tune, 14 steps of which 4 untimed, at most 10 measured cells).
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, ShareGPT, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
search="-m +experiment=tune train.max_steps=14 train.untimed_steps=4 search.max_cells=10"
sg="data=jsonl data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null data.packing=true"
packed() {  # packed <gpu> <seq>: fast's and Unsloth's searches on packed ShareGPT within 22 GiB
  for b in fast unsloth; do sweep $1 sg_s$2_$b $search $sg gpu=a10 seq_len=$2 backend=$b; done; }
gpu0() {
  if [ ! -f $R/gpu_tests.txt ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -m gpu tests/test_fast_arch.py tests/test_backends.py \
      -k "flex_attention or packed_rows or gemma2" > $R/gpu_tests.txt 2>&1; tail -1 $R/gpu_tests.txt
  fi
  local g="$search gpu=a10 seq_len=1024 model=gemma-2-9b backend.fused_add_norm=false backend.varlen_attention=false"
  # `;`, not `&&`: a failed search (flex attention's first GPU run) does not cost the others; a list out of
  # time passes over every step left at once (sweep returns 1 with under 90 s left)
  sweep 0 gemma-2-9b_fast_flex $g backend=fast backend.flex_attention=true
  sweep 0 gemma-2-9b_unsloth ${g% backend.fused_add_norm*} backend=unsloth
  sweep 0 gemma-2-9b_fast $g backend=fast
}
gpu2() {
  packed 2 512
  local p="-m +experiment=seed_optimum train.max_steps=16 train.untimed_steps=4 train.profile_steps=2 gpu=a10"
  local ck="train.gradient_checkpointing=true train.checkpoint_fraction"
  sweep 2 prof_s2048_hf $p seq_len=2048 backend=hf batch=6 $ck=1
  sweep 2 prof_s2048_fast $p seq_len=2048 backend=fast batch=4 $ck=0.25 train.offload_fraction=0.25
}
prof_sg() {  # hf's and fast's bests of 2026-11-26_gaps on packed ShareGPT at seq 1024, profiled
  local p="-m +experiment=seed_optimum train.max_steps=16 train.untimed_steps=4 train.profile_steps=2 gpu=a10"
  local ck="train.gradient_checkpointing=true train.checkpoint_fraction"
  sweep $1 prof_sg1024_hf $p $sg seq_len=1024 backend=hf batch=12 $ck=1
  sweep $1 prof_sg1024_fast $p $sg seq_len=1024 backend=fast batch=6 $ck=0.25 train.offload_fraction=0
}
gpu3() {
  packed 3 2048
  grep -q H100 $OUT/gpu_$2.csv || { prof_sg 3; return 0; }  # on H200s, GPU 3 takes gpu 2's second pair
  for b in fast unsloth; do sweep 3 m7_s512_auto_$b $search gpu=auto seq_len=512 backend=$b; done
}
# Staggered starts: each list's first model build and data tokenisation off the others'.
gpu0 & { sleep 20; sweep 1 trl_l4 +experiment=trl_l4_check train.profile_steps=2; packed 1 1024; } &
{ sleep 40; gpu2; } & { sleep 60; gpu3 "$@"; } & wait
pack_call $2
