#!/usr/bin/env bash
# Issue 34's two missed bests on one H100 alone (device tool kind nvidia-h100-x1) after the host-memory watchdog
# stopped scanning every process of the machine ten times a second (lorabench.guard, from 2026-11-26_host's py-spy
# samples): Unsloth's searched best layout and fast's two best layouts of the earlier searches for Qwen2.5-7B and
# Gemma-2-9B within 22 GiB at seq 1024, one run; one fast cell of each model again with the watchdog as it was
# (its children listed at every poll: Guard's relist_s set to its interval) for the watchdog's own share.
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-26_guard.sh <commit> c1|c2  (carry .whl_b and .whl_unsloth)
set -u
LIMIT_S=${LIMIT_S:-560}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
q="$cell model=qwen2.5-7b"; g="$cell model=gemma-2-9b"
old_guard() {  # old_guard <name> <train.py arguments...>: as `sweep 0`, the watchdog listing children at every poll
  local name=$1; shift
  [ -f $R/$name/done ] && return 0; [ "$(left)" -lt 90 ] && return 1
  echo "== gpu 0 $name (children listed at every poll): $*" >> $R/log_0.txt
  timeout -s INT $(left) python3 -c "import runpy, sys; import lorabench.guard as g
g.Guard.__init__.__defaults__ = (0.1, 0.1); sys.argv[0] = 'train.py'; runpy.run_path('train.py', run_name='__main__')" \
    "$@" hydra.sweep.dir=$R/$name >> $R/log_0.txt 2>&1
  echo "gpu 0 $name: exit $? after $((SECONDS - t0)) s" | tee -a $R/log_0.txt; touch $R/$name/done
}
sweep 0 qwen_unsloth $q backend=unsloth batch=4 train.gradient_checkpointing=false
sweep 0 qwen_fast_b4 $q backend=fast batch=4 $ckpt=0
old_guard qwen_fast_b4_old_guard $q backend=fast batch=4 $ckpt=0
sweep 0 qwen_fast_b8 $q backend=fast batch=8 $ckpt=0.25 train.offload_fraction=0.25
sweep 0 gemma_fast_b4 $g backend=fast batch=4 $ckpt=0 train.offload_fraction=0.25
sweep 0 gemma_unsloth $g backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false
sweep 0 gemma_fast_b4_c25 $g backend=fast batch=4 $ckpt=0.25
old_guard gemma_fast_b4_old_guard $g backend=fast batch=4 $ckpt=0 train.offload_fraction=0.25
pack_call $2
