"""``rocmft train``: render, validate, check, then the worker; writes the manifest, the weights, the logs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rocmft.cli.common import CHECKS_FILE, MANIFEST_FILE, Workspace, _prepare, _run_checks, _say, current_run_pointer
from rocmft.errors import ExitCode
from rocmft.fsutil import atomic_write_text

if TYPE_CHECKING:
    from rocmft.records import WorkerResult


def register(sub) -> None:
    """Add ``train`` to the subcommands ``sub``."""
    sub.add_parser("train", help="render, validate, check, then train").set_defaults(handler=run)


def run(_args) -> int:
    """Render, validate, check, train; the worker's exit code (rocmft.errors.ExitCode), after at most one
    automatic restart in real fp32 on a non-finite loss (ROCMFT_ON_NAN=fp32)."""
    from rocmft.launch import run_worker
    from rocmft.outputs.manifest import now, write_manifest
    from rocmft.records import read_worker_result, run_status

    started_at = now()
    workspace, timings = Workspace(), {}
    try:
        plan = _prepare(workspace, timings, keep_validator=True)
        checks = _run_checks(plan, workspace, timings)
        workspace.promote(plan.run_dir)
    except BaseException:
        workspace.discard()
        raise
    manifest_path = plan.run_dir / MANIFEST_FILE
    checks_summary = {
        "status": checks["status"],
        "seconds": checks["seconds"],
        "report": str(plan.run_dir / CHECKS_FILE),
    }
    write_manifest(manifest_path, plan, status="running", exit_code=None, timings=timings, checks=checks_summary,
                   worker=None, started_at=started_at)  # fmt: skip
    _say(f"configs and manifest in {plan.run_dir}")
    try:
        atomic_write_text(current_run_pointer(), f"{plan.run_dir}\n")  # for `rocmft status` (the healthcheck)
    except OSError:
        pass  # a read-only temp folder costs only the default of `rocmft status`

    began = time.monotonic()
    code = run_worker(plan, plan.settings.secrets)
    timings["train"] = time.monotonic() - began
    worker = read_worker_result(plan.run_dir)
    status = run_status(code)
    write_manifest(manifest_path, plan, status=status, exit_code=int(code), timings=timings, checks=checks_summary,
                   worker=worker, started_at=started_at)  # fmt: skip
    _write_summary(plan)
    if code == ExitCode.NON_FINITE_LOSS and _restart_in_fp32(plan, worker):
        return run(_args)
    if code == ExitCode.OK:
        losses = [entry.loss for entry in worker.losses] if worker else []
        trend = f", loss {losses[0]:.3f} → {losses[-1]:.3f}" if losses else ""
        _say(f"training finished in {timings['train']:.0f} s{trend}; outputs in {plan.output_dir}")
    else:
        _say(f"training ended with exit code {int(code)} ({status}); see {plan.run_dir / 'train.log'}")
    return code


def _write_summary(plan) -> None:
    """run_summary.md/.png in OUTPUT_DIR (node 0 only); a failure costs only the summary, never the run's code."""
    from rocmft.outputs.report import write_summary
    from rocmft.render import RUN_SUBDIR

    if plan.run_dir.name != RUN_SUBDIR:
        return
    try:
        _say(f"run summary in {write_summary(plan.output_dir)}")
    except Exception as err:  # matplotlib, a full disk: the run's outcome stands
        _say(f"WARNING: the run summary could not be written ({type(err).__name__}: {err})")


def _restart_in_fp32(plan, worker: WorkerResult | None) -> bool:
    """ROCMFT_ON_NAN=fp32: once, restart from the newest complete checkpoint saved before the last finite
    logged loss, with ROCMFT_PRECISION=fp32 (real fp32, rocmft.render.precision); recorded in manifest RESTARTS."""
    import os

    from rocmft.outputs.manifest import RESTARTS
    from rocmft.records import RunStatus, WorkerResult
    from rocmft.render.resume import last_good_checkpoint

    worker = worker or WorkerResult()
    cause = worker.non_finite.cause if worker.non_finite else RunStatus.NON_FINITE_LOSS.value
    if plan.settings.rocmft.on_nan != "fp32" or plan.precision.policy == "fp32":
        return False
    if any(r["cause"] == cause for r in RESTARTS):  # at most one automatic restart per cause
        return False
    checkpoint = last_good_checkpoint(plan.output_dir, worker.loss_dicts())
    RESTARTS.append({"cause": cause, "at_step": worker.non_finite.step if worker.non_finite else None,
                     "from_checkpoint": str(checkpoint) if checkpoint else None,
                     "precision": {"from": plan.precision.policy, "to": "fp32"}})  # fmt: skip
    os.environ["ROCMFT_PRECISION"] = "fp32"
    os.environ["ROCMFT_RESUME"] = str(checkpoint) if checkpoint else "never"
    _say(f"ROCMFT_ON_NAN=fp32: restarting in real fp32 from {checkpoint or 'step 0 (no checkpoint before the NaN)'}")
    return True
