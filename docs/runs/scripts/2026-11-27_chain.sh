#!/usr/bin/env bash
# Issue 34's four models' bests within 22 GiB at seq 1024 with their decoder layers replayed as CUDA graphs whose
# consecutive layers share their hidden states and gradients (lorabench.graphs: one gradient buffer per
# captured layer over the eager step's memory, where make_graphed_callables held three), Gemma-2's flex
# attention masks part of the captured calls; each against Unsloth's searched best layout on the same machine,
# one cell at a time on one H100 alone (device tool kind nvidia-h100-x1).
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-27_chain.sh <commit> c1|c2|c3   (carry .whl_b and .whl_unsloth)
#     c1: the GPU tests of the graphs and the parts they read, then Gemma-2-9B (graphs at two layouts, fast's
#     best eager layout, Unsloth's best); c2: Qwen2.5-7B and Llama-3.1-8B (graphs, Unsloth); c3: Qwen3-8B
#     (graphs, Unsloth), then each model's graphs cell again while time is left. c4 (another machine, after the
#     record's fix and the GPU tests' rework): the GPU tests of the graphs, then the two closest ratios again
#     (Qwen2.5-7B and Gemma-2-9B, graphs and Unsloth), then a layout each with more layers or rows captured.
#     c5 (a third machine, after the GPU test's Llama model was given SDPA attention, as the cells' models have):
#     the GPU tests, then Llama-3.1-8B and Qwen3-8B (graphs, Unsloth) and Gemma-2's graphs cell again.
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
graphs="backend=fast backend.cuda_graphs=true"
g="$cell model=gemma-2-9b"; q="$cell model=qwen2.5-7b"; l="$cell model=llama-3.1-8b"; q3="$cell model=qwen3-8b"
case $2 in
c1)
  timeout 200 python3 -m pytest -q -m gpu tests/test_graphs.py tests/test_fused.py -x > $R/gpu_tests_$2.txt 2>&1
  tail -3 $R/gpu_tests_$2.txt
  sweep 0 gemma_graphs_b4_c25 $g $graphs batch=4 $ckpt=0.25
  sweep 0 gemma_unsloth $g backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false
  sweep 0 gemma_graphs_b4_c375 $g $graphs batch=4 $ckpt=0.375
  sweep 0 gemma_fast_b4_c25 $g backend=fast batch=4 $ckpt=0.25 ;;
c2)
  sweep 0 qwen_graphs_b4 $q $graphs batch=4 $ckpt=0
  sweep 0 qwen_unsloth $q backend=unsloth batch=4 train.gradient_checkpointing=false
  sweep 0 llama_graphs_b4 $l $graphs batch=4 $ckpt=0
  sweep 0 llama_unsloth $l backend=unsloth batch=4 train.gradient_checkpointing=false
  sweep 0 qwen_graphs_b6 $q $graphs batch=6 $ckpt=0 ;;
c3)
  sweep 0 qwen3_graphs_b4_c25 $q3 $graphs batch=4 $ckpt=0.25
  sweep 0 qwen3_unsloth $q3 backend=unsloth batch=24 $ckpt=1 backend.unsloth_offload=true
  sweep 0 gemma_graphs_2 $g $graphs batch=4 $ckpt=${GEMMA_CKPT:-0.375}
  sweep 0 llama_graphs_2 $l $graphs batch=4 $ckpt=0 ;;
c4)
  timeout 150 python3 -m pytest -q -m gpu tests/test_graphs.py > $R/gpu_tests_$2.txt 2>&1; tail -3 $R/gpu_tests_$2.txt
  sweep 0 qwen_graphs_b4_$2 $q $graphs batch=4 $ckpt=0
  sweep 0 qwen_unsloth_$2 $q backend=unsloth batch=4 train.gradient_checkpointing=false
  sweep 0 gemma_graphs_b4_c375_$2 $g $graphs batch=4 $ckpt=0.375
  sweep 0 gemma_unsloth_$2 $g backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false
  sweep 0 qwen_graphs_b5_$2 $q $graphs batch=5 $ckpt=0
  sweep 0 gemma_graphs_b4_c31_$2 $g $graphs batch=4 $ckpt=0.31 ;;
c5)
  timeout 150 python3 -m pytest -q -m gpu tests/test_graphs.py > $R/gpu_tests_$2.txt 2>&1; tail -3 $R/gpu_tests_$2.txt
  sweep 0 llama_graphs_b4_$2 $l $graphs batch=4 $ckpt=0
  sweep 0 llama_unsloth_$2 $l backend=unsloth batch=4 train.gradient_checkpointing=false
  sweep 0 qwen3_graphs_b4_c25_$2 $q3 $graphs batch=4 $ckpt=0.25
  sweep 0 qwen3_unsloth_$2 $q3 backend=unsloth batch=24 $ckpt=1 backend.unsloth_offload=true
  sweep 0 gemma_graphs_b4_c375_$2 $g $graphs batch=4 $ckpt=0.375 ;;
esac
pack_call $2
