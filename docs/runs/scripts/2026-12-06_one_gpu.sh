#!/usr/bin/env bash
# The checkpoints users bring now and the recipes they run, measured on one GPU, one list of steps in order over
# consecutive calls:
#   bash docs/runs/scripts/2026-12-06_one_gpu.sh <commit> <call> "<steps>"      (call: c1, c2, ...; steps: "1 3 2")
# carrying .whl/ (device-wheels.sh) and .whl_unsloth/ (unsloth, unsloth_zoo, trl, xformers, fla-core; Unsloth's
# studio/ folder left out of its wheel). Every ratio is between cells of this GPU in one list. A step that
# finished in an earlier call on the same machine is passed over; <steps> names those a call runs, in order.
# fla-core (Qwen3.5's linear-attention kernels) is not carried: its 0.6.0 refuses Hopper GPUs under Triton < 3.7.1
# (torch 2.11 ships 3.6), so Qwen3.5's linear attention runs transformers' PyTorch path in every backend. What each step wrote is packed after it ($OUT/<call>_gpu0.tgz), so a call cut short returns what finished.
#   1  the GPU tests of the 2026 families (fast and hf in bf16 against hf in float64)
#   2  Qwen3.5-9B (hybrid linear attention) at seq 1024 within 22 GiB: fast's, hf's, Unsloth's searches; fast at
#      its best layout in 2026-12-06_h100_recipes without compile_delta_rule, and profiled with it
#   3  LoRA on every linear layer (r16) of Mistral-7B at seq 1024 within 22 GiB: fast's, Unsloth's, hf's searches
#   4  the longest row each backend trains at batch 1 within 22 GiB (Llama-3.1-8B): fast, Unsloth
#   5  gpt-oss-20b, its experts adapted, and Gemma-4-31B on the whole GPU (gpt-oss's experts stay bf16 under nf4:
#      ~40 GB): fast's and hf's searches, and
#      Unsloth's on Gemma-4 (lorabench runs Unsloth without expert adapters)
#   6  which fast part moves Qwen3.5's LoRA gradients furthest from exact (gate_grad_parts.py: each part off in turn)
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_gpu
steps=${3:-1 2 3 4 5}
tune="-m +experiment=tune train.max_steps=12 train.untimed_steps=4 seq_len=1024"; search="$tune gpu=a10"
small="search.max_cells=4 search.batches=[2,4,8,16]"
step1() {
  [ -f $R/gpu_tests.txt ] && return 0
  timeout 240 python3 -m pytest -q -m gpu tests/fast/test_fast_arch.py -k 2026_families > $R/gpu_tests.txt 2>&1
  grep -E "passed|failed" $R/gpu_tests.txt; pack_gpu 0
}
step2() {
  for b in fast hf; do
    sweep 0 qwen3.5-9b_$b $search model=qwen3.5-9b data=synthetic $small backend=$b || return
  done
  sweep 0 qwen3.5-9b_fast_rule_eager -m +experiment=seed_optimum train.max_steps=12 train.untimed_steps=4 gpu=a10 \
    model=qwen3.5-9b data=synthetic seq_len=1024 batch=16 $ckpt=1 backend=fast backend.compile_delta_rule=false || return
  sweep 0 qwen3.5-9b_unsloth $search model=qwen3.5-9b data=synthetic $small backend=unsloth || return
  sweep 0 qwen3.5-9b_fast_profiled $profiled_cells model=qwen3.5-9b data=synthetic seq_len=1024 batch=16 $ckpt=1 \
    backend=fast
}
step3() {
  for b in fast unsloth hf; do
    sweep 0 mistral-7b_all_linear_$b $search lora=all_linear $small backend=$b || return
  done
}
step4() {
  for b in fast unsloth; do
    sweep 0 llama-3.1-8b_max_context_$b -m +experiment=max_context gpu=a10 model=llama-3.1-8b search.max_cells=6 \
      backend=$b || return
  done
}
step5() {
  for b in fast hf; do
    sweep 0 gpt-oss-20b_$b $tune gpu=auto model=gpt-oss-20b data=synthetic lora.experts=true lora.dropout=0 \
      search.max_cells=3 search.batches=[2,4,8] backend=$b || return
  done
  for b in fast hf unsloth; do
    sweep 0 gemma-4-31b_$b $tune gpu=auto model=gemma-4-31b data=synthetic search.max_cells=3 search.batches=[1,2,4] \
      backend=$b || return
  done
}
step6() {
  [ -f $R/gate_grad_parts.txt ] && return 0
  timeout 120 python3 docs/runs/scripts/gate_grad_parts.py qwen3_5_text $R/gate_grad_parts.json \
    2>&1 | grep -v "^\[transformers\]" > $R/gate_grad_parts.txt; cat $R/gate_grad_parts.txt
  echo gate_grad_parts.txt >> $R/.names_0; echo gate_grad_parts.json >> $R/.names_0; pack_gpu 0
}
for s in $steps; do step$s || break; done
echo "call $2: exit after $((SECONDS - t0)) s" | tee -a $R/log.txt; pack_gpu 0
