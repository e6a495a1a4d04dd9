"""The health checks' report, ``RUN_DIR/checks.json``: written by ``rocmft check`` and ``rocmft train``
(rocmft.checks.report, one object per rocmft.checks.CheckResult), read back by the run report page
(rocmft.outputs.report_page) through :func:`read_checks_report`. Re-exported by :mod:`rocmft.records`. Ground
floor: nothing of rocmft is imported here but the ground floor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmft.records_common import _json_object, json_number

CHECKS_FILE = "checks.json"  # RUN_DIR/checks.json


@dataclass(frozen=True)
class CheckRow:
    """One check's line of the report (rocmft.checks.CheckResult as written): ``id``, ``title``, ``status``
    (``pass``, ``warn``, ``fail``, ``skip``), the measured ``value``, what it means (``message``), what to do
    (``remedy``) and how long it took (``seconds``)."""

    id: str
    status: str
    value: str = ""
    message: str = ""
    remedy: str = ""
    title: str = ""
    seconds: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckRow:
        """Raises KeyError without ``id`` or ``status``; TypeError when ``data`` is not an object."""
        text = {key: str(data.get(key) or "") for key in ("value", "message", "remedy", "title")}
        return cls(str(data["id"]), str(data["status"]), **text, seconds=json_number(data.get("seconds")))


@dataclass(frozen=True)
class ChecksReport:
    """``checks.json``: the overall ``status`` (``pass``, ``warn`` or ``fail``), the checks' ``seconds``, the
    rocmft that ran them, when they finished (ISO 8601, UTC) and every check's :class:`CheckRow`, in order."""

    status: str | None = None
    seconds: float | None = None
    rocmft_version: str | None = None
    finished_at: str | None = None
    checks: tuple[CheckRow, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChecksReport:
        """Raises ValueError when ``checks`` is not a list of check objects."""
        try:
            rows = tuple(CheckRow.from_json(row) for row in data.get("checks") or ())
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a checks report: {type(err).__name__}: {err}") from err
        text = {k: (str(data[k]) if data.get(k) is not None else None) for k in ("status", "rocmft_version",
                                                                               "finished_at")}  # fmt: skip
        return cls(**text, seconds=json_number(data.get("seconds")), checks=rows)


def read_checks_report(run_dir: Path) -> ChecksReport | None:
    """The checks' report in RUN_DIR; None when there is none (checks skipped, or a run of an older rocmft), or it
    cannot be read, or it is not a report."""
    try:
        return ChecksReport.from_json(_json_object((Path(run_dir) / CHECKS_FILE).read_text(), CHECKS_FILE))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested deeper than the parser goes
        return None


__all__ = ["CHECKS_FILE", "CheckRow", "ChecksReport", "read_checks_report"]
