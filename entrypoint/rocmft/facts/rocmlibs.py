"""Which ROCm build each library carries, read from its files without importing it: torch's HIP version string
and bitsandbytes' choice among its ``libbitsandbytes_rocm<ver>.so`` libraries. Used by the image build's check
(rocmft.image.buildinfo, where torch may be absent) and by the run-time compatibility check (rocmft.checks.compat,
where importing bitsandbytes would load a native library into rocmft's own process).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path


def hip_version_of(text: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a HIP/ROCm version string: ``"7.2.53211"`` and ``"7.2"`` give ``(7, 2)``."""
    match = re.match(r"^\s*(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else None


def bitsandbytes_library(package: Path, hip: tuple[int, int]) -> Path | None:
    """The ``libbitsandbytes_rocm<ver>.so`` that bitsandbytes loads under a torch built for HIP ``hip``.

    Mirrors bitsandbytes 0.50.2's ``cextension.get_cuda_bnb_library_path`` (an exact major.minor match, else the
    highest packaged version below it with the same major, else the lowest above it with the same major, else
    none), because bitsandbytes itself cannot be imported where torch is absent (a rehearsal).
    tests/test_buildinfo.py holds the two to the same answers. ``BNB_ROCM_VERSION`` overrides are not modelled.

    Args:
        package: the installed ``bitsandbytes/`` folder.
        hip: torch.version.hip's (major, minor).

    Returns:
        The library's path, or None when bitsandbytes would find none (it then raises at import).
    """
    available = {}
    for library in package.glob("libbitsandbytes_rocm*.so"):
        digits = re.search(r"rocm(\d+)", library.name)
        if digits:  # bitsandbytes: ROCm's major is one digit ('72' -> 7.2, '714' -> 7.14)
            available[(int(digits[1][:1]), int(digits[1][1:]))] = library
    if hip in available:
        return available[hip]
    lower = [v for v in available if v[0] == hip[0] and v < hip]
    higher = [v for v in available if v[0] == hip[0] and v > hip]
    if lower:
        return available[max(lower)]
    return available[min(higher)] if higher else None


def package_dir(module: str) -> Path | None:
    """Where an installed package's files are, found without importing it (bitsandbytes' import loads its native
    library); None when it is not installed."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec and spec.origin else None


def bitsandbytes_choice(package: Path, hip: tuple[int, int], environ: Mapping[str, str]) -> tuple[Path, str]:
    """The library bitsandbytes 0.50.2 loads under a torch built for HIP ``hip`` in a process started with
    ``environ``, and why: ``BNB_ROCM_VERSION=<digits>`` names it outright (cextension.get_cuda_bnb_library_path:
    "Override env vars bypass selection entirely", no fallback), else :func:`bitsandbytes_library`'s choice.

    Returns:
        ``(path, how)``: the path (it may not exist: bitsandbytes then fails at import) and ``"BNB_ROCM_VERSION=72"``,
        ``"exact"`` or ``"fallback"``.
    """
    override = (environ.get("BNB_ROCM_VERSION") or "").strip()
    if override:
        return package / f"libbitsandbytes_rocm{override}.so", f"BNB_ROCM_VERSION={override}"
    chosen = bitsandbytes_library(package, hip)
    exact = package / f"libbitsandbytes_rocm{hip[0]}{hip[1]}.so"
    if chosen is None:
        return exact, "missing"
    return chosen, "exact" if chosen == exact else "fallback"


def library_rocm(library: Path) -> tuple[int, int] | None:
    """The ROCm (major, minor) a ``libbitsandbytes_rocm<ver>.so`` was built for, from its name ('72' is 7.2, '714'
    7.14: bitsandbytes' one-digit major)."""
    digits = re.search(r"rocm(\d+)", library.name)
    return (int(digits[1][:1]), int(digits[1][1:])) if digits and len(digits[1]) > 1 else None


__all__ = ["bitsandbytes_choice", "bitsandbytes_library", "hip_version_of", "library_rocm", "package_dir"]
