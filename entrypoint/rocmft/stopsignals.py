"""Stop signals around work that writes a staging folder first (a run's files: rocmft.cli.workspace; an export:
rocmft.outputs.export): the first SIGTERM or SIGINT stops the work, and no signal can cut the folder's creation or
removal short."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignals:
    """``with StopOnSignals(why):`` in the main thread: the first SIGTERM or SIGINT raises
    ``KeyboardInterrupt("signal <n> <why>")`` (rocmft.cli.main: "interrupted", exit 143), later ones are ignored
    until the block ends, and one that comes inside :meth:`held` waits for that block's end. On leaving, the
    handlers from before are back. A signal the process already ignores (nohup; SIGINT in a background job of a
    non-interactive shell) stays ignored; outside the main thread (an embedding program) nothing is installed and
    its own handling stands (signal.signal works in the main thread only).

    Why: a KeyboardInterrupt raised inside ``shutil.rmtree`` leaves the folder half-removed. On Slurm a rank that
    refused its configuration was removing its staging folder when srun's SIGTERM for the first refusing rank came
    (srun --kill-on-bad-exit), and saves/<run>/ kept it (CI of stop 48; a clean-clone rehearsal, 2026-12-06).
    """

    def __init__(self, why: str) -> None:
        self.why = why
        self._before: dict[int, object] = {}
        self._holding = False
        self._held: int | None = None

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                before = signal.getsignal(signum)
                if before in (signal.SIG_DFL, signal.default_int_handler):
                    self._before[signum] = before
                    signal.signal(signum, self._stop)
        return self

    def __exit__(self, *_exc) -> None:
        for signum, before in self._before.items():
            signal.signal(signum, before)
        self._before = {}

    def _stop(self, signum: int, _frame) -> None:
        for handled in self._before:  # once: the stop is under way
            signal.signal(handled, signal.SIG_IGN)
        if self._holding:
            self._held = signum
            return
        raise KeyboardInterrupt(f"signal {signum} {self.why}")

    @contextmanager
    def held(self, then_stop: bool = True) -> Iterator[None]:
        """Run the block whole: a stop signal during it waits for its end, then raises KeyboardInterrupt
        (``then_stop``; the creation of a folder the clean-up must know of) or is dropped (a clean-up that already
        runs because the work is ending, so that the work's own error stands: a refusal's exit 2)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        signum, self._held = self._held, None
        if signum is not None and then_stop:
            raise KeyboardInterrupt(f"signal {signum} {self.why}")
