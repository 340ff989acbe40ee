#!/usr/bin/env bash
# What issues 34, 35 and 39 still missed after 2026-11-26_four, one list per GPU of one 4-GPU machine of
# the device tool, in consecutive calls on the same warm machine:
#   bash docs/runs/scripts/2026-11-26_gaps.sh <commit> <call>      (call: c1, c2, ... in order)
# with .whl/, .whl_unsloth/ (as 2026-11-26_best.sh) and .gpudata/ (the ShareGPT sample of
# 2026-11-23_equal_work.sh, xz-compressed) installed on the machine first; the working tree and all three
# are over the tool's 64 MiB together, so a call c0 carries .whl/ alone and installs it
# (`source docs/runs/scripts/device_setup.sh <commit> c0`), c1 carries the other two. Each list runs its steps in order; every call runs each list
# from the top, passing over a step that finished (its dir holds `done`) and resuming a sweep that the time
# left stopped (sweep.deadline_s, exit 4). Dirs in /tmp/runs (kept by the warm machine); each call packs
# what changed in it into $OUT/<call>.tgz. Every ratio is between cells of one GPU in one list.
#   gpu 0  Mistral-7B, seq 1024, the whole GPU (gpu=auto): fast's search and Unsloth's (issue 35); then
#          the two bests of seq 512 on the whole GPU (2026-11-26_four: fast b64, Unsloth b48, nothing
#          recomputed) profiled side by side
#   gpu 1  Mistral-7B, seq 2048, 22 GiB: fast's, Unsloth's and hf's searches; then Qwen2.5-7B's two bests
#          of 2026-11-26_four (fast b6 0.25 recomputed, Unsloth b4 nothing recomputed) profiled
#   gpu 2  Gemma-2-9B, seq 1024, 22 GiB: Unsloth's search (its loader given a stand-in tokenizer) and
#          fast's again (issue 34); then the L4 source cells (+experiment=trl_l4_check, issue 39), and on an
#          H100 the seed's diagnostic within 22 GiB (the A10 projection's source cells)
#   gpu 3  Mistral-7B on packed ShareGPT rows (the same 2,000 conversations, data.packing=true for every
#          backend: Unsloth told each sample's length), 22 GiB: fast's, hf's and Unsloth's searches at
#          seq 1024, then at 512 and 2048
# Searches: +experiment=tune, 14 steps of which 4 untimed, at most 10 measured cells per backend, as in
# 2026-11-26_four. Profiled cells: 16 steps, 4 untimed, 2 profiled.
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, ShareGPT, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
search="-m +experiment=tune train.max_steps=14 train.untimed_steps=4 search.max_cells=10"
prof="-m +experiment=seed_optimum train.max_steps=16 train.untimed_steps=4 train.profile_steps=2"
off="train.gradient_checkpointing=false"
sg="data=jsonl data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null data.packing=true"
gpu0() {
  for b in fast unsloth; do sweep 0 m7_s1024_auto_$b $search gpu=auto seq_len=1024 backend=$b || return 1; done
  sweep 0 prof_m7_s512_auto_fast $prof gpu=auto seq_len=512 batch=64 backend=fast $off \
    && sweep 0 prof_m7_s512_auto_unsloth $prof gpu=auto seq_len=512 batch=48 backend=unsloth $off
}
gpu1() {
  for b in fast unsloth hf; do sweep 1 m7_s2048_a10_$b $search gpu=a10 seq_len=2048 backend=$b || return 1; done
  local q="$prof gpu=a10 seq_len=1024 model=qwen2.5-7b"
  sweep 1 prof_qwen25_fast $q batch=6 backend=fast train.gradient_checkpointing=true train.checkpoint_fraction=0.25 \
    train.offload_fraction=0 && sweep 1 prof_qwen25_unsloth $q batch=4 backend=unsloth $off
}
gpu2() {
  local g="$search gpu=a10 seq_len=1024 model=gemma-2-9b"
  sweep 2 gemma-2-9b_unsloth $g backend=unsloth \
    && sweep 2 gemma-2-9b_fast $g backend=fast backend.fused_add_norm=false backend.varlen_attention=false \
    && sweep 2 trl_l4 +experiment=trl_l4_check train.profile_steps=2 || return 1
  grep -q H100 $OUT/gpu_$2.csv && sweep 2 diagnostic_a10 +experiment=diagnostic gpu=a10 train.max_steps=22 \
    train.profile_steps=2
}
gpu3() {
  for s in 1024 512 2048; do for b in fast hf unsloth; do
    sweep 3 sg_s${s}_$b $search $sg gpu=a10 seq_len=$s backend=$b || return 1; done; done
}
# Staggered starts: each list's first model build and data tokenisation off the others' (a busy host
# slowed the first cells of 2026-11-26_four's lists).
gpu0 & { sleep 20; gpu1; } & { sleep 40; gpu2; } & { sleep 60; gpu3; } & wait
pack_call $2
