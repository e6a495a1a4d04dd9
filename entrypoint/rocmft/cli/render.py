"""``rocmft render``: settings → rendered files → LLaMA-Factory's parser; writes OUTPUT_DIR/rocmft/ and prints it."""

from __future__ import annotations

from rocmft.cli.common import _prepare, add_config_arguments, command_line
from rocmft.cli.workspace import Workspace
from rocmft.console import say
from rocmft.container import AS_YOU, mount
from rocmft.errors import ConfigError, ExitCode
from rocmft.fsutil import folder_fix


def register(sub) -> None:
    """Add ``render`` to the subcommands ``sub`` (argparse's subparsers)."""
    add_config_arguments(sub, "render", "render and validate the configs into OUTPUT_DIR/rocmft; never trains"
                         ).set_defaults(handler=run)  # fmt: skip


def run(args) -> int:
    """Render and validate into OUTPUT_DIR/rocmft; exit 0, or raise ConfigError (exit 2, nothing left behind)."""
    given = command_line(args)  # a malformed token ends here, before any child process starts
    timings: dict[str, float] = {}
    with Workspace() as workspace:  # removes everything staged on a failure or a stop signal
        plan = _prepare(workspace, timings, given).plan
        if workspace.unwritable:  # `check` and `train` report this through the output check (exit 3)
            volume = (f"Set OUTPUT_DIR to a folder this user can write: a read-write volume "
                      f"({mount('./saves', '/saves')}) owned by the user rocmft runs as ({AS_YOU}).")  # fmt: skip
            raise ConfigError(
                f"OUTPUT_DIR {plan.output_dir} cannot be created or written ({workspace.unwritable}; "
                f"{plan.sources.get('output_dir')}).",
                folder_fix("OUTPUT_DIR", workspace.unwritable) or volume,
            )
        workspace.promote(plan.run_dir)
    for path in plan.files.values():
        say(f"wrote {plan.run_dir / path.relative_to(plan.staging)}", all_ranks=True)
    return ExitCode.OK
