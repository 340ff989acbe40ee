#!/usr/bin/env bash
# Where fast's host time goes on a host-bound cell (one H100 alone, device tool kind nvidia-h100-x1): the two
# bests of issue 34 that missed 1.15x over Unsloth, Gemma-2-9B (b4, 0.25 offloaded) and Qwen2.5-7B (its b4, nothing
# recomputed, ran below its b8 on an H200), each at its real shape and at batch 1 x 64 tokens (device work near
# nothing: the step's time is its host's), every cell sampled by py-spy (--nonblocking: the process is not paused).
#   bash docs/runs/scripts/2026-11-26_host.sh <commit> c1   (carry .whl, .whl_b, .whl_spy)
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, pack_call
cell="+experiment=seed_optimum train.untimed_steps=5 gpu=a10 backend=fast $ckpt=0"
spy() {  # spy <name> <train.py arguments...>: one cell under py-spy (plain python where py-spy cannot attach)
  local name=$1; shift
  [ -f $R/$name/done ] && return 0; [ "$(left)" -lt 90 ] && return 1
  echo "== $name: $*" >> $R/log_0.txt
  timeout -s INT $(left) /tmp/site/bin/py-spy record --nonblocking -r 250 -f raw -o $R/spy_$name.txt -- \
    python3 train.py "$@" hydra.run.dir=$R/$name >> $R/log_0.txt 2>&1
  local rc=$?; echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a $R/log_0.txt
  if [ ! -s $R/spy_$name.txt ] && [ ! -f $R/$name/metrics.json ]; then
    timeout -s INT $(left) python3 train.py "$@" hydra.run.dir=$R/$name >> $R/log_0.txt 2>&1
    echo "$name (no py-spy): exit $? after $((SECONDS - t0)) s" | tee -a $R/log_0.txt
  fi
  touch $R/$name/done
}
spy qwen_tiny $cell model=qwen2.5-7b batch=1 seq_len=64 train.max_steps=25
spy gemma_tiny $cell model=gemma-2-9b batch=1 seq_len=64 train.max_steps=25
spy qwen_b4 $cell model=qwen2.5-7b batch=4 seq_len=1024 train.max_steps=20
spy gemma_b4 $cell model=gemma-2-9b batch=4 seq_len=1024 train.max_steps=20 train.offload_fraction=0.25
pack_call $2
