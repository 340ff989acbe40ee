#!/usr/bin/env bash
# kill -9 during a Mistral-7B nf4 cell on a GPU, then the same command again: does it resume from its
# checkpoint and train as an uninterrupted run would? Run from the repository root on the GPU machine:
#   bash docs/runs/scripts/2026-11-24_gpu_resume.sh <commit>
# The cell: the seed's recipe (nf4, LoRA r16 qkvo, paged_adamw_8bit, every layer checkpointed) at
# seq 512, batch 8, on the arithmetic Q/A data (loss falls, so curves can differ) with lr 1e-3,
# 30 steps, a checkpoint every 10. Runs:
#   ref1, ref2   uninterrupted, twice: their difference is the run-to-run noise of bf16 kernels
#   killed       kill -9 once steps.jsonl has 25 steps (after checkpoint-20), then the same command
# Then docs/runs/scripts/compare_resume.py prints the loss differences and the optimizer states.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 LORABENCH_CACHE=/tmp/cache LORABENCH_GIT_SHA=$1
D=$OUT/resume; t0=$SECONDS
cmd="python3 train.py +experiment=seed_optimum data=tiny_instruct optimizer.lr=1e-3 train.max_steps=30 train.save_steps=10"
{
$cmd hydra.run.dir=$D/ref1
$cmd hydra.run.dir=$D/ref2
$cmd hydra.run.dir=$D/killed & pid=$!
until [ "$(wc -l < $D/killed/steps.jsonl 2>/dev/null || echo 0)" -ge 25 ] || ! kill -0 $pid 2>/dev/null; do sleep 0.2; done
kill -9 $pid; wait $pid; echo "killed at step $(wc -l < $D/killed/steps.jsonl); checkpoints: $(ls $D/killed/checkpoints)"
$cmd hydra.run.dir=$D/killed; echo "re-run exit $?"
python3 docs/runs/scripts/compare_resume.py $D/ref1 $D/ref2 $D/killed
} > $OUT/log_resume.txt 2>&1
echo "after $((SECONDS - t0)) s" >> $OUT/log_resume.txt
rm -rf $D/*/checkpoints  # adapters and optimizer states: hundreds of MB, compared above
(cd $OUT && tar czf resume.tgz resume && rm -rf resume)
grep -E "killed at|re-run|resum|max |optimizer|state|after" $OUT/log_resume.txt | tail -30
