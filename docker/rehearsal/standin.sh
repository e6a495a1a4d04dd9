#!/usr/bin/env bash
# Build rocmft-standin/rocm-dev:7.2.4, a local stand-in for AMD's rocm/dev-ubuntu-24.04:7.2.4-complete, so that
# the gfx images' FROM can be rehearsed on a machine that reaches no container registry, only Debian's archive
# (shared/docs/ENVIRONMENT.md). It carries the facts of the real base that our Dockerfile meets:
#   - user ubuntu 1000:1000 (ubuntu:24.04 ships it), group render with GID 109 (AMD's Dockerfile runs
#     `groupadd -g 109 render`), group video;
#   - no cmake (the -complete image has none);
#   - a ROCm 7.2.4 userland and an /opt/rocm that points at it (hipcc, libhipblas.so.3, libhipblaslt.so.1, ...).
# ROCm comes from Debian's experimental suite (the only consistent 7.2.4 set); its binaries need glibc >= 2.38,
# so the OS is Debian sid, not Ubuntu 24.04 (and Python is sid's, not 3.12: see the image's labels).
# Debian's hipcc drives Debian's upstream LLVM (clang-22), not AMD's fork.
#   usage: docker/rehearsal/standin.sh [--force]     (root; a running Docker engine: docker/ensure-docker.sh)
# Idempotent: an existing image is left alone unless --force. Log: $STANDIN_LOG (default /tmp/rocmft-standin.log).
set -euo pipefail
image=rocmft-standin/rocm-dev:7.2.4
mirror=http://deb.debian.org/debian
log=${STANDIN_LOG:-/tmp/rocmft-standin.log}
case "${1:-}" in
  "") force=0 ;; --force) force=1 ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac
say() { echo "[standin] $*" | tee -a "$log"; }

# one build at a time (a second run waits, then finds the image); runs that share a log would garble it
exec 9>/tmp/rocmft-standin.lock && flock 9
if [ "$force" = 0 ] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "[standin] $image exists; nothing to do (--force rebuilds)"; exit 0
fi
[ "$(id -u)" = 0 ] || { echo "[standin] ERROR: debootstrap needs root" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "[standin] ERROR: no Docker engine; run docker/ensure-docker.sh" >&2; exit 1; }
command -v debootstrap >/dev/null 2>&1 || apt-get install -y -qq debootstrap >>"$log" 2>&1

# The ROCm 7.2.4 set from experimental (apt adds what they need: libamdhip64-7, libhsa-runtime64-1, comgr, ...).
rocm_packages=(
  hipcc               # /opt/rocm/bin/hipcc; pulls clang-22/lld-22, rocminfo and rocm-device-libs-22
  rocm-device-libs-22 # the amdgcn bitcode (ocml, ockl) that every HIP kernel is linked with
  libamdhip64-dev     # HIP headers and libamdhip64.so.7 (the HIP runtime, on libhsa-runtime64-1 = ROCr)
  libhsa-runtime-dev  # ROCr headers and libhsa-runtime64.so (builds that link ROCr directly)
  libhipblas-dev      # libhipblas.so.3, NEEDED by bitsandbytes' libbitsandbytes_rocm7*.so (pulls rocBLAS, rocSOLVER)
  libhipblaslt-dev    # libhipblaslt.so.1, NEEDED by the same libraries
  librocrand-dev      # librocrand.so.1, NEEDED by libbitsandbytes_rocm714/715.so
)
# apt takes these source packages from experimental (pin 990): those of rocm_packages and of what they need at
# 7.2.4 (rocBLAS and rocSOLVER under hipBLAS, roctx under rocBLAS, comgr, ROCr); everything else comes from sid.
rocm_sources="src:rocm-llvm src:rocm-hipamd src:rocr-runtime src:hipblas src:hipblas-common src:hipblaslt"
rocm_sources+=" src:rocblas src:rocsolver src:roctracer src:rocrand"
# Not installed: RCCL (librccl1, a 370 MB download; nothing we build or run here links it: bitsandbytes does
# not, and torch's ROCm wheels bundle their own). Add librccl-dev here if that changes.

# Besides ROCm, AMD's Dockerfile (ROCm/ROCm-docker dev/Dockerfile-ubuntu-24.04-complete) installs python3-dev,
# python3-pip, file, build-essential, sudo, kmod, curl, gnupg. python3-venv and git are not on the real base, so
# they are not here either: the rehearsal's system stage apt-gets them, as it must on the real base.
base_packages=python3,python3-dev,python3-pip,g++,make,ca-certificates,file

start=$SECONDS
rootfs=$(mktemp -d /tmp/rocmft-standin-rootfs.XXXXXX)
sid_tmp=rocmft-standin/sid-minbase:tmp
cleanup() {
  trap - ERR
  # debootstrap mounts proc and sys in the rootfs; a killed run can leave them there: never rm across them
  if [ -d "$rootfs" ]; then
    umount -lR "$rootfs/proc" "$rootfs/sys" 2>/dev/null || true
    rm -rf --one-file-system "$rootfs" || true
  fi
  docker image rm "$sid_tmp" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'echo "[standin] ERROR: failed; see $log" >&2; exit 1' ERR
: >"$log"

say "debootstrap sid (minbase + $base_packages)"
keyring=(); [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] \
  && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
debootstrap --variant=minbase "${keyring[@]}" --include="$base_packages" sid "$rootfs" "$mirror" >>"$log" 2>&1
python_version=$(chroot "$rootfs" python3 -c 'import platform; print(platform.python_version())')
tar -C "$rootfs" -c . | docker import - "$sid_tmp" >>"$log"
rm -rf --one-file-system "$rootfs"

say "installing ROCm 7.2.4 from experimental: ${rocm_packages[*]}"
# Legacy builder on purpose: no build context, and it works where buildx is absent (ENVIRONMENT.md). A single
# RUN, so that a failed build leaves no intermediate image behind (cleanup then removes the sid base).
DOCKER_BUILDKIT=0 docker build --no-cache --force-rm -t "$image" - >>"$log" 2>&1 <<EOF
FROM $sid_tmp
# The mirror reachable here serves a frozen archive (sid's Release of 2026-10-30 was "Valid-Until" 11-06), which
# apt refuses once that date has passed; kept in the image so that our Dockerfile's apt-get works on it too.
RUN echo 'Acquire::Check-Valid-Until "false";' > /etc/apt/apt.conf.d/99rocmft-frozen-mirror \\
 && echo 'deb $mirror experimental main' > /etc/apt/sources.list.d/experimental.list \\
# experimental keeps its default priority (1: never chosen unasked) except for rocm_sources, whose 7.2.4 builds
# win over sid's 6.4-7.1. apt silently ignores a "Package: *" record with "Pin: version 7.2.4*", and a
# preferences.d file whose name has a dot other than ".pref" (such as "rocm-7.2.4").
 && printf 'Package: %s\nPin: release a=experimental\nPin-Priority: 990\n' '$rocm_sources' \\
      > /etc/apt/preferences.d/rocm-experimental \\
 && apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${rocm_packages[*]} \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* \\
 && echo 'from experimental:' && dpkg-query -W -f '\${Package} \${Version}\n' | grep '~exp' \\
# fail if the pin did not take (a ROCm package below 7.2.4) or if cmake came in (the real base has none)
 && if dpkg-query -W -f '\${Package} \${Version}\n' ${rocm_packages[*]} | grep -v ' 7\.2\.4'; then exit 1; fi \\
 && if command -v cmake; then echo 'cmake must be absent'; exit 1; fi \\
# AMD's layout as far as a build or a linker reads it: /opt/rocm -> /opt/rocm-7.2.4, with bin/hipcc, lib/
# (RUNPATH /opt/rocm/lib in bitsandbytes' libraries), include/hip, llvm/, amdgcn/bitcode and .info/version, all
# links to Debian's files. With ROCM_PATH or HIP_PATH=/opt/rocm, Debian's hipcc runs \$ROCM_PATH/lib/llvm-22/bin/
# clang++ (hence the llvm-22 link in Debian's lib dir), clang looks for amdgcn/bitcode and hipconfig for share/hip.
 && r=/opt/rocm-7.2.4 && mkdir -p \$r/bin \$r/.info && echo 7.2.4 > \$r/.info/version \\
 && for b in hipcc hipconfig rocminfo rocm_agent_enumerator; do ln -s "\$(command -v \$b)" \$r/bin/\$b; done \\
 && ln -s /usr/lib/llvm-22/bin/clang \$r/bin/amdclang && ln -s /usr/lib/llvm-22/bin/clang++ \$r/bin/amdclang++ \\
 && ln -s /usr/lib/x86_64-linux-gnu \$r/lib && ln -s /usr/include \$r/include && ln -s /usr/lib/llvm-22 \$r/llvm \\
 && ln -s "\$(/usr/lib/llvm-22/bin/clang -print-resource-dir)/amdgcn" \$r/amdgcn && ln -s /usr/share \$r/share \\
 && ln -s ../llvm-22 /usr/lib/x86_64-linux-gnu/llvm-22 && ln -s \$r /opt/rocm \\
# ubuntu:24.04's user, and AMD's render group (GID 109); Debian already has video (GID 44, as Ubuntu).
 && groupadd -g 109 render && groupadd -g 1000 ubuntu \\
 && useradd --create-home --uid 1000 --gid 1000 --shell /bin/bash ubuntu
LABEL org.opencontainers.image.title="rocmft stand-in for rocm/dev-ubuntu-24.04:7.2.4-complete" \\
      rocmft.standin.for="rocm/dev-ubuntu-24.04:7.2.4-complete" \\
      rocmft.standin.os="Debian sid (the real base is Ubuntu 24.04)" \\
      rocmft.standin.rocm="7.2.4 from Debian experimental, without RCCL; hipcc on Debian's clang-22" \\
      rocmft.standin.python="$python_version (the real base has 3.12)" \\
      rocmft.standin.built="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
EOF

size=$(docker image inspect -f '{{.Size}}' "$image")
fetched=$(grep -o 'Need to get [^ ]* [kMG]B' "$log" | tail -n 1 | sed 's/Need to get //' || true)
say "built $image: $((size / 1000000)) MB, $((SECONDS - start)) s" \
  "(ROCm download ${fetched:-?}; python $python_version; log $log)"
