"""What every record of :mod:`rocmft.records` shares: the layout's :data:`VERSION`, the one vocabulary of
statuses and causes (:class:`RunStatus`), and the reading of a JSON object. Ground floor, like
:mod:`rocmft.records`, whose face re-exports these."""

from __future__ import annotations

import enum
import json
from typing import Any

from rocmft.errors import ExitCode

VERSION = 1  # of every record's layout below


class RunStatus(str, enum.Enum):
    """How a run (the manifest's ``status``) or its worker (worker-result.json's ``status``) stands, and what
    stopped a diverging one (``non_finite.cause``, the restart's ``cause``). The value is the word written.

    The manifest says one of RUNNING, FINISHED, NON_FINITE_LOSS (exit 5, a loss spike included), INTERRUPTED,
    FAILED (:func:`run_status`). The worker also says LOSS_SPIKE, COLLECTIVES_HANG (exit 4), and
    ``"stopping (<why>)"`` / ``"interrupted (<why>)"`` (:func:`with_reason`).
    """

    RUNNING = "running"
    FINISHED = "finished"
    NON_FINITE_LOSS = "non-finite loss"  # the loss or the gradient norm is NaN/Inf
    LOSS_SPIKE = "loss spike"  # the loss jumped above ROCMFT_LOSS_SPIKE_FACTOR x its recent median
    GRAD_NORM_SPIKE = "grad-norm spike"  # ROCMFT_GRAD_NORM_SPIKE_FACTOR / ROCMFT_GRAD_NORM_LIMIT, with ..._SPIKE=stop
    COLLECTIVES_HANG = "collectives hang"  # a collective timed out (rocmft.worker.peers.collective_timeout)
    STOPPING = "stopping"
    INTERRUPTED = "interrupted"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__  # f"{RunStatus.FINISHED}" is "finished" on every Python


def with_reason(status: RunStatus, why: str) -> str:
    """``"<status> (<why>)"``: the worker's ``stopping (SIGTERM)``, ``interrupted (SIGINT)``."""
    return f"{status.value} ({why})"


def run_status(code: int) -> RunStatus:
    """The manifest's status for the worker's exit ``code`` (an :class:`~rocmft.errors.ExitCode` value)."""
    return {ExitCode.OK: RunStatus.FINISHED, ExitCode.NON_FINITE_LOSS: RunStatus.NON_FINITE_LOSS,
            ExitCode.INTERRUPTED: RunStatus.INTERRUPTED}.get(code, RunStatus.FAILED)  # fmt: skip


def json_number(value: Any) -> int | float | None:
    """``value`` when it is a JSON number (an int or float, not a bool), else None: a damaged record's value reads
    as missing instead of breaking the arithmetic or number format that uses it."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _json_object(text: str, what: str) -> dict[str, Any]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not a JSON object")
    return data


__all__ = ["VERSION", "RunStatus", "json_number", "run_status", "with_reason"]
