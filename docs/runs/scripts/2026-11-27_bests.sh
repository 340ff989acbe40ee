#!/usr/bin/env bash
# Issue 34's four models, each backend's best within 22 GiB at seq 1024 on fixed-length rows in one run per
# model: fast with its decoder layers replayed as CUDA graphs (lorabench.graphs, the input gradients
# alternating between two buffers), Unsloth's and hf's searched bests (their layouts from the searches of
# docs/runs/2026-11-25_models_search, 2026-11-26_four, 2026-11-26_flex), one model per GPU of one 4-GPU machine.
# Each list runs one process at a time, pinned to a quarter of the host's cores (what a one-GPU machine of the
# device tool has: 16), so that the four lists do not take each other's host time. Then issue 35's whole GPU
# (Mistral-7B, gpu=auto): fast's searched best layout eager and with graphs, and Unsloth's searched best.
#   source docs/runs/scripts/device_setup.sh <commit> c0      (carry .whl: installs it)
#   bash docs/runs/scripts/2026-11-27_bests.sh <commit> c1|c2   (carry .whl_b and .whl_unsloth)
#   LIMIT_S=420 bash docs/runs/scripts/2026-11-27_bests.sh <commit> c3: the GPU tests again (after the fused
#   LoRA test's fix), then a third round of graphs and Unsloth for Llama-3.1-8B (GPU 1) and Qwen3-8B (GPU 2)
# Every call runs each list from the top, passing over what an earlier call finished (sweep, gpu_lists.sh):
#   round 1: graphs, Unsloth, hf; a layout with graphs that fits only with the alternating gradients;
#   round 2: the same three cells in the reverse order; then GPU 0 Mistral-7B at seq 1024, GPU 2 at seq 512
#   (whole GPU), GPU 1 and GPU 3 a third round of graphs and Unsloth. GPU 0 runs the GPU tests of the graphs
#   and of the fused LoRA (device seeds) first.
set -u
LIMIT_S=${LIMIT_S:-570}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
source "$(dirname "$0")/gpu_lists.sh" "$@"  # /tmp/runs, the clocks, left, sweep, pack_call
nvidia-smi topo -m > $OUT/topo_$2.txt 2>&1
cell="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=a10 seq_len=1024"
graphs="backend=fast backend.cuda_graphs=true"
whole="-m +experiment=seed_optimum train.max_steps=14 train.untimed_steps=4 gpu=auto model=mistral-7b-v0.3"
cores=$(( $(nproc) / 4 ))
pinned() {  # pinned <gpu> <list function>: the list (this subshell and what it starts) on its own cores
  [ $cores -ge 1 ] && taskset -cp $(( $1 * cores ))-$(( $1 * cores + cores - 1 )) $BASHPID > $R/cores_$1.txt; $2; }
# per model: g (graphs), u (Unsloth's best), h (hf's best)
llama() { local m="$cell model=llama-3.1-8b" r
  if [ ! -f $R/gpu_tests_done ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -m gpu tests/test_graphs.py tests/test_fused.py \
      > $R/gpu_tests.txt 2>&1; tail -1 $R/gpu_tests.txt; touch $R/gpu_tests_done; fi
  for r in 1 2; do
    g="sweep 0 llama_graphs_$r $m $graphs batch=4 train.gradient_checkpointing=false"
    u="sweep 0 llama_unsloth_$r $m backend=unsloth batch=4 train.gradient_checkpointing=false"
    h="sweep 0 llama_hf_$r $m backend=hf batch=6 $ckpt=1"
    if [ $r = 1 ]; then $g && $u && $h || return; else $h && $u && $g || return; fi
  done
  # fast's and Unsloth's searched whole-GPU bests, nothing recomputed: on an H100 both b16 at seq 1024 and b32
  # at 512 (2026-11-26_h100); on an H200 fast b32 / b64, Unsloth b48 at 512 (2026-11-26_four), at 1024 its
  # H100 best and fast's
  local big=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits)
  local s f u; for s in 1024 512; do
    if [ $big -gt 100000 ]; then f=$((32768 / s)); u=$([ $s = 512 ] && echo 48 || echo "16 32"); else
      f=$((16384 / s)); u=$f; fi
    w="$whole seq_len=$s train.gradient_checkpointing=false"
    sweep 0 mistral_s${s}_graphs $w $graphs batch=$f || return
    for b in $u; do sweep 0 mistral_s${s}_unsloth_b$b $w backend=unsloth batch=$b || return; done
    sweep 0 mistral_s${s}_fast $w backend=fast batch=$f || return
  done; }
qwen() { local m="$cell model=qwen2.5-7b" r
  for r in 1 2 3; do
    g="sweep 1 qwen_graphs_$r $m $graphs batch=4 train.gradient_checkpointing=false"
    u="sweep 1 qwen_unsloth_$r $m backend=unsloth batch=4 train.gradient_checkpointing=false"
    h="sweep 1 qwen_hf_$r $m backend=hf batch=4 $ckpt=1"
    case $r in 1) $g && $u && $h || return
      sweep 1 qwen_graphs_b5 $m $graphs batch=5 train.gradient_checkpointing=false ;;
    2) $h && $u && $g || return ;; 3) $g && $u || return ;; esac
  done; }
qwen3() { local m="$cell model=qwen3-8b" r
  for r in 1 2; do
    g="sweep 2 qwen3_graphs_$r $m $graphs batch=4 $ckpt=0.25"
    u="sweep 2 qwen3_unsloth_$r $m backend=unsloth batch=24 $ckpt=1 backend.unsloth_offload=true"
    h="sweep 2 qwen3_hf_$r $m backend=hf batch=4 $ckpt=1"
    if [ $r = 1 ]; then $g && $u && $h || return
      sweep 2 qwen3_graphs_c0 $m $graphs batch=4 train.gradient_checkpointing=false
    else $h && $u && $g || return; fi
  done; }
gemma() { local m="$cell model=gemma-2-9b" r
  for r in 1 2 3; do
    g="sweep 3 gemma_graphs_$r $m $graphs batch=4 $ckpt=0.375"
    u="sweep 3 gemma_unsloth_$r $m backend=unsloth batch=8 $ckpt=1 backend.unsloth_offload=false"
    h="sweep 3 gemma_hf_$r $m backend=hf batch=2 $ckpt=1"
    case $r in 1) $g && $u && $h || return
      sweep 3 gemma_graphs_c25 $m $graphs batch=4 $ckpt=0.25 ;;
    2) $h && $u && $g || return ;; 3) $g && $u || return ;; esac
  done; }
third() {  # third <gpu> <name> <model> <graphs layout...>: graphs, then Unsloth's best (the arguments after "|")
  local gpu=$1 name=$2 model=$3; shift 3; local args="$*"
  sweep $gpu ${name}_graphs_3 $cell model=$model $graphs ${args%%|*} \
    && sweep $gpu ${name}_unsloth_3 $cell model=$model backend=unsloth ${args#*|}; }
if [ $2 = c3 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -m gpu tests/test_fused.py tests/test_graphs.py \
    > $R/gpu_tests_c3.txt 2>&1; tail -1 $R/gpu_tests_c3.txt
  (pinned 1 "third 1 llama llama-3.1-8b batch=4 train.gradient_checkpointing=false | batch=4 \
    train.gradient_checkpointing=false") &
  (pinned 2 "third 2 qwen3 qwen3-8b batch=4 $ckpt=0.25 | batch=24 $ckpt=1 backend.unsloth_offload=true") & wait
else
  (pinned 0 llama) & (pinned 1 qwen) & (pinned 2 qwen3) & (pinned 3 gemma) & wait
fi
pack_call $2
