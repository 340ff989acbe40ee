#!/usr/bin/env bash
# The checkpoints users bring now and the recipes they run, measured on one GPU, a list of steps over calls:
#   bash docs/runs/scripts/2026-12-07_one_gpu.sh <commit> <call> "<steps>"      (call: c1, c2, ...; steps: "1 3")
# carrying .whl/ (device-wheels.sh), .whl_unsloth/ and .whl_fla/ (fla-core 0.6.0 and einops: Qwen3.5's linear
# attention in fast through backend.fla_on_hopper; moved aside for hf's cells, which fla refuses on Hopper under
# Triton 3.6, so hf runs transformers' PyTorch rule, and for Unsloth's, which runs its own vendored copy of fla).
# A step that finished in an earlier call on the same machine is passed over; what each wrote comes back packed.
#   1  GPU tests: the 2026 families (gpt-oss's sinks in flex attention), Gemma-2's flex attention, experts in nf4,
#      fla against the PyTorch rule
#   2  gpt-oss's family test and its experts in nf4 on the GPU; gpt-oss-20b within 22 GiB, experts adapted: fast's
#      and hf's searches (experts in nf4), and whether Unsloth runs it (its own loading, attention adapted)
#   3  Qwen3.5-9B at seq 1024 within 22 GiB: fast (fla), hf (PyTorch rule), Unsloth (its own fla)
#   4  the longest row at batch 1 within 22 GiB (Llama-3.1-8B): fast, Unsloth
#   5  Gemma-4-31B within 22 GiB: fast, hf, Unsloth
#   6  LoRA r32 on every linear layer of Mistral-7B at seq 4096 within 22 GiB: fast, Unsloth, hf
#   7  step 3 in two cells a backend, at the batches each backend's earlier search found best
#   8  Qwen3.6-35B-A3B (MoE) on the whole GPU at seq 1024, experts in nf4 (fast, hf) and Unsloth's own loading
#   9  fla against the PyTorch rule (its kernels compile and tune on first use), then step 10
#  10  Qwen3.5's cells of each backend on this GPU, Unsloth's first
#  12  Qwen3.5-9B fast on this GPU in the layout its search found best (b16, every layer recomputed), two steps
#      profiled; then each decoder layer through torch.compile (backend.compile=true) at b8 and b16
#  13  fast's Gated DeltaNet layers through fla's kernels (backend.fla_delta_net): fla's exactness test with them in
#      the fast run, then Qwen3.5-9B at b16 and b24, every layer recomputed
#  14  Qwen3.5 with Liger's patch too: fla's test (fast with Liger against the PyTorch rule), then fast at b16 and
#      b24, every layer recomputed, two steps profiled (step 13's cells with Liger)
#  15  Unsloth's Qwen3.5 cells at b8 and b16, its checkpointing on (its search's best layout), for a ratio within
#      one call's machine beside step 14's
#  16  Unsloth's Qwen3.5 at b8 (its best layout), then fast at b16 (step 14's), on one machine
#  17  Unsloth's Qwen3.5 at b16, then fast at b24
#  18  step 11's Unsloth at b8 (its search went from b12 up)
#  19  Qwen3.5 after fast's MLP kept Liger's SwiGLU and its layers took the fused add + RMSNorm: fla's test, then
#      fast at b24 every layer recomputed (profiled), and at b8 with 12 of its 32 layers kept
#  20  Unsloth's Qwen3.5 at b16 (its fastest of step 16's and 17's cells) on step 19's machine, then fast at b12 with
#      8 layers kept and at b16 with 4
#  21  Qwen3.5-9B fast with fewer layers recomputed, on a new machine (its first cell compiles fla's kernels): b8 with
#      12 of 32 layers kept (2026-12-07e's fastest), b6 with 16 kept, b8 with 16 recomputed, 8 offloaded, 8 kept
#  22  Unsloth's Qwen3.5 at b16 on step 21's machine (the ratio's other side), then fast b4 with 24 layers kept
#  23  LoRA r32 on every linear layer at 4,096 (step 6): fast's search of 4 cells at b2-b4 with 5/8 to all layers
#      recomputed (where the memory model fits them), then hf's search of 3 cells
#  24  Qwen3.5-9B fast's search of 8 cells over half and all layers recomputed, its cells to spare on the fractions
#      between (search.refine_layouts); cut by a call's deadline, the same step in the next call resumes it
#  25  Qwen3.5-9B Unsloth's search of 4 cells from b16 up, its checkpointing on with the inputs on the GPU or
#      offloaded (its memory model now fits its checkpointed peaks: b24 to b48 estimated to fit, none measured yet)
#  26  LoRA r32 on every linear layer at 4,096 on one machine: Unsloth's search of 3 cells (batches 1, 2, 4), then fast
#      at the layout its wider search found best (b2, 5/8 of the layers recomputed)
#  27  Qwen3.5-9B on one machine: Unsloth b16 (its fastest cell so far), then fast b6 with half its layers kept (its
#      search's best)
#  28  Gemma-4-31B within 22 GiB, Unsloth's search alone (step 5's other backends measured: fast trains it, hf runs
#      out of memory at load)
#  29  LoRA r32 on every linear layer at 4,096 on one machine, each backend's best of its earlier search alone:
#      Unsloth b4 with its checkpointing on (inputs on the GPU), then fast b2 with 5/8 of the layers recomputed
#  30  the longest row at batch 1 within 22 GiB (Llama-3.1-8B, LoRA r16 on every linear layer): fast's search from
#      49,152 tokens up to the model's window (131,072), then Unsloth's, brackets of 5% (step 4 without the snapshot)
#  31  step 30's Unsloth search without its tiled MLP (backend.unsloth_tiled_mlp=false: with it, its first cell
#      failed in autograd), its checkpointing offloaded
#  32  Unsloth's longest row without its tiled MLP, probed by hand (step 31's search set the tiled MLP on over the
#      override): single cells of +experiment=max_context's workload at 76,032 tokens, then 5% up or down
#  33  step 32's probe at 65,536 tokens (76,032 and 72,192 ran out of memory)
#  34  its probe at 49,152 (65,536 ran out of memory too)
#  35  Unsloth's longest-row search with its tiled MLP and PEFT's LoRA forward (+experiment=max_context's layout
#      since: its fused LoRA MLP fails under its tiled MLP), from 65,536 tokens up
#  36  Mistral-7B's longest row within 22 GiB, fast's and Unsloth's searches from 32,768 tokens up, its window
#      raised to 131,072 (random weights: the positions past its 32,768 cost what they cost)
#  11  2,000 ShareGPT conversations packed into rows of 2,048 tokens within 22 GiB (Mistral-7B): fast, and Unsloth
#      through its own padding-free path (carry .gpudata: the conversations)
set -u
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"
source "$(dirname "$0")/gpu_lists.sh" "$@"
steps=${3:-1 2 3 4}
tune="-m +experiment=tune train.max_steps=12 train.untimed_steps=4 seq_len=1024"; search="$tune gpu=a10"
no_fla() { [ -d /tmp/site/fla ] && mv /tmp/site/fla /tmp/fla_aside; true; }
with_fla() { [ -d /tmp/fla_aside ] && mv /tmp/fla_aside /tmp/site/fla; true; }
step1() {  # the families' test takes transformers' PyTorch rule for Qwen3.5 (fla aside), then fla against it
  [ -f $R/gpu_tests.txt ] && return 0
  no_fla; timeout 240 python3 -m pytest -q -m gpu tests/fast/test_fast_arch.py tests/models/test_experts_nf4.py \
    -k "2026_families or flex or experts" > $R/gpu_tests.txt 2>&1
  with_fla; timeout 90 python3 -m pytest -q -m gpu tests/fast/test_fast_arch.py -k fla_computes \
    >> $R/gpu_tests.txt 2>&1
  grep -E "passed|failed" $R/gpu_tests.txt; pack_gpu 0
}
step2() {  # Unsloth loads gpt-oss itself and adapts no experts (lora.experts is hf's and fast's): whether it runs
  local oss="$search model=gpt-oss-20b data=synthetic lora.dropout=0 search.batches=[1,2,4]" b
  [ -f $R/oss_tests.txt ] || gpu_test oss_tests.txt 150 "(2026_families and gpt_oss) or experts"
  for b in fast hf; do  # hf: every layer recomputed (nothing or half recomputed: 26 or 24 GiB at b1, estimated)
    local keep=; [ $b = hf ] && keep="search.checkpoint_fractions=[1]"
    sweep 0 gpt-oss-20b_nf4_experts_$b $oss precision.experts_nf4=true lora.experts=true search.max_cells=3 \
      $keep backend=$b || return
  done
  sweep 0 gpt-oss-20b_unsloth $oss search.max_cells=1 backend=unsloth
}
fla_for() { if [ $1 = fast ]; then with_fla; else no_fla; fi; }  # fla for fast's cells, aside for the others'
qwen35() {  # qwen35 <cells a backend> <fast's and Unsloth's batches> <hf's batches> [backends, in turn] [overrides]
  local q="$search model=qwen3.5-9b data=synthetic search.max_cells=$1" b batches rc=0
  for b in ${4:-fast hf unsloth}; do
    batches=$2; [ $b = hf ] && batches=$3
    fla_for $b; sweep 0 qwen3.5-9b_$b $q search.batches=$batches ${5:-} backend=$b || { rc=1; break; }
  done
  with_fla; return $rc
}
step3() { qwen35 4 [2,4,8,16] [2,4,8,16]; }
step4() {  # 4 cells a backend from 49,152 tokens up, 2 timed steps a cell
  for b in fast unsloth; do
    sweep 0 llama-3.1-8b_max_context_$b -m +experiment=max_context gpu=a10 model=llama-3.1-8b search.max_cells=5 \
      search.min_seq_len=49152 train.max_steps=4 train.untimed_steps=2 backend=$b || return
  done
  # where a long row's memory goes (memory_at_peak.json; pack_gpu leaves the allocator's pickle out)
  sweep 0 llama-3.1-8b_65k_snapshot -m +experiment=seed_optimum train.max_steps=4 train.untimed_steps=2 gpu=a10 \
    model=llama-3.1-8b data=synthetic seq_len=65536 batch=1 $ckpt=1 train.offload_checkpoints=true \
    backend.tiled_mlp=4096 train.memory_snapshot=true backend=fast
}
step5() {  # no cell on a layout whose estimate at b1 is 5 GiB or more over the budget (fast: nothing recomputed, 27
  # GiB; hf: half recomputed, 29 GiB; Unsloth: its checkpointing off, 31 GiB)
  local b keep
  for b in fast hf unsloth; do
    keep="[1]"; [ $b = fast ] && keep="[0.5,1]"
    sweep 0 gemma-4-31b_$b $search model=gemma-4-31b data=synthetic search.max_cells=3 search.batches=[1,2,4] \
      search.checkpoint_fractions=$keep backend=$b || return
  done
}
step6() {  # QLoRA's and Unsloth's own recipe, r32 on every linear layer, at rows of 4,096 tokens
  local wide="-m +experiment=tune train.max_steps=10 train.untimed_steps=3 seq_len=4096 gpu=a10 lora=all_linear"
  for b in fast unsloth hf; do
    sweep 0 mistral-7b_all_linear_r32_4k_$b $wide lora.r=32 lora.alpha=64 search.max_cells=3 search.batches=[1,2,4] \
      backend=$b || return
  done
}
step7() { qwen35 2 [8,16] [2,4]; }
gpu_test() {  # gpu_test <file> <limit s> <-k expression>: unbuffered and verbose, so a test stopped by its limit
  # still shows how far it went
  timeout $2 python3 -u -m pytest -v -m gpu tests/fast/test_fast_arch.py tests/models/test_experts_nf4.py -k "$3" \
    >> $R/$1 2>&1
  echo "pytest exit $?" >> $R/$1; grep -E "PASSED|FAILED|exit" $R/$1; echo $1 >> $R/.names_0; pack_gpu 0
}
step9() {  # fla against the PyTorch rule, then step 10
  [ -f $R/fla_test.txt ] || { with_fla; gpu_test fla_test.txt 240 fla_computes; }
  step10
}
step10() {  # Qwen3.5 on this GPU: Unsloth's search of 3 cells first (its checkpointing on: off needs 28 GiB at b4),
  # then fast's and hf's two cells each in the layout their searches of 4 cells found best (every layer recomputed)
  local all="search.checkpoint_fractions=[1] search.offload_fractions=[0]"
  qwen35 3 [4,8,16] - unsloth "$all" && qwen35 2 [8,16] [2,4] "fast hf" "$all"
}
q35="-m +experiment=seed_optimum train.max_steps=12 train.untimed_steps=4 gpu=a10 seq_len=1024 model=qwen3.5-9b \
  data=synthetic train.gradient_checkpointing=true train.checkpoint_fraction=1"; one="$q35 backend=fast"
step13() {
  with_fla; [ -f $R/fla_test.txt ] || gpu_test fla_test.txt 200 fla_computes
  grep -q "1 passed" $R/fla_test.txt && sweep 0 qwen3.5-9b_fast_delta_net $one batch=16,24 train.profile_steps=2
}
step14() {  # fla's test covers Liger's kernels too: fast as it runs Qwen3.5 against the PyTorch rule
  with_fla; [ -f $R/q35_tests.txt ] || gpu_test q35_tests.txt 240 fla_computes
  grep -q "1 passed" $R/q35_tests.txt && sweep 0 qwen3.5-9b_fast_liger $one batch=16,24 train.profile_steps=2
}
step15() {
  no_fla; sweep 0 qwen3.5-9b_unsloth_b8_b16 $q35 batch=8,16 backend.unsloth_offload=false backend=unsloth
  with_fla
}
pair() {  # pair <Unsloth's batch> <fast's batch>: one cell of each on the same machine, Unsloth's first
  no_fla; sweep 0 qwen3.5-9b_unsloth_b$1 $q35 batch=$1 backend.unsloth_offload=false backend=unsloth
  with_fla; sweep 0 qwen3.5-9b_fast_liger_b$2 $one batch=$2
}
step16() { pair 8 16; }
step17() { pair 16 24; }
# Qwen3.5-9B fast in one layout: kept <batch> <fraction of layers recomputed> [more train.py arguments]
q35b="-m +experiment=seed_optimum train.max_steps=12 train.untimed_steps=4 gpu=a10 seq_len=1024 model=qwen3.5-9b \
  data=synthetic train.gradient_checkpointing=true backend=fast"
kept() { with_fla; sweep 0 qwen3.5-9b_fast_b$1_ckpt$2 $q35b batch=$1 train.checkpoint_fraction=$2 "${@:3}"; }
step19() {  # Qwen3.5 with Liger's SwiGLU kept in fast's MLP and the mixer's residual add in the next norm: fla's
  # test (fast as it runs Qwen3.5), then b24 every layer recomputed (profiled) and b8 with 12 of 32 layers kept
  # (20.2 GiB estimated: 12 layers whose forward is not computed twice)
  with_fla; [ -f $R/q35_fused_tests.txt ] || gpu_test q35_fused_tests.txt 240 fla_computes
  grep -q "1 passed" $R/q35_fused_tests.txt || return 1
  kept 24 1 train.profile_steps=2 && kept 8 0.625
}
step20() {  # Unsloth's Qwen3.5 at b16 (its fastest of steps 16-17) on step 19's machine, then fast's other layouts
  no_fla; sweep 0 qwen3.5-9b_unsloth_b16 $q35 batch=16 backend.unsloth_offload=false backend=unsloth
  kept 12 0.75 && kept 16 0.875
}
kept_off() { with_fla; sweep 0 qwen3.5-9b_fast_b$1_ckpt$2_off$3 $q35b batch=$1 train.checkpoint_fraction=$2 \
  train.offload_fraction=$3; }
step21() { kept 8 0.625 && kept 6 0.5 && kept_off 8 0.5 0.25; }  # 20.2, 19.1 and 16.9 GiB estimated
step22() {
  no_fla; sweep 0 qwen3.5-9b_unsloth_b16 $q35 batch=16 backend.unsloth_offload=false backend=unsloth
  kept 4 0.25
}
step23() {
  local wide="-m +experiment=tune train.max_steps=10 train.untimed_steps=3 seq_len=4096 gpu=a10 lora=all_linear"
  sweep 0 mistral-7b_all_linear_r32_4k_fast_wide $wide lora.r=32 lora.alpha=64 search.max_cells=4 \
    search.batches=[2,3,4] search.checkpoint_fractions=[0.625,0.75,0.875,1] search.offload_fractions=[0] \
    backend=fast || return
  sweep 0 mistral-7b_all_linear_r32_4k_hf $wide lora.r=32 lora.alpha=64 search.max_cells=3 search.batches=[1,2,4] \
    backend=hf
}
step24() {
  with_fla; sweep 0 qwen3.5-9b_fast_refined $search model=qwen3.5-9b data=synthetic search.max_cells=8 \
    search.checkpoint_fractions=[0.5,1] search.offload_fractions=[0] search.batches=[4,6,8,12,16,24] backend=fast
}
step25() {
  no_fla; sweep 0 qwen3.5-9b_unsloth_search $search model=qwen3.5-9b data=synthetic search.max_cells=4 \
    search.batches=[16,24,32,48] backend=unsloth
  local rc=$?; with_fla; return $rc
}
step26() {
  local wide="-m +experiment=tune train.max_steps=10 train.untimed_steps=3 seq_len=4096 gpu=a10 lora=all_linear"
  local one="-m +experiment=seed_optimum train.max_steps=10 train.untimed_steps=3 seq_len=4096 gpu=a10 lora=all_linear"
  sweep 0 mistral-7b_all_linear_r32_4k_unsloth $wide lora.r=32 lora.alpha=64 search.max_cells=3 search.batches=[1,2,4] \
    backend=unsloth || return
  sweep 0 mistral-7b_all_linear_r32_4k_fast_b2 $one lora.r=32 lora.alpha=64 batch=2 train.gradient_checkpointing=true \
    train.checkpoint_fraction=0.625 backend=fast
}
step27() {
  no_fla; sweep 0 qwen3.5-9b_unsloth_b16 $q35 batch=16 backend.unsloth_offload=false backend=unsloth
  kept 6 0.5
}
step28() {
  sweep 0 gemma-4-31b_unsloth $search model=gemma-4-31b data=synthetic search.max_cells=3 search.batches=[1,2,4] \
    search.checkpoint_fractions=[1] backend=unsloth
}
step29() {
  local one="-m +experiment=seed_optimum train.max_steps=10 train.untimed_steps=3 seq_len=4096 gpu=a10 lora=all_linear"
  one="$one lora.r=32 lora.alpha=64 train.gradient_checkpointing=true"
  sweep 0 mistral-7b_all_linear_r32_4k_unsloth_b4 $one batch=4 train.checkpoint_fraction=1 \
    backend.unsloth_offload=false backend=unsloth || return
  sweep 0 mistral-7b_all_linear_r32_4k_fast_b2 $one batch=2 train.checkpoint_fraction=0.625 backend=fast
}
step30() {
  local b cells
  for b in fast unsloth; do
    cells=4; [ $b = unsloth ] && cells=5
    sweep 0 llama-3.1-8b_max_context_$b -m +experiment=max_context gpu=a10 model=llama-3.1-8b search.max_cells=$cells \
      search.min_seq_len=49152 search.resolution_pct=0.05 train.max_steps=4 train.untimed_steps=2 backend=$b || return
  done
}
step31() {
  sweep 0 llama-3.1-8b_max_context_unsloth_untiled -m +experiment=max_context gpu=a10 model=llama-3.1-8b \
    search.max_cells=4 search.min_seq_len=49152 search.resolution_pct=0.05 train.max_steps=4 train.untimed_steps=2 \
    backend.unsloth_tiled_mlp=false backend=unsloth
}
uns_row() {  # uns_row <seq_len>: one cell of the max-context workload, Unsloth's offloaded checkpointing alone
  local name=llama-3.1-8b_unsloth_untiled_s$1
  [ -f $R/$name/metrics.json ] || { [ "$(left)" -ge 150 ] && echo $name >> $R/.names_0 && timeout $(left) python3 \
    train.py +experiment=max_context hydra.mode=RUN model=llama-3.1-8b gpu=a10 seq_len=$1 backend=unsloth \
    backend.unsloth_offload=true backend.unsloth_tiled_mlp=false train.checkpoint_fraction=1 train.max_steps=4 \
    train.untimed_steps=2 hydra.run.dir=$R/$name >> $R/log_0.txt 2>&1; }
  pack_gpu 0; python3 -c "import json; print(json.load(open('$R/$name/metrics.json'))['status'])" 2>/dev/null
}
step32() {
  local st; st=$(uns_row 76032); echo "unsloth 76032: $st" | tee -a $R/log_0.txt
  if [ "$st" = ok ]; then st=$(uns_row 79872); else st=$(uns_row 72192); fi
  echo "unsloth second: $st" | tee -a $R/log_0.txt
}
step33() { echo "unsloth 65536: $(uns_row 65536)" | tee -a $R/log_0.txt; }
step34() { echo "unsloth 49152: $(uns_row 49152)" | tee -a $R/log_0.txt; }
step35() {  # the GPU test of that layout on the tiny model first (a minute, against minutes of an 8B cell)
  [ -f $R/tiled_test.txt ] || { timeout 150 python3 -m pytest -q -m gpu tests/run/test_backends.py -k tiled_mlp \
    > $R/tiled_test.txt 2>&1; echo tiled_test.txt >> $R/.names_0; pack_gpu 0; }
  grep -q "1 passed" $R/tiled_test.txt || return 1
  sweep 0 llama-3.1-8b_max_context_unsloth_peft -m +experiment=max_context gpu=a10 model=llama-3.1-8b \
    search.max_cells=4 search.min_seq_len=65536 search.resolution_pct=0.05 train.max_steps=4 train.untimed_steps=2 \
    backend=unsloth
}
step36() {
  local b
  for b in fast unsloth; do
    sweep 0 mistral-7b_max_context_$b -m +experiment=max_context gpu=a10 model=mistral-7b-v0.3 \
      model.max_position_embeddings=131072 search.max_cells=4 search.min_seq_len=32768 search.resolution_pct=0.05 \
      train.max_steps=4 train.untimed_steps=2 backend=$b || return
  done
}
step12() {
  with_fla
  sweep 0 qwen3.5-9b_fast_profiled $one batch=16 train.profile_steps=2 || return
  sweep 0 qwen3.5-9b_fast_compiled $one batch=8,16 backend.compile=true
}
step11() {  # fast's and Unsloth's batches and layouts around those their searches of 10 cells found best at 2,048
  local p="-m +experiment=tune train.max_steps=12 train.untimed_steps=4 gpu=a10 seq_len=2048 $packed_rows"
  sweep 0 packed_s2048_fast $p search.max_cells=3 search.batches=[2,3,4] search.checkpoint_fractions=[0,0.25] \
    search.offload_fractions=[0] backend=fast || return
  sweep 0 packed_s2048_unsloth $p search.max_cells=3 search.batches=[8,12,16] search.checkpoint_fractions=[1] \
    backend=unsloth
}
step18() {  # Unsloth's packed ShareGPT at b8, its checkpointing on (below the batch its search started from)
  sweep 0 packed_s2048_unsloth_b8 -m +experiment=seed_optimum train.max_steps=12 train.untimed_steps=4 gpu=a10 \
    seq_len=2048 $packed_rows train.gradient_checkpointing=true train.checkpoint_fraction=1 batch=8 \
    backend.unsloth_offload=false backend=unsloth
}
step8() {  # the whole card: gpu=h200 or gpu=h100, as nvidia-smi names it
  local card=h100 b rc=0; nvidia-smi -L | grep -q H200 && card=h200
  local moe="$tune gpu=$card model=qwen3.6-35b-a3b data=synthetic search.max_cells=2 search.batches=[8,16,32]"
  for b in fast hf unsloth; do  # the experts in nf4 where lorabench loads the model, Unsloth's own loading
    local nf4=precision.experts_nf4=true; [ $b = unsloth ] && nf4=
    fla_for $b; sweep 0 qwen3.6-35b-a3b_${card}_$b $moe $nf4 backend=$b || { rc=1; break; }
  done
  with_fla; return $rc
}
for s in $steps; do step$s || break; done
echo "call $2: exit after $((SECONDS - t0)) s" | tee -a $R/log.txt; pack_gpu 0
