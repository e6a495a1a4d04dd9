"""The staging workspace of the commands that prepare a run (``train``, ``check``, ``render``): the folder the run's
files are written to first, moved into place only when everything passed, and removed, with the OUTPUT_DIR the
run created, on any failure or stop."""

from __future__ import annotations

import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from rocmft.console import say
from rocmft.errors import ConfigError
from rocmft.fsutil import folder_error, make_private_dir_public
from rocmft.records import MANIFEST_FILE, read_manifest

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Workspace:
    """Owns the staging folder and undoes everything on failure; a context manager for the preparation.

    The staging folder is made inside OUTPUT_DIR (same file system, so the final move is a rename). When
    OUTPUT_DIR cannot be written, it is made in the system temp folder instead and the ``output`` check
    reports the real problem. :meth:`discard` removes the staging folder, and OUTPUT_DIR too when this
    run created it and left it empty.

    ``with Workspace() as workspace:`` (in the main thread) stops the preparation on the first SIGTERM or SIGINT
    (KeyboardInterrupt: exit 143, rocmft.cli.main) instead of dying with the folder half-written; later ones are
    ignored until the block ends. Slurm sends SIGTERM when another task of the job failed (srun
    --kill-on-bad-exit: a configuration every task refuses, refused first by one) or on scancel. A signal never
    interrupts :meth:`make_staging` or :meth:`discard`: it waits for their end. Without that, a clean-clone
    rehearsal (2026-12-06) and CI (stop 48) each left a Slurm rank's staging folder behind, once without its
    run.json and once empty: the rank had refused the configuration itself and was removing its folder when the
    SIGTERM for the first refusing rank arrived, and the KeyboardInterrupt cut the removal short. On leaving the
    block with an exception the workspace is discarded; a signal that came during that clean-up is dropped, so the
    run ends with its own error (a refusal's 2, which the Slurm template reports as the job's code). A SIGTERM or
    SIGINT the parent already ignores (nohup) stays ignored.
    """

    def __init__(self) -> None:
        self.staging: Path | None = None
        self.created: list[Path] = []
        self.unwritable: str | None = None  # why OUTPUT_DIR could not hold the staging folder
        self._handlers: dict[int, object] = {}  # the signals this workspace handles, with the handler before
        self._holding = False  # inside make_staging or discard: a signal waits
        self._held: int | None = None

    def __enter__(self) -> Workspace:
        if threading.current_thread() is threading.main_thread():  # signal.signal works in the main thread only
            for signum in STOP_SIGNALS:
                before = signal.getsignal(signum)
                if before in (signal.SIG_DFL, signal.default_int_handler):
                    self._handlers[signum] = before
                    signal.signal(signum, self._stop)
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is not None:
                self.discard()
        finally:
            for signum, before in self._handlers.items():
                signal.signal(signum, before)
            self._handlers = {}

    def _stop(self, signum: int, _frame) -> None:
        for handled in self._handlers:  # once: the stop is under way
            signal.signal(handled, signal.SIG_IGN)
        if self._holding:
            self._held = signum
            return
        raise KeyboardInterrupt(f"signal {signum} before training began")

    def make_staging(self, output_dir: Path) -> Path:
        """Create the staging folder in ``output_dir`` (and ``output_dir`` with its missing parents, noted for
        :meth:`discard`); the temp folder when that fails (:attr:`unwritable` says why). Returns the folder.

        Raises:
            KeyboardInterrupt: a stop signal came while it was made (after it is recorded, so discard removes it).
        """
        self._holding = True
        try:
            missing = [p for p in [output_dir, *output_dir.parents] if not p.exists()]
            output_dir.mkdir(parents=True, exist_ok=True)
            self.created = sorted(missing, key=lambda p: len(p.parts), reverse=True)
            self.staging = make_private_dir_public(Path(tempfile.mkdtemp(prefix=".rocmft-staging-", dir=output_dir)))
        except OSError as err:
            self.unwritable = folder_error(output_dir, err)
            self.staging = Path(tempfile.mkdtemp(prefix="rocmft-staging-"))
        finally:
            self._holding = False
        if self._held is not None:
            raise KeyboardInterrupt(f"signal {self._held} before training began")
        return self.staging

    def discard(self) -> None:
        """Remove the staging folder, then each folder this run created, deepest first, while it is empty."""
        self._holding = True
        try:
            if self.staging is not None:
                shutil.rmtree(self.staging, ignore_errors=True)
                self.staging = None
            for folder in self.created:
                try:
                    folder.rmdir()
                except OSError:
                    break
        finally:
            self._holding = False

    def promote(self, run_dir: Path) -> None:
        """Move the staged files to ``run_dir``. The record of an earlier training run there (it has a
        manifest) is kept in ``OUTPUT_DIR/rocmft-history/<when it started>/``, never deleted."""
        from rocmft.fsutil import replace_dir

        assert self.staging is not None
        keep = None
        manifest = run_dir / MANIFEST_FILE
        if manifest.is_file():
            try:
                started = read_manifest(manifest).started_at
            except ConfigError:  # a damaged record is kept all the same, under the time now
                started = None
            # a folder name: the manifest's own time (a damaged one, "../x" or 3, gives the time now)
            if not isinstance(started, str) or not re.fullmatch(r"[0-9T:.+\-Z]+", started):
                started = ""
            stamp = (started or time.strftime("%Y-%m-%dT%H:%M:%S")).replace(":", "")
            keep = run_dir.parent / "rocmft-history" / stamp
            while keep.exists():
                keep = keep.with_name(keep.name + "-1")
            say(f"the earlier run's record moves to {keep}", all_ranks=True)
        replace_dir(self.staging, run_dir, keep_old_as=keep)
        self.staging = None
