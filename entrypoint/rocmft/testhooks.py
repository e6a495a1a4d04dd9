"""TEST ONLY: the hooks that let tests replace this machine's GPU probes with recorded results and inject faults
into training (rocmft.worker.faults), held off the production surface.

Production code asks this module, never the environment, for injected probe results (:func:`injected_probes`) and
faults (:func:`fault`). Nothing in the package installs hooks: the one installer is the tests' launcher,
``tests/support/rocmft_under_test.py`` (not shipped in the wheel or the image), which takes ROCMFT_TEST_PROBES and
ROCMFT_FAULT_* out of its own environment, installs them here and then calls :func:`rocmft.cli.main`. In a
production ``rocmft`` nothing is installed, so a user's environment cannot switch a hook on: those variables are
unknown ROCMFT_ settings there and refused (exit 2, :data:`VARIABLES` words the refusal). The faults reach the
worker, a separate process, in run.json (:class:`rocmft.records.RunPolicy`'s ``fault_*``), written by the process
that has them installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# fault name -> its type: a step (1-based, as logged) or seconds (rocmft.worker.faults has what each does)
FAULTS: dict[str, type] = {
    "nan_at_step": int,
    "kill_in_save_at_step": int,
    "slow_final_save_s": float,
    "grad_spike_at_step": int,
    "hang_at_step": int,
}
# The variables the tests' launcher reads; here only to word production's refusal of them (rocmft.config.settings).
VARIABLES = ("ROCMFT_TEST_PROBES", *(f"ROCMFT_FAULT_{name.upper()}" for name in FAULTS))


@dataclass(frozen=True)
class TestHooks:
    """What a test injects.

    Attributes:
        probes: probe id -> the result that replaces that probe (keys devices, allreduce, libs, image, shm_bytes,
            host, device_nodes, shaped as rocmft.facts.probe and the checks record them); empty: probe for real.
        faults: fault name (a key of :data:`FAULTS`) -> its step or seconds, a positive number.

    Raises:
        ValueError: a fault name not in :data:`FAULTS`, or a value that is not a positive number of its type.
    """

    __test__ = False  # not a pytest test class, whatever its name

    probes: dict[str, Any] = field(default_factory=dict)
    faults: dict[str, int | float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.faults.items():
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
            kinds = (int, float) if FAULTS[name] is float else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
                raise ValueError(f"fault {name}: {value!r} is not a positive {FAULTS[name].__name__}")


_installed: TestHooks | None = None


def install(hooks: TestHooks | None) -> None:
    """Make ``hooks`` the process's test hooks (None: none again). Called by the tests' launcher only."""
    global _installed
    _installed = hooks


def installed() -> TestHooks | None:
    """The installed test hooks; None in production."""
    return _installed


def injected_probes() -> dict[str, Any]:
    """The probe results a test injected (probe id -> result); ``{}`` in production."""
    return dict(_installed.probes) if _installed is not None else {}


def fault(name: str) -> int | float | None:
    """The step or seconds of the injected fault ``name`` (a key of :data:`FAULTS`); None when off, as in production.

    Raises:
        KeyError: ``name`` is not a fault (a caller's typo).
    """
    if name not in FAULTS:
        raise KeyError(name)
    return _installed.faults.get(name) if _installed is not None else None


__all__ = ["FAULTS", "VARIABLES", "TestHooks", "fault", "injected_probes", "install", "installed"]
