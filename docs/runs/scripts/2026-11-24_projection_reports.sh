#!/usr/bin/env bash
# The reports and projections of the 2026-11-24 H100 and H200 run dirs, written on a CPU machine from
# their result files (run from the repository root):
#   bash docs/runs/scripts/2026-11-24_projection_reports.sh
# For each GPU: the sweep report of the diagnostic and of the fast cells (which also projects them
# onto every conf/gpu option), then `bench.py suite=project` with the other GPU's measurements of the
# same cells (and, for the diagnostic, the seed study's A10 figures) to check the projection against:
# projection.md, projection.csv and projection_validation.csv beside each.
set -euo pipefail
for pair in h100:h200 h200:h100; do
  src=${pair%:*} tgt=${pair#*:}
  for part in diagnostic fast; do
    python bench.py sweep_dir=docs/runs/2026-11-24_${src}_projection/$part >/dev/null
    measured=docs/runs/2026-11-24_${tgt}_projection/$part
    [ $part = diagnostic ] && measured="$measured,docs/runs/seed_a10/diagnostic.csv"
    python bench.py suite=project sweep_dir=docs/runs/2026-11-24_${src}_projection/$part "measured=[$measured]" \
      | sed -n '/^Projection against/,/^files:/p' | grep -v '^files:'
  done
done
