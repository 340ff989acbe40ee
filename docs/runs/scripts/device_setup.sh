# Sourced, with <commit> <part>, by the scripts that measure on the device tool's GPU
# (2026-11-24_fused.sh, 2026-11-24_offload.sh): the carried wheels installed, the ShareGPT sample
# unpacked, the GPU's clocks recorded, the environment set; `run` is one train.py command with its
# table lines shown, stopped before the device's 10-minute limit (LIMIT_S), `sg` ShareGPT in 22 GiB.
# Each carried wheel installed once (a warm machine keeps /tmp/site between calls): a call may carry only
# some of the wheel dirs (.whl, .whl_b, .whl_unsloth...), as the device tool's 64 MiB for the working tree and
# what it carries allows; install-only calls first, then the measuring ones.
mkdir -p /tmp/site; touch /tmp/site/.wheels
new=$(for w in .whl*/*.whl; do [ -f "$w" ] && ! grep -qxF "$(basename $w)" /tmp/site/.wheels \
  && echo $w; done)
if [ -n "$new" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $new || exit 1
  for w in $new; do basename $w; done >> /tmp/site/.wheels
fi
[ -f .gpudata/sharegpt_2000.jsonl.xz ] && python3 -c "import lzma, shutil; shutil.copyfileobj(
  lzma.open('.gpudata/sharegpt_2000.jsonl.xz'), open('/tmp/sharegpt_2000.jsonl', 'wb'))"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $OUT/gpu_$2.csv
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 LORABENCH_CACHE=/tmp/cache LORABENCH_GIT_SHA=$1
D=$OUT/$2; t0=$SECONDS
sg="-m +experiment=seed_optimum train.max_steps=20 gpu=a10 data=jsonl data.path=/tmp/sharegpt_2000.jsonl data.max_samples=null"
run() { echo "== $*"; timeout $((${LIMIT_S:-570} - (SECONDS - t0))) python3 train.py "$@" 2>&1 \
  | grep -E "cells:|Error|error:|layers, bottom first|^\| [^c-]" ; }
