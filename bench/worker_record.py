"""Milliseconds per logged step that rocmft's training callback spends writing the worker record, with n losses
logged already (n = 1,000 / 10,000 / 50,000 by default).

Run from the repository root (CPU only; the rocmft on PYTHONPATH is the one measured)::

    PYTHONPATH=$PWD/entrypoint python bench/worker_record.py [--n 1000 10000 50000] [--steps 20] [--dir DIR]
    PYTHONPATH=$PWD/entrypoint python bench/worker_record.py --ref /work/main   # also a tree (or a commit) before

Each logged step is the callback's own ``on_log`` (rocmft.worker.callbacks: the watchdogs, the progress line,
the record's update and its write on disk), called with a stand-in trainer state on a record that holds n losses
already; the first call after filling it is not timed (it writes the n losses the first time). The figure is the
median over ``--steps`` calls, and the bytes are those of RUN_DIR's files afterwards. With ``--ref`` the same
measurement runs in a child process with PYTHONPATH at the reference tree's ``entrypoint`` (a commit is extracted
with ``git archive`` first) and both tables are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def measure(n: int, steps: int, folder: Path) -> dict:
    """``{"n", "ms_per_step", "record_bytes", "losses_bytes"}`` of ``steps`` logged steps after ``n`` (see the
    module docstring); RUN_DIR is a fresh folder under ``folder``."""
    from rocmft.records import LossRecord, RunPolicy, WorkerResult
    from rocmft.worker.callbacks import _RocmftHooks

    run_dir = Path(tempfile.mkdtemp(prefix=f"n{n}-", dir=folder))
    precision = {"policy": "bf16", "compute_dtype": "bfloat16", "bf16": True, "fp16": False, "reason": "bench"}
    hooks = _RocmftHooks(RunPolicy(precision=precision), run_dir)
    losses = tuple(LossRecord(step, 2.0 + 1.0 / step) for step in range(1, n + 1))
    hooks.result = WorkerResult.start().updated(losses=losses, last_step=n, tokens_seen=n * 512, elapsed_s=1.0)
    state = SimpleNamespace(global_step=n, max_steps=n + steps + 1, is_world_process_zero=True,
                            is_local_process_zero=True, num_input_tokens_seen=n * 512)  # fmt: skip
    args = SimpleNamespace(world_size=1, process_index=0)
    times = []
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        for i in range(steps + 1):
            state.global_step += 1
            state.num_input_tokens_seen += 512
            logs = {"loss": 2.0, "learning_rate": 1e-4, "grad_norm": 1.0}
            started = time.perf_counter()
            hooks.on_log(args, state, None, logs=logs)
            if i:  # the first call writes the n losses the first time
                times.append(time.perf_counter() - started)
    sizes = {name: (run_dir / name).stat().st_size if (run_dir / name).is_file() else 0
             for name in ("worker-result.json", "losses.jsonl")}  # fmt: skip
    return {"n": n, "ms_per_step": round(statistics.median(times) * 1000, 3),
            "record_bytes": sizes["worker-result.json"], "losses_bytes": sizes["losses.jsonl"]}  # fmt: skip


def table(rows: list[dict], title: str) -> str:
    """The rows as a plain text table under ``title``."""
    lines = [title, f"{'n logged':>10} {'ms/step':>10} {'record bytes':>14} {'losses.jsonl bytes':>20}"]
    lines += [f"{r['n']:>10,} {r['ms_per_step']:>10.3f} {r['record_bytes']:>14,} {r['losses_bytes']:>20,}"
              for r in rows]  # fmt: skip
    return "\n".join(lines)


def _reference_tree(ref: str, into: Path) -> Path:
    """The folder of ``ref``: a tree as it is, or a commit of this repository extracted into ``into``."""
    if (Path(ref) / "entrypoint").is_dir():
        return Path(ref)
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref, "entrypoint"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--ref {ref}: neither a folder holding entrypoint/ nor a commit of {repo}")
    archive = archive.stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 50000], help="losses logged already")
    parser.add_argument("--steps", type=int, default=20, help="logged steps timed at each n")
    parser.add_argument("--dir", type=Path, default=None, help="where the run folders go (default: a temp folder)")
    parser.add_argument("--ref", help="a tree (with entrypoint/) or a commit to measure too, as 'before'")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="worker-record-", dir=args.dir) as scratch:
        if args.ref:
            tree = _reference_tree(args.ref, Path(scratch))
            env = {**os.environ, "PYTHONPATH": str(tree / "entrypoint")}
            command = [sys.executable, __file__, "--steps", str(args.steps), "--n", *map(str, args.n)]
            if args.dir:
                command += ["--dir", str(args.dir)]
            subprocess.run(command, env=env, check=True)
        import rocmft

        rows = [measure(n, args.steps, Path(scratch)) for n in args.n]
        print(table(rows, f"rocmft from {Path(rocmft.__file__).parents[1]} (median of {args.steps} logged steps)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
