#!/usr/bin/env bash
# Issue 19, fourth round: the adapters as one flat tensor for the optimizer (backend.flat_optimizer,
# lorabench.flat_optim) on the GPU at hand (the device tool), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_flat.sh <commit> <part>
# with .whl/ (and .whl_unsloth/ for the Unsloth cells, .gpudata/ for ShareGPT) as for
# docs/runs/scripts/2026-11-24_fused.sh. Each part writes its sweep dirs to $OUT/<part>.tgz.
#   whole    the flat optimizer's GPU test; seq 512 on the whole GPU, fixed-length rows, b32, nothing
#            recomputed, 2 DataLoader workers: fast without and with the flat optimizer at LoRA dropout
#            0.05, with it at dropout 0 (profiled) and at b40
#   merged   the GPU tests of flat_optim, fused and profile; the step's GEMM shapes alone (bench.py
#            suite=hardware at 16,384 rows, 2 s per shape: their rate under the power limit); seq 512,
#            whole GPU, b32, dropout 0: fast at the commit before (c069343, its src/lorabench carried as
#            .old/src) and now (q/k/v's adapters sharing their thin GEMMs; profiled), and b40
#   unsloth  seq 512, whole GPU: fast's best and Unsloth's best (b32, 2 workers) at dropout 0.05 and 0 in one lease
#   packed   seq 512, ShareGPT packed, 22 GiB: hf's seed cell and fast's best with and without the flat optimizer
#   h200     (on nvidia-h200) seq 512, the whole GPU (139 GiB), dropout 0: fast and Unsloth at b32 and b64, fast at b48
#   h200p    (on nvidia-h200, the same lease) fast's best H200 cell (b48) profiled, and b40
set -u
LIMIT_S=580; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
sub='hydra.sweep.subdir=${backend.name}_s${seq_len}_b${batch}_r${train.checkpoint_fraction}_o${train.offload_fraction}_f${backend.flat_optimizer}'
s="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=auto train.checkpoint_fraction=0 data.num_workers=2"
w="hydra.sweep.subdir=\${backend.name}_b\${batch}_d\${lora.dropout}_f\${backend.flat_optimizer}"
case $2 in
  whole)
    python3 -m pytest -q -m gpu tests/test_flat_optim.py > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    x="hydra.sweep.dir=$D/auto"
    run $s $x "$w" backend=fast batch=32 backend.flat_optimizer=false
    run $s $x "$w" backend=fast batch=32
    run $s $x "$w" backend=fast batch=32 lora.dropout=0 train.profile_steps=2
    run $s $x "$w" backend=fast batch=40 lora.dropout=0 ;;
  merged)
    python3 -m pytest -q -m gpu tests/test_flat_optim.py tests/test_fused.py tests/test_profile.py tests/test_backends.py \
      -k "not unsloth" > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    python3 bench.py suite=hardware model=mistral-7b-v0.3 'hardware.tokens=[16384]' 'hardware.dtypes=[bf16]' \
      'hardware.sizes=[8192]' hardware.rep_ms=2000 hydra.run.dir=$D/hardware 2>&1 | grep -E "gemm|clock|power|rror" | head
    x="hydra.sweep.dir=$D/auto"
    PYTHONPATH=/tmp/site:$PWD/.old/src run $s hydra.sweep.dir=$D/before "$w" backend=fast batch=32 lora.dropout=0
    run $s $x "$w" backend=fast batch=32 lora.dropout=0 train.profile_steps=2
    run $s $x "$w" backend=fast batch=40 lora.dropout=0 ;;
  unsloth)
    x="hydra.sweep.dir=$D/auto"
    run $s $x "$w" backend=fast batch=32
    run $s $x "$w" backend=fast batch=32 lora.dropout=0
    run $s $x "$w" backend=unsloth batch=32
    run $s $x "$w" backend=unsloth batch=32 lora.dropout=0 ;;
  packed)
    x="hydra.sweep.dir=$D/sharegpt"
    run $sg $x "$sub" backend=hf batch=8 train.checkpoint_fraction=1 data.packing=true
    run $sg $x "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25 backend.flat_optimizer=false
    run $sg $x "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25 ;;
  h200)
    x="hydra.sweep.dir=$D/auto"
    for b in 64 48 32; do run $s $x "$w" backend=fast batch=$b lora.dropout=0; done
    for b in 64 32; do run $s $x "$w" backend=unsloth batch=$b lora.dropout=0; done ;;
  h200p)
    x="hydra.sweep.dir=$D/auto"
    run $s $x "$w" backend=fast batch=48 lora.dropout=0 train.profile_steps=2
    run $s $x "$w" backend=fast batch=40 lora.dropout=0 ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
