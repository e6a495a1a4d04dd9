#!/usr/bin/env bash
# The torch triple (torch, torchvision, torchaudio) from the profile's wheel index, at the lock's versions; in
# a ROCm image also triton-rocm, the ROCm torch's own triton.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
if rehearsal; then
  skipped torch "needs the torch triple from $TORCH_INDEX_URL, which this host cannot reach"
  exit 0
fi
mapfile -t pins < <(grep -E '^(torch|torchvision|torchaudio|triton-rocm)==' /opt/rocmft/build/lock.txt)
if [ "${#pins[@]}" -lt 3 ]; then
  echo "[build] the lock ($LOCK) pins ${#pins[@]} of torch, torchvision, torchaudio: run make lock-rocm (ROCm) or make lock (cpu)" >&2
  exit 1
fi
# The ROCm index's copies of pure packages lag PyPI's: torch's own dependencies come from PyPI, at the lock's pins.
extra=()
[ "$TORCH_INDEX_URL" = https://pypi.org/simple ] || extra=(--extra-index-url https://pypi.org/simple)
rocmft-pip install --index-url "$TORCH_INDEX_URL" "${extra[@]}" -c /opt/rocmft/build/lock.txt "${pins[@]}"
ran torch "$(python -c 'import torch; print(f"torch {torch.__version__}, HIP {torch.version.hip}, CUDA {torch.version.cuda}")')"
