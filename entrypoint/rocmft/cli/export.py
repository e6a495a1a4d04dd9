"""``rocmft export``: merge a finished run's LoRA adapter into its base, as a Hugging Face model folder
(rocmft.outputs.export)."""

from __future__ import annotations

import os

from rocmft.cli.common import given_path
from rocmft.errors import ExitCode


def register(sub) -> None:
    """Add ``export`` and its argument to the subcommands ``sub``."""
    export = sub.add_parser("export", help="merge a finished run's LoRA adapter into its base: a Hugging Face "
                            "model folder in EXPORT_DIR (default OUTPUT_DIR-merged)")  # fmt: skip
    export.add_argument("run", nargs="?", help="the run's OUTPUT_DIR or a checkpoint-N in it (default: the run "
                        "of these settings)")  # fmt: skip
    export.set_defaults(handler=run)


def run(args) -> int:
    """Merge/export the run (argument, else the run of these settings) into EXPORT_DIR (rocmft.outputs.export)."""
    from rocmft.config.settings import load_settings
    from rocmft.outputs.export import export, find_run, plan_export

    settings = load_settings(os.environ)
    plan = plan_export(find_run(given_path(args.run, "rocmft export"), settings), settings)
    export(plan, settings.rocmft.saves_dir)
    return ExitCode.OK
