"""The automatic changes rocmft makes to a launch, said on the console and recorded, one record type for all.

Every value rocmft sets that the user did not (a variable it adds to the workers' environment: RCCL/NCCL network
settings, node-local caches, FORCE_TORCHRUN, a full node's tuning, the safe collectives fallbacks; a training
argument the planner, the precision policy, the resume decision or a restart set) is one :class:`Change`. The
launch spec holds them all (rocmft.launch.LaunchSpec.changes, built by rocmft.launch.changes), the manifest records
them (``launch.changes``, :meth:`Change.as_dict`), and :func:`say_changes` prints the same records as one block
before the checks and training: the console and the manifest read one list, never two.

A new automatic action plugs in by producing a :class:`Change` where its value is decided: a variable added in
rocmft.launch.spec.build_launch_spec goes through its ``added.add(name, value, why, source)``; a training argument
set with a :class:`rocmft.config.provenance.Source` of kind PLAN or RESTART (or the ROCMFT decisions listed in
rocmft.launch.changes) becomes one by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rocmft.console import say

REDACTED = "<redacted>"
HEADER = "automatic changes to the launch (recorded in the manifest's launch.changes):"
NONE_LINE = "automatic changes to the launch: none"


@dataclass(frozen=True)
class Change:
    """One automatic change.

    Attributes:
        variable: the name as the user would set it: an environment variable (``NCCL_SOCKET_IFNAME``), or a
            training argument in its UPPER_SNAKE_CASE variable form (``PER_DEVICE_TRAIN_BATCH_SIZE``).
        value: the value as set, as text (``<redacted>`` for a secret: :attr:`secret`).
        why: the reason, in words (what it fixes or avoids).
        source: who decided it (``rocmft plan``, ``network detection (rocmft.facts.netenv)``,
            ``the restart after a collectives hang at step 20``...).
        secret: whether the value is a credential; never printed or recorded (the value is replaced when made).
    """

    variable: str
    value: str
    why: str
    source: str
    secret: bool = False

    def __post_init__(self) -> None:
        if self.secret and self.value != REDACTED:
            object.__setattr__(self, "value", REDACTED)

    def line(self) -> str:
        """``<VARIABLE>=<value>: <why> (<source>)``, the console's line."""
        return f"{self.variable}={self.value}: {self.why} ({self.source})"

    def as_dict(self) -> dict[str, str]:
        """The manifest's entry: ``{variable, value, why, source}``."""
        return {"variable": self.variable, "value": self.value, "why": self.why, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Change:
        """The change of an :meth:`as_dict` object. Raises KeyError on another shape."""
        return cls(str(data["variable"]), str(data["value"]), str(data["why"]), str(data["source"]))


def change_lines(changes: Iterable[Change]) -> list[str]:
    """The block :func:`say_changes` prints, one string per line (without the ``[rocmft]`` prefix): the header and
    one indented :meth:`Change.line` each, or the one line saying there are none."""
    changes = list(changes)
    if not changes:
        return [NONE_LINE]
    return [HEADER, *(f"  {change.line()}" for change in changes)]


def say_changes(changes: Iterable[Change]) -> None:
    """Print :func:`change_lines`, once per node (rocmft.console.is_first_rank: each node's entrypoint, or a
    node's first Slurm task; nodes may differ, the tasks of one node do not)."""
    for text in change_lines(changes):
        say(text)


__all__ = ["HEADER", "NONE_LINE", "REDACTED", "Change", "change_lines", "say_changes"]
