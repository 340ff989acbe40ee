#!/usr/bin/env bash
# docker/Dockerfile built for real where there is no Docker engine and no registry of base images
# (a bare Debian machine, a CI runner): buildah builds the same file on a local Debian base.
#
#   sudo docker/image.sh build          # make image: the base if missing, then the image lorabench:<version>
#   sudo docker/image.sh can-run        # exit 0 if buildah can build and run here, else one line saying why
#   sudo docker/image.sh size           # the image's size and what takes the space
#   docker/image.sh tag                 # the image's name and tag (lorabench:<lorabench.__version__>)
#   sudo docker/image.sh install        # buildah, mmdebstrap and pip from Debian's packages, where missing
#   sudo docker/image.sh rebuild-base   # the base made again (a new Debian point release, say)
#
# The base (docker/Dockerfile.base-cpu, tagged localhost/lorabench-base:cpu): a Debian 12 root file
# system from Debian's packages (mmdebstrap) with Python 3.11, plus torch 2.13.0's CPU build, taken
# by pip from wherever pip finds it (a folder named by PIP_FIND_LINKS holding the wheel, or PIP_INDEX_URL
# set to PyTorch's CPU wheel index). It stands where pytorch/pytorch stands on a GPU machine; every stage
# and layer of docker/Dockerfile is the same on both. Root is needed: apt-get, and buildah's chroot.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' src/lorabench/__init__.py)
image=${IMAGE:-lorabench:$version}
base=localhost/lorabench-base:cpu
# overlay where the kernel allows it (layers share files), else vfs (a full copy per layer).
driver=${STORAGE_DRIVER:-overlay}
bah() { buildah --storage-driver="$driver" "$@"; }
# pip inside the build trusts what this host trusts (a TLS-inspecting proxy's CA, say): the host's CA
# bundle is bind-mounted for the RUN steps only, so it is in no layer.
ca=/etc/ssl/certs/ca-certificates.crt
trust=(); [ -f "$ca" ] && trust=(--volume "$ca:$ca:ro")

need_tools() {
  [ "$(id -u)" = 0 ] || { echo "image.sh: run as root (apt-get, and buildah's chroot isolation)" >&2; exit 2; }
  # pip here only downloads torch's wheel for the base (python3 -m pip download).
  command -v buildah >/dev/null && command -v mmdebstrap >/dev/null && python3 -m pip --version >/dev/null 2>&1 \
    && return
  echo "installing buildah, mmdebstrap and pip (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah mmdebstrap uidmap python3-pip >/dev/null
}

can_run() {
  # One empty container made, mounted and removed: the storage and mounts a build needs.
  local out ctr
  [ "$(id -u)" = 0 ] || { echo "image: skipped: not root (buildah's chroot isolation needs root)"; return 1; }
  command -v buildah >/dev/null || { echo "image: skipped: buildah is not installed (apt-get install buildah mmdebstrap)"; return 1; }
  if ! out=$(bah from scratch 2>&1); then
    echo "image: skipped: buildah cannot make a container here: $(tail -1 <<<"$out")"; return 1
  fi
  ctr=$(tail -1 <<<"$out")
  if ! out=$(bah mount "$ctr" 2>&1); then
    bah rm "$ctr" >/dev/null 2>&1 || true
    echo "image: skipped: buildah cannot mount a container here ($driver): $(tail -1 <<<"$out")"; return 1
  fi
  bah umount "$ctr" >/dev/null; bah rm "$ctr" >/dev/null
}

build_base() {
  if bah inspect --type image "$base" >/dev/null 2>&1; then
    echo "[1/2] base $base exists (docker/image.sh rebuild-base makes it again)"; return
  fi
  local ctx; ctx=$(mktemp -d)
  echo "[1/2] base: Debian 12 root file system (mmdebstrap), then torch 2.13.0 CPU"
  # minbase: essential packages and apt; Python with venv and pip; no documentation (smaller).
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$ctx/rootfs.tar"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 -d "$ctx" torch==2.13.0
  bah bud --quiet --isolation=chroot "${trust[@]}" -f "$PWD/docker/Dockerfile.base-cpu" -t "$base" "$ctx"
  rm -rf "$ctx"
}

build() {
  need_tools
  can_run || exit 2
  local t0=$SECONDS
  build_base
  echo "[2/2] $image: docker/Dockerfile, target runtime, BASE=$base EXTRAS=tokenizers (Liger: CUDA only)"
  bah bud --isolation=chroot "${trust[@]}" --layers --target runtime --build-arg BASE="$base" \
    --build-arg EXTRAS=tokenizers -f docker/Dockerfile -t "$image" .
  echo "built $image in $((SECONDS - t0)) s"
  size
}

size() {
  # The image's size, then the largest folders of its file system (what takes the space).
  local ctr mnt d
  bah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E "lorabench(-base)?:" || true
  ctr=$(bah from --pull=never "$image"); mnt=$(bah mount "$ctr")
  echo "what takes the space in $image (MiB, folders of 40 MiB or more):"
  # One du per folder: du counts a file once over all of its arguments.
  for d in / /usr/local/lib/python3.11/dist-packages /opt/venv/lib/python3.11/site-packages; do
    du -xm --max-depth=1 "$mnt$d" 2>/dev/null | awk -v m="$mnt" '$1 >= 40 {sub(m, "", $2); print $1 "\t" ($2 == "" ? "/" : $2)}'
  done | sort -rn | uniq
  bah umount "$ctr" >/dev/null; bah rm "$ctr" >/dev/null
}

case "${1:-}" in
  build) build ;;
  can-run) can_run ;;
  size) size ;;
  tag) echo "$image" ;;
  install) need_tools ;;
  rebuild-base) need_tools; bah rmi "$base" >/dev/null 2>&1 || true; build_base ;;
  *) echo "usage: docker/image.sh build|can-run|size|tag|install|rebuild-base" >&2; exit 2 ;;
esac
