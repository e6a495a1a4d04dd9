"""``rocmft status``: is the run making progress (the compose healthcheck); exit 0 yes, 1 no."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from rocmft.cli.common import MANIFEST_FILE, current_run_pointer, given_path
from rocmft.errors import ConfigError, ExitCode


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
    folder. Progress is the age of worker-result.json, which the worker rewrites at every logging step.
    Reads two small files and losses.jsonl (the last loss; ~0.1 s after 50,000 logged steps): fast enough for a
    healthcheck every minute.
    """
    from rocmft.records import RunStatus, WorkerResult, read_manifest, read_worker_result, worker_result_path
    from rocmft.render import RUN_SUBDIR

    if given_path(args.output_dir, "rocmft status"):
        given = Path(args.output_dir)
        run_dir = given / RUN_SUBDIR if (given / RUN_SUBDIR / MANIFEST_FILE).is_file() else given
    elif current_run_pointer().is_file():
        try:  # one line rocmft train wrote; a damaged one (not UTF-8, a name too long) is no run
            run_dir = Path(current_run_pointer().read_text(encoding="utf-8").strip())
            (run_dir / MANIFEST_FILE).is_file()
        except (OSError, ValueError) as err:
            print(f"no run: {current_run_pointer()} cannot be read ({err}); pass the run's OUTPUT_DIR")
            return ExitCode.UNHEALTHY
    else:
        print("no run: nothing started `rocmft train` here; pass the run's OUTPUT_DIR")
        return ExitCode.UNHEALTHY
    manifest_path, result_path = run_dir / MANIFEST_FILE, worker_result_path(run_dir)
    try:
        manifest = read_manifest(manifest_path)
    except ConfigError as err:
        nested = Path(args.output_dir) / RUN_SUBDIR / MANIFEST_FILE if args.output_dir is not None else manifest_path
        where = f"{manifest_path}" if nested == manifest_path else f"{nested} (or {manifest_path})"
        print(f"no run: cannot read {where} ({err.__cause__ or err})")
        return ExitCode.UNHEALTHY
    result = read_worker_result(run_dir)
    try:
        age = time.time() - result_path.stat().st_mtime
    except OSError:
        result = None
    if result is None:  # no record (yet): the run's age is the manifest's
        result, age = WorkerResult(), time.time() - manifest_path.stat().st_mtime
    status = manifest.status
    step, total = result.last_step, result.max_steps
    where = f"step {step}/{total}" if step is not None else "no step logged yet"
    loss = f", loss {result.losses[-1].loss:.4f}" if result.losses else ""
    if status != RunStatus.RUNNING:
        print(f"{status}: {where}{loss} (exit code {manifest.exit_code}; {run_dir})")
        return ExitCode.OK if status == RunStatus.FINISHED else ExitCode.UNHEALTHY
    limit = args.max_idle if step is not None else args.max_start
    state = "running" if age <= limit else "stalled"
    print(f"{state}: {where}{loss}, last update {age:.0f} s ago (limit {limit:.0f} s; {run_dir})")
    return ExitCode.OK if state == "running" else ExitCode.UNHEALTHY
