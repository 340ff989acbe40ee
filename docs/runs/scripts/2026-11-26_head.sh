#!/usr/bin/env bash
# Where fast loses its lead over Unsloth on Llama-3's 128,256-word head, and the searched bests again with
# Liger's fused cross-entropy in larger chunks (backend.ce_chunk_mem; issues 34 and 35), on one GPU of the
# device tool, in consecutive calls on the same warm machine:
#   bash docs/runs/scripts/2026-11-26_head.sh <commit> <call>      (call: c1, c2, ... in order)
# carrying .whl/ and .whl_unsloth/ as 2026-11-26_best.sh does. Every call runs the list below from the top:
# a step that finished in an earlier call is passed over (its dir holds `done`); a sweep that the time
# left stopped (sweep.deadline_s: after a cell, when the next would not fit; exit 4) is resumed by the
# same command. The dirs live in /tmp/runs, which the warm machine keeps; each call packs them into
# $OUT/<call>.tgz.
#   head           docs/runs/scripts/2026-11-26_loss_head.py: the loss head alone per vocabulary, Liger's
#                  chunking 1..32, torch's, Unsloth's
#   llama_b4       fast (ce_chunk_mem 1 and 8) and Unsloth at b4, nothing recomputed, seq 1024, 22 GiB:
#                  the layout where Unsloth led fast (14,522 against 13,373 tok/s in 2026-11-26_best),
#                  profiled, 24 steps of which 4 untimed and 2 profiled
#   <model>_s<seq>_<backends>   +experiment=tune gpu=a10: each backend's best within 22 GiB, as in
#                  2026-11-26_best (14 steps, 4 untimed, at most 10 measured cells per backend)
# What ran: c1 at b93a4ae on an H100 (its Unsloth rows of head.csv failed on a shadowed name); the machine went
# back while c1's figures were read; c2 and c3 at 06130bd on an H200 (the call named no kind), c3 right after c2
# on the same machine; then the session's device time was spent (qwen3-8b not run).
set -u
LIMIT_S=${LIMIT_S:-570}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, run, t0
R=/tmp/runs; mkdir -p $R; log=$R/log.txt; echo "=== call $2 at commit $1" >> $log
left() { echo $((LIMIT_S - (SECONDS - t0))); }
sweep() {  # sweep <name> <train.py arguments...>: once, resumed until it finishes
  local name=$1; shift
  [ -f $R/$name/done ] && return 0
  [ "$(left)" -lt 90 ] && return 1
  echo "== $name: $*" | tee -a $log
  # the sweep stops itself after a cell when the next would end past the deadline; SIGINT is the backstop
  timeout -s INT $(left) python3 train.py "$@" sweep.deadline_s=$(( $(left) - 15 )) hydra.sweep.dir=$R/$name \
    2>&1 | tee -a $log | grep -E "^\[backend=|^\[search|cells:|Error|error:|^\| [^c-]"
  local rc=${PIPESTATUS[0]}  # 124: the backstop cut it; 4: stopped before the deadline; 2: a cell failed
  echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a $log
  [ $rc -ne 124 ] && [ $rc -ne 4 ] && touch $R/$name/done
  [ $rc -ne 124 ] && [ $rc -ne 4 ]
}
cell="-m +experiment=seed_optimum gpu=a10 seq_len=1024 batch=4 train.gradient_checkpointing=false
  train.checkpoint_fraction=0 train.max_steps=24 train.untimed_steps=4 model=llama-3.1-8b"
search="-m +experiment=tune gpu=a10 train.max_steps=14 train.untimed_steps=4 search.max_cells=10"
drop() { rm -rf /tmp/cache/random_init; }  # a model's random weights, once its sweeps are done (~16 GB each)
if [ $2 = c1 ]; then  # (at b93a4ae; the machine went back after it)
  echo "== head" | tee -a $log
  python3 docs/runs/scripts/2026-11-26_loss_head.py > $R/head.csv 2>> $log
  python3 docs/runs/scripts/2026-11-26_loss_head.py --unsloth 2>> $log | tail -n +2 >> $R/head.csv
  cat $R/head.csv | tee -a $log
  sweep llama_b4_fast $cell train.profile_steps=2 backend=fast backend.ce_chunk_mem=1,8 \
    && sweep llama_b4_unsloth $cell train.profile_steps=2 backend=unsloth \
    && sweep llama-3.1-8b_s1024_fast $search backend=fast model=llama-3.1-8b seq_len=1024
else  # c2, c3 on a fresh machine: Unsloth's loss head (c1's call of it named the module), the chunking
  # in the cell, twice each in turn, and Qwen2.5-7B's searches
  if [ ! -f $R/head_unsloth.csv ]; then
    python3 docs/runs/scripts/2026-11-26_loss_head.py --unsloth > $R/head_unsloth.csv 2>> $log
    cat $R/head_unsloth.csv | tee -a $log
  fi
  sweep llama_b4_chunks $cell backend=fast train.seed=0,1 backend.ce_chunk_mem=1,8 && drop \
    && sweep qwen2.5-7b_s1024_fast $search backend=fast model=qwen2.5-7b seq_len=1024 \
    && sweep qwen2.5-7b_s1024_unsloth $search backend=unsloth model=qwen2.5-7b seq_len=1024 && drop
fi
echo "call $2: exit after $((SECONDS - t0)) s" | tee -a $log
(cd $R && tar czf $OUT/$2.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude=checkpoint-* .)
