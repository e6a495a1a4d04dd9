#!/usr/bin/env bash
# Turn a Docker image into an Apptainer/Singularity image (SIF): `make sif ARCH=<arch>` runs this.
#   usage: docker/apptainer/build-sif.sh IMAGE OUTPUT.sif
# The image goes through `docker save` (a docker-archive: source, so no registry and no Docker socket inside
# the build). With apptainer on this host it builds here; without, in the helper image of
# docker/apptainer/helper-image.sh (Debian sid's apptainer), as root inside that container, and the SIF is then
# handed to the invoking user. The SIF appears only when complete (built beside OUTPUT, then renamed).
#
# Compression (SIF_MKSQUASHFS_ARGS): zstd at level 3 by default. Apptainer's default is mksquashfs' gzip, which
# on a 2-core build machine was the slowest step; zstd at a low level compresses several times faster than gzip at
# a similar ratio, and decompresses faster at run time. The kernel's squashfs reads zstd since Linux 4.14 and
# Debian's squashfuse (what apptainer mounts with when not root) is built with it. Measured numbers: docs/clusters.md.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 IMAGE OUTPUT.sif" >&2; exit 2; }
image=$1
output=$2
squashfs_args=${SIF_MKSQUASHFS_ARGS:--comp zstd -Xcompression-level 3}
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "[sif] $*" >&2; }

docker image inspect "$image" >/dev/null 2>&1 || {
  say "ERROR: no image $image here: build it first (make image ARCH=...), or set IMAGE to the one to convert"
  exit 2
}
out_dir=$(dirname "$output")
[ -d "$out_dir" ] && [ -w "$out_dir" ] || { say "ERROR: cannot write $output: $out_dir is not a writable folder"; exit 2; }
# the work folder is beside the output, on its file system: the archive and the unpacked root need about twice the
# image's size there, and the finished SIF is renamed into place, never copied
work=$(mktemp -d "$out_dir/.rocmft-sif.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
say "docker save $image"
docker save -o "$work/image.tar" "$image"
if command -v apptainer >/dev/null 2>&1; then
  say "apptainer build ($(apptainer --version), on this host; mksquashfs $squashfs_args)"
  APPTAINER_TMPDIR="$work" apptainer build --force --mksquashfs-args "$squashfs_args" \
    "$work/image.sif" "docker-archive:$work/image.tar"
else
  helper=$("$here/helper-image.sh")
  say "apptainer build in $helper (no apptainer on this host; mksquashfs $squashfs_args)"
  docker run --rm -v "$work:/work" -e APPTAINER_TMPDIR=/work -e APPTAINER_CACHEDIR=/work/cache \
    --entrypoint sh "$helper" -c 'apptainer build --force --mksquashfs-args "$1" /work/image.sif \
      docker-archive:/work/image.tar && chown "$2" /work/image.sif' sh "$squashfs_args" "$(id -u):$(id -g)"
fi
mv -f "$work/image.sif" "$output"
say "built $output from $image: $(du -h "$output" | cut -f1), $(($(date +%s) - started)) s"
