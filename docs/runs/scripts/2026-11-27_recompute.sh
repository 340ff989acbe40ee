#!/usr/bin/env bash
# Recomputed decoder layers captured as CUDA graphs too (lorabench.graphs: a recomputed layer's backward graph runs
# its forward again), on one GPU: the GPU tests of the graphs (eager step against graphs, one of two layers
# recomputed, Llama and Gemma-2), then Gemma-2-9B's best layout with graphs (batch 4, 0.375 of the layers
# recomputed: before, its 16 recomputed layers ran eagerly beside 26 captured ones) and Unsloth's best on the same
# GPU, within 22 GiB at seq 1024, fixed-length rows.
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   LIMIT_S=280 bash docs/runs/scripts/2026-11-27_recompute.sh <commit> c1   (carry .whl_b and .whl_unsloth)
set -u
LIMIT_S=${LIMIT_S:-280}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024 model=gemma-2-9b"
timeout 90 python3 -m pytest -q -m gpu tests/test_graphs.py > $R/gpu_tests_$2.txt 2>&1; tail -1 $R/gpu_tests_$2.txt
sweep 0 gemma_graphs_c375 $cell backend=fast backend.cuda_graphs=true batch=4 $ckpt=0.375 \
  && sweep 0 gemma_unsloth $cell backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false
grep -h "lorabench.graphs\]" $R/log_0.txt | cut -c1-220
pack_call $2
