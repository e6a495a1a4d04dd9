"""Build-time assertions and the image's build record, run once as the last step of an image build.

``python -m rocmft.buildinfo /etc/rocmft/arch.env /etc/rocmft/build.json`` checks what the architecture
profile (docker/arch/<ARCH>.env) promised, without a GPU, and fails the build listing every broken promise:

* torch is the HIP build in ROCm images (``torch.version.hip``), and torch/torchvision/torchaudio import;
* no ``nvidia-*`` distribution slipped in where the profile forbids them (CUDA wheels in a ROCm image);
* bitsandbytes imports and its HIP library contains code for the profile's gfx target;
* DeepSpeed's ops named in DS_BUILD_OPS_LIST were compiled into the installation;
* flash-attention imports where the profile has a backend; LLaMA-Factory and rocmft import.

It then writes the build record (JSON: architecture, ROCm version, base image, key package versions, git
commit, date), which ``rocmft env`` prints and every run's manifest includes.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# The image's copy of docker/arch/<ARCH>.env (the Dockerfile installs it; container-entry.sh reads it).
ARCH_PROFILE = Path("/etc/rocmft/arch.env")


def read_profile(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of an architecture profile (comments and blank lines skipped)."""
    profile = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            profile[key.strip()] = value.strip()
    return profile


def _gfx_in_library(library: Path, gfx: str) -> bool:
    """Whether a HIP fat binary holds code objects for ``gfx`` (their names carry ``amdgcn-amd-amdhsa--<gfx>``)."""
    needle = f"amdgcn-amd-amdhsa--{gfx}".encode()
    with library.open("rb") as handle:
        tail = b""
        while chunk := handle.read(1 << 20):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle) :]
    return False


def check(profile: dict[str, str]) -> list[str]:
    """Every promise of the profile the installed image breaks, as messages (empty: all kept)."""
    failures: list[str] = []
    try:
        import torch

        for name in ("torchvision", "torchaudio"):
            importlib.import_module(name)
        if profile.get("TORCH_IS_HIP") == "1" and not torch.version.hip:
            failures.append(f"torch {torch.__version__} is not the HIP build (torch.version.hip is empty); "
                            f"check TORCH_INDEX_URL={profile.get('TORCH_INDEX_URL')}")  # fmt: skip
    except Exception as err:
        failures.append(f"torch triple does not import: {type(err).__name__}: {err}")
    if profile.get("NVIDIA_WHEELS") == "forbidden":
        nvidia = sorted(
            {d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].lower().startswith("nvidia-")}
        )
        if nvidia:
            failures.append(f"CUDA wheels slipped into a ROCm image: {', '.join(nvidia)}")
    if profile.get("BITSANDBYTES") == "hip":
        try:
            bnb = importlib.import_module("bitsandbytes")
            libraries = sorted(Path(bnb.__file__).parent.glob("libbitsandbytes_rocm*.so"))
            gfx = profile.get("BNB_ROCM_ARCH", "")
            if not libraries:
                failures.append("bitsandbytes has no HIP library (libbitsandbytes_rocm*.so)")
            elif not any(_gfx_in_library(lib, gfx) for lib in libraries):
                failures.append(f"bitsandbytes' HIP library has no code for {gfx}: {', '.join(map(str, libraries))}")
        except Exception as err:
            failures.append(f"bitsandbytes does not import: {type(err).__name__}: {err}")
    ops = profile.get("DS_BUILD_OPS_LIST", "").split()
    if ops:
        try:
            from deepspeed.git_version_info import installed_ops

            missing = [op for op in ops if not installed_ops.get(op.lower())]
            if missing:
                failures.append(f"DeepSpeed ops not prebuilt: {', '.join(missing)} (installed_ops: {installed_ops})")
        except Exception as err:
            failures.append(f"DeepSpeed does not import: {type(err).__name__}: {err}")
    modules = ["llamafactory", "rocmft.cli"] + (
        ["flash_attn"] if profile.get("FLASH_ATTN_BACKEND", "none") != "none" else []
    )
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:
            failures.append(f"{module} does not import: {type(err).__name__}: {err}")
    return failures


def record(profile: dict[str, str]) -> dict[str, Any]:
    """The build record: the profile's build facts, package versions, commit and date."""
    from .lfargs import stack_versions

    try:
        import torch

        toolkit = {"torch_hip": torch.version.hip, "torch_cuda": torch.version.cuda}
    except Exception:
        toolkit = {}
    keys = ("ARCH", "GPU_FAMILY", "ROCM_VERSION", "PYTORCH_ROCM_ARCH", "BNB_ROCM_ARCH", "FLASH_ATTN_BACKEND",
            "DS_BUILD_OPS_LIST", "TORCH_INDEX_URL", "RCCL_BUSBW_FLOOR_GBPS")  # fmt: skip
    return {
        **{key.lower(): profile.get(key, "") for key in keys},
        "base_image": os.environ.get("ROCMFT_BASE_IMAGE", "unknown"),
        "git_commit": os.environ.get("ROCMFT_GIT_COMMIT", "unknown"),
        "build_date": os.environ.get("ROCMFT_BUILD_DATE")
        or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": dict(stack_versions()),
        **toolkit,
        "runtime_profile": {k.removeprefix("RUNTIME_"): v for k, v in profile.items() if k.startswith("RUNTIME_")},
    }


def main(argv: list[str]) -> int:
    """Check the image against the profile ``argv[0]`` and write the record to ``argv[1]``; 1 on failures."""
    profile = read_profile(Path(argv[0]))
    failures = check(profile)
    if failures:
        print(f"rocmft image for {profile.get('ARCH')} is broken:\n  - " + "\n  - ".join(failures), file=sys.stderr)
        return 1
    data = record(profile)
    Path(argv[1]).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
