#!/usr/bin/env bash
# flash-attention, built once per architecture into a wheel in /wheels (its own stage: the Composable Kernel
# build takes an hour, and BuildKit keeps the stage's layer as long as the flash-attn version, the stack, the
# architecture, its gfx target and its backend stay the same). The target stage installs it.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
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
  skipped flash-attn "needs torch (flash-attn's setup.py imports it to build $spec, backend $FLASH_ATTN_BACKEND)"
  exit 0
fi
# ninja: torch's extension builder compiles in parallel only with it (torch/utils/cpp_extension.py falls back to
# one file at a time), and the stack does not have it (only DeepSpeed requires it, and that comes later)
locked ninja
rocmft-pip install "$PIN"
# pip wheel with the same no-cache rule as every per-target build (lib.sh build_for_target)
rocmft-pip wheel --no-cache-dir --no-build-isolation --no-deps -w /wheels "$spec"
ran flash-attn "built $(basename /wheels/flash_attn-*.whl) (backend $FLASH_ATTN_BACKEND, ${GPU_ARCHS:-no extension})"
