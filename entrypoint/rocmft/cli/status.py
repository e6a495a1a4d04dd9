"""``rocmft status``: is the run making progress (the compose healthcheck); exit 0 yes, 1 no."""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rocmft.cli.common import current_run_pointer, given_path
from rocmft.errors import ConfigError, ExitCode
from rocmft.records import MANIFEST_FILE
from rocmft.values import is_count

if TYPE_CHECKING:
    from rocmft.records import WorkerResult


def register(sub) -> None:
    """Add ``status`` and its arguments to the subcommands ``sub``."""
    status = sub.add_parser("status", help="is the run making progress? exit 0 yes (or finished), 1 no")
    status.add_argument("output_dir", nargs="?", help="the run's OUTPUT_DIR (default: the run started here)")
    status.add_argument(
        "--max-idle",
        type=_seconds,
        default=1800.0,
        help="seconds without a logged step before the run counts as stalled (default 1800)",
    )
    status.add_argument(
        "--max-start",
        type=_seconds,
        default=3600.0,
        help="seconds allowed from start to the first logged step: model loading (default 3600)",
    )
    status.set_defaults(handler=run)


def _seconds(text: str) -> float:
    """argparse type: a number of seconds above 0, ``inf`` for no limit (argparse prints the error with the option's
    name and exits 2). ``float`` alone took ``nan`` (every run "stalled": no age is <= NaN) and limits of 0 or less
    (stalled at once): tried as a new user, 2026-12-05.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return seconds


def run(args) -> int:
    """One line on the run's progress; exit 0 when healthy (starting, progressing, finished), 1 when not.

    The run folder is OUTPUT_DIR/rocmft of the given folder, else the one ``rocmft train`` noted in the temp
    folder, when this user's: a /tmp shared by users (a host, Apptainer's default binds) holds the first user's note,
    which the others' `rocmft train` cannot replace (the sticky bit), and their `rocmft status` showed that user's
    run as their own (a break-it trial, 2026-12-06).
    Progress is the age of worker-result.json, which the worker rewrites at every logging step.
    Reads two small files and losses.jsonl (the last loss; ~0.1 s after 50,000 logged steps): fast enough for a
    healthcheck every minute.
    """
    from rocmft.records import RunStatus, json_number, read_manifest, worker_result_path
    from rocmft.render import RUN_SUBDIR

    if given_path(args.output_dir, "rocmft status"):
        given = Path(args.output_dir)
        run_dir = given / RUN_SUBDIR if (given / RUN_SUBDIR / MANIFEST_FILE).is_file() else given
    elif (pointer := current_run_pointer()).is_file():
        if (owner := pointer.stat().st_uid) != os.getuid():
            print(f"no run: {pointer} notes the run of another user's `rocmft train` (uid {owner}), "
                  "not yours; pass the run's OUTPUT_DIR")  # fmt: skip
            return ExitCode.UNHEALTHY
        try:  # one line rocmft train wrote; a damaged one (not UTF-8, a name too long) is no run
            run_dir = Path(pointer.read_text(encoding="utf-8").strip())
            (run_dir / MANIFEST_FILE).is_file()
        except (OSError, ValueError) as err:
            print(f"no run: {pointer} cannot be read ({err}); pass the run's OUTPUT_DIR")
            return ExitCode.UNHEALTHY
    else:
        print("no run: nothing started `rocmft train` here; pass the run's OUTPUT_DIR")
        return ExitCode.UNHEALTHY
    manifest_path, result_path = run_dir / MANIFEST_FILE, worker_result_path(run_dir)
    missing = _missing_run(args.output_dir, run_dir)
    if missing:
        print(missing)
        return ExitCode.UNHEALTHY
    try:
        manifest = read_manifest(manifest_path)
    except ConfigError as err:
        nested = Path(args.output_dir) / RUN_SUBDIR / MANIFEST_FILE if args.output_dir is not None else manifest_path
        where = f"{manifest_path}" if nested == manifest_path else f"{nested} (or {manifest_path})"
        print(f"no run: cannot read {where} ({err.__cause__ or err})")
        return ExitCode.UNHEALTHY
    result, problem = _worker_record(run_dir)
    try:
        age = time.time() - result_path.stat().st_mtime
    except OSError:  # no record (yet): the run's age is the manifest's
        result, problem = None, None
        age = time.time() - manifest_path.stat().st_mtime
    status = manifest.status
    stepped, where = _progress(result, result_path, problem)
    last_loss = json_number(result.losses[-1].loss) if result is not None and result.losses else None
    loss = f", loss {last_loss:.4f}" if last_loss is not None else ""
    if status != RunStatus.RUNNING:
        print(f"{status}: {where}{loss} (exit code {manifest.exit_code}; {run_dir})")
        return ExitCode.OK if status == RunStatus.FINISHED else ExitCode.UNHEALTHY
    limit = args.max_idle if stepped else args.max_start
    state = "running" if age <= limit else "stalled"
    print(f"{state}: {where}{loss}, last update {age:.0f} s ago (limit {limit:.0f} s; {run_dir})")
    return ExitCode.OK if state == "running" else ExitCode.UNHEALTHY


def _missing_run(given: str | None, run_dir: Path) -> str | None:
    """The "no run" line when ``run_dir`` is not there at all, with what to do; None when it is (a damaged
    record inside is read_manifest's to name). A folder given that does not exist printed the bare errno, and the
    temp folder's note of an earlier `rocmft train` whose run was deleted since named that run with no word on why
    (a newcomer's trial, 2026-12-05)."""
    if run_dir.exists():
        return None
    if given is not None:
        return (f"no run: {given} does not exist here; pass the OUTPUT_DIR a `rocmft train` wrote to (as this machine "
                "or container sees it, e.g. saves/<run>)")  # fmt: skip
    return (f"no run: {current_run_pointer()} notes {run_dir}, the run of an earlier `rocmft train`, which no longer "
            "exists; pass the run's OUTPUT_DIR")  # fmt: skip


def _worker_record(run_dir: Path) -> tuple[WorkerResult | None, str | None]:
    """``(WorkerResult or None, problem)``: the worker's record; None and no problem when there is no file (the
    worker has not started training); None and ``"cannot be read: <why>"`` when the file is there but is no
    record (cut short, not JSON, not an object: a worker writes whole records, atomically)."""
    from rocmft.records import load_worker_result

    try:
        return load_worker_result(run_dir), None
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as err:
        return None, f"cannot be read: {err}"


def _progress(result: WorkerResult | None, path: Path, problem: str | None) -> tuple[bool, str]:
    """``(whether a step was logged, the words for it)``: ``step 12/100``; a record that does not say all of it
    names ``path`` and what it lacks (``step 1 (total unknown: PATH has no max_steps)``, ``step unknown (PATH cannot
    be read: ...)``): a damaged record printed "step 1/None", one cut short "no step logged yet" (a break-it
    trial, 2026-12-05)."""
    if problem is not None:
        return False, f"step unknown ({path} {problem})"
    step, total = (result.last_step, result.max_steps) if result is not None else (None, None)
    if step is None:
        return False, "no step logged yet"
    if not is_count(step):
        return False, f"step unknown ({path} has last_step={step!r}, not a step number)"
    if total is None:
        return True, f"step {step} (total unknown: {path} has no max_steps)"
    if not is_count(total) or total == 0:
        return True, f"step {step} (total unknown: {path} has max_steps={total!r}, not a number of steps)"
    return True, f"step {step}/{total}"
