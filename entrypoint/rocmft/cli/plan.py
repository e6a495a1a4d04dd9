"""``rocmft plan``: the planner's choices for the GPU (rocmft.render.planner) as a table; writes nothing."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rocmft.cli.common import add_config_arguments, command_line
from rocmft.errors import ExitCode


def register(sub) -> None:
    """Add ``plan`` to the subcommands ``sub``."""
    add_config_arguments(
        sub, "plan", "print the planner's choices (micro-batch, packing, checkpointing, kernels) and why"
    ).set_defaults(handler=run)


def run(args) -> int:
    """Print the planner's choices as a table (choice, value, reason); writes nothing to OUTPUT_DIR."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from rocmft import testhooks
    from rocmft.config.settings import load_settings
    from rocmft.facts.device import facts_from_probe, probe_devices_raw, start_probes
    from rocmft.facts.host import shm_bytes
    from rocmft.facts.probes import Probes
    from rocmft.validate.rules import render_checked

    given = command_line(args)
    start_probes()
    settings = load_settings(os.environ, command_line=given, defer_unknown=True)  # render_checked refuses them
    device = facts_from_probe(probe_devices_raw())
    staging = Path(tempfile.mkdtemp(prefix="rocmft-plan-"))
    try:
        shm = Probes(injected=testhooks.injected_probes()).get("shm_bytes", shm_bytes)  # as `rocmft train` reads it
        plan = render_checked(settings, device, lambda _output_dir: staging, shm)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    perf = plan.perf
    console = Console(markup=False)  # notes and reasons hold paths and brackets: printed as they are
    if not perf.choices:  # an empty table says less than the reason does
        console.print(f"rocmft plan: nothing planned ({perf.note})")
        return ExitCode.OK
    table = Table(title=Text(f"rocmft plan: {perf.note}"))
    for column in ("choice", "value", "reason"):
        table.add_column(column, overflow="fold")
    for choice in perf.choices:
        table.add_row(
            Text(choice.name), Text(str(choice.value)), Text(("" if choice.planned else "kept: ") + choice.reason)
        )
    console.print(table)
    if perf.estimate_gib is not None:
        console.print(f"estimated peak {perf.estimate_gib} GiB per GPU of {perf.usable_gib} GiB planned against "
                      f"(rocmft.render.memfit): {perf.breakdown_gib}")  # fmt: skip
    return ExitCode.OK
