#!/usr/bin/env bash
# The pins stage: the flavour's one lock (LOCK: docker/lock/rocm7.2.txt or constraints.txt, the single source of
# truth) split into a constraint file per stage that installs from it, each holding only what that stage installs.
# Each stage COPYs only its own file, and BuildKit keys a COPY by the checksum of what it copies (file contents and
# metadata, not mtime: https://docs.docker.com/build/cache/invalidation/, "General rules"), so a re-pin of a package
# a stage does not install leaves that stage and every stage built FROM it cached (issue 31, finding 2). The full
# lock is copied late, by the stack stage.
#   usage: pins.sh LOCK OUT_DIR     writes OUT_DIR/system.txt, torch.txt, flash-attn.txt (NAME==VERSION lines)
# A name the lock lacks is left out (constraints.txt has no setuptools or wheel; only a cpu image's lock has
# nvidia-*); the step that needs a pin checks for it (lib.sh pin, torch.sh).
set -euo pipefail
lock=$1 out=$2
mkdir -p "$out"
# The NAME==VERSION lines of the lock whose name, normalised (PEP 503: lowercase, runs of -_. as one -; the cpu
# lock spells typing_extensions and Jinja2), matches the extended regex $1 in full
only() {
  awk -F'==' -v names="^($1)\$" 'NF == 2 { n = tolower($1); gsub(/[-_.]+/, "-", n); if (n ~ names) print }' "$lock"
}
# system.sh: the build requirements put into the venv for the builds without build isolation (pyproject.toml's
# [build-system] requires, which docker/lock/rocm_lock.py locks)
only 'setuptools|wheel' >"$out/system.txt"
# torch.sh: the torch triple and what it brings: torch's own requirements (filelock, typing-extensions, setuptools,
# sympy, networkx, jinja2, fsspec; sympy's mpmath, jinja2's markupsafe), torchvision's numpy and pillow, the ROCm
# build's triton-rocm, PyPI's CUDA build's triton, nvidia-* and cuda-*, and packaging (the cpu image's torch brought
# it: torch.sh's check, 2026-12-05). torch.sh fails, naming it, when torch installs anything this list leaves unpinned.
only 'torch|torchvision|torchaudio|triton|triton-rocm|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+|filelock|typing-extensions|setuptools|sympy|mpmath|networkx|jinja2|markupsafe|fsspec|numpy|pillow|packaging' >"$out/torch.txt"
# flash-attn.sh: flash-attn's setup.py (v2.8.3) imports packaging, setuptools, wheel and torch, and psutil when
# MAX_JOBS is unset; ninja makes torch's extension builder compile in parallel
only 'ninja|packaging|psutil' >"$out/flash-attn.txt"
wc -l "$out"/*.txt
