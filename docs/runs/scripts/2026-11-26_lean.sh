#!/usr/bin/env bash
# Issue 34's two missed bests on one H100 alone (device tool kind nvidia-h100-x1) after fewer host launches per
# decoder layer: every Triton kernel launched past JITFunction.run's per-call work (backend.lean_launch,
# lorabench.lean_launch), the adapters cast to bf16 once a step instead of at each use (lorabench.flat_optim's
# LowCopy, in lorabench.fused), the adapter gradients' scale in their GEMMs. Unsloth's searched best layout and
# fast's best layout of Qwen2.5-7B and Gemma-2-9B within 22 GiB at seq 1024 in one run, fast also with
# backend.lean_launch=false (that part's own share); what one launch costs, with and without lean_launch.
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-26_lean.sh <commit> c1|c2   (carry .whl_b and .whl_unsloth)
#     c1 (fb80e4e): the launch costs, the GPU tests of the parts changed, Qwen2.5's cells. c2 (a later machine,
#     after the adapter gradients were written in fp32 by their GEMMs and Liger's RMSNorm of a frozen weight launched
#     without its per-call wrappers): the GPU tests again, then Qwen2.5's and
#     Gemma-2's cells, Gemma-2 also with lean_launch off; the host's floor (batch 1 x 64 tokens) if time is left.
#     c3 (another machine, the same commit as c2): the host's floor of Qwen2.5 with all of fast's parts, without
#     lean_launch, without norm_backward_grid; then each model's fast best and Unsloth's again, fast first.
#     c4 (the same machine as c3, carry old/ too): fast's bests with this commit and with 027e72e's code, alternating
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
q="$cell model=qwen2.5-7b"; g="$cell model=gemma-2-9b"
if [ $2 = c1 ]; then
  python3 docs/runs/scripts/launch_costs.py > $R/launch_costs.md 2>&1
  timeout 200 python3 -m pytest -q -m gpu tests/test_lean_launch.py tests/test_fused.py tests/test_flat_optim.py \
    tests/test_backends.py tests/test_fast_parts.py -k "not unsloth" > $R/gpu_tests.txt 2>&1; tail -1 $R/gpu_tests.txt
  sweep 0 qwen_unsloth $q backend=unsloth batch=4 train.gradient_checkpointing=false
  sweep 0 qwen_fast_b4 $q backend=fast batch=4 $ckpt=0
  sweep 0 qwen_fast_b4_nolean $q backend=fast batch=4 $ckpt=0 backend.lean_launch=false
  pack_call $2; exit
fi
python3 docs/runs/scripts/launch_costs.py > $R/launch_costs_$2.md 2>&1
tiny="+experiment=seed_optimum train.untimed_steps=5 gpu=a10 backend=fast $ckpt=0 model=qwen2.5-7b batch=1 seq_len=64"
if [ $2 = c4 ]; then  # this commit's fast path against 027e72e's (in old/: `git archive 027e72e src conf train.py`),
  old() { (cd old && PYTHONPATH=/tmp/site:$PWD/src LORABENCH_GIT_SHA=027e72e sweep "$@"); }  # alternating
  for i in 1 2; do
    sweep 0 qwen_fast_b4_${2}_$i $q backend=fast batch=4 $ckpt=0
    old 0 qwen_fast_b4_old_${2}_$i $q backend=fast batch=4 $ckpt=0
    sweep 0 gemma_fast_b4_c25_${2}_$i $g backend=fast batch=4 $ckpt=0.25
    old 0 gemma_fast_b4_c25_old_${2}_$i $g backend=fast batch=4 $ckpt=0.25
  done
  pack_call $2; exit
fi
if [ $2 = c3 ]; then
  sweep 0 qwen_tiny_$2 -m $tiny train.max_steps=25
  sweep 0 qwen_tiny_nolean_$2 -m $tiny train.max_steps=25 backend.lean_launch=false
  sweep 0 qwen_tiny_nonorm_$2 -m $tiny train.max_steps=25 backend.norm_backward_grid=false
  sweep 0 qwen_fast_b4_$2 $q backend=fast batch=4 $ckpt=0
  sweep 0 qwen_unsloth_$2 $q backend=unsloth batch=4 train.gradient_checkpointing=false
  sweep 0 gemma_fast_b4_c25_$2 $g backend=fast batch=4 $ckpt=0.25
  sweep 0 gemma_fast_b4_c25_nolean_$2 $g backend=fast batch=4 $ckpt=0.25 backend.lean_launch=false
  sweep 0 gemma_unsloth_$2 $g backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false
  pack_call $2; exit
fi
timeout 200 python3 -m pytest -q -m gpu tests/test_lean_launch.py tests/test_fused.py tests/test_flat_optim.py \
  tests/test_backends.py tests/test_fast_parts.py -k "not unsloth" > $R/gpu_tests_$2.txt 2>&1; tail -1 $R/gpu_tests_$2.txt
sweep 0 qwen_unsloth_$2 $q backend=unsloth batch=4 train.gradient_checkpointing=false
sweep 0 qwen_fast_b4_$2 $q backend=fast batch=4 $ckpt=0
sweep 0 gemma_unsloth_$2 $g backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false
sweep 0 gemma_fast_b4_c25_$2 $g backend=fast batch=4 $ckpt=0.25
sweep 0 gemma_fast_b4_c25_nolean_$2 $g backend=fast batch=4 $ckpt=0.25 backend.lean_launch=false
sweep 0 qwen_tiny_$2 -m $tiny train.max_steps=25
sweep 0 qwen_tiny_nolean_$2 -m $tiny train.max_steps=25 backend.lean_launch=false
pack_call $2
