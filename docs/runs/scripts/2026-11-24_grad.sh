#!/usr/bin/env bash
# Issue 19, sixth round: the backward's input gradients as one Triton GEMM per group
# (backend.triton_input_grad) and SwiGLU's backward in the down projection's (backend.swiglu_in_gemm),
# on the GPU at hand (the device tool), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_grad.sh <commit> <part>
# with .whl/ (and .whl_unsloth/ for Unsloth's cells) as for docs/runs/scripts/2026-11-24_lean.sh.
# Each part writes its sweep dirs to $OUT/<part>.tgz.
# Whole-GPU cells: seq 512, fixed-length rows, nothing recomputed, LoRA dropout 0, 2 workers.
#   h200e  (nvidia-h200) the GPU tests of the new parts and of lorabench.fused; one layer's input
#          gradients alone (2026-11-24_grad_shapes.py); fast b48 with the two knobs off (the fifth
#          round's fast), with both, with triton_input_grad alone
#   h200f  (nvidia-h200) after h200e, triton_input_grad on the attention's groups only and swiglu_in_gemm
#          off in fast (h200e: both slower in the MLP): fast b48 with triton_input_grad off (the fifth
#          round's fast), fast b48, the same profiled; Unsloth's b64
#   h100e  (nvidia-h100-x1, fast as in h200f) fast b40 with triton_input_grad off and on; Unsloth's b32; within 22 GiB at seq
#          1024 (the fifth round's s1024 layout, b12, 0.375 recomputed, 0.25 offloaded) with both on
set -u
LIMIT_S=580; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
s="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=auto train.checkpoint_fraction=0 data.num_workers=2 lora.dropout=0"
w='hydra.sweep.subdir=${backend.name}_b${batch}_g${backend.triton_input_grad}_s${backend.swiglu_in_gemm}_p${train.profile_steps}'
x="hydra.sweep.dir=$OUT/$2/auto"
off="backend.triton_input_grad=false backend.swiglu_in_gemm=false"
case $2 in
  h200e)
    python3 -m pytest -q -m gpu -k "not unsloth" tests/test_grad_kernels.py tests/test_fast_parts.py tests/test_fused.py \
      > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    python3 docs/runs/scripts/2026-11-24_grad_shapes.py 2>&1 | tee $OUT/grad_shapes.txt
    run $s $x "$w" backend=fast batch=48 $off
    run $s $x "$w" backend=fast batch=48
    run $s $x "$w" backend=fast batch=48 backend.swiglu_in_gemm=false ;;
  h200f)
    python3 -m pytest -q -m gpu tests/test_grad_kernels.py > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    run $s $x "$w" backend=fast batch=48 $off
    run $s $x "$w" backend=fast batch=48
    run $s $x "$w" backend=fast batch=48 train.profile_steps=2
    run $s $x "$w" backend=unsloth batch=64 ;;
  h100e)
    run $s $x "$w" backend=fast batch=40 $off
    run $s $x "$w" backend=fast batch=40
    run $s $x "$w" backend=unsloth batch=32
    run -m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=a10 seq_len=1024 "$w" \
      hydra.sweep.dir=$OUT/$2/a10 backend=fast batch=12 train.checkpoint_fraction=0.375 train.offload_fraction=0.25 ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
