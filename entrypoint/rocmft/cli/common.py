"""The steps the commands share: the configuration arguments (:func:`add_config_arguments`), settings → render →
validate (:func:`_prepare`, into a :class:`rocmft.cli.workspace.Workspace`), the health checks (:func:`_run_checks`),
and the note of the current run for ``rocmft status``."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmft.changes import say_changes
from rocmft.console import say
from rocmft.errors import ChecksFailed, ConfigError
from rocmft.records import CHECKS_FILE

if TYPE_CHECKING:
    from rocmft.cli.workspace import Workspace
    from rocmft.facts.probes import Probes
    from rocmft.launch import LaunchSpec
    from rocmft.render import Plan


CONFIG_HELP = """\
CONFIG.yaml is a LLaMA-Factory training YAML, the same as ROCMFT_CONFIG (given both, they must name one file).
Each key=value overrides one argument, read as `llamafactory-cli train CONFIG.yaml key=value` reads it
(OmegaConf: 5e-5 is a float, true a bool, [a,b] a list, a.b=1 a key of a mapping, "k='001'" a string;
an empty value is refused: write key=null).

Precedence, highest first: key=value on the command line > environment variables (LEARNING_RATE=...) >
the YAML > rocmft's defaults. Secrets (HF_TOKEN, HF_HUB_TOKEN, ...) only from the environment. The manifest
records where each argument came from (settings.sources).

example: rocmft %(command)s my.yaml learning_rate=5e-5 max_steps=100 output_dir=/saves/run1
"""


def add_config_arguments(sub, name: str, help: str):
    """Add the command ``name`` to the subcommands ``sub`` with the configuration arguments every command that
    reads a configuration takes (train, render, check, plan): ``[CONFIG.yaml] [key=value ...]``
    (rocmft.config.cmdline) and ``--json`` (a refusal's findings as JSON, printed by :func:`rocmft.cli.main`).
    Returns its parser; :func:`command_line` reads the arguments back."""
    import argparse

    from rocmft.config.cmdline import USAGE

    parser = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                            usage=f"rocmft {name} [-h] [--json] {USAGE}", epilog=CONFIG_HELP % {"command": name},
                            formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("config_args", nargs="*", metavar="CONFIG.yaml | key=value",
                        help="the training YAML (first), then overrides; see below")  # fmt: skip
    parser.add_argument("--json", dest="findings_json", action="store_true",
                        help='when the configuration is refused (exit 2), also print its findings as one JSON line '
                        'on stdout, the last: {"findings": [{code, severity, message, fix, settings}], '
                        '"exit_code": 2}')  # fmt: skip
    return parser


def command_line(args):
    """The parsed ``[CONFIG.yaml] [key=value ...]`` of ``args`` (:func:`add_config_arguments`).

    Raises:
        ConfigError: a malformed token, a secret, or a first argument that is not a YAML file name
            (rocmft.config.cmdline.parse_command_line).
    """
    from rocmft.config.cmdline import parse_command_line

    return parse_command_line(getattr(args, "config_args", None) or [])


@dataclass(frozen=True)
class Prepared:
    """The records of settings → render → launch spec → validate, none changed by a later stage.

    Attributes:
        plan: the rendered run, its files staged (rocmft.render.Plan).
        probes: the run's probe provider (rocmft.facts.probes.Probes), seeded with the device probe and a test's
            injected probes; the checks measure through it, the manifest records its snapshot.
        launch: how the worker starts (rocmft.launch.LaunchSpec).
    """

    plan: Plan
    probes: Probes
    launch: LaunchSpec


def _prepare(workspace: Workspace, timings: dict[str, float], command_line=None, keep_validator: bool = False,
             overrides=None) -> Prepared:  # fmt: skip
    """Settings → render → launch spec → validate. Returns the :class:`Prepared` records, the plan's files
    staged. ``command_line``: the command's
    ``[CONFIG.yaml] [key=value ...]`` (rocmft.config.cmdline.CommandLine), read over the environment;
    ``overrides``: rocmft's own settings for this attempt with their sources (a restart's; load_settings).
    ``keep_validator``: `rocmft train` may reuse the parser's process as its worker (rocmft.validate.take_kept)."""
    from rocmft import testhooks
    from rocmft.facts.device import facts_from_probe, probe_devices_raw, start_probes
    from rocmft.facts.host import shm_bytes
    from rocmft.facts.probes import Probes
    from rocmft.validate import start_validator, validate

    start_probes()  # GPU probes in child processes, running while the settings import LLaMA-Factory
    start_validator()  # LLaMA-Factory's parser in a child process, importing meanwhile
    from rocmft.checks import validate_skip
    from rocmft.config.settings import load_settings
    from rocmft.launch import prepare_launch
    from rocmft.validate.rules import render_checked

    started = time.monotonic()
    # the run's one snapshot; unknown variables are refused by render_checked, with the rules' findings
    settings = load_settings(os.environ, command_line=command_line, overrides=overrides, defer_unknown=True)
    validate_skip(settings.rocmft.skip_checks)
    timings["settings"] = time.monotonic() - started

    started = time.monotonic()
    devices = probe_devices_raw()
    device = facts_from_probe(devices)
    timings["device probe"] = time.monotonic() - started

    started = time.monotonic()
    # the run's one probe provider; the probe results a test injected (empty in production) win over measuring
    probes = Probes(seeded={"devices": devices}, injected=testhooks.injected_probes())
    # /dev/shm's size: render plans the loader workers it holds, the shm check measures against the same figure
    plan = render_checked(settings, device, workspace.make_staging, probes.get("shm_bytes", shm_bytes))
    launch = prepare_launch(plan, probes)  # NNODES/NODE_RANK/WORLD_SIZE agree, NUMA binding, communication settings
    probes = _with_gfx_override(settings.environ, launch, probes, testhooks.injected_probes())
    timings["render"] = time.monotonic() - started
    say(f"precision: {plan.precision.policy} ({plan.precision.reason})", all_ranks=True)
    _say_plan(plan.perf)
    from rocmft.render.checkpointing import said

    mode = said(plan.arguments, plan.sources)  # the checkpointing mode rocmft chose for adapters, if it chose one
    if mode:
        say(mode, all_ranks=True)
    say_changes(launch.changes)  # the one block of what rocmft set: the manifest's launch.changes

    started = time.monotonic()
    validation = validate(plan, keep=keep_validator)
    timings["validate"] = time.monotonic() - started
    say(
        f"LLaMA-Factory accepted the configuration (its import {validation.import_s:.1f} s, "
        f"started with rocmft; the parse {validation.seconds:.1f} s)",
        all_ranks=True,
    )
    return Prepared(plan=plan, probes=probes, launch=launch)


def _with_gfx_override(environ, launch: LaunchSpec, probes: Probes, injected) -> Probes:
    """When rocmft sets HSA_OVERRIDE_GFX_VERSION for the launch (ROCMFT_GFX_OVERRIDE=auto,
    rocmft.launch.spec.gfx_override), probe the devices again under it, so that the checks judge the GPUs as the
    training will run them (the first probe started before the settings were read; the change itself is said in the
    block of rocmft.changes.say_changes). Returns the probe provider the checks use."""
    from rocmft.facts.device import PROBE_TIMEOUT_S, run_probe
    from rocmft.facts.probes import Probes

    added = launch.communication.get("HSA_OVERRIDE_GFX_VERSION")
    if not added or "HSA_OVERRIDE_GFX_VERSION" not in launch.environment:
        return probes
    if "devices" in injected:
        return probes  # a test's injected probe stands for the device
    env = {**environ, "HSA_OVERRIDE_GFX_VERSION": added["value"]}
    return Probes(seeded={"devices": run_probe(["devices"], PROBE_TIMEOUT_S, env=env)}, injected=injected)


def _run_checks(prepared: Prepared, workspace: Workspace, timings: dict[str, float]) -> dict[str, Any]:
    """Run the health checks on ``prepared`` (ROCMFT_SKIP_CHECKS skipped) and write their report, checks.json, into
    the staging folder; returns the report (rocmft.checks.report).

    Raises:
        ChecksFailed: a check failed; rocmft/ then holds the report alone (and the network preflight's node list).
    """
    from rocmft.checks import CheckSubject, failed, print_table, report, run_checks
    from rocmft.checks.network import NODES_FILE
    from rocmft.fsutil import atomic_write_json

    plan = prepared.plan
    subject = CheckSubject(plan=plan, probes=prepared.probes, launch_environment=prepared.launch.environment)
    started = time.monotonic()
    results = run_checks(subject, plan.settings.rocmft.skip_checks)
    timings["checks"] = time.monotonic() - started
    data = report(results, timings["checks"])
    if failed(results):
        path = None
        if workspace.staging is not None and workspace.unwritable is None:
            try:  # rocmft/ becomes the report alone (and the network preflight's per-node list, which names the
                # nodes to exclude); an earlier run's record moves to rocmft-history (promote)
                for item in workspace.staging.iterdir():
                    if item.name == NODES_FILE:
                        continue
                    if item.is_dir():
                        shutil.rmtree(item)
                    else:
                        item.unlink()
                atomic_write_json(workspace.staging / CHECKS_FILE, data)
                workspace.promote(plan.run_dir)
                path = plan.run_dir / CHECKS_FILE
            except OSError:
                pass  # OUTPUT_DIR is not writable: the output check says so, the table is all there is
        workspace.discard()
        print_table(results, path)
        names = ", ".join(r.id for r in failed(results))
        raise ChecksFailed(f"Health checks failed: {names}.", "Fix what the table says, then run again.")
    atomic_write_json(plan.staging / CHECKS_FILE, data)
    print_table(results, plan.run_dir / CHECKS_FILE)
    return data


def _say_plan(perf) -> None:
    """Why the planner planned nothing, or one line per value it kept (rocmft.render.planner); the values it set
    (the loader workers /dev/shm holds among them, rocmft.render.loader) are automatic changes, said in the block of
    rocmft.changes.say_changes."""
    if perf is None or not perf.choices:
        say(f"plan: nothing planned ({perf.note if perf else 'no planner'})", all_ranks=True)
        return
    if not perf.active:
        say(f"plan: {perf.note}", all_ranks=True)
    for choice in perf.choices:
        if not choice.planned:
            say(f"plan: {choice.name}={choice.value} (kept: {choice.reason})", all_ranks=True)


CURRENT_RUN = "rocmft-current-run"  # in the temp folder: which run `rocmft status` looks at by default


def current_run_pointer() -> Path:
    """The file where ``rocmft train`` notes its run folder (per container: /tmp is the container's own)."""
    return Path(tempfile.gettempdir()) / CURRENT_RUN


def given_path(text: str | None, what: str) -> str | None:
    """A folder given on the command line (``what``: how the command names it, e.g. ``rocmft report RUN``),
    checked before anything looks inside: returned as given (None stays None).

    Raises:
        ConfigError: it cannot be a path here: an unknown ``~user`` (pathlib's RuntimeError), a name the system
            refuses to look up (a part over 255 bytes: ENAMETOOLONG; a symbolic link loop), or a folder on its way
            this user may not enter (PermissionError) — each made pathlib's is_file()/is_dir() raise, a traceback.
    """
    if text is None:
        return None
    try:
        os.stat(Path(text).expanduser())
    except (FileNotFoundError, NotADirectoryError):
        pass  # absent: each command says so in its own words
    except (OSError, RuntimeError, ValueError) as err:
        reason = str(getattr(err, "strerror", None) or err).rstrip(".")
        raise ConfigError(
            f"{what} {text[:200]!r}: this cannot be looked at here ({type(err).__name__}: {reason}).",
            "Give the run's folder as this machine or container sees it (e.g. saves/<run>); a folder of another "
            "user needs read and search permission for yours (`chmod -R a+rX` on it).",
        ) from err
    return text
