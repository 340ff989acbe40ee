#!/usr/bin/env bash
# Issue 19's closing measurements: every target of the issue measured again at one commit, on the GPU at
# hand (the device tool), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_final.sh <commit> <part>
# with .whl/ and .whl_unsloth/ (Unsloth's cells) and .gpudata/ (ShareGPT) as for
# docs/runs/scripts/2026-11-24_lean.sh. Each part writes its sweep dirs to $OUT/<part>.tgz.
#   s512, s1024, s2048  (nvidia-h100-x1) within 22 GiB (gpu=a10), LoRA dropout 0.05 (the seed's recipe):
#         fixed-length rows: hf's best cell that fits (at 512 the seed's cell), fast's best layout of the
#         earlier rounds, Unsloth's best cell at two batch sizes (every layer recomputed, its own offloading);
#         ShareGPT packed for both: hf and fast in the same layouts (Unsloth is left out of packed rows: its
#         patched attention is not known to keep packed samples apart, so the work would not be equal)
#   tests (nvidia-h100-x1) the GPU tests of every module (Unsloth's left out), and the loss-match experiment
#         (hf and fast on the same packed ShareGPT batches, 55 steps)
#   whole (nvidia-h200) the whole GPU at seq 512, fixed-length rows, nothing recomputed, LoRA dropout 0,
#         2 loader workers: fast b48, with absmax_cache, the same profiled; Unsloth's b64
set -u
LIMIT_S=585; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
w='hydra.sweep.subdir=${backend.name}_b${batch}_r${train.checkpoint_fraction}_o${train.offload_fraction}_c${backend.absmax_cache}_p${train.profile_steps}'
case $2 in
  s512|s1024|s2048)
    n=${2#s}
    #    hf, fast (batch, recomputed, offloaded), Unsloth's two batches
    case $n in
      512)  b=(8 24 0.375 0.25 64 32) ;;
      1024) b=(8 12 0.375 0.25 32 16) ;;
      2048) b=(4 6 0.3125 0.3125 16 8) ;;
    esac
    fixed="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=a10 seq_len=$n hydra.sweep.dir=$D/fixed"
    packed="$sg seq_len=$n hydra.sweep.dir=$D/sharegpt"
    fast="backend=fast batch=${b[1]} train.checkpoint_fraction=${b[2]} train.offload_fraction=${b[3]}"
    run $fixed "$w" backend=hf batch=${b[0]} train.checkpoint_fraction=1
    run $fixed "$w" $fast
    run $fixed "$w" backend=unsloth batch=${b[4]} train.checkpoint_fraction=1
    run $packed "$w" backend=hf batch=${b[0]} train.checkpoint_fraction=1 data.packing=true
    run $packed "$w" $fast
    run $fixed "$w" backend=unsloth batch=${b[5]} train.checkpoint_fraction=1 ;;
  tests)
    python3 -m pytest -q -m gpu -k "not unsloth" tests > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    mkdir -p $D; echo "python train.py +experiment=fast_loss_match data=jsonl data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null" > $D/command.txt
    timeout $((LIMIT_S - (SECONDS - t0))) python3 train.py +experiment=fast_loss_match data=jsonl \
      data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null hydra.sweep.dir=$D/loss_match 2>&1 \
      | grep -E "cells:|Error|^\| [^c-]" ;;
  whole)
    s="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=auto train.checkpoint_fraction=0 data.num_workers=2 lora.dropout=0 hydra.sweep.dir=$D/auto"
    run $s "$w" backend=fast batch=48
    run $s "$w" backend=fast batch=48 backend.absmax_cache=true
    run $s "$w" backend=fast batch=48 backend.absmax_cache=true train.profile_steps=2
    run $s "$w" backend=unsloth batch=64 ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
