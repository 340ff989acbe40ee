#!/usr/bin/env bash
# Issue 19, second round: train.offload_fraction (lorabench.offload) within the A10's 22 GiB, on the GPU
# at hand (the device tool), in parts that each fit one call:
#   bash docs/runs/scripts/2026-11-24_offload.sh <commit> <part>
# with .whl/, .whl_unsloth/ and .gpudata/ as for docs/runs/scripts/2026-11-24_fused.sh. Each part
# writes its sweep dirs to $OUT/<part>.tgz.
#   probe     the offload GPU tests; seq 2048 b6: recomputed / offloaded / kept layers traded
#   probe2    the same after two fixes, with backend.expandable_segments; the budget still holds
#   long      seq 1024 and 2048: hf's best cell that fits, fast as before, fast with offloading
#   t512      seq 512, the seed's recipe: hf's seed cell, fast as before and with offloading;
#             ShareGPT packed for hf and fast
#   unsloth   seq 1024 and 2048: fast with offloading and Unsloth's best cell within 22 GiB
#   profile   the best 22 GiB cell at seq 2048 profiled; fast's best whole-GPU cell (b32) again
set -u
LIMIT_S=580; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, data, environment, run, sg
s="-m +experiment=seed_optimum data=synthetic train.max_steps=20 gpu=a10"
sub='hydra.sweep.subdir=${backend.name}_s${seq_len}_b${batch}_r${train.checkpoint_fraction}_o${train.offload_fraction}'
case $2 in
  probe)  # at 30702a7; (the first try, at 4e1f595, ran out of memory in every offloaded cell: the pack hook held the originals)
    python3 -m pytest -q -m gpu tests/test_offload.py tests/test_fused.py 2>&1 | tail -2
    python3 docs/runs/scripts/2026-11-24_offload_memory.py 2048 6 20,0 12,8 8,12 4,16 7,12 2>&1 \
      | grep -v "WARNING\|Loading\|deprecated\|Backend impl" > $OUT/memory_s2048_b6.txt; grep -v "^   (" $OUT/memory_s2048_b6.txt
    x="seq_len=2048 batch=6 hydra.sweep.dir=$D/s2048"
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.625 train.offload_fraction=0
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.375 train.offload_fraction=0.25
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.25 train.offload_fraction=0.375
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.21875 train.offload_fraction=0.375
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.125 train.offload_fraction=0.5 ;;
  probe2)  # views of one buffer travel once; backend.expandable_segments (on in fast); more layers kept
    python3 -m pytest -q -m gpu tests/test_offload.py 2>&1 | tail -2
    python3 docs/runs/scripts/2026-11-24_offload_memory.py 2048 6 20,0 12,8 2>&1 \
      | grep -v "WARNING\|Loading\|deprecated\|Backend impl" > $OUT/memory_s2048_b6.txt; grep -v "^   (" $OUT/memory_s2048_b6.txt
    x="seq_len=2048 batch=6 hydra.sweep.dir=$D/s2048"
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.625 train.offload_fraction=0
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.375 train.offload_fraction=0.25
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.3125 train.offload_fraction=0.25
    run $s $x "$sub" backend=fast train.checkpoint_fraction=0.25 train.offload_fraction=0.25
    # the budget still holds with expandable segments: no recomputation needs ~45 GiB, so this must run out
    run $s $x hydra.sweep.dir=$D/no_recompute "$sub" backend=fast train.gradient_checkpointing=false train.max_steps=7 ;;
  long)  # hf's best cell that fits (the sizes of the 2026-11-24_h100_fused run), fast before and with offloading
    python3 -m pytest -q -x -m gpu tests/test_offload.py > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    for sb in "1024 8 12" "2048 4 6"; do set -- $1 $2 $sb
      x="seq_len=$3 hydra.sweep.dir=$D/s$3"
      run $s $x "$sub" backend=hf batch=$4 train.checkpoint_fraction=1
      run $s $x "$sub" backend=fast batch=$5 train.checkpoint_fraction=0.625 train.offload_fraction=0
      run $s $x "$sub" backend=fast batch=$5 train.checkpoint_fraction=0.375 train.offload_fraction=0.25
    done; set -- $1 long
    run $s seq_len=2048 hydra.sweep.dir=$D/s2048 "$sub" backend=fast batch=6 train.checkpoint_fraction=0.3125 train.offload_fraction=0.3125 ;;
  t512)  # seq 512: fixed-length rows and ShareGPT packed (b24 with 0.625 recomputed ran out there on 2026-11-24)
    python3 -m pytest -q -m gpu tests/test_offload.py tests/test_fused.py > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    run $s hydra.sweep.dir=$D/fixed "$sub" backend=hf batch=8 train.checkpoint_fraction=1
    run $s hydra.sweep.dir=$D/fixed "$sub" backend=fast batch=24 train.checkpoint_fraction=0.625 train.offload_fraction=0
    run $s hydra.sweep.dir=$D/fixed "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25
    run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=hf batch=8 train.checkpoint_fraction=1 data.packing=true
    run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=fast batch=16 train.checkpoint_fraction=0.5 train.offload_fraction=0
    run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=fast batch=16 train.checkpoint_fraction=0.25 train.offload_fraction=0.25
    run $sg hydra.sweep.dir=$D/sharegpt "$sub" backend=fast batch=24 train.checkpoint_fraction=0.375 train.offload_fraction=0.25 ;;
  unsloth)  # Unsloth's best cell within 22 GiB (every layer recomputed, its offloading) beside fast's, same lease
    python3 -m pytest -q -m gpu tests/test_offload.py > $OUT/gpu_tests.txt 2>&1; tail -1 $OUT/gpu_tests.txt
    for sb in "1024 12 16 0.375 0.25" "2048 6 8 0.3125 0.3125"; do set -- $1 $2 $sb
      x="seq_len=$3 hydra.sweep.dir=$D/s$3"
      run $s $x "$sub" backend=fast batch=$4 train.checkpoint_fraction=$6 train.offload_fraction=$7
      run $s $x "$sub" backend=unsloth batch=$5 train.checkpoint_fraction=1
    done; set -- $1 unsloth ;;
  profile)  # the best 22 GiB cell at seq 2048 profiled (offloading copies left out of the partition),
            # and fast's best whole-GPU cell again now that fast runs with expandable segments
    run $s seq_len=2048 hydra.sweep.dir=$D/s2048 "$sub" backend=fast batch=6 train.checkpoint_fraction=0.3125 \
      train.offload_fraction=0.3125 train.profile_steps=2
    run $s gpu=auto hydra.sweep.dir=$D/auto "$sub" backend=fast batch=32 train.checkpoint_fraction=0 train.profile_steps=2 ;;
esac
echo "exit after $((SECONDS - t0)) s"
(cd $OUT && tar czf $2.tgz $2 && rm -rf $2)
