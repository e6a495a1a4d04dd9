#!/usr/bin/env bash
# The torch triple (torch, torchvision, torchaudio) from the profile's wheel index, at the lock's versions; in
# a ROCm image also triton-rocm, the ROCm torch's own triton.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
if rehearsal; then
  skipped torch "needs the torch triple from $TORCH_INDEX_URL, which this host cannot reach"
  exit 0
fi
# The lock's pins for this stage only (pins-torch.txt, split by docker/steps/pins.sh): the triple, and what it brings.
constraints=/opt/rocmft/build/pins-torch.txt
mapfile -t pins < <(grep -E '^(torch|torchvision|torchaudio|triton-rocm)==' "$constraints")
if [ "${#pins[@]}" -lt 3 ]; then
  echo "[build] the lock pins ${#pins[@]} of torch, torchvision, torchaudio: run make lock-rocm (ROCm) or make lock (cpu)" >&2
  exit 1
fi
# The ROCm index's copies of pure packages lag PyPI's: torch's own dependencies come from PyPI, at the lock's pins.
extra=()
[ "$TORCH_INDEX_URL" = https://pypi.org/simple ] || extra=(--extra-index-url https://pypi.org/simple)
rocmft-pip install --index-url "$TORCH_INDEX_URL" "${extra[@]}" -c "$constraints" "${pins[@]}"
# Everything torch brought must be pinned there: a requirement pins.sh does not list would come in at the index's
# newest version, unlike the lock (the stack stage would then move it, and the layer would differ from the lock).
python3 - "$constraints" /opt/rocmft/build/pins-system.txt <<'PY'
import importlib.metadata as m, re, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pinned = {norm(line.split("==")[0]) for path in sys.argv[1:] for line in open(path) if "==" in line}
unpinned = sorted({norm(d.metadata["Name"]) for d in m.distributions()} - pinned - {"pip", "setuptools", "wheel"})
if unpinned:
    sys.exit(f"[build] torch brought {', '.join(unpinned)}, which pins-torch.txt does not pin: add the names to "
             "the torch list in docker/steps/pins.sh")
PY
ran torch "$(python -c 'import torch; print(f"torch {torch.__version__}, HIP {torch.version.hip}, CUDA {torch.version.cuda}")')"
