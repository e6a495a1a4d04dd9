"""Launch: start the worker (one process, or torchrun per rank), stream and save its output, pass signals.

The worker's output goes both to the console and to ``OUTPUT_DIR/rocmft/train.log``, with the values of
any secrets replaced by ``<redacted>``. SIGTERM/SIGINT to rocmft are passed to the worker's process
group; the worker exits 143 (rocmft.errors).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from .errors import ExitCode
from .render import Plan
from .validate import free_port

LOG_FILE = "train.log"


def processes_per_node(plan: Plan) -> int:
    """Local processes the launch starts: 1 without torchrun; with it ROCMFT_NPROC_PER_NODE, else
    NPROC_PER_NODE, else one per visible GPU (at least one)."""
    if plan.launcher != "torchrun":
        return 1
    asked = plan.settings.rocmft.nproc_per_node or os.environ.get("NPROC_PER_NODE")
    return int(asked) if asked else max(plan.device.count, 1)


def worker_command(plan: Plan) -> list[str]:
    """The command line that starts the worker(s) for ``plan``.

    One process: ``python -m rocmft.worker RUN_DIR``. Otherwise torchrun (``python -m torch.distributed.run``)
    with LLaMA-Factory's launcher conventions: NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT from the
    environment, processes per node from :func:`processes_per_node`.
    """
    worker = ["-m", "rocmft.worker", str(plan.run_dir)]
    if plan.launcher != "torchrun":
        return [sys.executable, *worker]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", os.environ.get("NNODES", "1"),
        "--node_rank", os.environ.get("NODE_RANK", "0"),
        "--nproc_per_node", str(processes_per_node(plan)),
        "--master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "--master_port", os.environ.get("MASTER_PORT", str(free_port())),
        *worker,
    ]  # fmt: skip


def _redactor(secrets: list[str]):
    secrets = [s for s in secrets if len(s) >= 4]

    def redact(line: str) -> str:
        for secret in secrets:
            line = line.replace(secret, "<redacted>")
        return line

    return redact


def run_worker(plan: Plan, secrets: dict[str, str]) -> int:
    """Run the worker to the end and return its exit code (an :class:`ExitCode` value)."""
    command = worker_command(plan)
    environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if plan.launcher == "torchrun":
        environ["FORCE_TORCHRUN"] = "1"  # LLaMA-Factory requires it for DeepSpeed
    redact = _redactor(list(secrets.values()))
    log_path = plan.run_dir / LOG_FILE
    print(f"[rocmft] launching: {' '.join(command)}", flush=True)
    proc = subprocess.Popen(
        command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        start_new_session=True,
    )  # fmt: skip
    interrupted = []

    def forward(signum, _frame):
        interrupted.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with Path(log_path).open("a", encoding="utf-8") as log:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = redact(line)
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if code in (ExitCode.OK, ExitCode.NON_FINITE_LOSS, ExitCode.INTERRUPTED):
        return ExitCode(code)
    # killed by the forwarded signal before its handler ran (negative code), or torchrun's own exit on it
    return ExitCode.INTERRUPTED if interrupted else ExitCode.TRAINING_FAILED
