#!/usr/bin/env bash
# Where fast's host time goes on a host-bound cell (one H100 alone, device tool kind nvidia-h100-x1): the two
# bests of issue 34 that missed 1.15x over Unsloth, Gemma-2-9B (b4, 0.25 offloaded) and Qwen2.5-7B (its b4, nothing
# recomputed, ran below its b8 on an H200), each at its real shape and at batch 1 x 64 tokens (device work near
# nothing: the step's time is its host's), every cell sampled by py-spy (--nonblocking: the process is not paused).
#   source docs/runs/scripts/device_setup.sh <commit> c0   (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-26_host.sh <commit> c1   (carry .whl_b, .whl_spy): the four cells, py-spy's
#                                                          samples summed by stack (raw)
#   bash docs/runs/scripts/2026-11-26_host.sh <commit> c2   (a later machine, same carries): the batch-1 cells again
#     with the samples in time order per thread (speedscope: warm-up steps told apart), waits included (--idle);
#     Qwen2.5's b4 cell profiled (torch.profiler: device work and idle); lorabench's launches timed alone
#     (launch_costs.py)
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, pack_call
cell="+experiment=seed_optimum train.untimed_steps=5 gpu=a10 backend=fast $ckpt=0"
spy() {  # spy <name> <train.py arguments...>: one cell under py-spy (plain python where py-spy cannot attach)
  local name=$1; shift
  [ -f $R/$name/done ] && return 0; [ "$(left)" -lt 90 ] && return 1
  echo "== $name: $*" >> $R/log_0.txt
  timeout -s INT $(left) /tmp/site/bin/py-spy record --nonblocking -r 250 $SPY -o $R/spy_$name.txt -- \
    python3 train.py "$@" hydra.run.dir=$R/$name >> $R/log_0.txt 2>&1
  local rc=$?; echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a $R/log_0.txt
  if [ ! -s $R/spy_$name.txt ] && [ ! -f $R/$name/metrics.json ]; then
    timeout -s INT $(left) python3 train.py "$@" hydra.run.dir=$R/$name >> $R/log_0.txt 2>&1
    echo "$name (no py-spy): exit $? after $((SECONDS - t0)) s" | tee -a $R/log_0.txt
  fi
  touch $R/$name/done
}
SPY="-f raw"
if [ $2 = c2 ]; then
  SPY="-f speedscope --idle"
  python3 docs/runs/scripts/launch_costs.py > $R/launch_costs.md 2>&1
  spy qwen_tiny_t $cell model=qwen2.5-7b batch=1 seq_len=64 train.max_steps=25
  spy gemma_tiny_t $cell model=gemma-2-9b batch=1 seq_len=64 train.max_steps=25
  spy qwen_b4_prof $cell model=qwen2.5-7b batch=4 seq_len=1024 train.max_steps=16 train.untimed_steps=4 \
    train.profile_steps=2
  pack_call $2; exit
fi
spy qwen_tiny $cell model=qwen2.5-7b batch=1 seq_len=64 train.max_steps=25
spy gemma_tiny $cell model=gemma-2-9b batch=1 seq_len=64 train.max_steps=25
spy qwen_b4 $cell model=qwen2.5-7b batch=4 seq_len=1024 train.max_steps=20
spy gemma_b4 $cell model=gemma-2-9b batch=4 seq_len=1024 train.max_steps=20 train.offload_fraction=0.25
pack_call $2
