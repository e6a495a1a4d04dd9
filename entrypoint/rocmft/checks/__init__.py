"""Health checks: small, independent, each with an id, a status, the value it measured and a remedy.

A check is a function ``subject -> Outcome`` registered with :func:`check`; its :class:`CheckSubject` is the
frozen plan, the run's probe provider (rocmft.facts.probes: each host or device fact measured at most once) and the
variables the launch adds. :func:`run_checks` runs them in
order, each in its own thread with its own timeout (a check that hangs becomes a ``fail`` with the
timeout named, never a hung entrypoint), skips those named in ``ROCMFT_SKIP_CHECKS`` and those whose
prerequisite failed, and returns the results for the JSON report (``rocmft/checks.json``) and the table.
The design follows AMD Primus' preflight (small checks, hard timeouts, JSON results; DESIGN.md).
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rocmft.errors import ConfigError
from rocmft.facts.probes import Probes

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"


@dataclass
class Outcome:
    """What a check found.

    Attributes:
        status: ``pass``, ``warn``, ``fail`` or ``skip``.
        value: the measured value, short (``"1000 records, p95 312 tokens"``, ``"41.2 GiB free"``).
        message: what it means, naming the file, variable or device.
        remedy: what to do, for ``warn`` and ``fail``.
        data: machine-readable detail for the JSON report.
    """

    status: str
    value: str
    message: str = ""
    remedy: str = ""
    data: dict[str, Any] | None = None


@dataclass
class CheckResult(Outcome):
    """An :class:`Outcome` with the check's id, title and duration (seconds)."""

    id: str = ""
    title: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class CheckSubject:
    """What every check reads, and nothing it may change.

    One record instead of three arguments, so that a check's signature stays ``fn(subject)`` and a check that
    needs one more input later does not change every other check; frozen, so that the only state the checks share
    is the probe provider's memo of measured facts (never the plan).

    Attributes:
        plan: the rendered and written run (rocmft.render.Plan, frozen).
        probes: the run's probe provider (rocmft.facts.probes.Probes): a check reads a host or device fact with
            ``probes.get(id, measure)`` (measured once, recorded in the manifest's ``gpu_probes``), a test's
            injected fact with ``probes.known(id)``.
        launch_environment: the variables the launch adds to the worker's environment
            (rocmft.launch.LaunchSpec.environment: GLOO_SOCKET_IFNAME from the network detection, ...); the
            checks need no more of the launch spec, whose module comes after theirs.
    """

    plan: Any
    probes: Probes = field(default_factory=Probes)
    launch_environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """A registered check: ``fn(subject) -> Outcome`` under ``timeout_s``; skipped when a check in ``needs`` failed."""

    id: str
    title: str
    fn: Callable[[Any], Outcome]
    timeout_s: float
    needs: tuple[str, ...] = ()


REGISTRY: list[Check] = []


def check(id: str, title: str, timeout_s: float = 30.0, needs: tuple[str, ...] = ()):
    """Register ``fn`` as a check, run in registration order."""

    def register(fn: Callable[[Any], Outcome]) -> Callable[[Any], Outcome]:
        REGISTRY.append(Check(id=id, title=title, fn=fn, timeout_s=timeout_s, needs=needs))
        return fn

    return register


def check_ids() -> list[str]:
    """Ids of every registered check."""
    _load_builtin_checks()
    return [c.id for c in REGISTRY]


def validate_skip(skip: list[str]) -> None:
    """Raise a :class:`ConfigError` for ids in ``ROCMFT_SKIP_CHECKS`` that name no check."""
    import difflib

    known = check_ids()
    unknown = [s for s in skip if s not in known]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1)
            hints.append(f"{name}" + (f" (did you mean {close[0]}?)" if close else ""))
        raise ConfigError(
            f"ROCMFT_SKIP_CHECKS names unknown checks: {', '.join(hints)}.",
            f"Use ids from: {', '.join(known)}.",
        )


def _run_one(entry: Check, subject: CheckSubject) -> Outcome:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = entry.fn(subject)
        except Exception as err:  # a crashing check is a failed check, with its error
            box["outcome"] = Outcome(
                FAIL, "error", f"The check itself failed: {type(err).__name__}: {err}",
                "Report this as a rocmft bug, and skip the check with ROCMFT_SKIP_CHECKS to continue.",
            )  # fmt: skip

    thread = threading.Thread(target=target, name=f"check-{entry.id}", daemon=True)
    thread.start()
    thread.join(entry.timeout_s)
    if thread.is_alive():
        return Outcome(
            FAIL, f"timed out after {entry.timeout_s:.0f} s",
            f"The {entry.id} check did not finish in {entry.timeout_s:.0f} s.",
            f"Look for a hung mount or device; skip it with ROCMFT_SKIP_CHECKS={entry.id} only if you know why.",
        )  # fmt: skip
    return box["outcome"]


def run_checks(subject: CheckSubject, skip: list[str]) -> list[CheckResult]:
    """Run every registered check on ``subject`` and return their results in order (ids in ``skip`` are skipped)."""
    _load_builtin_checks()
    results: list[CheckResult] = []
    status_of: dict[str, str] = {}
    value_of: dict[str, str] = {}
    for entry in REGISTRY:
        started = time.monotonic()
        failed_needs = [n for n in entry.needs if status_of.get(n) in (FAIL, SKIP)]
        if entry.id in skip:
            outcome = Outcome(SKIP, "skipped", "Skipped by ROCMFT_SKIP_CHECKS.")
        elif failed_needs:
            # a prerequisite that was skipped says why (net-rendezvous on one node: "one node"), not "did not pass"
            why = [f"{n} ({'skipped: ' + value_of[n] if status_of[n] == SKIP else 'failed'})" for n in failed_needs]
            outcome = Outcome(SKIP, "not run", f"Needs {', '.join(why)}.")
        else:
            outcome = _run_one(entry, subject)
        result = CheckResult(**asdict(outcome), id=entry.id, title=entry.title,
                             seconds=round(time.monotonic() - started, 3))  # fmt: skip
        status_of[entry.id] = result.status
        value_of[entry.id] = str(result.value)
        results.append(result)
    return results


def failed(results: list[CheckResult]) -> list[CheckResult]:
    """The results with status ``fail``."""
    return [r for r in results if r.status == FAIL]


def report(results: list[CheckResult], seconds: float) -> dict[str, Any]:
    """The JSON report: overall status, duration and every result."""
    from rocmft import __version__

    overall = FAIL if failed(results) else WARN if any(r.status == WARN for r in results) else PASS
    return {
        "rocmft_version": __version__,
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "status": overall,
        "seconds": round(seconds, 2),
        "checks": [asdict(r) for r in results],
    }


def print_table(results: list[CheckResult], report_path: Path | None) -> None:
    """Print the results as a table (rich), with each warning's and failure's remedy below it.

    Every text is printed literally (rich.text.Text, markup off): a remedy such as "devices [/dev/kfd, /dev/dri]"
    is not rich markup (read as markup it raised MarkupError: issue 21)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    colors = {PASS: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}
    table = Table(title="rocmft health checks", show_lines=False)
    for column in ("check", "status", "measured", "what it means / what to do"):
        table.add_column(column, overflow="fold")
    for r in results:
        text = r.message + (f"\n→ {r.remedy}" if r.remedy and r.status in (WARN, FAIL) else "")
        table.add_row(Text(r.id), Text(r.status, style=colors.get(r.status, "")), Text(str(r.value)), Text(text))
    console = Console(width=160)
    console.print(table)
    if report_path is not None:
        console.print(f"report: {report_path}", markup=False)


def _load_builtin_checks() -> None:
    from rocmft.checks import host  # noqa: F401, I001  (registers on import: host checks, GPU checks, then the rest)
    from rocmft.checks import gpu  # noqa: F401
    from rocmft.checks import node  # noqa: F401  (RAS, kernel-log faults, GPU families: after the GPU checks)
    from rocmft.checks import compat  # noqa: F401  (driver, ROCm builds, known-bad versions: before `libraries`)
    from rocmft.checks import perf  # noqa: F401  (gpu-perf: after the all-reduce probe, so no probe shares the GPUs)
    from rocmft.checks import system  # noqa: F401
    from rocmft.checks import network  # noqa: F401  (after `fabric`: the multi-node preflight, the rendezvous last)
    from rocmft.checks import trackers  # noqa: F401  (report_to: packages, MLflow store, W&B key; after the host checks)
