"""CPU-seconds of one `rocmft train` of the built-in default, per process, at one or more commits (not a test).

Run from the repository root (CPU is enough)::

    python bench/run_cpu.py --out DIR [--repeat 3] [--ref GITREF ...]

Issue 29: on our 2-core machines `make test` is CPU-bound (the clean-clone rehearsal's /proc/stat samples: 2.3% idle
during pytest), and about 150 of its tests start a real `rocmft train`, so what one run costs in CPU-seconds, not
wall time, is what the suite's time is made of. Each repetition runs ``python -m rocmft train`` on the built-in
default (the tiny model and demo data rocmft makes; ``MAX_STEPS=10``) in a clean environment, with a
``sitecustomize`` on PYTHONPATH that appends each Python process's user+system CPU time and command line to a log
at its exit: the entrypoint, the device probe, the parser's process that becomes the worker. ``--ref`` runs the
same at other commits (a detached ``git worktree`` each, its ``entrypoint/`` first on PYTHONPATH, the same .venv);
without it, the working tree. Writes DIR/run_cpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, clean_environment

SITECUSTOMIZE = """
import atexit, json, os, resource, sys, time
_started = time.monotonic()
def _account():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["BENCH_CPU_LOG"], "a") as log:
        log.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[:2], "cpu_s": usage.ru_utime + usage.ru_stime,
                              "wall_s": time.monotonic() - _started}) + "\\n")
atexit.register(_account)
"""


def _role(argv: list[str]) -> str:
    """A process's part in the run, from its command line."""
    text = " ".join(argv)
    if "facts/probe" in text or "facts.probe" in text:
        return "device probe"
    if "rocmft.worker" in text or "validate/child" in text or "validate.child" in text:
        return "parser + worker"
    return "entrypoint" if "rocmft" in text else text[:60]


def run_once(entrypoint: Path, work: Path) -> dict:
    """One `rocmft train` of the built-in default with ``entrypoint`` (a folder holding the ``rocmft`` package) first
    on PYTHONPATH; returns the wall seconds, the exit code and the CPU-seconds per role."""
    log = work / "cpu.jsonl"
    log.unlink(missing_ok=True)
    output = work / "run"
    shutil.rmtree(output, ignore_errors=True)
    env = clean_environment()
    (work / "tmp").mkdir(exist_ok=True)  # its own temp folder: `rocmft train` notes its run there for `rocmft
    # status`, and a note in the system's temp folder outlived the deleted run (a newcomer's trial, 2026-12-05)
    env.update({"PYTHONPATH": f"{work / 'site'}{os.pathsep}{entrypoint}", "BENCH_CPU_LOG": str(log),
                "OUTPUT_DIR": str(output), "MAX_STEPS": "10", "HF_HUB_OFFLINE": "1",
                "TMPDIR": str(work / "tmp")})  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rocmft", "train"], env=env, cwd=work, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=900)  # fmt: skip
    wall = time.monotonic() - started
    roles: dict[str, float] = {}
    for line in log.read_text().splitlines() if log.is_file() else []:
        record = json.loads(line)
        role = _role(record["argv"])
        roles[role] = roles.get(role, 0.0) + record["cpu_s"]
    return {
        "exit": done.returncode,
        "wall_s": round(wall, 2),
        "cpu_s": {k: round(v, 2) for k, v in roles.items()},
        "cpu_total_s": round(sum(roles.values()), 2),
        "tail": done.stdout[-400:] if done.returncode else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ref", action="append", default=[], help="a commit to measure (repeatable)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rocmft-runcpu-"))
    (work / "site").mkdir()
    (work / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    targets = [("working tree", REPO / "entrypoint")]
    for ref in args.ref:
        tree = work / f"tree-{len(targets)}"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref], check=True,
                       capture_output=True)  # fmt: skip
        targets.append((ref, tree / "entrypoint"))
    results = []
    try:
        run_once(targets[0][1], work)  # warm the page cache, the tiny model and the vocabulary cache
        for repeat in range(args.repeat):
            for name, entrypoint in targets:  # interleaved, so that a busy moment hits every commit alike
                result = {"target": name, "repeat": repeat, **run_once(entrypoint, work)}
                results.append(result)
                print(f"{name:>14}  #{repeat}  exit {result['exit']}  wall {result['wall_s']:6.2f} s  "
                      f"CPU {result['cpu_total_s']:6.2f} s  {result['cpu_s']}", flush=True)  # fmt: skip
    finally:
        for _name, entrypoint in targets[1:]:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(entrypoint.parent)],
                           capture_output=True)  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)
    (out / "run_cpu.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
