#!/usr/bin/env bash
# Issue 35's table from its own command: each backend searched within 22 GiB, one sweep per workload,
# `+experiment=tune backend=fast,unsloth,hf gpu=a10` (at most 10 measured cells per backend, 14 steps of which 4
# untimed), fast with its decoder layers as CUDA graphs (on in backend=fast since this run's commit), on one 4-GPU
# machine, one list per GPU pinned to its own quarter of the host's cores (gpu_lists.sh):
#   GPU 0 fixed-length rows at seq 512; GPU 1 at seq 1024; GPU 2 at seq 2048;
#   GPU 3 the GPU tests (the input-gradient kernel's below 8 waves, not run since its fix; the graphs, now with
#         Qwen3's QK-norm; the fast parts; the fused LoRA), issue 34's Llama-3.1-8B against Unsloth's best in two
#         rounds per call (c1, c2; its Unsloth cell failed in 2026-11-27_searched: the eos list), then packed
#         ShareGPT at seq 512.
# Each call runs each list from the top; a search cut by a call's time limit is resumed by the next call (the
# same hydra.sweep.dir: its finished cells are read back, not run again).
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   LIMIT_S=540 bash docs/runs/scripts/2026-11-27_each.sh <commit> c1|c2|c3   (carry .whl_unsloth .gpudata)
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, ShareGPT, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pinned, rounds, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
each="$tune_cells backend=fast,unsloth,hf gpu=a10"
s512() { sweep 0 fixed_s512 $each seq_len=512; }
s1024() { sweep 1 fixed_s1024 $each seq_len=1024; }
s2048() { sweep 2 fixed_s2048 $each seq_len=2048; }
last() {
  if [ ! -f $R/gpu_tests_$call.txt ] && [ $call = c1 ]; then
    CUDA_VISIBLE_DEVICES=3 timeout 240 python3 -m pytest -q -m gpu tests/test_grad_kernels.py tests/test_graphs.py \
      tests/test_fast_parts.py tests/test_fused.py > $R/gpu_tests_$call.txt 2>&1; tail -1 $R/gpu_tests_$call.txt; fi
  [ $call = c3 ] || rounds 3 llama llama-3.1-8b 2 "fast: backend=fast batch=4 train.gradient_checkpointing=false | \
    unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false" || return
  sweep 3 packed_s512 $each seq_len=512 $packed_rows; }
# c3: GPUs 0 and 2 had finished their searches; GPU 0 Qwen2.5-7B against Unsloth's best in three rounds, GPU 2 the
# search on packed ShareGPT at seq 1024
q3() { rounds 0 qwen qwen2.5-7b 3 "fast: backend=fast batch=4 train.gradient_checkpointing=false | \
    unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false"; }
p3() { sweep 2 packed_s1024 $each seq_len=1024 $packed_rows; }
if [ $call = c3 ]; then (pinned 0 q3) & (pinned 1 s1024) & (pinned 2 p3) & (pinned 3 last) & wait
else (pinned 0 s512) & (pinned 1 s1024) & (pinned 2 s2048) & (pinned 3 last) & wait; fi
for g in 0 1 2 3; do grep -h "^gpu $g .*exit\|^\[search\] best" $R/log_$g.txt | tail -8; done
pack_call $2
