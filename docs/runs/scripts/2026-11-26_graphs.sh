#!/usr/bin/env bash
# Issue 34's Qwen2.5-7B best within 22 GiB at seq 1024 with its decoder layers replayed as CUDA graphs
# (backend.cuda_graphs, lorabench.graphs) on one H100 alone (device tool kind nvidia-h100-x1): the GPU tests of
# the graphs and of the parts they touch, then fast's best layout with and without graphs and Unsloth's best
# layout, in one run, fast with graphs first and last.
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-26_graphs.sh <commit> c1    (carry .whl_b and .whl_unsloth)
#   As run: 0d0de39 c1 (the layers were not captured: the fast path's forward passes output_hidden_states to each
#   layer, then refused); on the same machine, after ae17285, `rm -rf /tmp/runs/qwen_graphs_1 /tmp/runs/qwen_graphs_2
#   /tmp/runs/qwen_fast; LIMIT_S=230 bash docs/runs/scripts/2026-11-26_graphs.sh ae17285 c2` (Unsloth's cell of c1
#   passed over), and the GPU test alone (gpu_tests_c3.txt)
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
timeout 150 python3 -m pytest -q -m gpu tests/test_graphs.py tests/test_fused.py -x > $R/gpu_tests_$2.txt 2>&1
tail -3 $R/gpu_tests_$2.txt
q="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024 model=qwen2.5-7b batch=4"
sweep 0 qwen_graphs_1 $q backend=fast $ckpt=0 backend.cuda_graphs=true
sweep 0 qwen_fast $q backend=fast $ckpt=0
sweep 0 qwen_unsloth $q backend=unsloth train.gradient_checkpointing=false
sweep 0 qwen_graphs_2 $q backend=fast $ckpt=0 backend.cuda_graphs=true
pack_call $2
