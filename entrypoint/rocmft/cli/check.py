"""``rocmft check``: render, then the health checks; writes the files and checks.json. Never trains."""

from __future__ import annotations

from rocmft.cli.common import _prepare, _run_checks, add_config_arguments, command_line
from rocmft.cli.workspace import Workspace
from rocmft.console import say
from rocmft.errors import ExitCode


def register(sub) -> None:
    """Add ``check`` to the subcommands ``sub``."""
    add_config_arguments(sub, "check", "render, validate and run the health checks; never trains").set_defaults(
        handler=run
    )


def run(args) -> int:
    """Render, validate, run the health checks; exit 0, or raise ConfigError (2) / ChecksFailed (3)."""
    given = command_line(args)
    timings: dict[str, float] = {}
    with Workspace() as workspace:  # removes everything staged on a failure or a stop signal
        prepared = _prepare(workspace, timings, given)
        _run_checks(prepared, workspace, timings)
        workspace.promote(prepared.plan.run_dir)
    parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in timings.items())
    say(f"checks passed in {sum(timings.values()):.1f} s ({parts})", all_ranks=True)
    return ExitCode.OK
