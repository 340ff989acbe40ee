#!/usr/bin/env bash
# Whether the backward's input-gradient GEMMs run faster with the dequantised weight laid out as W^T (issue 34's
# Qwen2.5-7B, where fast leads Unsloth by 1.12-1.35x from round to round), on one H100 (kind nvidia-h100-x1):
#   b1: docs/runs/scripts/dx_layout.py (both layouts' GEMMs at 4,096 and 16,384 rows, the dequantisation into each
#       layout, checked bit for bit) and the GPU test that the transposing kernel had in src at c01e353 (it moved
#       into dx_layout.py after this run: W^T was no faster, see docs/results.md's h100c section).
#   r1: issue 34's Gemma-2-9B and Qwen3-8B, one round each of fast's defaults against Unsloth's best, at the layouts
#       their searches found within 22 GiB at seq 1024 (2026-11-27_searched: Gemma-2 fast b4 with 0.375 of its layers
#       recomputed, Unsloth b8 every layer recomputed, not offloaded; Qwen3 fast b4 with 0.25 recomputed, Unsloth b24
#       every layer recomputed and offloaded), whose rounds with graphs had run on H200s.
#   LIMIT_S=300 bash docs/runs/scripts/2026-11-27_h100d.sh <commit> b1   (carry .whl; r1: .whl .whl_unsloth)
set -u
LIMIT_S=${LIMIT_S:-300}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, rounds, pack_call
case $call in
  b1) (cd docs/runs/scripts && timeout $(( $(left) - 60 )) python3 dx_layout.py) > $OUT/dx_layout.md 2>&1
      cat $OUT/dx_layout.md
      timeout $(( $(left) - 5 )) python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_fast_parts.py \
        -k "transpose" > $OUT/gpu_tests_$call.txt 2>&1; tail -3 $OUT/gpu_tests_$call.txt ;;
  r1) cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
      rounds 0 gemma gemma-2-9b 1 "fast: backend=fast batch=4 $ckpt=0.375 | \
        unsloth: backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false"
      rounds 0 qwen3 qwen3-8b 1 "fast: backend=fast batch=4 $ckpt=0.25 | \
        unsloth: backend=unsloth batch=24 $ckpt=1 backend.unsloth_offload=true"
      grep -h "^gpu 0 .*exit" $R/log_0.txt ;;
esac
pack_call $2
