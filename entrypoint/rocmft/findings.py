"""Findings: what the configuration rules (:mod:`rocmft.validate.rules`) report, all of a phase at once.

A :class:`Finding` is one refusal (``severity`` ``error``) or one warning of a rule, with a stable ``code`` (the
rule's ``<module>.<function>``, e.g. ``ranges.more_ranges``; ``config`` for a refusal outside the rules: the
settings' names and types, the command line, rendering), the message and the fix the user reads, and the settings
the message names (:class:`Setting`: name, value as shown, and where it came from). The rules themselves still
raise :class:`rocmft.errors.ConfigError` and return warning strings; :func:`rocmft.validate.rules.apply` turns them
into findings, and the settings are noted while a rule runs by the one place messages name a setting
(:mod:`rocmft.config.provenance`, through :func:`note`), so no rule has to list them twice.

``rocmft render|check|train --json`` prints them as ``{"findings": [...], "exit_code": 2}`` (:func:`document`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

ERROR, WARNING = "error", "warning"
OUTSIDE_RULES = "config"  # the code of a refusal that no rule made


@dataclass(frozen=True)
class Setting:
    """A setting a finding's message names.

    Attributes:
        name: a training argument by its name (``cutoff_len``), rocmft's own setting or a variable read as it is
            by its variable (``ROCMFT_ZERO_STAGE``, ``WORLD_SIZE``).
        value: the value as the message shows it (as the user wrote it where known); None when not set.
        source: where it came from, the text the source map holds (``LEARNING_RATE``, ``ROCMFT_CONFIG (/x.yaml)``,
            ``the default in train.yaml.j2``); None when not set.
        kind: the source's kind (:class:`rocmft.config.provenance.Kind`'s word: ``environment``,
            ``rocmft_config``, ``command_line_yaml``, ``command_line``, ``template``, ...); None when the source is
            not a training argument's typed one (rocmft's settings and raw variables) or not set.
        text: how the message names it (``CUTOFF_LEN=2048 (set in the environment)``); not part of the JSON.
    """

    name: str
    value: str | None
    source: str | None
    text: str = ""
    kind: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "source": self.source, "kind": self.kind}


@dataclass(frozen=True)
class Finding:
    """One error or warning of a configuration rule (see the module docstring)."""

    code: str
    severity: Literal["error", "warning"]
    message: str
    fix: str = ""
    settings: tuple[Setting, ...] = ()

    def __str__(self) -> str:  # the text of a ConfigError with the same message and remedy
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message, "fix": self.fix,
                "settings": [s.to_json() for s in self.settings]}  # fmt: skip


def document(findings: tuple[Finding, ...] | list[Finding], exit_code: int) -> dict[str, Any]:
    """The JSON document of ``--json``: ``{"findings": [...], "exit_code": n}``."""
    return {"findings": [f.to_json() for f in findings], "exit_code": int(exit_code)}


_NOTED: ContextVar[list[Setting] | None] = ContextVar("rocmft_noted_settings", default=None)


@contextlib.contextmanager
def noting() -> Iterator[list[Setting]]:
    """Collect the settings :func:`note` is told about while the block runs (one rule), in the order named."""
    noted: list[Setting] = []
    token = _NOTED.set(noted)
    try:
        yield noted
    finally:
        _NOTED.reset(token)


def note(name: str, value: Any, source: Any, text: str) -> None:
    """Note that a message names setting ``name`` as ``text``; nothing unless :func:`noting` is active.
    ``source`` is kept as ``str(source)`` (its one rendering) and, for a typed source, its kind."""
    noted = _NOTED.get()
    if noted is not None:
        kind = getattr(getattr(source, "kind", None), "value", None)  # a provenance.Source (the ground floor
        # imports nothing above it, so the type is read, not imported)
        noted.append(Setting(name=str(name), value=None if value is None else str(value),
                             source=None if source is None else str(source), text=text, kind=kind))  # fmt: skip


__all__ = ["ERROR", "OUTSIDE_RULES", "WARNING", "Finding", "Setting", "document", "note", "noting"]
