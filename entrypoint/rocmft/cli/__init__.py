"""The ``rocmft`` command: ``render | check | train | env``.

* ``render``: settings → rendered files → LLaMA-Factory's parser; writes OUTPUT_DIR/rocmft/ and prints it.
* ``plan``: the planner's choices for the GPU (rocmft.render.planner) as a table; writes nothing.
* ``check``: render, then the health checks; writes the files and checks.json. Never trains.
* ``train``: all of the above, then the worker; writes the manifest, the weights, the logs.
* ``status``: is the run making progress (the compose healthcheck); exit 0 yes, 1 no.
* ``env``: versions, device facts and the image build record; ``--docs`` prints the variable reference.
* ``export``: merge a finished run's LoRA adapter into its base, as a Hugging Face model folder (rocmft.outputs.export).
* ``chat``: answer prompts with an export or a run's adapter, with the model's chat template (rocmft.outputs.chat).
* ``report``: (re)write a run's summary, run_summary.md/.png, from its files (rocmft.outputs.report; train too).

Exit codes: see :mod:`rocmft.errors` (0, 2 config, 3 check failed, 4 training failed, 5 non-finite loss,
143 interrupted). On 2 nothing is left in OUTPUT_DIR; on 3 only OUTPUT_DIR/rocmft/checks.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmft import __version__
from rocmft.errors import ChecksFailed, ConfigError, ExitCode, RocmftError
from rocmft.fsutil import atomic_write_text, make_private_dir_public

if TYPE_CHECKING:
    from rocmft.records import WorkerResult

CHECKS_FILE = "checks.json"
MANIFEST_FILE = "manifest.json"


def _say(message: str) -> None:
    print(f"[rocmft] {message}", flush=True)


class Workspace:
    """Owns the staging folder and undoes everything on failure.

    The staging folder is made inside OUTPUT_DIR (same file system, so the final move is a rename). When
    OUTPUT_DIR cannot be written, it is made in the system temp folder instead and the ``output`` check
    reports the real problem. :meth:`discard` removes the staging folder, and OUTPUT_DIR too when this
    run created it and left it empty.
    """

    def __init__(self) -> None:
        self.staging: Path | None = None
        self.created: list[Path] = []
        self.unwritable: str | None = None  # why OUTPUT_DIR could not hold the staging folder

    def make_staging(self, output_dir: Path) -> Path:
        try:
            missing = [p for p in [output_dir, *output_dir.parents] if not p.exists()]
            output_dir.mkdir(parents=True, exist_ok=True)
            self.created = sorted(missing, key=lambda p: len(p.parts), reverse=True)
            self.staging = make_private_dir_public(Path(tempfile.mkdtemp(prefix=".rocmft-staging-", dir=output_dir)))
        except OSError as err:
            self.unwritable = f"{type(err).__name__}: {err.strerror or err}"
            self.staging = Path(tempfile.mkdtemp(prefix="rocmft-staging-"))
        return self.staging

    def discard(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        for folder in self.created:  # deepest first; only folders this run created, only when empty
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
                started = json.loads(manifest.read_text()).get("started_at", "")
            except (OSError, ValueError):
                started = ""
            stamp = (started or time.strftime("%Y-%m-%dT%H:%M:%S")).replace(":", "")
            keep = run_dir.parent / "rocmft-history" / stamp
            while keep.exists():
                keep = keep.with_name(keep.name + "-1")
            _say(f"the earlier run's record moves to {keep}")
        replace_dir(self.staging, run_dir, keep_old_as=keep)
        self.staging = None


def _prepare(workspace: Workspace, timings: dict[str, float], keep_validator: bool = False):
    """Settings → render → validate. Returns the plan, staged. ``keep_validator``: `rocmft train` may reuse the
    parser's process as its worker (rocmft.validate.take_kept)."""
    from rocmft.facts.device import facts_from_probe, injected_probes, probe_devices_raw, start_probes
    from rocmft.validate import start_validator, validate

    start_probes()  # GPU probes in child processes, running while the settings import LLaMA-Factory
    start_validator()  # LLaMA-Factory's parser in a child process, importing meanwhile
    from rocmft.checks import validate_skip
    from rocmft.config.settings import load_settings
    from rocmft.launch import prepare_launch
    from rocmft.render import render

    started = time.monotonic()
    settings = load_settings()
    validate_skip(settings.rocmft.skip_checks)
    timings["settings"] = time.monotonic() - started

    started = time.monotonic()
    devices = probe_devices_raw()
    device = facts_from_probe(devices)
    timings["device probe"] = time.monotonic() - started

    started = time.monotonic()
    plan = render(settings, device, workspace.make_staging)
    plan.probes["devices"] = devices
    plan.probes.update(injected_probes())  # a test hook (ROCMFT_TEST_PROBES); empty unless set
    prepare_launch(plan)  # NNODES/NODE_RANK/WORLD_SIZE agree, NUMA binding, communication settings
    timings["render"] = time.monotonic() - started
    _say(f"precision: {plan.precision.policy} ({plan.precision.reason})")
    _say_plan(plan.perf)

    started = time.monotonic()
    validation = validate(plan, keep=keep_validator)
    timings["validate"] = time.monotonic() - started
    _say(
        f"LLaMA-Factory accepted the configuration (its import {validation.import_s:.1f} s, "
        f"started with rocmft; the parse {validation.seconds:.1f} s)"
    )
    return plan


def _run_checks(plan, workspace: Workspace, timings: dict[str, float]) -> dict[str, Any]:
    from rocmft.checks import failed, print_table, report, run_checks
    from rocmft.fsutil import atomic_write_json

    started = time.monotonic()
    results = run_checks(plan, plan.settings.rocmft.skip_checks)
    timings["checks"] = time.monotonic() - started
    data = report(results, timings["checks"])
    if failed(results):
        path = None
        if workspace.staging is not None and workspace.unwritable is None:
            try:  # rocmft/ becomes the report alone; an earlier run's record moves to rocmft-history (promote)
                for item in workspace.staging.iterdir():
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
    """One line per planner decision (rocmft.render.planner), or why it planned nothing."""
    if perf is None or not perf.active:
        _say(f"plan: nothing planned ({perf.note if perf else 'no planner'})")
        return
    for choice in perf.choices:
        _say(f"plan: {choice.name}={choice.value} ({'' if choice.planned else 'kept: '}{choice.reason})")


def cmd_plan(_args) -> int:
    """Print the planner's choices as a table (choice, value, reason); writes nothing to OUTPUT_DIR."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from rocmft.config.settings import load_settings
    from rocmft.facts.device import facts_from_probe, probe_devices_raw, start_probes
    from rocmft.render import render

    start_probes()
    settings = load_settings()
    device = facts_from_probe(probe_devices_raw())
    staging = Path(tempfile.mkdtemp(prefix="rocmft-plan-"))
    try:
        plan = render(settings, device, lambda _output_dir: staging)
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


def cmd_render(_args) -> int:
    workspace, timings = Workspace(), {}
    try:
        plan = _prepare(workspace, timings)
        if workspace.unwritable:  # `check` and `train` report this through the output check (exit 3)
            raise ConfigError(
                f"OUTPUT_DIR {plan.output_dir} cannot be created or written ({workspace.unwritable}; "
                f"{plan.sources.get('output_dir')}).",
                "Set OUTPUT_DIR to a folder this user can write (a read-write volume in the container).",
            )
        workspace.promote(plan.run_dir)
    except BaseException:
        workspace.discard()
        raise
    for path in plan.files.values():
        _say(f"wrote {plan.run_dir / path.relative_to(plan.staging)}")
    return ExitCode.OK


def cmd_check(_args) -> int:
    workspace, timings = Workspace(), {}
    try:
        plan = _prepare(workspace, timings)
        _run_checks(plan, workspace, timings)
        workspace.promote(plan.run_dir)
    except BaseException:
        workspace.discard()
        raise
    parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in timings.items())
    _say(f"checks passed in {sum(timings.values()):.1f} s ({parts})")
    return ExitCode.OK


def cmd_train(_args) -> int:
    from rocmft.launch import run_worker
    from rocmft.outputs.manifest import now, write_manifest
    from rocmft.records import read_worker_result, run_status

    started_at = now()
    workspace, timings = Workspace(), {}
    try:
        plan = _prepare(workspace, timings, keep_validator=True)
        checks = _run_checks(plan, workspace, timings)
        workspace.promote(plan.run_dir)
    except BaseException:
        workspace.discard()
        raise
    manifest_path = plan.run_dir / MANIFEST_FILE
    checks_summary = {
        "status": checks["status"],
        "seconds": checks["seconds"],
        "report": str(plan.run_dir / CHECKS_FILE),
    }
    write_manifest(manifest_path, plan, status="running", exit_code=None, timings=timings, checks=checks_summary,
                   worker=None, started_at=started_at)  # fmt: skip
    _say(f"configs and manifest in {plan.run_dir}")
    try:
        atomic_write_text(current_run_pointer(), f"{plan.run_dir}\n")  # for `rocmft status` (the healthcheck)
    except OSError:
        pass  # a read-only temp folder costs only the default of `rocmft status`

    began = time.monotonic()
    code = run_worker(plan, plan.settings.secrets)
    timings["train"] = time.monotonic() - began
    worker = read_worker_result(plan.run_dir)
    status = run_status(code)
    write_manifest(manifest_path, plan, status=status, exit_code=int(code), timings=timings, checks=checks_summary,
                   worker=worker, started_at=started_at)  # fmt: skip
    _write_summary(plan)
    if code == ExitCode.NON_FINITE_LOSS and _restart_in_fp32(plan, worker):
        return cmd_train(_args)
    if code == ExitCode.OK:
        losses = [entry.loss for entry in worker.losses] if worker else []
        trend = f", loss {losses[0]:.3f} → {losses[-1]:.3f}" if losses else ""
        _say(f"training finished in {timings['train']:.0f} s{trend}; outputs in {plan.output_dir}")
    else:
        _say(f"training ended with exit code {int(code)} ({status}); see {plan.run_dir / 'train.log'}")
    return code


def _write_summary(plan) -> None:
    """run_summary.md/.png in OUTPUT_DIR (node 0 only); a failure costs only the summary, never the run's code."""
    from rocmft.outputs.report import write_summary
    from rocmft.render import RUN_SUBDIR

    if plan.run_dir.name != RUN_SUBDIR:
        return
    try:
        _say(f"run summary in {write_summary(plan.output_dir)}")
    except Exception as err:  # matplotlib, a full disk: the run's outcome stands
        _say(f"WARNING: the run summary could not be written ({type(err).__name__}: {err})")


def cmd_export(args) -> int:
    """Merge/export the run (argument, else the run of these settings) into EXPORT_DIR (rocmft.outputs.export)."""
    from rocmft.config.settings import load_settings
    from rocmft.outputs.export import export, find_run, plan_export

    settings = load_settings()
    plan = plan_export(find_run(args.run, settings), settings)
    export(plan, settings.rocmft.saves_dir)
    return ExitCode.OK


def cmd_chat(args) -> int:
    """Answer prompts with an export or a run (rocmft.outputs.chat)."""
    from rocmft.config.settings import load_settings
    from rocmft.outputs.chat import main as chat_main
    from rocmft.outputs.chat import read_prompts

    prompts = read_prompts(args.prompt, args.file)
    chat_main(args.model, prompts, args.max_new_tokens, args.system, args.json, load_settings())
    return ExitCode.OK


def cmd_report(args) -> int:
    """Write run_summary.md/.png for the run (argument, else the run of these settings)."""
    from rocmft.config.settings import load_settings
    from rocmft.outputs.export import find_run
    from rocmft.outputs.report import write_summary

    run = find_run(args.run, load_settings())
    _say(f"run summary in {write_summary(run.output_dir)}")
    return ExitCode.OK


def _restart_in_fp32(plan, worker: WorkerResult | None) -> bool:
    """ROCMFT_ON_NAN=fp32: once, restart from the newest complete checkpoint saved before the last finite
    logged loss, with ROCMFT_PRECISION=fp32 (real fp32, rocmft.render.precision); recorded in manifest RESTARTS."""
    import os

    from rocmft.outputs.manifest import RESTARTS
    from rocmft.records import RunStatus, WorkerResult
    from rocmft.render.resume import last_good_checkpoint

    worker = worker or WorkerResult()
    cause = worker.non_finite.cause if worker.non_finite else RunStatus.NON_FINITE_LOSS.value
    if plan.settings.rocmft.on_nan != "fp32" or plan.precision.policy == "fp32":
        return False
    if any(r["cause"] == cause for r in RESTARTS):  # at most one automatic restart per cause
        return False
    checkpoint = last_good_checkpoint(plan.output_dir, worker.loss_dicts())
    RESTARTS.append({"cause": cause, "at_step": worker.non_finite.step if worker.non_finite else None,
                     "from_checkpoint": str(checkpoint) if checkpoint else None,
                     "precision": {"from": plan.precision.policy, "to": "fp32"}})  # fmt: skip
    os.environ["ROCMFT_PRECISION"] = "fp32"
    os.environ["ROCMFT_RESUME"] = str(checkpoint) if checkpoint else "never"
    _say(f"ROCMFT_ON_NAN=fp32: restarting in real fp32 from {checkpoint or 'step 0 (no checkpoint before the NaN)'}")
    return True


CURRENT_RUN = "rocmft-current-run"  # in the temp folder: which run `rocmft status` looks at by default


def current_run_pointer() -> Path:
    """The file where ``rocmft train`` notes its run folder (per container: /tmp is the container's own)."""
    return Path(tempfile.gettempdir()) / CURRENT_RUN


def cmd_status(args) -> int:
    """One line on the run's progress; exit 0 when healthy (starting, progressing, finished), 1 when not.

    The run folder is OUTPUT_DIR/rocmft of the given folder, else the one ``rocmft train`` noted in the temp
    folder. Progress is the age of worker-result.json, which the worker rewrites at every logging step.
    Reads two small files: fast enough for a healthcheck every minute.
    """
    from rocmft.records import WorkerResult, read_worker_result, worker_result_path
    from rocmft.render import RUN_SUBDIR

    if args.output_dir:
        given = Path(args.output_dir)
        run_dir = given / RUN_SUBDIR if (given / RUN_SUBDIR / MANIFEST_FILE).is_file() else given
    elif current_run_pointer().is_file():
        run_dir = Path(current_run_pointer().read_text().strip())
    else:
        print("no run: nothing started `rocmft train` here; pass the run's OUTPUT_DIR")
        return ExitCode.UNHEALTHY
    manifest_path, result_path = run_dir / MANIFEST_FILE, worker_result_path(run_dir)
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        where = (
            f"{manifest_path}"
            if args.output_dir is None
            else (f"{Path(args.output_dir) / RUN_SUBDIR / MANIFEST_FILE} (or {manifest_path})")
        )
        print(f"no run: cannot read {where} ({err})")
        return ExitCode.UNHEALTHY
    result = read_worker_result(run_dir)
    try:
        age = time.time() - result_path.stat().st_mtime
    except OSError:
        result = None
    if result is None:  # no record (yet): the run's age is the manifest's
        result, age = WorkerResult(), time.time() - manifest_path.stat().st_mtime
    status = manifest.get("status")
    step, total = result.last_step, result.max_steps
    where = f"step {step}/{total}" if step is not None else "no step logged yet"
    loss = f", loss {result.losses[-1].loss:.4f}" if result.losses else ""
    if status != "running":
        print(f"{status}: {where}{loss} (exit code {manifest.get('exit_code')}; {run_dir})")
        return ExitCode.OK if status == "finished" else ExitCode.UNHEALTHY
    limit = args.max_idle if step is not None else args.max_start
    state = "running" if age <= limit else "stalled"
    print(f"{state}: {where}{loss}, last update {age:.0f} s ago (limit {limit:.0f} s; {run_dir})")
    return ExitCode.OK if state == "running" else ExitCode.UNHEALTHY


def cmd_env(args) -> int:
    if args.docs:
        from rocmft.config.envdoc import reference

        print(reference(full=args.full), end="")
        return ExitCode.OK
    from rocmft.config.lfargs import stack_versions
    from rocmft.facts.device import probe_device
    from rocmft.facts.host import host_facts
    from rocmft.facts.image import build_record

    facts = {"rocmft": __version__, "versions": stack_versions(), "device": probe_device().as_dict(),
             "host": host_facts(), "image": build_record()}  # fmt: skip
    print(json.dumps(facts, indent=2))
    return ExitCode.OK


def _positive_int(text: str) -> int:
    """argparse type: a whole number above 0 (argparse prints the error with the option's name and exits 2)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number above 0, not {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (all configuration comes from environment variables; see the README)."""
    parser = argparse.ArgumentParser(
        prog="rocmft",
        description="Fine-tune LLMs with LLaMA-Factory: configured by environment variables, checked before "
        "the model loads. Exit codes: 0 ok, 2 configuration error, 3 check failed, 4 training failed, "
        "5 non-finite loss, 143 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"rocmft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("render", help="render and validate the configs into OUTPUT_DIR/rocmft; never trains")
    sub.add_parser("plan", help="print the planner's choices (micro-batch, packing, checkpointing, kernels) and why")
    sub.add_parser("check", help="render, validate and run the health checks; never trains")
    sub.add_parser("train", help="render, validate, check, then train")
    status = sub.add_parser("status", help="is the run making progress? exit 0 yes (or finished), 1 no")
    status.add_argument("output_dir", nargs="?", help="the run's OUTPUT_DIR (default: the run started here)")
    status.add_argument(
        "--max-idle",
        type=float,
        default=1800.0,
        help="seconds without a logged step before the run counts as stalled (default 1800)",
    )
    status.add_argument(
        "--max-start",
        type=float,
        default=3600.0,
        help="seconds allowed from start to the first logged step: model loading (default 3600)",
    )
    env = sub.add_parser("env", help="print versions, device facts and the image build record as JSON")
    env.add_argument("--docs", action="store_true", help="print the environment-variable reference (Markdown)")
    env.add_argument("--full", action="store_true", help="with --docs: list every training argument too")
    export = sub.add_parser("export", help="merge a finished run's LoRA adapter into its base: a Hugging Face "
                            "model folder in EXPORT_DIR (default OUTPUT_DIR-merged)")  # fmt: skip
    export.add_argument("run", nargs="?", help="the run's OUTPUT_DIR or a checkpoint-N in it (default: the run "
                        "of these settings)")  # fmt: skip
    chat = sub.add_parser("chat", help="answer prompts with an exported model or a run's adapter (greedy)")
    chat.add_argument("model", nargs="?", help="an export folder or a run's OUTPUT_DIR (default: the export of the "
                      "run of these settings, else the run)")  # fmt: skip
    chat.add_argument("--prompt", "-p", action="append", help="a prompt (repeatable)")
    chat.add_argument("--file", "-f", help="a file with one prompt per line (- for standard input)")
    chat.add_argument("--system", help="a system message before each prompt")
    chat.add_argument("--max-new-tokens", type=_positive_int, default=128,
                      help="tokens to generate per prompt (default 128)")  # fmt: skip
    chat.add_argument("--json", action="store_true", help="one JSON line per prompt: {prompt, completion}")
    report = sub.add_parser("report", help="write run_summary.md/.png (loss, eval loss, lr, tokens/s, GPU memory)")
    report.add_argument("run", nargs="?", help="the run's OUTPUT_DIR (default: the run of these settings)")
    return parser


COMMANDS = {"plan": cmd_plan, "render": cmd_render, "check": cmd_check, "train": cmd_train,
            "status": cmd_status, "env": cmd_env, "export": cmd_export, "chat": cmd_chat,
            "report": cmd_report}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rocmft`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(COMMANDS[args.command](args))
    except ConfigError as err:
        print(f"[rocmft] CONFIGURATION ERROR: {err}", file=sys.stderr, flush=True)
        return int(err.code)
    except RocmftError as err:
        print(f"[rocmft] {err}", file=sys.stderr, flush=True)
        return int(err.code)
    except KeyboardInterrupt:
        print("[rocmft] interrupted", file=sys.stderr, flush=True)
        return int(ExitCode.INTERRUPTED)
