#!/usr/bin/env bash
# Each backend's best per model (issues 34 and 35), four models at once: one model per GPU of one
# 4-GPU machine of the device tool, each GPU running its own list in order, in consecutive calls on
# the same warm machine:
#   bash docs/runs/scripts/2026-11-26_four.sh <commit> <call>      (call: c1, c2, ... in order)
# carrying .whl/, .whl_unsloth/ (as 2026-11-26_best.sh) and .ab/ (nf4_kernels.py as it was at 6debc91).
# Every ratio is between cells of one GPU in one sweep or one list; the four lists share the host
# (64 cores: one Python process per GPU at a time). Every call runs each list from the top: a step that
# finished in an earlier call is passed over (its dir holds `done`); a sweep that the time left stopped
# (sweep.deadline_s, exit 4) is resumed by the same command. Dirs in /tmp/runs (kept by the warm
# machine); each call packs them into $OUT/<call>.tgz.
#   gpu 0  llama-3.1-8b: the GPU tests of the nf4 kernel and of fast's gradients; fast's searched best
#          layout (b8, 0.25 recomputed, 0.25 offloaded) with nf4_kernels as at 6debc91 (double
#          quantisation undone by bitsandbytes' calls) and as now (inside the kernel), in turn, twice;
#          then fast's search and Unsloth's
#   gpu 1  qwen2.5-7b: fast's search, Unsloth's, hf's
#   gpu 2  qwen3-8b: fast's search, Unsloth's, hf's
#   gpu 3  gemma-2-9b: fast's search (fused_add_norm and varlen_attention off: Gemma-2's sandwich norms
#          and soft-capped attention), hf's (Unsloth's loader needs Gemma's tokenizer, which no registry
#          package ships: skipped by name); then (from c2) Mistral-7B at seq 512 on the whole GPU (gpu=auto):
#          fast's search and Unsloth's
# Searches: +experiment=tune gpu=a10 seq_len=1024 (22 GiB), 14 steps of which 4 untimed, at most 10
# measured cells per backend, as in 2026-11-26_best.
set -u
LIMIT_S=${LIMIT_S:-570}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
search="-m +experiment=tune gpu=a10 train.max_steps=14 train.untimed_steps=4 search.max_cells=10 seq_len=1024"
best="-m +experiment=seed_optimum gpu=a10 seq_len=1024 model=llama-3.1-8b backend=fast batch=8
  train.gradient_checkpointing=true train.checkpoint_fraction=0.25 train.offload_fraction=0.25
  train.max_steps=16 train.untimed_steps=4"
# lorabench with nf4_kernels.py as at 6debc91, the rest as now: the A/B's "before"
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r src/lorabench /tmp/old/ && cp .ab/nf4_kernels_6debc91.py \
  /tmp/old/lorabench/nf4_kernels.py
old() { PYTHONPATH=/tmp/site:/tmp/old sweep "$@"; }
gpu0() {
  if [ ! -f $R/gpu_tests.txt ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m pytest -q -m gpu tests/test_fast_parts.py tests/test_fast_arch.py \
      -k "triton_dequant or architecture_s_model" > $R/gpu_tests.txt 2>&1; tail -1 $R/gpu_tests.txt
  fi
  old 0 ab_6debc91_1 $best && sweep 0 ab_now_1 $best && old 0 ab_6debc91_2 $best && sweep 0 ab_now_2 $best \
    && sweep 0 llama-3.1-8b_fast $search backend=fast model=llama-3.1-8b \
    && sweep 0 llama-3.1-8b_unsloth $search backend=unsloth model=llama-3.1-8b
}
per_model() {  # per_model <gpu> <model> <backends...>
  local gpu=$1 model=$2; shift 2
  for b in "$@"; do
    local extra=""
    [ $b = fast ] && [ $model = gemma-2-9b ] && extra="backend.fused_add_norm=false backend.varlen_attention=false"
    sweep $gpu ${model}_$b $search backend=$b model=$model $extra || return 1
  done
}
m7() {  # m7 <gpu> <gpu option> <seq>: Mistral-7B's fast and Unsloth searches (issue 35; from c3)
  local s=${search/gpu=a10/gpu=$2}; for b in fast unsloth; do
    sweep $1 mistral-7b_s$3_$2_$b ${s/seq_len=1024/seq_len=$3} backend=$b || return 1; done; }
gpu0 & { per_model 1 qwen2.5-7b fast unsloth hf && m7 1 auto 1024; } &
{ per_model 2 qwen3-8b fast unsloth hf && m7 2 a10 2048; } &
{ per_model 3 gemma-2-9b fast hf && for b in fast unsloth; do  # then the whole GPU (issue 35), Mistral-7B, seq 512
  s=${search/gpu=a10/gpu=auto}; sweep 3 mistral-7b_s512_auto_$b ${s/seq_len=1024/seq_len=512} backend=$b || break; done; } & wait
echo "call $2: exit after $((SECONDS - t0)) s" | tee -a $R/log.txt
(cd $R && tar czf $OUT/$2.tgz --exclude='*.pt' --exclude='*.safetensors' --exclude=checkpoint-* .)
