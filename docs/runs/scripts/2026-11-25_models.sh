#!/usr/bin/env bash
# The model axis and each backend at its best (issues 34 and 35), on the GPU at hand (the device tool), in
# parts that each fit one call:
#   bash docs/runs/scripts/2026-11-25_models.sh <commit> <part>
# carrying .whl/ (../shared/tools/device-wheels.sh; pycountry's translations left out), .whl_unsloth/
# (unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0, installed --no-deps, unsloth's studio/ left out)
# and .gpudata/ (the 2,000 ShareGPT conversations as JSONL, made as 2026-11-23_equal_work.sh says).
# Each part writes its sweep dirs to $OUT/<part>.tgz. Every search is `+experiment=tune` (lorabench.search:
# at most search.max_cells measured cells per backend) within an A10's 22 GiB (gpu=a10), fixed-length rows,
# nf4, LoRA r16 q/k/v/o dropout 0.05, paged_adamw_8bit, 14 steps of which 4 untimed (10 timed):
#   m1, m2  (nvidia-h100-x1) seq 1024, hf and fast: llama-3.1-8b and qwen2.5-7b (m1), qwen3-8b and gemma-2-9b
#           (m2; fast with fused_add_norm and varlen_attention off: Gemma-2's sandwich norms and soft-capped
#           attention, which those parts do not compute, so backend=fast alone skips the cell)
#   m3      (nvidia-h100-x1) qwen3-8b's hf search again (m2's skipped a cell that fits: a memory-model bug, fixed)
#           and gemma-2-9b's fast search (m2 ran out of time before it)
#   u       (nvidia-h100-x1) Unsloth's search: llama-3.1-8b at seq 1024, Mistral-7B at seq 512
#   big     (nvidia-h200) llama-3.3-70b nf4 on the whole GPU, seq 1024 b8, every layer recomputed: hf and fast
#   s2048   (nvidia-h100-x1) Mistral-7B seq 2048, hf and fast
#   packed  (nvidia-h100-x1) Mistral-7B seq 1024 on packed ShareGPT rows (data.packing=true), hf and fast
set -u
LIMIT_S=${LIMIT_S:-585}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
# The whole output in <part>/log.txt; here the search's progress lines and the tables. SIGINT at the limit, so
# a search cut short still writes its report.
run() { echo "== $*"; mkdir -p $D; timeout -s INT $((LIMIT_S - (SECONDS - t0))) python3 train.py "$@" 2>&1 \
  | tee -a $D/log.txt | grep -E "^\[backend=|cells:|Error|error:|^\| [^c-]" ; }
short="train.max_steps=14 train.untimed_steps=4 search.max_cells=10"
tune() { local dir=$1; shift; run +experiment=tune gpu=a10 $short hydra.sweep.dir=$D/$dir "$@"; }
case $2 in
  m1) tune llama-3.1-8b model=llama-3.1-8b seq_len=1024 backend=hf,fast
      tune qwen2.5-7b model=qwen2.5-7b seq_len=1024 backend=hf,fast ;;
  m2) tune qwen2.5-7b model=qwen2.5-7b seq_len=1024 backend=hf,fast  # (m1's stopped at a bug in the search, since fixed)
      tune qwen3-8b model=qwen3-8b seq_len=1024 backend=hf,fast
      tune gemma-2-9b model=gemma-2-9b seq_len=1024 backend=hf
      tune gemma-2-9b_fast model=gemma-2-9b seq_len=1024 backend=fast backend.fused_add_norm=false \
        backend.varlen_attention=false ;;
  m3) tune qwen3-8b_hf model=qwen3-8b seq_len=1024 backend=hf  # m2's search of it skipped b4 (fixed since)
      tune gemma-2-9b_fast model=gemma-2-9b seq_len=1024 backend=fast backend.fused_add_norm=false \
        backend.varlen_attention=false ;;
  u)  tune llama-3.1-8b_unsloth model=llama-3.1-8b seq_len=1024 backend=unsloth
      tune mistral_s512_unsloth seq_len=512 backend=unsloth ;;
  big)
      s="-m +experiment=seed_optimum model=llama-3.3-70b data=synthetic gpu=auto seq_len=1024 batch=8 train.max_steps=10 train.untimed_steps=3 train.checkpoint_fraction=1 hydra.sweep.dir=$D/llama-3.3-70b"
      run $s 'hydra.sweep.subdir=${backend.name}' backend=hf,fast ;;
  s2048) tune mistral_s2048 seq_len=2048 backend=hf,fast ;;
  packed) tune mistral_s1024_packed seq_len=1024 backend=hf,fast data=jsonl data.path=/tmp/sharegpt_2000.jsonl \
        data.max_samples=null data.packing=true ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
