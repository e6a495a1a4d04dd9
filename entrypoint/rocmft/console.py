"""The one printer of rocmft's own lines: ``[rocmft] `` first, flushed at once, from the first rank only.

Under torchrun every rank runs the worker; a line every rank would print identically is printed by the process
whose ``RANK`` is 0 (or unset: one process, the entrypoint itself). Lines about one rank's own failure pass
``all_ranks=True``. Progress lines of commands whose stdout is data (``rocmft chat --json``) go to stderr.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

PREFIX = "[rocmft] "


def is_first_rank(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether this process is rank 0 of its job (``RANK`` unset or ``0``: torchrun sets it for every rank)."""
    return environ.get("RANK", "0").strip() in ("", "0")


def say(message: str, *, stream: TextIO | None = None, all_ranks: bool = False) -> None:
    """Print ``[rocmft] message`` to ``stream`` (stdout by default), on rank 0 only unless ``all_ranks``."""
    if all_ranks or is_first_rank():
        print(f"{PREFIX}{message}", file=stream or sys.stdout, flush=True)


def warn(message: str, *, stream: TextIO | None = None, all_ranks: bool = False) -> None:
    """:func:`say` ``WARNING: message``."""
    say(f"WARNING: {message}", stream=stream, all_ranks=all_ranks)


__all__ = ["PREFIX", "is_first_rank", "say", "warn"]
