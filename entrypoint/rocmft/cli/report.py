"""``rocmft report``: (re)write a run's summary, run_summary.md/.png and the report page run_summary.html, from its
files (rocmft.outputs.report, rocmft.outputs.report_page; ``train`` writes them too)."""

from __future__ import annotations

import os

from rocmft.cli.common import given_path
from rocmft.console import say
from rocmft.errors import ConfigError, ExitCode


def register(sub) -> None:
    """Add ``report`` and its argument to the subcommands ``sub``."""
    report = sub.add_parser(
        "report",
        help="write run_summary.md/.png and the report page run_summary.html (loss, "
        "grad norm, lr, tokens/s, memory, checks, plan, settings)",
    )
    report.add_argument("run", nargs="?", help="the run's OUTPUT_DIR (default: the run of these settings)")
    report.set_defaults(handler=run)


def run(args) -> int:
    """Write run_summary.md/.png/.html for the run (argument, else the run of these settings)."""
    from rocmft.config.settings import load_settings
    from rocmft.outputs.export import find_run
    from rocmft.outputs.report import SUMMARY_MD, SUMMARY_PNG, write_summary
    from rocmft.outputs.report_page import SUMMARY_HTML

    run = find_run(given_path(args.run, "rocmft report"), load_settings(os.environ))
    try:
        written = write_summary(run.output_dir)
    except IsADirectoryError as err:  # the write is atomic: the system names its temporary file, not the folder
        folders = [run.output_dir / name for name in (SUMMARY_MD, SUMMARY_HTML, SUMMARY_PNG)
                   if (run.output_dir / name).is_dir()]  # fmt: skip
        raise ConfigError(
            f"{', '.join(map(str, folders or [run.output_dir]))}: a folder where `rocmft report` writes a file.",
            "Move or remove that folder, then run `rocmft report` again.",
        ) from err
    except OSError as err:  # a read-only mount, a full disk, a folder of another user
        raise ConfigError(
            f"The run summary cannot be written into {run.output_dir} ({type(err).__name__}: "
            f"{err.strerror or err}{f': {err.filename}' if err.filename else ''}).",
            "Run `rocmft report` where the run's folder is writable (compose mounts ./saves read-write in `export`: "
            "`docker compose run --rm export report /saves/<run>`).",
        ) from err
    say(
        f"run summary in {written}; the report page, {written.with_name(SUMMARY_HTML)}, opens in any browser offline",
        all_ranks=True,
    )
    return ExitCode.OK
