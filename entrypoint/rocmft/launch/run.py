"""The launch, run: start the worker as a :class:`~rocmft.launch.spec.LaunchSpec` says, stream and save its
output (secrets redacted), pass signals, and turn its end into rocmft's exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from rocmft.console import say
from rocmft.errors import ExitCode
from rocmft.launch.spec import LaunchSpec

LOG_FILE = "train.log"


def _redactor(secrets: list[str]):
    secrets = [s for s in secrets if len(s) >= 4]

    def redact(line: str) -> str:
        for secret in secrets:
            line = line.replace(secret, "<redacted>")
        return line

    return redact


def graceful_stop_targets(pid: int, launcher: str) -> list[int]:
    """The processes a first SIGTERM/SIGINT is forwarded to: the ones that turn it into a stop at the next
    optimizer step with a checkpoint (rocmft.worker). That is the worker ``pid`` itself, or under torchrun its
    ranks (torchrun's own children; empty while it has started none).

    Not the process group: DataLoader worker processes (DATALOADER_NUM_WORKERS, 2 by default) die on SIGTERM,
    and the trainer then raises "DataLoader worker (pid N) is killed by signal: Terminated" mid-step, so a
    two-GPU run on 2 x H200 stopped with no checkpoint (BENCHMARKS.md, stop-resume). Nor torchrun: signalled,
    it shuts its ranks down and kills them 30 s later, whatever a checkpoint still needs.
    """
    if launcher != "torchrun":
        return [pid]
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def graceful_stop_recorded(run_dir: Path) -> bool:
    """Whether this node's worker record (RUN_DIR/worker-result.json) says training stopped early at a step
    boundary with a checkpoint (rocmft.worker: a signal here, or on another rank)."""
    from rocmft.records import read_worker_result

    result = read_worker_result(run_dir)
    return result is not None and result.stopped_at_step is not None


def _block_stop_signals() -> None:
    """In torchrun's process, before exec: SIGTERM and SIGINT blocked (the mask survives exec, and Python's
    signal.signal does not unblock). A scheduler signals every process of the step (Slurm's scancel --signal and
    preemption, through proctrack), and torchrun answers a SIGTERM by shutting its ranks down, SIGKILL 30 s later
    (torch.distributed.elastic's PContext.close), whatever a checkpoint still needs; rocmft signals the ranks itself
    (:func:`graceful_stop_targets`), and each rank unblocks them (rocmft.worker.main)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


_STOPPED_AT_ONCE = (
    "stopped at once (a second signal, or a signal before training began): no checkpoint of the step in "
    "progress was written, and DataLoader errors above are this stop, not a crash. The next `rocmft train` with the "
    "same settings resumes from the newest complete checkpoint in OUTPUT_DIR, if there is one."
)


def run_spec(spec: LaunchSpec, run_dir: Path, launcher: str, secrets: Mapping[str, str]) -> int:
    """Run the worker as ``spec`` says for the run in ``run_dir`` (``launcher``: rocmft.facts.job.LAUNCHERS) and
    return its exit code (an :class:`~rocmft.errors.ExitCode` value); ``secrets`` (name -> value) are redacted
    from what is shown and saved in ``run_dir/train.log``."""
    command = list(spec.command)
    environ = spec.process_environment(os.environ)
    redact = _redactor(list(secrets.values()))
    log_path = run_dir / LOG_FILE
    interrupted: list[int] = []
    started: list[subprocess.Popen] = []  # the worker, once it runs

    def forward(signum, _frame):
        interrupted.append(signum)
        if not started:  # it has not started yet, and now will not (below)
            return
        pid = started[0].pid
        targets = graceful_stop_targets(pid, launcher) if len(interrupted) == 1 else []
        try:
            for target in targets:
                os.kill(target, signum)
            if not targets:  # a second signal (stop now), or torchrun has no ranks yet: the whole group
                os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    # installed before the worker starts: a signal meanwhile killed rocmft and left the worker running alone
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    _say_launch(spec, command, launcher)
    from rocmft.validate import take_kept

    kept = take_kept()
    why_not = kept.can_train(command, environ) if kept is not None else "no parser process was kept"
    if interrupted:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if kept is not None:
            kept.cancel()
        say(_STOPPED_AT_ONCE, all_ranks=True)
        return ExitCode.INTERRUPTED
    proc = _start_worker(kept, why_not, command, environ, run_dir, launcher)
    started.append(proc)
    if interrupted:  # arrived while it started: before training, so it stops at once
        try:
            os.killpg(proc.pid, interrupted[0])
        except ProcessLookupError:
            pass
    try:
        code = _stream_output(proc, log_path, redact)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return _exit_code(code, spec, run_dir, bool(interrupted))


def _say_launch(spec: LaunchSpec, command: list[str], launcher: str) -> None:
    """The launch's lines: the job, the command, and for a distributed launcher the NUMA binding, the network notes
    and the communication settings (what rocmft changed was said before the checks: rocmft.changes)."""
    say(f"job: {spec.job.get('description', 'one node')}", all_ranks=True)
    say(f"launching: {' '.join(command)}", all_ranks=True)
    if launcher != "python":
        say(f"NUMA binding: {spec.numa['reason']}", all_ranks=True)
        for note in spec.network_notes:
            say(f"network: {note}", all_ranks=True)
        shown = ", ".join(f"{k}={v['value']} ({v['source']})" for k, v in spec.communication.items())
        say(f"communication settings: {shown or 'library defaults'}", all_ranks=True)


def _start_worker(kept, why_not: str | None, command: list[str], environ: dict[str, str], run_dir: Path,
                  launcher: str) -> subprocess.Popen:  # fmt: skip
    """Start the worker: the kept parser process when it can train (``why_not`` None), else a fresh process in a
    new session (the kept one, if any, cancelled)."""
    if kept is not None and why_not is None:
        say("the worker is the process that validated the configuration (LLaMA-Factory already imported)",
            all_ranks=True)  # fmt: skip
        proc = kept.train(run_dir, environ)
    else:
        if kept is not None:
            say(f"a fresh worker process: {why_not}", all_ranks=True)
            kept.cancel()
        proc = subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True, preexec_fn=_block_stop_signals if launcher == "torchrun" else None,
        )  # fmt: skip
    return proc


def _stream_output(proc: subprocess.Popen, log_path: Path, redact) -> int:
    """Copy the worker's output, redacted, to stdout and the log file until it exits; its exit code."""
    with Path(log_path).open("a", encoding="utf-8") as log:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = redact(line)
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
    return proc.wait()


def _exit_code(code: int, spec: LaunchSpec, run_dir: Path, interrupted: bool) -> int:
    """rocmft's exit code for the worker's ``code``: a graceful stop recorded in ``run_dir`` is INTERRUPTED (OK on a
    Slurm node other than the first), a signal here INTERRUPTED, any other failure TRAINING_FAILED."""
    graceful = graceful_stop_recorded(run_dir)
    if code == ExitCode.OK and graceful:
        if not spec.job.get("is_first") and spec.job.get("engine") == "slurm":
            # srun --kill-on-bad-exit (deploy/slurm/train.sbatch) ends the whole step when one task exits non-zero:
            # a 143 here would kill node 0 while it still writes the final model after the stop. Node 0 reports it.
            say("stopped with a checkpoint; exit 0 so that srun lets the first node finish writing (it exits 143)",
                all_ranks=True)  # fmt: skip
            return ExitCode.OK
        return ExitCode.INTERRUPTED  # torchrun's ranks exit 0 after a graceful stop (rocmft.worker.main)
    if code in (ExitCode.OK, ExitCode.NON_FINITE_LOSS):
        return ExitCode(code)
    if not interrupted and code != ExitCode.INTERRUPTED:
        return ExitCode.TRAINING_FAILED
    if not graceful:
        # the worker was stopped at once: by a second signal (which also kills the DataLoader workers, whose
        # errors then fill the log), or by one that came before training began
        say(_STOPPED_AT_ONCE, all_ranks=True)
    return ExitCode.INTERRUPTED


__all__ = ["LOG_FILE", "graceful_stop_recorded", "graceful_stop_targets", "run_spec"]
