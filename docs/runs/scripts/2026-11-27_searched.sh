#!/usr/bin/env bash
# Issue 34's two models short of 1.15x Unsloth's best in 2 of 3 rounds (docs/runs/2026-11-27_bests), and issue 35's
# search of fast with its layers as CUDA graphs, on one 4-GPU machine, one list per GPU, each pinned to its own
# quarter of the host's cores (as 2026-11-27_bests.sh), within 22 GiB at seq 1024 on fixed-length rows:
#   GPU 0 Qwen2.5-7B: the nf4 kernel's variants timed (dequant_variants.py), fast with graphs profiled (where the
#         step's time goes now that no launch waits on the host), then rounds of graphs b4 (its best of 2026-11-27_bests),
#         graphs b5 with one layer recomputed (captured too since bd3db68) and Unsloth's best, in turn;
#   GPU 1 Gemma-2-9B: graphs b4 0.375 recomputed (all 42 layers captured since bd3db68; 26 in 2026-11-27_bests)
#         profiled, then rounds of it and Unsloth's best, in turn, and graphs b6 with half the layers recomputed;
#   GPU 2 the GPU tests of the graphs and of the nf4 kernel, then the search of fast with graphs on Mistral-7B
#         (`+experiment=tune backend=fast backend.cuda_graphs=true`, 10 cells);
#   GPU 3 the same search on Qwen2.5-7B.
# c2 (the nf4 kernel reading whole quantisation blocks, the capture's probe stopped before the head): GPU 0 the
#   layer's GEMMs each way (gemm_variants.py), the nf4 kernel's variants again, then three rounds of Qwen2.5-7B
#   graphs b4 and Unsloth's best; GPU 1 a round of Gemma-2-9B's and graphs b6 half recomputed; GPU 2 the search of
#   fast with graphs on Qwen2.5-7B again (its large batches no longer spend 18.6 GiB on the probe's logits), then on
#   Mistral-7B at seq 512; GPU 3 the GPU tests of the graphs, the nf4 kernel and the fused LoRA, then the search on
#   Mistral-7B at seq 2048.
# c3 (the attention's input gradients by cuBLAS where Triton's tiles fill fewer than 8 waves: 4,096 tokens): GPU 0
#   three rounds of Qwen2.5-7B graphs b4 and Unsloth's best; GPU 1 a round of Gemma-2-9B's, GPU 2 of Llama-3.1-8B's;
#   GPU 3 the GPU tests of the input-gradient kernel, the graphs and the fused LoRA, then a round of Qwen3-8B's.
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   LIMIT_S=560 bash docs/runs/scripts/2026-11-27_searched.sh <commit> c1|c2|c3   (carry .whl_unsloth)
# Every call runs each list from the top, passing over what an earlier call finished (sweep, gpu_lists.sh); a round's
# cells are named by the call that runs them (qwen_graphs_c2_1: call c2, round 1), so that a later commit's cells
# stand apart from an earlier one's.
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pinned, rounds, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
graphs="backend=fast backend.cuda_graphs=true"
qwen() {
  [ -f $R/dequant_$call.md ] || CUDA_VISIBLE_DEVICES=0 timeout 120 python3 docs/runs/scripts/dequant_variants.py \
    > $R/dequant_$call.md 2>&1
  sweep 0 qwen_prof_$call $profiled_cells model=qwen2.5-7b seq_len=1024 $graphs batch=4 \
    train.gradient_checkpointing=false || return
  rounds 0 qwen qwen2.5-7b 3 "graphs: $graphs batch=4 train.gradient_checkpointing=false | \
    unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false | b5: $graphs batch=5 $ckpt=0.036"; }
gemma() {
  sweep 1 gemma_prof_$call $profiled_cells model=gemma-2-9b seq_len=1024 $graphs batch=4 $ckpt=0.375 || return
  rounds 1 gemma gemma-2-9b 2 "graphs: $graphs batch=4 $ckpt=0.375 | \
    unsloth: backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false" || return
  sweep 1 gemma_b6_$call $cell model=gemma-2-9b $graphs batch=6 $ckpt=0.5 || return
  rounds 1 gemma3 gemma-2-9b 1 "graphs: $graphs batch=4 $ckpt=0.375 | \
    unsloth: backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false"; }
mistral_search() {
  if [ ! -f $R/gpu_tests_$call.txt ]; then
    CUDA_VISIBLE_DEVICES=2 timeout 200 python3 -m pytest -q -m gpu tests/test_graphs.py tests/test_fast_parts.py \
      > $R/gpu_tests_$call.txt 2>&1; tail -1 $R/gpu_tests_$call.txt; fi
  sweep 2 mistral_tune_$call $tune_cells $graphs gpu=a10 seq_len=1024; }
qwen_search() { sweep 3 qwen_tune_$call $tune_cells $graphs gpu=a10 seq_len=1024 model=qwen2.5-7b; }
if [ $call = c3 ]; then  # the attention's input gradients by cuBLAS below 8 waves of Triton's tiles
  m3() { rounds 0 qwen qwen2.5-7b 3 "graphs: $graphs batch=4 train.gradient_checkpointing=false | \
      unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false"; }
  g3() { rounds 1 gemma gemma-2-9b 1 "graphs: $graphs batch=4 $ckpt=0.375 | \
      unsloth: backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false"; }
  l3() { rounds 2 llama llama-3.1-8b 1 "graphs: $graphs batch=4 train.gradient_checkpointing=false | \
      unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false"; }
  q3() { CUDA_VISIBLE_DEVICES=3 timeout 150 python3 -m pytest -q -m gpu tests/test_grad_kernels.py tests/test_graphs.py \
      tests/test_fused.py > $R/gpu_tests_$call.txt 2>&1; tail -1 $R/gpu_tests_$call.txt
    rounds 3 qwen3 qwen3-8b 1 "graphs: $graphs batch=4 $ckpt=0.25 | \
      unsloth: backend=unsloth batch=24 $ckpt=1 backend.unsloth_offload=true"; }
  (pinned 0 m3) & (pinned 1 g3) & (pinned 2 l3) & (pinned 3 q3) & wait
elif [ $call = c1 ]; then
  (pinned 0 qwen) & (pinned 1 gemma) & (pinned 2 mistral_search) & (pinned 3 qwen_search) & wait
else  # c2 on: the nf4 kernel by block and the probe without logits (commit in the call's command)
  q2() { [ -f $R/gemm_$call.md ] || CUDA_VISIBLE_DEVICES=0 timeout 150 python3 docs/runs/scripts/gemm_variants.py \
      > $R/gemm_$call.md 2>&1
    [ -f $R/dequant_$call.md ] || CUDA_VISIBLE_DEVICES=0 timeout 120 python3 docs/runs/scripts/dequant_variants.py \
      > $R/dequant_$call.md 2>&1
    rounds 0 qwen qwen2.5-7b 3 "graphs: $graphs batch=4 train.gradient_checkpointing=false | \
      unsloth: backend=unsloth batch=4 train.gradient_checkpointing=false"; }
  g2() { rounds 1 gemma gemma-2-9b 1 "graphs: $graphs batch=4 $ckpt=0.375 | \
      unsloth: backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false" || return
    sweep 1 gemma_b6_$call $cell model=gemma-2-9b $graphs batch=6 $ckpt=0.5; }
  s2() { sweep 2 qwen_tune_$call $tune_cells $graphs gpu=a10 seq_len=1024 model=qwen2.5-7b || return
    sweep 2 mistral_s512_tune_$call $tune_cells $graphs gpu=a10 seq_len=512; }
  s3() { CUDA_VISIBLE_DEVICES=3 timeout 200 python3 -m pytest -q -m gpu tests/test_graphs.py tests/test_fast_parts.py \
      tests/test_fused.py > $R/gpu_tests_$call.txt 2>&1; tail -1 $R/gpu_tests_$call.txt
    sweep 3 mistral_s2048_tune_$call $tune_cells $graphs gpu=a10 seq_len=2048; }
  (pinned 0 q2) & (pinned 1 g2) & (pinned 2 s2) & (pinned 3 s3) & wait
  cat $R/gemm_$call.md 2>/dev/null
fi
cat $R/dequant_$call.md 2>/dev/null | head -60
for g in 0 1 2 3; do grep -h "^gpu $g .*exit" $R/log_$g.txt | tail -6; done
pack_call $2
