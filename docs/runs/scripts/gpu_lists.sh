# Sourced, with <commit> <call>, after device_setup.sh by the scripts that run one list per GPU of a
# several-GPU machine in consecutive calls (2026-11-26_four.sh, _gaps.sh, _flex.sh): dirs in /tmp/runs (kept
# by the warm machine), the GPUs' clocks recorded, `left` (seconds before LIMIT_S), `sweep` (one train.py
# command that a later call resumes or passes over), `pinned` (a list on its own share of the host's cores),
# `rounds` (cells in turn on one GPU, named by the call) and `pack_call` (what this call wrote, into $OUT/<call>.tgz).
# The lists' common arguments (2026-11-26_h100.sh, _h100b.sh, _gemma.sh): a search (+experiment=tune, 14 steps of
# which 4 untimed, at most 10 measured cells), a profiled cell (16 steps: 4 untimed, 2 profiled, 10 timed, within
# 22 GiB), the recomputed fraction's key, packed ShareGPT (device_setup.sh unpacks it).
tune_cells="-m +experiment=tune train.max_steps=14 train.untimed_steps=4 search.max_cells=10"
profiled_cells="-m +experiment=seed_optimum train.max_steps=16 train.untimed_steps=4 train.profile_steps=2 gpu=a10"
ckpt="train.gradient_checkpointing=true train.checkpoint_fraction"
packed_rows="data=jsonl data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null data.packing=true"
call=$2; R=/tmp/runs; mkdir -p $R; echo "=== call $2 at commit $1" >> $R/log.txt; touch $R/.start_$2
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv \
  > $OUT/gpu_$2.csv
left() { echo $((LIMIT_S - (SECONDS - t0))); }
sweep() {  # sweep <gpu> <name> <train.py arguments...>: once, resumed until it finishes
  local gpu=$1 name=$2; shift 2
  [ -f $R/$name/done ] && return 0
  [ "$(left)" -lt 90 ] && return 1
  echo "== gpu $gpu $name: $*" >> $R/log_$gpu.txt; echo $name >> $R/.names_$gpu
  CUDA_VISIBLE_DEVICES=$gpu timeout -s INT $(left) python3 train.py "$@" sweep.deadline_s=$(( $(left) - 15 )) \
    hydra.sweep.dir=$R/$name >> $R/log_$gpu.txt 2>&1
  local rc=$?  # 124: the backstop cut it; 4: stopped before the deadline; 2: a cell failed
  echo "gpu $gpu $name: exit $rc after $((SECONDS - t0)) s" | tee -a $R/log_$gpu.txt
  [ $rc -ne 124 ] && [ $rc -ne 4 ] && touch $R/$name/done
  pack_gpu $gpu  # what this GPU's list wrote so far comes back even if the call is cut later
  [ $rc -ne 124 ] && [ $rc -ne 4 ]
}
pack_gpu() {  # pack_gpu <gpu>: what this GPU's list wrote in this call (its sweeps, its log) into
  # $OUT/<call>_gpu<gpu>.tgz, one archive a GPU, written beside and renamed, so a cut call returns whole archives
  (cd $R && { echo log_$1.txt; [ $1 = 0 ] && echo gpu_tests.txt; cat .names_$1 2>/dev/null; } | sort -u \
    | xargs -r find 2>/dev/null | while read -r f; do [ -f "$f" ] && [ "$f" -nt .start_$call ] && echo "$f"; done \
    | grep -vE '\.(pt|safetensors|html|png|pickle)$|checkpoint-' | tar czf $OUT/.${call}_gpu$1.tgz -T - \
    && mv $OUT/.${call}_gpu$1.tgz $OUT/${call}_gpu$1.tgz) 2>/dev/null
}
cores=$(( $(nproc) / $(nvidia-smi -L | wc -l) ))  # each GPU's share of the host's cores
pinned() {  # pinned <gpu> <list function>: the list (this subshell and what it starts) on its own cores
  [ $cores -ge 1 ] && taskset -cp $(( $1 * cores ))-$(( $1 * cores + cores - 1 )) $BASHPID > $R/cores_$1.txt; $2; }
rounds() {  # rounds <gpu> <name> <model> <n> <cell A> | <cell B> | <cell C>: n rounds of the cells, each round in
  # the order before's reverse; a cell's arguments after $cell (the script's common ones) and the model's
  local gpu=$1 name=$2 model=$3 n=$4; shift 4; local IFS='|'; local cells=($*) r i order; unset IFS
  for r in $(seq 1 $n); do
    order=$(seq 0 $(( ${#cells[@]} - 1 ))); [ $((r % 2)) = 0 ] && order=$(echo $order | tr ' ' '\n' | tac)
    for i in $order; do
      local label=$(echo ${cells[$i]%%:*}) args=${cells[$i]#*:}
      sweep $gpu ${name}_${label}_${call}_$r $cell model=$model $args || return
    done
  done; }
pack_call() {  # pack_call <call>: what this call wrote (earlier calls' files came back with them), without
  # weights, checkpoints, pages or allocator snapshots
  echo "call $1: exit after $((SECONDS - t0)) s" | tee -a $R/log.txt
  (cd $R && find . -type f -newer .start_$1 ! -name '*.pt' ! -name '*.safetensors' ! -name '*.html' ! -name '*.png' \
    ! -name '*.pickle' ! -path '*checkpoint-*' | tar czf $OUT/$1.tgz -T -)
  ls -la $OUT
}
