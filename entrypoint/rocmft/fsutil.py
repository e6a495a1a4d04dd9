"""Atomic file writes: a reader (or a crash) never sees half a file.

Each write goes to a temporary file in the same folder, is flushed to disk, and is renamed over the target
(``os.replace`` is atomic on POSIX file systems). The standard library has no atomic-write helper; the
well-known packages for it (atomicwrites) are unmaintained, hence these few lines.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def make_private_dir_public(path: Path) -> Path:
    """Give a folder made by ``tempfile.mkdtemp`` (mode 0700) the mode a plain ``mkdir`` would have."""
    os.chmod(path, 0o777 & ~_umask())
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating parent folders. Returns ``path``.

    The file gets the mode a plain ``open()`` would give it (0666 minus the umask), not mkstemp's 0600,
    so that the host user can read what the container wrote.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically. Returns ``path``."""
    return atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def replace_dir(staging: Path, final: Path, keep_old_as: Path | None = None) -> None:
    """Move the fully written folder ``staging`` to ``final``, replacing an older ``final``.

    POSIX cannot rename a folder over a non-empty one, so the old folder is first renamed aside and
    removed (or, with ``keep_old_as``, moved there) after the new one is in place: at every moment
    ``final`` is either the old or the new, complete folder, or (for the instant between two renames)
    absent — never a mix.
    """
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}-old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    staging.rename(final)
    if old is not None and keep_old_as is not None:
        keep_old_as.parent.mkdir(parents=True, exist_ok=True)
        old.rename(keep_old_as)
    elif old is not None:
        shutil.rmtree(old, ignore_errors=True)


STALE_STAGING_S = 3600  # a run's preparation stages for seconds and an export's shard writes for minutes


def stale_staging(folder: Path, prefix: str, now: float | None = None) -> list[tuple[Path, int, float]]:
    """The staging folders named ``prefix*`` in ``folder`` that nothing changed for :data:`STALE_STAGING_S`
    seconds: each as (path, bytes, newest change as a Unix time), oldest first. A run killed with SIGKILL (the
    kernel's OOM killer, a node failure, `docker kill`) cannot remove its own; a live one, another rank's or another
    node's on a shared OUTPUT_DIR, changes within seconds. Unreadable entries count as absent. Raises nothing."""
    now = time.time() if now is None else now
    found = []
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    for path in candidates:
        size, newest = 0, 0.0
        for entry in (path, *path.rglob("*")):
            try:
                info = entry.lstat()
            except OSError:
                continue
            size += 0 if stat.S_ISDIR(info.st_mode) else info.st_size
            newest = max(newest, info.st_mtime)
        if now - newest >= STALE_STAGING_S:
            found.append((path, size, newest))
    return sorted(found, key=lambda item: item[2])


def stale_staging_notes(folder: Path, prefix: str, what: str) -> list[str]:
    """A warning's text for each :func:`stale_staging` folder in ``folder``, with the command that removes it:
    rocmft never deletes one itself (a staging folder belongs to whichever process made it). ``what`` says what
    they would have become (``a run's files``, ``an export to <folder>``). A break-it trial (2026-12-06) found a
    SIGKILLed render's folder staying in OUTPUT_DIR with no word; an export's is a hidden merged model of GBs."""
    notes = []
    for path, size, newest in stale_staging(folder, prefix):
        shown = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(newest))
        notes.append(f"{path} ({shown}, last changed {when}) is the staging folder of {what} that was killed before "
                     "it could clean up (SIGKILL, the OOM killer, a lost node); nothing uses it. Remove it: "
                     f"rm -rf {shlex.quote(str(path))}")  # fmt: skip
    return notes


def default_cache_dir() -> Path:
    """rocmft's cache folder when ROCMFT_CACHE_DIR is unset: ``$XDG_CACHE_HOME/rocmft`` or ``~/.cache/rocmft``
    (the XDG base directory convention)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rocmft"


def write_error(folder: Path) -> str:
    """'' when a file can be created in ``folder`` (made with its parents if missing; the test file is removed),
    else the error as ``"<OSError subclass>: <strerror>"``, for a check's measured value."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".rocmft-write-test-"):
            pass
    except OSError as err:
        return folder_error(folder, err)
    return ""


NOT_A_FOLDER = "not a folder"  # in :func:`folder_error`'s text when a file or device is in the way


def not_a_folder_fix(variable: str) -> str:
    """The fix for a :func:`folder_error` that says :data:`NOT_A_FOLDER`, for the setting ``variable`` names."""
    return f"Set {variable} to a folder (or a path where one can be made), not a file or a device."


DANGLING_LINK = "a symbolic link to nothing"  # in :func:`folder_error`'s text when a link on the path leads nowhere


def folder_fix(variable: str, error: str) -> str | None:
    """The fix for a :func:`folder_error` text ``error`` of the setting ``variable`` when it names what is in the way
    (a file or device: :func:`not_a_folder_fix`; a symbolic link to nothing), else None: the caller's own (a
    permission or a volume)."""
    if NOT_A_FOLDER in error:
        return not_a_folder_fix(variable)
    if DANGLING_LINK in error:
        return (f"Make the folder that link points to (a volume that is not mounted?), or set {variable} to a "
                "folder that exists or can be made.")  # fmt: skip
    return None


def folder_error(folder: Path, err: OSError) -> str:
    """Why ``folder`` could not be made or written, for a message: the file or device on its path that is in the way
    (``/dev/null is a device or socket, not a folder``; errno alone said "FileExistsError" for OUTPUT_DIR=/dev/null,
    a break-it trial, 2026-12-05), a symbolic link on it whose target does not exist (``saves`` linked to a volume
    that is not mounted: mkdir says "File exists", and the message sent root to change the folder's owner, a
    break-it trial, 2026-12-06), else ``"<OSError subclass>: <strerror>"``."""
    dangling = next((p for p in (folder, *folder.parents) if os.path.islink(p) and not os.path.exists(p)), None)
    if dangling is not None:
        return f"{dangling} is {DANGLING_LINK}: its target {os.readlink(dangling)} does not exist"
    blocking = next((p for p in (folder, *folder.parents) if os.path.exists(p) and not os.path.isdir(p)), None)
    if blocking is not None:
        return f"{blocking} is {'a file' if os.path.isfile(blocking) else 'a device or socket'}, {NOT_A_FOLDER}"
    return f"{type(err).__name__}: {err.strerror or err}"
