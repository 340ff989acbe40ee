#!/usr/bin/env bash
# Issue 19's measurements on the GPU at hand (the device tool), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_fused.sh <commit> <part>
# with the wheels of ../shared/tools/device-wheels.sh in .whl/, Unsloth's in .whl_unsloth/
# (`../shared/tools/device-wheels.sh` names them; its studio/ web app stripped from the wheel to travel)
# and the 2,000 ShareGPT conversations of docs/runs/scripts/2026-11-23_equal_work.sh as
# .gpudata/sharegpt_2000.jsonl.xz. Each part writes its sweep dirs to $OUT/<part>.tgz.
#   t512     seq 512, fixed-length rows, the seed's recipe (LoRA dropout 0.05): hf's seed cell, fast and
#            Unsloth within the A10's 22 GiB and on the whole GPU (fast's best cell profiled)
#   t512d0   the same with lora.dropout=0 (Unsloth's default), and ShareGPT packed for hf and fast
#   sharegpt the 2,000 ShareGPT conversations packed, for hf and fast, within 22 GiB
#   long     seq 1024 and 2048 within 22 GiB: hf's best cell that fits, fast's, Unsloth's
set -u
source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
# seq 512, synthetic fixed-length rows, the seed's recipe (nf4, LoRA r16 qkvo dropout 0.05, paged_adamw_8bit)
s="-m +experiment=seed_optimum data=synthetic train.max_steps=20"
sub='hydra.sweep.subdir=${backend.name}_s${seq_len}_b${batch}_f${train.checkpoint_fraction}_seeded${backend.seeded_dropout}'
case $2 in
  probe)  # the fused projections against PEFT's, the GPU gradient tests
    python3 -m pytest -q -m gpu tests/test_fused.py tests/test_backends.py -k "fused or fast_path" 2>&1 | tail -3
    sub='hydra.sweep.subdir=${backend.name}_b${batch}_f${train.checkpoint_fraction}_fused${backend.fused_lora}'
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=hf batch=8 train.checkpoint_fraction=1
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.75 backend.fused_lora=false
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.75,0.625,0.5 backend.fused_lora=true
    run $s hydra.sweep.dir=$D/auto gpu=auto backend=fast batch=24 train.checkpoint_fraction=0 backend.fused_lora=false,true \
      train.profile_steps=2 'hydra.sweep.subdir=fast_b24_fused${backend.fused_lora}' ;;
  probe2)  # seeded dropout (no masks kept): what fits in 22 GiB now, and the whole GPU
    python3 -m pytest -q -m gpu tests/test_fused.py tests/test_backends.py -k "fused or fast_path or seeded" 2>&1 | tail -3
    sub='hydra.sweep.subdir=${backend.name}_b${batch}_f${train.checkpoint_fraction}'
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.5,0.375
    run $s hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=24 train.checkpoint_fraction=0.75,0.625
    run $s hydra.sweep.dir=$D/auto gpu=auto "$sub" backend=fast batch=24,32 train.checkpoint_fraction=0 train.profile_steps=2 ;;
  t512|t512d0)
    d=; [ $2 = t512d0 ] && d=lora.dropout=0
    run $s $d hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=hf batch=8 train.checkpoint_fraction=1
    [ $2 = t512 ] && run $s $d hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.5 backend.seeded_dropout=false,true
    run $s $d hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=24 train.checkpoint_fraction=0.625 backend.seeded_dropout=true
    [ $2 = t512d0 ] && run $s $d hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=fast batch=16 train.checkpoint_fraction=0.375
    run $s $d hydra.sweep.dir=$D/a10 gpu=a10 "$sub" backend=unsloth batch=32 train.checkpoint_fraction=1
    run $s $d hydra.sweep.dir=$D/auto gpu=auto "$sub" backend=fast batch=32 train.checkpoint_fraction=0 train.profile_steps=2
    run $s $d hydra.sweep.dir=$D/auto gpu=auto "$sub" backend=unsloth batch=24 train.checkpoint_fraction=0
    if [ $2 = t512d0 ]; then
      run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=hf batch=8 train.checkpoint_fraction=1 data.packing=true
      run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=fast batch=24 train.checkpoint_fraction=0.625
    fi ;;
  sharegpt)  # t512d0's fast cell on ShareGPT (b24, 0.625) ran out of the 22 GiB: packed rows, next size down
    run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=hf batch=8 train.checkpoint_fraction=1 data.packing=true
    run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=fast batch=16 train.checkpoint_fraction=0.5,0.625 ;;
  long)
    for sb in "1024 8 12 16" "2048 4 6 8"; do set -- $1 $2 $sb
      run $s seq_len=$3 hydra.sweep.dir=$D/s$3 gpu=a10 "$sub" backend=hf batch=$4 train.checkpoint_fraction=1
      run $s seq_len=$3 hydra.sweep.dir=$D/s$3 gpu=a10 "$sub" backend=fast batch=$4,$5 train.checkpoint_fraction=0.625
      run $s seq_len=$3 hydra.sweep.dir=$D/s$3 gpu=a10 "$sub" backend=unsloth batch=$6 train.checkpoint_fraction=1
    done; set -- $1 long ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
