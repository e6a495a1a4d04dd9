#!/usr/bin/env bash
# Make the image `make sif` runs Apptainer in, where the host has no apptainer: Debian sid's apptainer and
# squashfs-tools on a debootstrapped sid root file system, imported into Docker (no registry is needed).
#   usage: docker/apptainer/helper-image.sh        prints the image's name on stdout
# Why sid: Debian packages apptainer only there (1.4.5; it needs glibc >= 2.38, bookworm has 2.36), and no image
# can be pulled on our build machines (shared/docs/ENVIRONMENT.md). The same recipe as ensure-docker.sh's
# bookworm base: debootstrap --variant=minbase, then `docker import`.
set -euo pipefail
version=${APPTAINER_VERSION:-1.4.5}
image=${APPTAINER_HELPER_IMAGE:-rocmft-apptainer:$version}
say() { echo "[apptainer-helper] $*" >&2; }

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
[ "$(id -u)" = 0 ] || { say "ERROR: building $image needs root (debootstrap); install apptainer on this host instead" \
  "(https://apptainer.org/docs/admin/latest/installation.html), and make sif uses it directly"; exit 1; }
command -v debootstrap >/dev/null 2>&1 || apt-get install -y -qq debootstrap >/dev/null
rootfs=$(mktemp -d /tmp/rocmft-apptainer-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
log=/tmp/rocmft-apptainer-debootstrap.log
say "building $image: debootstrap of Debian sid with apptainer (a minute or two; log: $log)"
# squashfuse and fuse2fs let apptainer mount a SIF without root (it picks them when it is not root), fuse3 has the
# fusermount3 it unmounts them with;
# e2fsprogs and tar are what its build and overlay code call.
debootstrap --variant=minbase --include=apptainer,squashfs-tools,squashfuse,fuse2fs,fuse3,e2fsprogs,ca-certificates \
  sid "$rootfs" >"$log" 2>&1 || { say "ERROR: debootstrap failed; see $log"; exit 1; }
found=$(chroot "$rootfs" apptainer --version)
case "$found" in
  *"$version"*) ;;
  *) say "ERROR: sid now has $found, not $version: set APPTAINER_VERSION=${found##* } to build with it"; exit 1 ;;
esac
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import --change 'ENTRYPOINT ["apptainer"]' \
  --change "LABEL io.rocmft.apptainer=$version" - "$image" >/dev/null
say "built $image ($found)"
echo "$image"
