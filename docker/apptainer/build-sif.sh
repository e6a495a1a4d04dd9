#!/usr/bin/env bash
# Turn a Docker image into an Apptainer/Singularity image (SIF): `make sif ARCH=<arch>` runs this.
#   usage: docker/apptainer/build-sif.sh IMAGE OUTPUT.sif
# With apptainer and mksquashfs on this host it runs them here; without, in the helper image of
# docker/apptainer/helper-image.sh (Debian sid's apptainer), as root inside that container; the SIF is handed to the
# invoking user and appears only when complete (built beside OUTPUT, then renamed).
#
# Why not `apptainer build out.sif docker-archive:image.tar`: that path (Apptainer's OCI conveyor) first gzips every
# layer into an OCI layout, then unpacks them, then runs mksquashfs: 34 min for the 6.9 GB cpu image on a 2-core
# machine, where mksquashfs alone took 2 min (docs/clusters.md). Here the image's root file system is read once:
#   1. Apptainer's own OCI conversion runs on a config-only image (the image's configuration, one empty layer;
#      seconds): the SIF it makes ("mini") holds what that conversion writes from the configuration, exactly as for
#      the real image: /.singularity.d/{runscript,env/10-docker2singularity.sh,labels.json} and the base
#      environment (actions, env/*.sh, the /singularity, /.run, /.exec, ... links), plus its SIF objects (the
#      definition, oci-config.json that `apptainer run --oci` reads, inspect-metadata.json). Source:
#      internal/pkg/build/sources/conveyorPacker_oci.go (Pack: insertBaseEnv, insertRunScript, insertEnv,
#      insertOCIConfig, insertOCILabels) and base_environment.go, and internal/pkg/build/assemblers/sif.go, at
#      apptainer v1.4.5.
#   2. `docker export` of a created (never started) container streams the image's flattened root file system as one
#      tar, followed by a tar of the mini root's Apptainer entries, into `mksquashfs - -tar -ignore-zeros`, so nothing
#      is unpacked on disk. -ignore-zeros (two tars in one stream) needs squashfs-tools >= 4.6: its
#      Documentation/4.6/USAGE-MKSQUASHFS lists it, 4.5.1's USAGE has -tar but not it (plougher/squashfs-tools).
#      RHEL 8/9 and Ubuntu 22.04 ship older ones: there the helper image is used, with a message (issue 31).
#      The export has Docker's init layer on top of the image (what `docker run` sees too): mksquashfs drops its
#      /.dockerenv and gives its empty /etc/hosts and /etc/resolv.conf mode 0644, as Apptainer's makeFiles does
#      (apptainer binds its own over both at run time). Left as Docker's: /etc/hostname (empty), /dev/console (an
#      empty file; apptainer mounts its own /dev over /dev) and /etc/mtab (a link to /proc/mounts). Compared with a
#      SIF that `apptainer build docker-archive:` made of the same image (unsquashfs -lln, 82,326 entries): those are
#      the only differences in name, type, mode, owner and size, besides the build date in labels.json.
#   3. The mini SIF's file system partition is replaced by this one (`apptainer sif del` / `sif add`, the same
#      descriptor: squashfs, primary system partition, group 1, the image's architecture).
# The root directory keeps the mode Apptainer's OCI build gives it (0700, its build folder's: seen in a SIF it made).
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
# the work folder is beside the output, on its file system: the squashfs and the SIF (each about half the image's
# size) are there, and the finished SIF is renamed into place, never copied
work=$(mktemp -d "$out_dir/.rocmft-sif.XXXXXX")
container=
cleanup() {
  [ -z "$container" ] || docker rm "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
started=$(date +%s)

# SIF architecture codes: `apptainer sif add --help` (--partarch)
architecture=$(docker image inspect --format '{{.Architecture}}' "$image")
case "$architecture" in
  amd64) partarch=2 ;;
  arm64) partarch=4 ;;
  *) say "ERROR: $image is for $architecture; only amd64 and arm64 are handled here"; exit 2 ;;
esac

# 1. the config-only image as a docker-archive (the `docker save` layout: manifest.json, the configuration, one
# layer): an empty tar as the layer, the image's configuration (`docker image inspect` .Config: the keys of the OCI
# image configuration) around it
mkdir "$work/mini"
tar -c -f "$work/mini/layer.tar" -T /dev/null
layer_sha=$(sha256sum "$work/mini/layer.tar" | cut -d' ' -f1)
printf '{"architecture":"%s","os":"%s","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$architecture" "$(docker image inspect --format '{{.Os}}' "$image")" \
  "$(docker image inspect --format '{{json .Config}}' "$image")" "$layer_sha" >"$work/mini/config.json"
printf '[{"Config":"config.json","RepoTags":null,"Layers":["layer.tar"]}]' >"$work/mini/manifest.json"
tar -C "$work/mini" -c -f "$work/image.tar" manifest.json config.json layer.tar
rm -rf "$work/mini"

# squashfs_new_enough: this host's mksquashfs reads concatenated tars (-tar -ignore-zeros: 4.6 or later, see above);
# `mksquashfs -version` prints e.g. "mksquashfs version 4.6.1 (2023/03/25)" on its first line
squashfs_new_enough() {
  local found
  found=$(mksquashfs -version 2>/dev/null | sed -n '1s/^mksquashfs version \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
  case "$found" in
    4.[6-9]* | 4.[1-9][0-9]* | [5-9].* | [1-9][0-9]*.*) return 0 ;;
  esac
  say "this host's mksquashfs is ${found:-of an unknown version}; -tar -ignore-zeros needs squashfs-tools >= 4.6:" \
    "building in the helper image instead (or install squashfs-tools 4.6 or later)"
  return 1
}

# in_apptainer SCRIPT ARGS...: sh -c SCRIPT with the work folder at $W, stdin passed on; here or in the helper image
if command -v apptainer >/dev/null 2>&1 && command -v mksquashfs >/dev/null 2>&1 && squashfs_new_enough; then
  where="on this host"
  in_apptainer() { W=$work APPTAINER_TMPDIR=$work APPTAINER_CACHEDIR=$work/cache sh -c "$@"; }
else
  helper=$("$here/helper-image.sh")
  where="in $helper"
  in_apptainer() {
    docker run --rm -i -v "$work:/work" -e W=/work -e APPTAINER_TMPDIR=/work -e APPTAINER_CACHEDIR=/work/cache \
      --entrypoint sh "$helper" -c "$@"
  }
fi
say "Apptainer's OCI conversion of $image's configuration ($where)"
# the mini SIF's partition is its last descriptor (assemblers/sif.go adds it after the definition and the JSON objects)
# shellcheck disable=SC2016  # expanded by the inner shell
in_apptainer 'set -e
  apptainer -q build "$W/image.sif" "docker-archive:$W/image.tar"
  part=$(apptainer sif list "$W/image.sif" | awk "/FS \\(Squashfs/ {print \$1}")
  apptainer sif dump "$part" "$W/image.sif" >"$W/mini.sqfs"
  apptainer sif del "$part" "$W/image.sif"
  unsquashfs -q -d "$W/mini" "$W/mini.sqfs" >/dev/null
  tar -C "$W/mini" -c -f "$W/apptainer.tar" .singularity.d singularity .run .exec .shell .test environment
  rm -rf "$W/mini" "$W/mini.sqfs" "$W/image.tar" "$W/cache"'

say "docker export $image | mksquashfs ($squashfs_args)"
# never started: the command only satisfies `docker create` for images without one
container=$(docker create --entrypoint /never-run "$image")
# (-e takes every argument after it as a name to exclude: it comes last)
# shellcheck disable=SC2016  # expanded by the inner shell
{ docker export "$container"; cat "$work/apptainer.tar"; } | in_apptainer '
  mksquashfs - "$W/image.sqfs" -tar -ignore-zeros -noappend -quiet -no-progress $1 -root-mode 700 \
    -p "etc/hosts m 0644 0 0" -p "etc/resolv.conf m 0644 0 0" -wildcards -e .dockerenv' sh "$squashfs_args"
docker rm "$container" >/dev/null
container=

# shellcheck disable=SC2016  # expanded by the inner shell
in_apptainer 'set -e
  apptainer sif add --datatype 4 --parttype 2 --partfs 1 --partarch "$1" --groupid 1 "$W/image.sif" "$W/image.sqfs"
  rm -f "$W/image.sqfs"
  chown "$2" "$W/image.sif"' sh "$partarch" "$(id -u):$(id -g)"
mv -f "$work/image.sif" "$output"
say "built $output from $image: $(du -h "$output" | cut -f1), $(($(date +%s) - started)) s"
