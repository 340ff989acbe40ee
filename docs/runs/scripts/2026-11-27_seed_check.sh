#!/usr/bin/env bash
# Issue 39: the source cells of the seed study's six A10 figures as the seed's software ran them
# (+experiment=seed_a10_check: the diagnostic with eager attention, conf/experiment/seed_a10_check.yaml), and on
# the same machine the diagnostic with lorabench's default SDPA, each profiled within an A10's 22 GiB as the
# 2026-11-24 diagnostic was (2026-11-24_projection.sh a: 22 steps, 5 untimed, 2 profiled, 15 timed):
#   s1: python train.py +experiment=seed_a10_check gpu=a10 train.max_steps=22 train.profile_steps=2
#   s2: python train.py +experiment=diagnostic gpu=a10 train.max_steps=22 train.profile_steps=2, then the
#       hardware suite (python bench.py suite=hardware model=mistral-7b-v0.3) as far as the call's time goes
#   s1 and s2 ran at a89867b, one after the other on one H100. Then, after the profile's classifier stopped counting
#   copies inside a matrix product as one (977a605), s3 (s1's cells) on another machine, and h3 (the same) on the
#   next machine the device tool lent for kind nvidia-h200 (an H200), and s4 (the same) on a third H100.
#   LIMIT_S=570 bash docs/runs/scripts/2026-11-27_seed_check.sh <commit> s1   (carry .whl)
# Then, on a CPU: python bench.py suite=project sweep_dir=<the s1 dir> 'measured=[docs/runs/seed_a10/diagnostic.csv]'
set -u
LIMIT_S=${LIMIT_S:-570}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
diag="gpu=a10 train.max_steps=22 train.profile_steps=2"
case $call in
  s1|s3|s4|h3) sweep 0 eager_$call -m +experiment=seed_a10_check $diag ;;
  s2) sweep 0 sdpa_$call -m +experiment=diagnostic $diag
      [ "$(left)" -gt 120 ] && timeout $(( $(left) - 10 )) python3 bench.py suite=hardware model=mistral-7b-v0.3 \
        hydra.run.dir=$R/hardware_$call >> $R/log_0.txt 2>&1 ;;
esac
grep -h "^gpu 0 .*exit" $R/log_0.txt 2>/dev/null | tail -6
pack_call $2
