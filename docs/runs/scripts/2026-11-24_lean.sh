#!/usr/bin/env bash
# Issue 19, fifth round: the Trainer's per-step host work cut (backend.lean_step), the MLP through
# lorabench.fused (backend.fused_mlp), nf4 dequantised in Triton (backend.triton_dequant) and Liger's
# RMSNorm backward on a full grid (backend.norm_backward_grid), on the GPU at hand (the device tool),
# in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_lean.sh <commit> <part>
# with .whl/ (and .whl_unsloth/ for Unsloth's cells, .gpudata/ for ShareGPT) as for
# docs/runs/scripts/2026-11-24_fused.sh. Each part writes its sweep dirs to $OUT/<part>.tgz.
# Every cell: seq 512, fixed-length rows, the whole GPU, nothing recomputed, LoRA dropout 0, 2 workers.
#   h200a   (nvidia-h200) the GPU tests of the new parts; fast b48 with the four options off (the fourth
#            round's fast), with all four, and with all but lean_step, all but fused_mlp
#   h200b   (nvidia-h200) fast b48 with the four options off (in h200a its name was too long for a
#            file name: fixed in lorabench.cell.link_name), with all four profiled, all but triton_dequant,
#            all but norm_backward_grid; Unsloth's b64 (its best H200 cell in the fourth round)
#   h200c   (nvidia-h200) with backend.fused_add_norm (the fifth option, added after h200b): the GPU
#            tests; fast b48 with all five off, with all five, all but fused_add_norm, all five profiled;
#            Unsloth's b64 (the profiled cell took the all-five cell's dir name, so it was not run: h200d)
#   h200d   (nvidia-h200) with backend.absmax_cache (added after h200c): fast b48 with all five, with all
#            five and absmax_cache, the same profiled, and at b56
#   h100    (nvidia-h100-x1) fast b40 with the five options off and on, b32 with them, profiled; Unsloth b32
#   h100b   (nvidia-h100-x1) fast b40 with the five options, and with absmax_cache too; b32 with all six,
#            profiled; Unsloth b32 (h100's profile showed the GPU waiting for the host's launches in the
#            forward, 7.6 ms of them before bitsandbytes' absmax dequantisation)
#   h100l   (nvidia-h100-x1, carry .gpudata) the GPU tests of every fast-path module; the loss-match
#            experiment (hf and fast, with and without QLoRA's fp32 upcast, 55 steps on the same packed ShareGPT
#            batches) with fast's five new options on
#   s1024, s2048  (nvidia-h100-x1, one lease) fixed-length rows within 22 GiB, LoRA dropout 0.05: hf's best
#            cell that fits, fast's best layout of the second round with the five options, Unsloth's best
#            cell (every layer recomputed, its own offloading), at seq 1024 and 2048
#   h100p   (nvidia-h100-x1, carry .gpudata) ShareGPT packed within 22 GiB: hf's seed cell (b8, every layer
#            recomputed) and fast's best layout of the fourth round (b24, 0.375 recomputed, 0.25
#            offloaded) with the five options off and on
set -u
LIMIT_S=580; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
s="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=auto train.checkpoint_fraction=0 data.num_workers=2 lora.dropout=0"
w='hydra.sweep.subdir=${backend.name}_b${batch}_l${backend.lean_step}_m${backend.fused_mlp}_t${backend.triton_dequant}_n${backend.norm_backward_grid}'
x="hydra.sweep.dir=$OUT/$2/auto"
w2="${w}_a\${backend.fused_add_norm}"
w3="${w2}_c\${backend.absmax_cache}_p\${train.profile_steps}"
off="backend.fused_add_norm=false backend.lean_step=false backend.fused_mlp=false backend.triton_dequant=false backend.norm_backward_grid=false"
case $2 in
  h200a)
    python3 -m pytest -q -m gpu tests/test_fast_parts.py tests/test_fused.py > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
    run $s $x "$w" backend=fast batch=48 $off
    run $s $x "$w" backend=fast batch=48
    run $s $x "$w" backend=fast batch=48 backend.lean_step=false
    run $s $x "$w" backend=fast batch=48 backend.fused_mlp=false ;;
  h200b)
    run $s $x "$w" backend=fast batch=48 $off
    run $s $x "$w" backend=fast batch=48 train.profile_steps=2
    run $s $x "$w" backend=fast batch=48 backend.triton_dequant=false
    run $s $x "$w" backend=fast batch=48 backend.norm_backward_grid=false
    run $s $x "$w" backend=unsloth batch=64 ;;
  h200c)
    python3 -m pytest -q -m gpu tests/test_fast_parts.py > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
    run $s $x "$w2" backend=fast batch=48 $off
    run $s $x "$w2" backend=fast batch=48
    run $s $x "$w2" backend=fast batch=48 backend.fused_add_norm=false
    run $s $x "$w2" backend=fast batch=48 train.profile_steps=2
    run $s $x "$w2" backend=unsloth batch=64 ;;
  h200d)
    python3 -m pytest -q -m gpu tests/test_fast_parts.py -k dequant > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    run $s $x "$w3" backend=fast batch=48
    run $s $x "$w3" backend=fast batch=48 backend.absmax_cache=true
    run $s $x "$w3" backend=fast batch=48 backend.absmax_cache=true train.profile_steps=2
    run $s $x "$w3" backend=fast batch=56 backend.absmax_cache=true ;;
  h100)
    run $s $x "$w3" backend=fast batch=40 $off
    run $s $x "$w3" backend=fast batch=40
    run $s $x "$w3" backend=fast batch=32 train.profile_steps=2
    run $s $x "$w3" backend=unsloth batch=32 ;;
  h100b)
    run $s $x "$w3" backend=fast batch=40
    run $s $x "$w3" backend=fast batch=40 backend.absmax_cache=true
    run $s $x "$w3" backend=fast batch=32 backend.absmax_cache=true train.profile_steps=2
    run $s $x "$w3" backend=unsloth batch=32 ;;
  h100l)
    python3 -m pytest -q -m gpu -k "not unsloth" tests/test_fast_parts.py tests/test_fused.py tests/test_backends.py \
      tests/test_flat_optim.py tests/test_packed_attention.py tests/test_offload.py > $OUT/gpu_tests.txt 2>&1
    tail -1 $OUT/gpu_tests.txt
    mkdir -p $D; echo "python train.py +experiment=fast_loss_match data=jsonl data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null" > $D/command.txt
    timeout $((LIMIT_S - (SECONDS - t0))) python3 train.py +experiment=fast_loss_match data=jsonl \
      data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null hydra.sweep.dir=$D/loss_match 2>&1 \
      | grep -E "cells:|Error|^\| [^c-]" ;;
  s1024|s2048)
    l="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=a10 seq_len=${2#s} hydra.sweep.dir=$OUT/$2/a10"
    if [ $2 = s1024 ]; then b=(8 12 0.375 0.25 16); else b=(4 6 0.3125 0.3125 8); fi
    run $l "$w3" backend=hf batch=${b[0]} train.checkpoint_fraction=1
    run $l "$w3" backend=fast batch=${b[1]} train.checkpoint_fraction=${b[2]} train.offload_fraction=${b[3]}
    run $l "$w3" backend=unsloth batch=${b[4]} train.checkpoint_fraction=1 ;;
  h100p)
    p="hydra.sweep.dir=$OUT/$2/sharegpt"
    run $sg $p "$w3" backend=hf batch=8 train.checkpoint_fraction=1 data.packing=true
    run $sg $p "$w3" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25 $off
    run $sg $p "$w3" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25 ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
