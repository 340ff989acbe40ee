#!/usr/bin/env bash
# The checkpoints users bring now and the recipes they run, measured on one machine of 4 H200s, one list per
# GPU, each list in order, in consecutive calls on the same warm machine:
#   bash docs/runs/scripts/2026-11-28_families.sh <commit> <call>      (call: c1, c2, ... in order)
# carrying .whl/ (device-wheels.sh) and .whl_unsloth/ (unsloth, unsloth_zoo, trl, xformers, fla-core; Unsloth's
# studio/ folder left out of its wheel). Every ratio is between cells of one GPU in one list. A step that
# finished in an earlier call is passed over; a sweep stopped by the time left resumes in the next call. Each
# list packs what it wrote after each sweep ($OUT/<call>_gpu<n>.tgz), so a call cut short returns what finished.
#   gpu 0  the GPU tests of the 2026 families (fast against hf in bf16), the loss in chunks and the long-row parts;
#          then LoRA on every linear layer (r16) of Mistral-7B at seq 1024 within 22 GiB: fast's, Unsloth's, hf's
#          searches
#   gpu 1  Qwen3.5-9B (hybrid linear attention) at seq 1024 within 22 GiB: fast's, hf's, Unsloth's searches
#   gpu 2  the longest row each backend trains at batch 1 within 22 GiB (Llama-3.1-8B): fast, Unsloth, hf
#   gpu 3  the whole GPU, each model's experts adapted where it has them: gpt-oss-20b, Gemma-4-31B,
#          Qwen3.6-35B-A3B, fast's and hf's searches
set -u
LIMIT_S=${LIMIT_S:-570}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
search="-m +experiment=tune train.max_steps=12 train.untimed_steps=4"
small="search.max_cells=5 search.batches=[1,2,4,8,12,16,24,32]"
gpu0() {
  if [ ! -f $R/gpu_tests.txt ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m pytest -q -m gpu tests/fast/test_fast_arch.py \
      tests/fast/test_chunked_loss.py tests/fast/test_long_context.py -k "2026_families or chunked or long or tiles" \
      > $R/gpu_tests.txt 2>&1; tail -1 $R/gpu_tests.txt; pack_gpu 0
  fi
  for b in fast unsloth hf; do
    sweep 0 mistral-7b_all_linear_$b $search gpu=a10 seq_len=1024 lora=all_linear $small backend=$b || return
  done
}
gpu1() {
  for b in fast hf unsloth; do
    sweep 1 qwen3.5-9b_$b $search gpu=a10 seq_len=1024 model=qwen3.5-9b data=synthetic $small backend=$b || return
  done
}
gpu2() {
  for b in fast unsloth hf; do
    sweep 2 llama-3.1-8b_max_context_$b -m +experiment=max_context gpu=a10 model=llama-3.1-8b backend=$b || return
  done
}
gpu3() {
  local whole="$search gpu=auto seq_len=1024 data=synthetic search.max_cells=3 search.batches=[2,4,8,16]"
  for m in gpt-oss-20b gemma-4-31b qwen3.6-35b-a3b; do
    local experts=""; [ $m != gemma-4-31b ] && experts="lora.experts=true lora.dropout=0"
    for b in fast hf; do sweep 3 ${m}_$b $whole model=$m $experts backend=$b || return; done
  done
}
pinned 0 gpu0 & pinned 1 gpu1 & pinned 2 gpu2 & pinned 3 gpu3 & wait
echo "call $2: exit after $((SECONDS - t0)) s" | tee -a $R/log.txt
