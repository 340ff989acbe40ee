#!/usr/bin/env bash
# Whether the backward's input-gradient GEMMs run faster with the dequantised weight laid out as W^T (issue 34's
# Qwen2.5-7B, where fast leads Unsloth by 1.12-1.35x from round to round), on one H100 (kind nvidia-h100-x1):
#   b1: docs/runs/scripts/dx_layout.py (both layouts' GEMMs at 4,096 and 16,384 rows, the dequantisation into each
#       layout, checked bit for bit) and the new kernel's GPU test.
#   LIMIT_S=300 bash docs/runs/scripts/2026-11-27_h100d.sh <commit> b1   (carry .whl)
set -u
LIMIT_S=${LIMIT_S:-300}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, rounds, pack_call
case $call in
  b1) (cd docs/runs/scripts && timeout $(( $(left) - 60 )) python3 dx_layout.py) > $OUT/dx_layout.md 2>&1
      cat $OUT/dx_layout.md
      timeout $(( $(left) - 5 )) python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_fast_parts.py \
        -k "transpose" > $OUT/gpu_tests_$call.txt 2>&1; tail -3 $OUT/gpu_tests_$call.txt ;;
esac
pack_call $2
