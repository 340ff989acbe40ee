#!/usr/bin/env bash
# The reports and A10 projections of docs/runs/2026-11-27_seed_check (2026-11-27_seed_check.sh's calls), written on
# a CPU machine from their result files (run from the repository root):
#   bash docs/runs/scripts/2026-11-27_seed_check_reports.sh
# For each sweep: its report (which projects it onto every conf/gpu option), then `bench.py suite=project` with the
# seed study's six A10 figures to check the projection against: projection.md, projection.csv and
# projection_validation.csv, written into the command's own run dir and copied beside each. eager_s1 and sdpa_s2
# were profiled before 977a605: their categories count copies inside a matrix product as matmul.
set -euo pipefail
D=docs/runs/2026-11-27_seed_check
for s in eager_s1 sdpa_s2 eager_s3 eager_s4 eager_h3; do
  python bench.py sweep_dir=$D/$s >/dev/null
  out=outputs/projection/2026-11-27_seed_check_$s
  python bench.py suite=project sweep_dir=$D/$s 'measured=[docs/runs/seed_a10/diagnostic.csv]' hydra.run.dir=$out \
    | sed -n '/^Projection against/,/^files:/p' | grep -v '^files:'
  cp $out/projection.md $out/projection.csv $out/projection_validation.csv $D/$s/
done
