"""The one printer of rocmft's own lines: ``[rocmft] `` first, flushed at once, from the first rank only.

Under torchrun every rank runs the worker; a line every rank would print identically is printed by the process
whose ``RANK`` is 0 (or unset: one process, the entrypoint itself). Lines about one rank's own failure pass
``all_ranks=True``. Progress lines of commands whose stdout is data (``rocmft chat --json``) go to stderr.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rocmft.values import whole_number

PREFIX = "[rocmft] "


def is_first_rank(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether this process prints the lines every rank would print identically.

    A worker (torchrun sets ``LOCAL_RANK`` and ``RANK`` for every rank, and so does rocmft's task-mode launch):
    rank 0. One of several Slurm tasks on a node (``SLURM_STEP_NUM_TASKS`` > ``SLURM_STEP_NUM_NODES``): the node's
    first task (``SLURM_LOCALID`` 0), so each node prints its own checks once. Else (one process, or one
    entrypoint per node: a PyTorchJob pod's ``RANK`` is the pod's index, not a process rank): yes.
    """
    if "LOCAL_RANK" in environ:
        return environ.get("RANK", "0").strip() in ("", "0")
    tasks, nodes = environ.get("SLURM_STEP_NUM_TASKS", ""), environ.get("SLURM_STEP_NUM_NODES", "")
    if None not in (whole_number(tasks), whole_number(nodes)) and whole_number(tasks) > whole_number(nodes):
        return environ.get("SLURM_LOCALID", "0").strip() in ("", "0")
    return True


def say(message: str, *, stream: TextIO | None = None, all_ranks: bool = False) -> None:
    """Print ``[rocmft] message`` to ``stream`` (stdout by default), on rank 0 only unless ``all_ranks``."""
    if all_ranks or is_first_rank():
        print(f"{PREFIX}{message}", file=stream or sys.stdout, flush=True)


def warn(message: str, *, stream: TextIO | None = None, all_ranks: bool = False) -> None:
    """:func:`say` ``WARNING: message``."""
    say(f"WARNING: {message}", stream=stream, all_ranks=all_ranks)


__all__ = ["PREFIX", "is_first_rank", "say", "warn"]
