#!/usr/bin/env bash
# Issue 19's measurements on the GPU at hand (the device tool), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_fused.sh <commit> <part>
# with the wheels of ../shared/tools/device-wheels.sh in .whl/ (+ .whl_unsloth/ or .whl_sharegpt/
# where a part needs them). Each part writes its sweep dirs to $OUT/<part>.tgz and its log to $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  $(ls .whl_unsloth/*.whl .whl_sharegpt/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 LORABENCH_CACHE=/tmp/cache LORABENCH_GIT_SHA=$1
D=$OUT/$2; t0=$SECONDS
# seq 512, synthetic fixed-length rows, the seed's recipe (nf4, LoRA r16 qkvo dropout 0.05, paged_adamw_8bit)
s="-m +experiment=seed_optimum data=synthetic train.max_steps=20"
run() { echo "== $*"; timeout $((570 - (SECONDS - t0))) python3 train.py "$@" 2>&1 | grep -E "cells:|Error|error:|^\| [^c-]" ; }
case $2 in
  probe)  # the fused projections against PEFT's, the GPU gradient tests
    python3 -m pytest -q -m gpu tests/test_fused.py tests/test_backends.py -k "fused or fast_path" 2>&1 | tail -3
    sub='hydra.sweep.subdir=${backend.name}_b${batch}_f${train.checkpoint_fraction}_fused${backend.fused_lora}'
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=hf batch=8 train.checkpoint_fraction=1
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.75 backend.fused_lora=false
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.75,0.625,0.5 backend.fused_lora=true
    run $s hydra.sweep.dir=$D/auto gpu=auto backend=fast batch=24 train.checkpoint_fraction=0 backend.fused_lora=false,true \
      train.profile_steps=2 'hydra.sweep.subdir=fast_b24_fused${backend.fused_lora}' ;;
  probe2)  # seeded dropout (no masks kept): what fits in 22 GiB now, and the whole GPU
    python3 -m pytest -q -m gpu tests/test_fused.py tests/test_backends.py -k "fused or fast_path or seeded" 2>&1 | tail -3
    sub='hydra.sweep.subdir=${backend.name}_b${batch}_f${train.checkpoint_fraction}'
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.5,0.375
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=24 train.checkpoint_fraction=0.75,0.625
    run $s hydra.sweep.dir=$D/auto gpu=auto "$sub" backend=fast batch=24,32 train.checkpoint_fraction=0 train.profile_steps=2 ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
