"""``rocmft train``: render, validate, check, then the worker; writes the manifest, the weights, the logs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rocmft.cli.common import (
    CHECKS_FILE,
    _prepare,
    _run_checks,
    add_config_arguments,
    command_line,
    current_run_pointer,
)
from rocmft.cli.workspace import Workspace
from rocmft.console import say, warn
from rocmft.errors import ExitCode
from rocmft.fsutil import atomic_write_text
from rocmft.records import MANIFEST_FILE, RunStatus, WorkerResult

if TYPE_CHECKING:
    from rocmft.config.cmdline import CommandLine
    from rocmft.config.provenance import Source
    from rocmft.records import Restart


def register(sub) -> None:
    """Add ``train`` to the subcommands ``sub``."""
    add_config_arguments(sub, "train", "render, validate, check, then train").set_defaults(handler=run)


def run(args) -> int:
    """Render, validate, check, train; the worker's exit code (rocmft.errors.ExitCode), after at most one
    automatic restart in real fp32 on a non-finite loss (ROCMFT_ON_NAN=fp32) and one with RCCL's safe fallbacks
    after a collectives hang (ROCMFT_ON_HANG=retry).

    Each attempt is the whole flow again with the restarts so far and rocmft's settings they decide (precision
    fp32, the checkpoint to resume from) as overrides of that attempt's settings, each with its source (the
    restart after a non-finite loss at step N; :attr:`rocmft.config.settings.Settings.overridden`). Nothing is
    written into the process environment, so no rule can take rocmft's decision for the user's (a user's
    BF16=true chose the first attempt's precision, not the restart's). The command line's
    ``[CONFIG.yaml] [key=value ...]`` is parsed once and read by every attempt's settings, above the environment;
    it reaches the parser child and the worker as every training argument does, in the rendered arguments.
    """
    given = command_line(args)
    restarts: list[Restart] = []
    overrides: dict[str, tuple[str, Source]] = {}
    while True:
        code, restart = _attempt(restarts, given, overrides)
        if restart is None:
            return code
        restarts.append(restart)
        overrides = {**overrides, **restart_overrides(restart)}


def restart_overrides(restart: Restart) -> dict[str, tuple[str, Source]]:
    """rocmft's settings a restart decides, with its source ``the restart after a <cause> at step N``: resume from
    its checkpoint (``never``: step 0), and precision fp32 (a non-finite loss) or ROCMFT_COLLECTIVES=safe (a hang)."""
    from rocmft.config.provenance import Kind, Source

    at = f" at step {restart.at_step}" if restart.at_step is not None else ""
    source = Source(Kind.RESTART, f"after a {restart.cause}{at}")
    changed = ("collectives", restart.collectives_to) if restart.collectives_to else ("precision", restart.precision_to)
    return {changed[0]: (changed[1], source), "resume": (restart.from_checkpoint or "never", source)}


def _attempt(restarts: list[Restart], given: CommandLine,
             overrides: dict[str, tuple[str, Source]]) -> tuple[int, Restart | None]:  # fmt: skip
    """One pass of render → validate → check → train with the command line ``given`` and rocmft's ``overrides``
    (:func:`restart_overrides`). Returns the worker's exit code and the restart to make (None: this attempt's
    outcome is the command's)."""
    from rocmft.launch import run_worker
    from rocmft.outputs.manifest import RunOutcome, now, write_manifest
    from rocmft.records import read_worker_result, run_status

    started_at = now()
    timings: dict[str, float] = {}
    with Workspace() as workspace:  # a stop signal while preparing: everything staged is removed, exit 143
        prepared = _prepare(workspace, timings, given, keep_validator=True, overrides=overrides)
        checks = _run_checks(prepared, workspace, timings)
        plan = prepared.plan
        workspace.promote(plan.run_dir)
    manifest_path = plan.run_dir / MANIFEST_FILE
    checks_summary = {
        "status": checks["status"],
        "seconds": checks["seconds"],
        "report": str(plan.run_dir / CHECKS_FILE),
    }
    running = RunOutcome(RunStatus.RUNNING, None, started_at, timings, restarts=tuple(restarts))
    write_manifest(manifest_path, plan, probes=prepared.probes.snapshot(), launch=prepared.launch,
                   checks=checks_summary, outcome=running)  # fmt: skip
    say(f"configs and manifest in {plan.run_dir}", all_ranks=True)
    try:
        atomic_write_text(current_run_pointer(), f"{plan.run_dir}\n")  # for `rocmft status` (the healthcheck)
    except OSError:
        pass  # a read-only temp folder costs only the default of `rocmft status`

    began = time.monotonic()
    code = run_worker(plan, prepared.launch, plan.settings.secrets)
    timings["train"] = time.monotonic() - began
    worker = read_worker_result(plan.run_dir)
    status = run_status(code)
    ended = RunOutcome(status, int(code), started_at, timings, worker, tuple(restarts))
    write_manifest(manifest_path, plan, probes=prepared.probes.snapshot(), launch=prepared.launch,
                   checks=checks_summary, outcome=ended)  # fmt: skip
    _write_summary(plan)
    restart = _restart_after(plan, code, worker, restarts)
    if restart is not None:
        return code, restart
    if code == ExitCode.OK:
        losses = [entry.loss for entry in worker.losses] if worker else []
        trend = (f", loss {losses[0]:.3f} → {losses[-1]:.3f} over {len(losses)} logged steps" if len(losses) > 1
                 else f", loss {losses[0]:.3f} (one logged step)" if losses else "")  # fmt: skip
        say(f"training finished in {timings['train']:.0f} s{trend}; outputs in {plan.output_dir}", all_ranks=True)
    else:
        lost = worker.error if worker and (worker.error or "").startswith("LOST") else None
        say(lost or f"training ended with exit code {int(code)} ({status}); see {plan.run_dir / 'train.log'}",
            all_ranks=True)  # fmt: skip
    return code, None


def _write_summary(plan) -> None:
    """run_summary.md/.png and the report page run_summary.html in OUTPUT_DIR (node 0 only); a failure costs only
    the summary, never the run's code."""
    from rocmft.outputs.report import write_summary
    from rocmft.outputs.report_page import SUMMARY_HTML
    from rocmft.render import RUN_SUBDIR

    if plan.run_dir.name != RUN_SUBDIR:
        return
    try:
        written = write_summary(plan.output_dir)
        say(f"run summary in {written}; report page {written.with_name(SUMMARY_HTML)}", all_ranks=True)
    except Exception as err:  # matplotlib, a full disk: the run's outcome stands
        warn(f"the run summary could not be written ({type(err).__name__}: {err})", all_ranks=True)


def _restart_after(plan, code: int, worker: WorkerResult | None, restarts: list[Restart]) -> Restart | None:
    """The automatic restart this attempt's end calls for, said on the console (None: none): in fp32 after a
    non-finite loss (:func:`_fp32_restart`), with RCCL's safe fallbacks after a hang (:func:`_hang_restart`)."""
    if code == ExitCode.NON_FINITE_LOSS:
        restart = _fp32_restart(plan, worker, restarts)
        if restart is not None:
            where = restart.from_checkpoint or "step 0 (no checkpoint before the NaN)"
            say(f"ROCMFT_ON_NAN=fp32: restarting in real fp32 from {where}", all_ranks=True)
        return restart
    if code == ExitCode.TRAINING_FAILED:
        return _hang_restart(plan, worker, restarts)
    return None


def _hang_restart(plan, worker: WorkerResult | None, restarts: list[Restart]) -> Restart | None:
    """ROCMFT_ON_HANG=retry: after a collective timed out (the worker's record says ``collectives hang``, or
    train.log holds torch's watchdog line: rocmft.worker.peers.collective_timeout), restart once from the newest
    complete checkpoint with ROCMFT_COLLECTIVES=safe (rocmft.launch.changes.SAFE_COLLECTIVES). None, with the
    reason on the console when a hang was seen: no hang, ROCMFT_ON_HANG=stop, a job of several nodes (each node's
    rocmft would decide alone; every node must restart with the same settings), the fallbacks already on, or a
    hang restart already made."""
    from rocmft.launch import LOG_FILE
    from rocmft.records import Restart
    from rocmft.render.resume import newest_complete
    from rocmft.worker.peers import collective_timeout

    worker = worker or WorkerResult()
    log = plan.run_dir / LOG_FILE
    seen = worker.status == RunStatus.COLLECTIVES_HANG.value or (log.is_file() and collective_timeout(_tail(log)))
    if not seen:
        return None
    from rocmft.facts.scheduler import job_layout

    settings = plan.settings.rocmft
    at_step = (worker.last_step or 0) + 1 if worker.status == RunStatus.COLLECTIVES_HANG.value else None
    reasons = (
        (settings.on_hang != "retry", "ROCMFT_ON_HANG=stop; ROCMFT_ON_HANG=retry would restart with RCCL's fallbacks"),
        (any(r.cause == RunStatus.COLLECTIVES_HANG.value for r in restarts), "it restarted once already"),
        (settings.collectives == "safe", "ROCMFT_COLLECTIVES=safe was already on"),
        ((plan.layout or job_layout(plan.settings.environ)).nnodes > 1,
         "a job of several nodes: run every node again with ROCMFT_COLLECTIVES=safe"),
    )  # fmt: skip
    why_not = next((why for applies, why in reasons if applies), None)
    if why_not is not None:
        say(f"a collective timed out; no automatic retry ({why_not})", all_ranks=True)
        return None
    checkpoint = newest_complete(plan.output_dir).checkpoint
    restart = Restart(cause=RunStatus.COLLECTIVES_HANG.value, at_step=at_step,
                      from_checkpoint=str(checkpoint) if checkpoint else None, precision_from=plan.precision.policy,
                      precision_to=plan.precision.policy, collectives_from=settings.collectives,
                      collectives_to="safe")  # fmt: skip
    where = restart.from_checkpoint or "step 0 (no complete checkpoint)"
    say(f"ROCMFT_ON_HANG=retry: a collective timed out; restarting once from {where} with ROCMFT_COLLECTIVES=safe "
        "(RCCL's safe fallbacks, listed with the automatic changes)", all_ranks=True)  # fmt: skip
    return restart


def _tail(path, size: int = 2**20) -> str:
    """The last ``size`` bytes of the file ``path`` as text (a watchdog's line is near the end of a long log)."""
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - size))
        return handle.read().decode("utf-8", errors="replace")


def _fp32_restart(plan, worker: WorkerResult | None, restarts: list[Restart]) -> Restart | None:
    """ROCMFT_ON_NAN=fp32: the restart to make after a non-finite loss, from the newest complete checkpoint saved
    before the last finite logged loss, in real fp32 (rocmft.render.precision); None when the policy is not
    fp32-on-NaN, the run already was fp32, or this cause already restarted once."""
    from rocmft.render.resume import last_good_checkpoint

    worker = worker or WorkerResult()
    cause = worker.non_finite.cause if worker.non_finite else RunStatus.NON_FINITE_LOSS.value
    if plan.settings.rocmft.on_nan != "fp32" or plan.precision.policy == "fp32":
        return None
    if any(r.cause == cause for r in restarts):  # at most one automatic restart per cause
        return None
    checkpoint = last_good_checkpoint(plan.output_dir, worker.loss_dicts())
    from rocmft.records import Restart

    return Restart(
        cause=cause,
        at_step=worker.non_finite.step if worker.non_finite else None,
        from_checkpoint=str(checkpoint) if checkpoint else None,
        precision_from=plan.precision.policy,
    )
