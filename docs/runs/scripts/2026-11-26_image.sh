#!/usr/bin/env bash
# The record in docs/runs/2026-11-26_image: docker/Dockerfile built from nothing (the local base too)
# with buildah, its size and what takes the space (build.txt), and the default cell's output inside
# it, as the image's user, with no network (default_cell.txt). Root, Debian:
#   sudo bash docs/runs/scripts/2026-11-26_image.sh docs/runs/2026-11-26_image
set -euo pipefail
out=$(realpath -m "${1:?usage: 2026-11-26_image.sh RUN_DIR}")
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
image=$(docker/image.sh tag)
# From nothing: no base, no cached layer of an earlier build.
buildah rmi --force "$image" localhost/lorabench-base:cpu >/dev/null 2>&1 || true
buildah rmi --prune >/dev/null 2>&1 || true
{ echo "$ docker/image.sh build   # commit $(git rev-parse --short HEAD), $(nproc) cores, $(date -u +%F)"
  docker/image.sh build 2>&1 | grep -v '^ *\(Collecting\|Downloading\|Using cached\|Requirement already\)'; } > "$out/build.txt"
ctr=$(buildah from --pull=never "$image")
{ echo "$ unshare --net buildah run --isolation=chroot <a container of $image> -- sh -c 'id; python train.py'"
  unshare --net buildah run --isolation=chroot "$ctr" -- sh -c 'id; python train.py' 2>&1 | tr '\r' '\n' \
    | grep -v '^train: .*[0-9]/100 \[' ; } > "$out/default_cell.txt"
buildah rm "$ctr" >/dev/null
tail -3 "$out/default_cell.txt"
