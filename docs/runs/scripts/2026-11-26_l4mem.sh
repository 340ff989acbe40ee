#!/usr/bin/env bash
# Issue 39: the L4 source cell (+experiment=trl_l4_check) holds 23.15 GiB allocated at its peak on an H100, more than
# the L4's 22.5 GiB on which the source trained it (2026-11-26_h100's mem_trl_l4). On one H100 (device tool kind
# nvidia-h100-x1), one cell at a time, 3 optimizer steps each (the peak statistics reset after step 1):
#   1. mem_trl_l4: docs/runs/scripts/memory_peak.py again, now with each group's blocks by size and the stacks of the
#      peak's own allocation and of each large group's largest block
#   2. trl_l4_reentrant: the cell with transformers' reentrant checkpointing, the source's (reentrant_train.py)
#   3. trl_l4_plain: the cell as lorabench runs it, untraced, in the same call
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-26_l4mem.sh <commit> c1     (carry .whl_b)
#   bash docs/runs/scripts/2026-11-26_l4mem.sh <commit> c2     (carry .whl_b; a later lend): the cell after the
#     amendment of docs/runs/trl_l4 (embedding and head in bf16), profiled as the projection checks it, then traced
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, pack_call
l4="+experiment=trl_l4_check train.max_steps=3 train.untimed_steps=1"
if [ ! -f $R/mem_trl_l4/peak.md ] && [ $2 = c1 ]; then
  timeout $(( $(left) - 10 )) python3 docs/runs/scripts/memory_peak.py $R/mem_trl_l4 $l4 \
    hydra.sweep.dir=$R/mem_trl_l4 > $R/log_mem.txt 2>&1
  echo "mem_trl_l4: exit $? after $((SECONDS - t0)) s"; tail -45 $R/log_mem.txt
fi
for v in reentrant plain; do
  [ $2 = c1 ] || continue
  [ -f $R/trl_l4_$v/0/metrics.json ] || [ "$(left)" -lt 80 ] && continue
  py=train.py; [ $v = reentrant ] && py=docs/runs/scripts/reentrant_train.py
  timeout -s INT $(left) python3 $py $l4 hydra.sweep.dir=$R/trl_l4_$v > $R/log_$v.txt 2>&1
  echo "trl_l4_$v: exit $? after $((SECONDS - t0)) s"; grep -E "^\| batch=1 \| " $R/log_$v.txt | head -1
done
if [ $2 = c2 ]; then  # after the amendment (the cell's embedding and head in bf16, TRL 0.9.6's): the cell as the
  # projection checks it (profiled, as 2026-11-26_h100's trl_l4), then its memory traced
  sweep 0 trl_l4 +experiment=trl_l4_check train.profile_steps=2
  [ "$(left)" -gt 100 ] && timeout $(( $(left) - 10 )) python3 docs/runs/scripts/memory_peak.py $R/mem_trl_l4_bf16 \
    $l4 hydra.sweep.dir=$R/mem_trl_l4_bf16 > $R/log_mem_bf16.txt 2>&1 && head -16 $R/mem_trl_l4_bf16/peak.md
fi
pack_call $2
