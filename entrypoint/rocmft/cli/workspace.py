"""The staging workspace of the commands that prepare a run (``train``, ``check``, ``render``): the folder the run's
files are written to first, moved into place only when everything passed, and removed, with the OUTPUT_DIR the
run created, on any failure or stop."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

from rocmft.console import say, warn
from rocmft.errors import ConfigError
from rocmft.fsutil import folder_error, make_private_dir_public, stale_staging_notes
from rocmft.records import MANIFEST_FILE, read_manifest
from rocmft.stopsignals import StopOnSignals

STAGING_PREFIX = ".rocmft-staging-"  # in OUTPUT_DIR; hidden, and on the same file system as the run folder


class Workspace:
    """Owns the staging folder and undoes everything on failure; a context manager for the preparation.

    The staging folder is made inside OUTPUT_DIR (same file system, so the final move is a rename). When
    OUTPUT_DIR cannot be written, it is made in the system temp folder instead and the ``output`` check
    reports the real problem. :meth:`discard` removes the staging folder, and OUTPUT_DIR too when this
    run created it and left it empty.

    ``with Workspace() as workspace:`` stops the preparation on the first SIGTERM or SIGINT (KeyboardInterrupt: exit
    143, rocmft.cli.main) instead of dying with the folder half-written, and discards the workspace when the block
    ends with an exception (rocmft.stopsignals.StopOnSignals: later signals are ignored, and none cuts
    :meth:`make_staging` or :meth:`discard` short). A signal that comes during the clean-up is dropped, so the run
    ends with its own error: a refusal's 2, which the Slurm template reports as the job's code. Slurm sends SIGTERM
    when another task of the job failed (srun --kill-on-bad-exit) or on scancel.
    """

    def __init__(self) -> None:
        self.staging: Path | None = None
        self.created: list[Path] = []
        self.unwritable: str | None = None  # why OUTPUT_DIR could not hold the staging folder
        self._signals = StopOnSignals("before training began")

    def __enter__(self) -> Workspace:
        self._signals.__enter__()
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if kind is not None:
                self.discard()
        finally:
            self._signals.__exit__(kind, error, trace)

    def make_staging(self, output_dir: Path) -> Path:
        """Create the staging folder in ``output_dir`` (and ``output_dir`` with its missing parents, noted for
        :meth:`discard`); the temp folder when that fails (:attr:`unwritable` says why). Returns the folder.

        Raises:
            KeyboardInterrupt: a stop signal came while it was made (after it is recorded, so discard removes it).
        """
        with self._signals.held():
            try:
                missing = [p for p in [output_dir, *output_dir.parents] if not p.exists()]
                output_dir.mkdir(parents=True, exist_ok=True)
                self.created = sorted(missing, key=lambda p: len(p.parts), reverse=True)
                self.staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=output_dir))
                make_private_dir_public(self.staging)
            except OSError as err:
                if self.staging is not None:  # made, but its mode could not be set: not used
                    shutil.rmtree(self.staging, ignore_errors=True)
                self.unwritable = folder_error(output_dir, err)
                self.staging = Path(tempfile.mkdtemp(prefix="rocmft-staging-"))
        if self.unwritable is None:  # outside the held block: a stop during this walk of OUTPUT_DIR is not delayed
            for note in stale_staging_notes(output_dir, STAGING_PREFIX, "a run's files"):
                warn(note)
        return self.staging

    def discard(self) -> None:
        """Remove the staging folder, then each folder this run created, deepest first, while it is empty."""
        with self._signals.held(then_stop=False):
            if self.staging is not None:
                shutil.rmtree(self.staging, ignore_errors=True)
                self.staging = None
            for folder in self.created:
                try:
                    folder.rmdir()
                except OSError:
                    break

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
        with self._signals.held():  # between replace_dir's two renames the run folder is absent: not cut there
            replace_dir(self.staging, run_dir, keep_old_as=keep)
            self.staging = None
