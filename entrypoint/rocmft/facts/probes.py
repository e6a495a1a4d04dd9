"""The run's probe provider: every host and device fact a later stage measures, measured at most once.

One :class:`Probes` is made where a command starts (rocmft.cli.common), seeded with the device probe's result and
with the results a test injected (rocmft.testhooks.injected_probes; empty in production). The health checks and the
launch read facts through it (:meth:`Probes.get` measures a fact the first time it is asked for and keeps it;
:meth:`Probes.known` reads one without measuring), and the manifest records :meth:`Probes.snapshot`, a read-only
copy of what was measured or injected. Nothing writes facts into the plan.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

T = TypeVar("T")


class Probes:
    """Facts by id (``"devices"``, ``"image"``, ``"host"``, ``"allreduce"``, ``"libs"``, ``"kmsg"``, ...), each
    shaped as the code that measures it returns it (rocmft.facts.probe, rocmft.checks).

    Args:
        seeded: facts already measured (the device probe's result as ``"devices"``).
        injected: facts a test put in place of measuring (rocmft.testhooks.injected_probes); they win over
            ``seeded`` and are never measured. Test-only inputs that no probe measures (``node_root``, ``kmsg_now``,
            ``hf_cache``) are read with :meth:`known`.

    Safe to share between the checks' threads: a fact asked for twice at once may be measured twice, and the first
    value kept wins (the checks run one at a time; only a timed-out check's thread can still be measuring).
    """

    def __init__(self, seeded: Mapping[str, Any] | None = None, injected: Mapping[str, Any] | None = None) -> None:
        self._facts: dict[str, Any] = {**(seeded or {}), **(injected or {})}
        self._lock = threading.Lock()

    def get(self, key: str, measure: Callable[[], T]) -> T:
        """The fact ``key``: the one kept, else ``measure()``'s result, kept for every later reader. Exceptions of
        ``measure`` propagate and nothing is kept."""
        with self._lock:
            if key in self._facts:
                return self._facts[key]
        value = measure()
        with self._lock:
            return self._facts.setdefault(key, value)

    def known(self, key: str, default: Any = None) -> Any:
        """The fact ``key`` when seeded, injected or measured already, else ``default``; never measures."""
        with self._lock:
            return self._facts.get(key, default)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._facts

    def snapshot(self) -> Mapping[str, Any]:
        """A read-only copy of every fact kept so far, in the order they came (seeded, injected, measured): the
        manifest's ``gpu_probes`` (less the image's build record, recorded as ``image``)."""
        with self._lock:
            return MappingProxyType(dict(self._facts))


__all__ = ["Probes"]
