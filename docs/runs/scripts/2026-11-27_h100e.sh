#!/usr/bin/env bash
# Issue 34 on one H100 a machine (device kind nvidia-h100-x1), alone on it, after fast's fused loss lost
# its two waits for the GPU a step (backend.loss_on_device):
#   e1: docs/runs/scripts/dequant_store.py (the nf4 kernel against two ways of writing its output, timed in CUDA
#       graphs); the GPU tests of tests/test_loss_kernels.py; one round within 22 GiB at seq 1024 (fixed-length
#       rows, b4, nothing recomputed): fast's defaults, fast with backend.loss_on_device=false, Unsloth's best.
#   e2, e3: fast's defaults profiled (16 steps: 4 untimed, 2 profiled, 10 timed; the line lacks seq_len=1024, so it
#       ran the experiment's seq 512), then two rounds of fast's defaults and Unsloth's best (e3: three rounds).
#   t1: the GPU tests of every architecture's fast path against hf (tests/test_fast_arch.py), of the backends, the CUDA
#       graphs and the input-gradient kernels, at this commit: each fast cell's loss now goes through
#       lorabench.loss_kernels (Gemma-2's soft-capped head too).
#   h1 (asked for an H200; the H100 held ran it): two rounds, the second in reverse order, of fast's defaults, fast with
#       backend.loss_on_device=false and Unsloth's best.
#   m1: the other GPU tests of the fast path's parts (t2 of 2026-11-27_h100c.sh), then one round each of Llama-3.1-8B,
#       Gemma-2-9B and Qwen3-8B, fast's defaults against Unsloth's best at their searched layouts (2026-11-27_h100b.sh,
#       2026-11-27_h100d.sh), as far as the call's time goes; m2: Qwen3-8B's round, which m1 had no time left for.
#   p1: the GPU tests of packed rows (varlen attention, their CUDA graphs) after the collator's offsets moved to
#       lorabench.fastpath's table (8b19b95).
#   LIMIT_S=560 bash docs/runs/scripts/2026-11-27_h100e.sh <commit> e1   (carry .whl .whl_unsloth .gpudata)
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, ShareGPT, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, rounds, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
b4="batch=4 train.gradient_checkpointing=false"
tests() {  # tests <files...>: the GPU tests of those files, their summary into $OUT/gpu_tests_<call>.txt
  timeout $(( $(left) - 10 )) python3 -m pytest -m gpu -q -rA -p no:cacheprovider "$@" > $OUT/gpu_tests_$call.txt 2>&1
  tail -3 $OUT/gpu_tests_$call.txt; }
case $call in
  e1) (cd docs/runs/scripts && timeout 150 python3 dequant_store.py) > $OUT/dequant_store_$call.md 2>&1
      tail -4 $OUT/dequant_store_$call.md
      tests tests/test_loss_kernels.py
      rounds 0 qwen qwen2.5-7b 1 "fast: backend=fast $b4 | waits: backend=fast $b4 backend.loss_on_device=false | \
        unsloth: backend=unsloth $b4" ;;
  e2) sweep 0 qwen_prof_$call $profiled_cells model=qwen2.5-7b backend=fast $b4
      rounds 0 qwen qwen2.5-7b 2 "fast: backend=fast $b4 | unsloth: backend=unsloth $b4" ;;
  t1) tests tests/test_fast_arch.py tests/test_backends.py tests/test_graphs.py tests/test_grad_kernels.py ;;
  h1) rounds 0 qwen qwen2.5-7b 2 "fast: backend=fast $b4 | waits: backend=fast $b4 backend.loss_on_device=false | \
        unsloth: backend=unsloth $b4" ;;
  m1) tests tests/test_fast_parts.py tests/test_fused.py tests/test_gpu.py tests/test_flat_optim.py \
        tests/test_lean_launch.py tests/test_offload.py tests/test_packed_attention.py tests/test_random_weights.py \
        tests/test_bench.py tests/test_fsdp.py
      rounds 0 llama llama-3.1-8b 1 "fast: backend=fast $b4 | unsloth: backend=unsloth $b4"
      rounds 0 gemma gemma-2-9b 1 "fast: backend=fast batch=4 $ckpt=0.375 | \
        unsloth: backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false"
      rounds 0 qwen3 qwen3-8b 1 "fast: backend=fast batch=4 $ckpt=0.25 | \
        unsloth: backend=unsloth batch=24 $ckpt=1 backend.unsloth_offload=true" ;;
  m2) rounds 0 qwen3 qwen3-8b 1 "fast: backend=fast batch=4 $ckpt=0.25 | \
        unsloth: backend=unsloth batch=24 $ckpt=1 backend.unsloth_offload=true" ;;
  p1) tests tests/test_packed_attention.py tests/test_graphs.py ;;
  e3) rounds 0 qwen qwen2.5-7b 3 "fast: backend=fast $b4 | unsloth: backend=unsloth $b4" ;;
esac
grep -h "^gpu 0 .*exit" $R/log_0.txt 2>/dev/null | tail -6
pack_call $2
