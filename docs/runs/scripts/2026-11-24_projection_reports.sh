#!/usr/bin/env bash
# The reports and projections of the 2026-11-24 H100 and H200 run dirs, written on a CPU machine from
# their result files (run from the repository root):
#   bash docs/runs/scripts/2026-11-24_projection_reports.sh
# For each GPU: the sweep report of the diagnostic (which also projects its cells onto every conf/gpu
# option), then `bench.py suite=project` of the diagnostic and of the fast cells with the other GPU's
# measurements of the same cells (and, for the diagnostic, the seed study's A10 figures) to check the
# projection against: projection.md, projection.csv and projection_validation.csv, written into the
# command's own run dir and copied beside each. (fast/ holds cells of two runs, not one multirun's dir:
# bench.py writes no report there; its results.md is from before it refused to.)
set -euo pipefail
for pair in h100:h200 h200:h100; do
  src=${pair%:*} tgt=${pair#*:}
  for part in diagnostic fast; do
    dir=docs/runs/2026-11-24_${src}_projection/$part
    [ $part = diagnostic ] && python bench.py sweep_dir=$dir >/dev/null
    measured=docs/runs/2026-11-24_${tgt}_projection/$part
    [ $part = diagnostic ] && measured="$measured,docs/runs/seed_a10/diagnostic.csv"
    out=outputs/projection/2026-11-24_${src}_$part
    python bench.py suite=project sweep_dir=$dir "measured=[$measured]" hydra.run.dir=$out \
      | sed -n '/^Projection against/,/^files:/p' | grep -v '^files:'
    cp $out/projection.md $out/projection.csv $out/projection_validation.csv $dir/
  done
done
