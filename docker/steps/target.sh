#!/usr/bin/env bash
# The architecture's own libraries: DeepSpeed for its accelerator (with the profile's ops), bitsandbytes,
# liger-kernel, the flash-attention wheel from its stage, and (rehearsals only) the arch probe.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
load_profile
gpu_pin() { pin "$1" /opt/rocmft/build/gpu-requirements.txt; }  # pyproject.toml's `gpu` extra, into $PIN

# --- DeepSpeed: DS_ACCELERATOR is set while it installs, because DeepSpeed records the accelerator it was built
# for (git_version_info_installed.py, accelerator_name) and at run time uses prebuilt ops only when that name is
# the running one (op_builder/builder.py); with no GPU at build time it would pick and record `cpu`
# (accelerator/real_accelerator.py; deepspeedai/DeepSpeed#7011). DS_BUILD_<OP>=1 for each prebuilt op.
export DS_ACCELERATOR PYTORCH_ROCM_ARCH
locked deepspeed
if rehearsal; then
  # without torch DeepSpeed's setup.py can compile no op (it refuses DS_BUILD_<OP>=1); its dependencies come from
  # the (skipped) stack step
  build_for_target --no-deps "$PIN"
  ran deepspeed "$PIN, DS_ACCELERATOR=$DS_ACCELERATOR, no ops"
  [ -z "$DS_BUILD_OPS_LIST" ] || skipped deepspeed-ops "needs torch to compile $DS_BUILD_OPS_LIST for $PYTORCH_ROCM_ARCH"
else
  for op in $DS_BUILD_OPS_LIST; do export "DS_BUILD_${op}=1"; done
  build_for_target -c /opt/rocmft/build/lock.txt "$PIN"
  ran deepspeed "$PIN, DS_ACCELERATOR=$DS_ACCELERATOR, ops: ${DS_BUILD_OPS_LIST:-none}"
fi

# --- bitsandbytes: PyPI's wheel carries libbitsandbytes_rocm<ver>.so for many gfx targets; rocmft.image.buildinfo
# checks that the one bitsandbytes will load holds the profile's target. BITSANDBYTES=source is the fallback for
# a target the wheel lacks: bitsandbytes' own recipe (.github/scripts/build-rocm.sh: cmake 3.31.6 from PyPI,
# -DCOMPUTE_BACKEND=hip), then its setup.py packs the library CMake built (BNB_SKIP_CMAKE=1: setup.py at
# bitsandbytes-foundation/bitsandbytes@95f9af30; a plain `pip install` re-runs CMake with the CPU backend, and
# without scikit-build-core, its build backend, it does not build at all).
case "$BITSANDBYTES" in
  none) ;;
  wheel)
    gpu_pin bitsandbytes
    rocmft-pip install --no-deps --only-binary=bitsandbytes "$PIN"
    ran bitsandbytes "$PIN from PyPI's wheel" ;;
  source)
    gpu_pin bitsandbytes
    version=${PIN#*==}
    git clone --depth 1 --branch "$version" https://github.com/bitsandbytes-foundation/bitsandbytes.git /tmp/bnb
    rocmft-pip install "cmake==3.31.6" "scikit-build-core==1.1.2" "trove-classifiers>=2025.8.6.13"
    cmake -S /tmp/bnb -B /tmp/bnb/build -DCOMPUTE_BACKEND=hip -DCMAKE_BUILD_TYPE=MinSizeRel \
      -DCMAKE_HIP_FLAGS=--offload-compress -DBNB_ROCM_ARCH="$PYTORCH_ROCM_ARCH"
    cmake --build /tmp/bnb/build --parallel "$(nproc)"
    BNB_SKIP_CMAKE=1 rocmft-pip install --no-cache-dir --no-build-isolation --no-deps /tmp/bnb
    rm -rf /tmp/bnb
    ran bitsandbytes "$version built from source for $PYTORCH_ROCM_ARCH" ;;
  *) echo "[build] BITSANDBYTES=$BITSANDBYTES in docker/arch/$ARCH.env: use wheel, source or none" >&2; exit 1 ;;
esac

# --- liger-kernel without its dependencies: it requires `triton`, and PyPI's triton is CUDA's; it would sit
# beside triton-rocm, both owning triton/, the last installed winning (rocmft.image.buildinfo refuses PyPI's triton).
if [ "$LIGER_KERNEL" = install ]; then
  gpu_pin liger-kernel
  rocmft-pip install --no-deps "$PIN"
  ran liger-kernel "$PIN, no dependencies (triton is triton-rocm's)"
fi

# --- flash-attention: the wheel its stage built for this ARCH
shopt -s nullglob
wheels=(/opt/rocmft/wheels/*.whl)
[ "${#wheels[@]}" -eq 0 ] || rocmft-pip install --no-deps "${wheels[@]}"
[ ! -f /opt/rocmft/wheels/build-steps.jsonl ] || cat /opt/rocmft/wheels/build-steps.jsonl >>"$STEP_LOG"

# --- rehearsals: the arch probe, a source distribution whose build records PYTORCH_ROCM_ARCH, built the way
# DeepSpeed's ops and flash-attention are: a wheel reused from another ARCH's build shows up as the wrong target.
if rehearsal; then
  # a byte-identical archive for every ARCH, found by name and version the way `deepspeed==0.18.4` is on PyPI:
  # pip reuses a cached wheel for such a requirement (not for a bare file path)
  mkdir -p /tmp/arch-probe
  tar -C /opt/rocmft/build --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - arch_probe-1.0 \
    | gzip -n >/tmp/arch-probe/arch_probe-1.0.tar.gz
  build_for_target --no-deps --no-index --find-links /tmp/arch-probe "arch-probe==1.0"
  built=$(python -c 'import arch_probe; print(arch_probe.BUILT_FOR)')
  if [ "$built" != "$PYTORCH_ROCM_ARCH" ]; then
    echo "[build] the arch probe was built for '$built', not $PYTORCH_ROCM_ARCH: a wheel built for another" \
      "architecture was reused (pip's wheel cache is shared between targets)" >&2
    exit 1
  fi
  rocmft-pip uninstall -q -y arch-probe
  ran arch-probe "a source build in this stage is built for $built"
fi

# --- the installed set is consistent (pip check). One known exception in a ROCm image: liger-kernel's plain
# `triton` requirement, which triton-rocm (the ROCm torch's triton, same triton/ package) fulfils.
if rehearsal; then
  skipped pip-check "the torch and stack steps did not run, so their packages are missing"
else
  problems=$(rocmft-pip check 2>&1 | grep -v -e '^No broken requirements' || true)
  if [ "$TORCH_IS_HIP" = 1 ] && rocmft-pip show -q triton-rocm 2>/dev/null; then
    problems=$(grep -v -E '^liger-kernel [^ ]+ requires triton, which is not installed\.$' <<<"$problems" || true)
  fi
  if [ -n "$problems" ]; then
    echo "[build] pip check found inconsistent requirements:" >&2
    echo "$problems" >&2
    exit 1
  fi
  ran pip-check "no broken requirements"
fi
