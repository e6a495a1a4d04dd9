#!/usr/bin/env bash
# flash-attention, built once per architecture into a wheel in /wheels (its own stage: the Composable Kernel
# build takes hours, and BuildKit keeps the stage's layer as long as the flash-attn version, the stack, the
# architecture, its gfx target and its backend stay the same). The target stage installs it.
# Which architectures build it, and why: FLASH_ATTN_BACKEND in docker/arch/<ARCH>.env.
#
# `flash-attn.sh --jobs [MEMINFO [CGROUP_DIR [CORES]]]` only prints the parallel compile jobs it would use
# (build_jobs below; the arguments stand in for /proc/meminfo, /sys/fs/cgroup and nproc in tests).
# `flash-attn.sh --smoke TREE ARCHS [ARGS]` only runs the CK smoke compile (ck_smoke below) on an unpacked sdist.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# build_jobs [MEMINFO [CGROUP_DIR [CORES]]]: compile jobs for the CK build (MAX_JOBS), at least 1. flash-attn
# 2.8.3's setup.py (NinjaBuildExtension, tag v2.8.3) takes min(cores / 2, available GB / 9), "each JOB peak
# memory cost is ~8-9GB"; it reads the available memory with psutil, which sees the host's /proc/meminfo, not
# the build container's cgroup limit (a BuildKit builder with a memory limit then runs out of memory), and it
# imports psutil, which the stack need not have under --no-build-isolation. Same rule here, with the memory
# left under the cgroup v2 limit (memory.max - memory.current) when that is lower. Units: KiB in, jobs out.
build_jobs() {
  local meminfo=${1:-/proc/meminfo} cgroup=${2:-/sys/fs/cgroup} cores=${3:-$(nproc)}
  local avail limit used by_memory by_cores
  avail=$(awk '/^MemAvailable:/ {print $2}' "$meminfo")
  if [ -r "$cgroup/memory.max" ] && limit=$(<"$cgroup/memory.max") && [ "$limit" != max ]; then
    used=$(cat "$cgroup/memory.current" 2>/dev/null || echo 0)
    limit=$(((limit - used) / 1024))
    if [ "$limit" -lt "$avail" ]; then avail=$limit; fi
  fi
  by_memory=$((avail / (9 * 1024 * 1024)))
  by_cores=$((cores / 2))
  local jobs=$((by_memory < by_cores ? by_memory : by_cores))
  echo $((jobs < 1 ? 1 : jobs))
}

# ck_smoke TREE ARCHS [ARGS]: before the hours-long CK build, compile one generated forward kernel with the
# flags flash-attn's setup.py would use (docker/steps/flash_attn_ck_smoke.py says which, with setup.py's lines),
# so that a broken toolchain (hipcc, the CK headers, the ROCm/torch pairing) fails in minutes, naming the
# compiler's first error. Exit status: the script's (0 compiled, 1 failed or timed out, 2 bad input).
ck_smoke() {
  python "$(dirname "$0")/flash_attn_ck_smoke.py" "$@"
}

if [ "${1:-}" = --smoke ]; then
  shift
  ck_smoke "$@"
  exit 0
fi
if [ "${1:-}" = --jobs ]; then
  shift
  build_jobs "$@"
  exit 0
fi

load_profile
export STEP_LOG=/wheels/build-steps.jsonl
mkdir -p /wheels
spec="flash-attn==$FLASH_ATTN_VERSION"
case "$FLASH_ATTN_BACKEND" in
  none) ran flash-attn "none for $ARCH (FLASH_ATTN_BACKEND=none)"; exit 0 ;;
  ck) export GPU_ARCHS=$PYTORCH_ROCM_ARCH ;;  # flash-attn's setup.py: --offload-arch for each of GPU_ARCHS
  triton) export FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE ;;  # setup.py then builds no extension
  *) echo "[build] FLASH_ATTN_BACKEND=$FLASH_ATTN_BACKEND in docker/arch/$ARCH.env: use ck, triton or none" >&2; exit 1 ;;
esac
if rehearsal; then
  # the CK smoke compile (ck_smoke) needs torch and hipcc too; tests/test_buildinfo.py runs it with a stand-in hipcc
  smoke=""
  if [ "$FLASH_ATTN_BACKEND" = ck ]; then smoke=", as does the CK smoke compile before it"; fi
  skipped flash-attn "needs torch (flash-attn's setup.py imports it to build $spec, backend $FLASH_ATTN_BACKEND$smoke)"
  exit 0
fi
# Build, never download: without FLASH_ATTENTION_FORCE_BUILD=TRUE, setup.py's bdist_wheel (CachedWheelsCommand,
# v2.8.3) first fetches a guessed prebuilt wheel from GitHub with urllib and no timeout, which hangs a build
# that cannot reach GitHub and would install a wheel built for another torch or target where it can.
export FLASH_ATTENTION_FORCE_BUILD=TRUE
# MAX_JOBS from this builder's memory and cores (build_jobs); a MAX_JOBS in the step's environment wins
MAX_JOBS=${MAX_JOBS:-$(build_jobs)}
export MAX_JOBS
echo "[build] flash-attn: MAX_JOBS=$MAX_JOBS ($(nproc) cores)"
# This stage is built FROM torch, not the stack: its build requirements come from its own pins (pins-flash-attn.txt,
# docker/steps/pins.sh): ninja (torch's extension builder compiles in parallel only with it; torch/utils/
# cpp_extension.py falls back to one file at a time), packaging (setup.py imports it) and psutil.
pins=/opt/rocmft/build/pins-flash-attn.txt
pin ninja "$pins"
pin packaging "$pins"
rocmft-pip install --no-deps -r "$pins"
# The sdist, unpacked and patched (docker/patches/flash-attn-<version>-*.patch, each saying what it fixes and
# where upstream fixed it). Its metadata is read without the CK build (FLASH_ATTENTION_SKIP_CUDA_BUILD: setup.py
# then skips the kernel generation, which runs at import time on ROCm).
src=$(mktemp -d)
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE rocmft-pip download --no-deps --no-binary flash-attn --no-build-isolation \
  -d "$src" "$spec"
tar -xzf "$src/flash_attn-$FLASH_ATTN_VERSION.tar.gz" -C "$src"
tree="$src/flash_attn-$FLASH_ATTN_VERSION"
patched=()
for patch in /opt/rocmft/build/patches/flash-attn-"$FLASH_ATTN_VERSION"-*.patch; do
  [ -e "$patch" ] || continue
  git -C "$tree" apply --verbose "$patch"
  patched+=("$(basename "$patch")")
done
if [ "$FLASH_ATTN_BACKEND" = ck ]; then
  ck_smoke "$tree" "$GPU_ARCHS"
fi
# pip wheel with the same no-cache rule as every per-target build (lib.sh build_for_target)
rocmft-pip wheel --no-cache-dir --no-build-isolation --no-deps -w /wheels "$tree"
rm -rf "$src"
ran flash-attn "built $(basename /wheels/flash_attn-*.whl) (backend $FLASH_ATTN_BACKEND, ${GPU_ARCHS:-no extension}, MAX_JOBS=$MAX_JOBS, patches: ${patched[*]:-none})"
