#!/usr/bin/env bash
# Measurements for the GPU projection (lorabench.projection) and its validation, on the GPU at hand.
# Run from the repository root on the GPU machine, once per GPU (an H100, then an H200), in two parts
# that each fit one device call:
#   bash docs/runs/scripts/2026-11-24_projection.sh <commit> a   # hardware suite, profiled diagnostic
#   bash docs/runs/scripts/2026-11-24_projection.sh <commit> b   # the fast path's best cells, profiled
# with the wheels of ../shared/tools/device-wheels.sh in .whl/. Results go to $OUT/runs_<part>.tgz.
#   a: python bench.py suite=hardware model=mistral-7b-v0.3
#      python train.py +experiment=diagnostic gpu=a10 train.max_steps=22 train.profile_steps=2
#         (the seed's six cells within an A10's 22 GiB: 5 warmup, 2 profiled, 15 timed steps)
#   b: python train.py +experiment=seed_optimum backend=fast data=synthetic gpu=a10 batch=16
#         train.checkpoint_fraction=0.75 train.max_steps=22 train.profile_steps=2   (best within 22 GiB)
#      the same with gpu=auto batch=24 train.checkpoint_fraction=0                  (best on the whole GPU)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 LORABENCH_CACHE=/tmp/cache LORABENCH_GIT_SHA=$1
q="--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu,driver_version"
nvidia-smi $q --format=csv > $OUT/gpu_before_$2.csv
D=$OUT/runs_$2; t0=$SECONDS
fast="+experiment=seed_optimum backend=fast data=synthetic train.max_steps=22 train.profile_steps=2"
case $2 in
  a) timeout 570 bash -c "
python3 bench.py suite=hardware model=mistral-7b-v0.3 hydra.run.dir=$D/hardware
python3 train.py +experiment=diagnostic gpu=a10 train.max_steps=22 train.profile_steps=2 hydra.sweep.dir=$D/diagnostic
" > $OUT/log_a.txt 2>&1 ;;
  b) timeout 570 bash -c "
python3 train.py $fast gpu=a10 batch=16 train.checkpoint_fraction=0.75 hydra.run.dir=$D/fast/a10_b16_ckpt075
python3 train.py $fast gpu=auto batch=24 train.checkpoint_fraction=0 hydra.run.dir=$D/fast/auto_b24_ckpt0
" > $OUT/log_b.txt 2>&1 ;;
esac
echo "exit $? after $((SECONDS - t0)) s" >> $OUT/log_$2.txt
nvidia-smi $q --format=csv > $OUT/gpu_after_$2.csv
(cd $OUT && tar czf runs_$2.tgz runs_$2 && rm -rf runs_$2)
grep -E "cells:|hw/gemm|^\| |exit " $OUT/log_$2.txt | tail -25
