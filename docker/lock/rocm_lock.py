"""Resolve the ROCm flavour's lock, docker/lock/rocm<ROCM_VERSION>.txt: ``make lock-rocm`` (write) and a test (check).

The ROCm images resolve against this file, never against constraints.txt: that one is the CPU development
environment's freeze, with PyPI's CUDA torch, its nvidia-* wheels and PyPI's (CUDA) triton, none of which may
reach a ROCm image. This host reaches PyPI but not the ROCm wheel index, so the lock is made in two parts:

1. pyproject.toml's dependencies, its ``gpu`` extra and its build requirements are resolved by uv for the ROCm
   images' Python and platform (``PYTHON_VERSION`` of the profile, manylinux_2_28 x86_64), from PyPI as of
   :data:`AS_OF`, so that the same inputs give the same lock. torch resolves to PyPI's build of the pinned release.
2. What only PyPI's CUDA build of torch brings is dropped (the torch triple itself, ``nvidia-*``, ``cuda-*`` and
   ``triton``), and the ROCm index's triple is pinned in their place: the same versions with the ``+rocm<ver>``
   local label, and ``triton-rocm`` at the version PyPI's torch pins ``triton`` to. A ROCm wheel of a torch release
   requires the same pure packages as the CUDA wheel plus triton-rocm instead of the CUDA runtime wheels
   (PyTorch's ``.github/scripts/generate_binary_build_matrix.py``: its extra install requirements are per CUDA
   version only); the image build's ``pip check`` and rocmft.image.buildinfo verify that on a connected host.

``--check`` resolves again with the lock's own pins as constraints: it fails when pyproject.toml asks for something
the lock lacks or excludes a pinned version, and when the lock holds a package the requirements no longer bring. It
does not re-resolve freely: this host's view of PyPI fills in late, so releases whose upload time is before
:data:`AS_OF` appear days after a lock was written (httpx 0.29.0, filelock 4.3.2, opentelemetry-api 1.45.3, and
regex 2026.11.24, uploaded 2026-11-25 and missing when the lock was written on 2026-12-04, which failed CI's run of
de1c04b), and an exact re-resolution then fails with nothing changed here.

Usage: ``python docker/lock/rocm_lock.py --write | --check [--profile docker/arch/gfx942.env ...] [--lock FILE]``:
every ROCm profile of docker/arch/ by default; the profiles that share a lock must agree on its ROCm and Python
versions. ``--lock`` checks FILE in place of the one profile's lock (the tests' way to show a stale lock is caught).
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

from rocmft.image.buildinfo import read_profile, validate_profile

REPO = Path(__file__).resolve().parents[2]
# PyPI as of this date (uv --exclude-newer): re-resolving later gives the same lock. Move it when updating.
AS_OF = "2026-12-01"
# Distributions only PyPI's CUDA build of torch (and liger-kernel's plain `triton` requirement) bring in.
CUDA_ONLY = re.compile(r"^(nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+|triton)$")
TORCH_TRIPLE = ("torch", "torchvision", "torchaudio")


def requirements() -> list[str]:
    """pyproject.toml's runtime dependencies plus its ``gpu`` extra: what a ROCm image installs; and its build
    requirements (``[build-system] requires``: setuptools, wheel), which docker/steps/system.sh installs into the
    image's environment under this lock, where flash-attention and DeepSpeed are built without build isolation.
    flash-attn 2.8.3's setup.py imports ``wheel.bdist_wheel`` (line 20 of its sdist). wheel 0.43.0 was the last to
    implement it; from 0.44.0 it is a deprecated shim, "will be removed in a future release" (its own warning), that
    in 0.45.1 to 0.48.0 returns setuptools' command (setuptools >= 70.1; the lock has 81) (wheels from PyPI, opened
    2026-12-04; issue 31, finding 8). Unlocked, the next wheel release could break the flash-attn build; locked,
    wheel changes only when this lock is re-resolved, and tests/test_images.py imports it as flash-attn does."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["gpu"], *pyproject["build-system"]["requires"]]


def lock_constraints(text: str) -> list[str]:
    """The PyPI pins a lock's ``text`` stands for, as uv constraints: each ``name==version`` line, with the torch
    triple's ``+rocm<ver>`` label dropped and ``triton-rocm`` read as the ``triton`` PyPI's torch pins (what
    :func:`render` derived them from). Comment and blank lines are skipped."""
    pins = []
    for line in text.splitlines():
        if "==" not in line or line.lstrip().startswith("#"):
            continue
        name, version = (part.strip() for part in line.split("==", 1))
        if name in TORCH_TRIPLE:
            version = version.split("+", 1)[0]
        pins.append(f"{'triton' if name == 'triton-rocm' else name}=={version}")
    return pins


def resolve(python_version: str, constraints: list[str] | None = None) -> list[tuple[str, str]]:
    """``(name, version)`` pairs uv resolves :func:`requirements` to for ``python_version`` on manylinux x86_64,
    held to ``constraints`` (``name==version`` lines, :func:`lock_constraints`) when given.

    Raises:
        SystemExit: uv is missing or the resolution fails (its message is printed; under constraints, the lock no
            longer satisfies pyproject.toml).
    """
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "requirements.in"
        source.write_text("\n".join(requirements()) + "\n")
        command = [uv, "pip", "compile", str(source), "--python-version", python_version,
                   "--python-platform", "x86_64-manylinux_2_28", "--exclude-newer", AS_OF, "--no-header",
                   "--no-annotate", "--quiet", "--index-url", "https://pypi.org/simple"]  # fmt: skip
        if constraints is not None:
            pinned = Path(scratch) / "lock-constraints.txt"
            pinned.write_text("\n".join(constraints) + "\n")
            command += ["--constraint", str(pinned)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SystemExit(f"rocm_lock: uv did not run ({err}); `make venv` installs it") from None
    if result.returncode != 0:
        why = "the lock's pins no longer satisfy pyproject.toml; run `make lock-rocm`" if constraints else ""
        raise SystemExit(f"rocm_lock: uv could not resolve the ROCm lock {why}:\n{result.stderr[-3000:]}")
    pins = []
    for line in result.stdout.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(";")[0].strip().split("==", 1)
            pins.append((name.lower(), version.strip()))
    return pins


def render(profile: dict[str, str], pins: list[tuple[str, str]]) -> str:
    """The lock file's text for the profile's ROCm version, from PyPI's resolution ``pins``.

    Raises:
        SystemExit: the resolution lacks torch or triton (the ROCm pins are derived from them).
    """
    found = dict(pins)
    missing = [name for name in (*TORCH_TRIPLE, "triton") if name not in found]
    if missing:
        raise SystemExit(f"rocm_lock: the resolution has no {', '.join(missing)}; cannot derive the ROCm pins")
    label = f"+rocm{profile['ROCM_VERSION']}"
    kept = [f"{name}=={version}" for name, version in pins if name not in TORCH_TRIPLE and not CUDA_ONLY.match(name)]
    rocm = [f"{name}=={found[name]}{label}" for name in TORCH_TRIPLE] + [f"triton-rocm=={found['triton']}"]
    header = [
        f"# The ROCm {profile['ROCM_VERSION']} images' lock (Python {profile['PYTHON_VERSION']}, manylinux x86_64).",
        "# Made by `make lock-rocm` (docker/lock/rocm_lock.py): pyproject.toml's dependencies, `gpu` extra and",
        "# build requirements (the image's flash-attn and DeepSpeed builds use them, without build isolation),",
        f"# resolved by uv from PyPI as of {AS_OF}, without what only PyPI's CUDA torch brings (nvidia-*, cuda-*,",
        "# triton); the torch triple and triton-rocm below come from the profile's TORCH_INDEX_URL. Do not edit.",
    ]
    return "\n".join([*header, *sorted(kept, key=str.lower), "# from the ROCm wheel index:", *rocm]) + "\n"


def locks(paths: list[Path]) -> dict[str, dict[str, str]]:
    """The ROCm locks the profiles ``paths`` name, each with the profile values it is made for.

    Raises:
        SystemExit: a profile is invalid or not a ROCm one, or two profiles sharing a lock disagree on its ROCm or
            Python version (the message names the files).
    """
    found: dict[str, dict[str, str]] = {}
    for path in paths:
        problems = validate_profile(path)
        if problems:
            raise SystemExit("rocm_lock: " + "\n  ".join(problems))
        profile = read_profile(path)
        if profile["ROCM_VERSION"] == "none":
            raise SystemExit(f"rocm_lock: {path} is not a ROCm profile (ROCM_VERSION=none); its lock, "
                             f"{profile['LOCK']}, is the CPU environment's: make lock")  # fmt: skip
        first = found.setdefault(profile["LOCK"], {**profile, "_from": str(path)})
        for key in ("ROCM_VERSION", "PYTHON_VERSION"):
            if first[key] != profile[key]:
                raise SystemExit(f"rocm_lock: {path} and {first['_from']} share {profile['LOCK']} but say {key}="
                                 f"{profile[key]} and {first[key]}: give each ROCm version its own lock")  # fmt: skip
    return found


def main(argv: list[str]) -> int:
    """``--write`` each lock, or ``--check`` that each lock is what resolving under its own pins gives (exit 1 and
    a diff if not; the module's docstring says why the check is held to the pins)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    parser.add_argument("--profile", type=Path, action="append", help="a profile (default: every ROCm profile)")
    parser.add_argument("--lock", type=Path, help="with --check and one profile: check this file instead")
    args = parser.parse_args(argv)
    if args.lock and not (args.check and args.profile and len(args.profile) == 1):
        parser.error("--lock goes with --check and exactly one --profile")
    paths = args.profile or [p for p in sorted((REPO / "docker" / "arch").glob("*.env"))
                             if read_profile(p).get("ROCM_VERSION", "none") != "none"]  # fmt: skip
    stale = 0
    for lock, profile in locks(paths).items():
        target = args.lock or REPO / lock
        if args.write:
            text = render(profile, resolve(profile["PYTHON_VERSION"]))
            target.write_text(text)
            print(f"rocm_lock: wrote {lock} ({text.count('==')} pins)")
            continue
        current = target.read_text() if target.is_file() else ""
        text = render(profile, resolve(profile["PYTHON_VERSION"], lock_constraints(current)))
        if current == text:
            print(f"rocm_lock: {target} is what resolving pyproject.toml under its own pins gives")
            continue
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(target),
                                                   "resolved"))  # fmt: skip
        print(f"rocm_lock: {target} is stale; run `make lock-rocm`", file=sys.stderr)
        stale += 1
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
