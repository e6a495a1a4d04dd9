"""Validate: the rendered configuration goes through LLaMA-Factory's own argument parser, no model load.

``llamafactory.hparams.get_train_args`` is the parser the training run will use, with every cross-field
rule LLaMA-Factory and transformers have (removed arguments, DeepSpeed without torchrun, quantization with
full fine-tuning, ...). rocmft runs it in a child process because it has side effects that must not leak
into the entrypoint: it initialises a (one-rank) process group for DeepSpeed/FSDP, sets environment
variables (ACCELERATE_USE_DEEPSPEED) and configures logging. For torchrun launches the child gets the
environment torchrun would give rank 0 of a one-process job, so the distributed rules are checked too.
The child starts when the entrypoint does and imports LLaMA-Factory meanwhile (:class:`Validator`), so the
parse itself adds about a second once the configuration is rendered.

For a one-process `rocmft train` whose worker would get the environment the child started with, the child is
then kept and becomes the worker (:meth:`Validator.train`): its LLaMA-Factory import (4-6 s on our CPU
machines, 14 s on the H200 host) is not paid a second time. torchrun launches, and launches that add variables
the child did not start with (they must be set before torch/HIP initialise), start a fresh worker as before.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmft.errors import ConfigError
from rocmft.proc import free_port
from rocmft.records import ParseRequest, ParseResult, TrainOrder, read_parse_result

if TYPE_CHECKING:  # not imported at run time: the parser child (rocmft.validate.child) imports this package and
    from rocmft.render import (
        Plan,  # should reach LLaMA-Factory's import (the check's critical path) without rocmft's settings stack
    )

TIMEOUT_S = 180

# Variables a library sets in the process that imports it, which are no setting of the run: a worker started with
# or without them trains the same, so a launch that differs from the parser child only in these keeps the child.
# _MLFLOW_TELEMETRY_SESSION_ID: `import mlflow` (transformers' MLflowCallback, rocmft's tracker check) sets it to a
# new id in the importing process (mlflow/telemetry/client.py, _set_telemetry_client, mlflow-skinny 3.18.0;
# measured: `python -c "import mlflow"` adds it); the worker's own import sets one too.
LIBRARY_OWN_VARIABLES = frozenset({"_MLFLOW_TELEMETRY_SESSION_ID"})


def environment_changes(started: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """The names, sorted, whose value in ``wanted`` (the launch's environment) differs from ``started`` (the
    environment the parser child started with): added, removed or changed. Secrets (handed over on
    :meth:`Validator.train`), PYTHONUNBUFFERED (the worker's output is line-buffered either way) and
    :data:`LIBRARY_OWN_VARIABLES` are not changes."""
    from rocmft.config.lfargs import is_secret_name

    def kept(env: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items()
                if not is_secret_name(k) and k != "PYTHONUNBUFFERED" and k not in LIBRARY_OWN_VARIABLES}  # fmt: skip

    a, b = kept(started), kept(wanted)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def stale_extension_locks() -> list[Path]:
    """Lock files of torch C++ extension builds (DeepSpeed JIT-compiles ops there, e.g. its CPU shm op).

    A build killed mid-way leaves its ``lock`` file, and every later build of that op waits on it forever
    (seen on our CI machines: the DeepSpeed validation hung on ``deepspeed_shm_comm/lock``).
    """
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    return sorted(root.glob("*/*/lock")) if root.is_dir() else []


def torchrun_rank0_env(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` plus what torchrun sets for rank 0 of a one-process job on this host."""
    return {
        **environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


def _names_in(message: str) -> list[str]:
    """Argument names a LLaMA-Factory/transformers error message mentions: `name`, ['name'], or a bare
    word that is an argument name ("Please specify dataset for training")."""
    from rocmft.config.lfargs import lf_arguments

    quoted = re.findall(r"`([a-z0-9_]+)`", message) + re.findall(r"'([a-z0-9_]+)'", message)
    bare = re.findall(r"[a-z][a-z0-9_]+", message)
    # quoted unknown names are kept (a removed argument the parser rejects by name); bare words only if arguments
    names = [n for n in quoted if n in lf_arguments() or "_" in n] + [w for w in bare if w in lf_arguments()]
    return list(dict.fromkeys(names))


def _parser_fix(names: list[str], plan: Plan) -> str:
    """The fix for a parser refusal naming ``names``: how to take each one away where the user set it (the user's
    own setting behind a value rocmft derived: ``bf16: true`` of a YAML behind the precision policy's BF16)."""
    from rocmft.config.provenance import removal

    if not names:
        return "Change the settings LLaMA-Factory's message names"
    ways = []
    for name in names:
        source = plan.sources.get(name)
        user = source.basis if source is not None and source.basis is not None else source
        if user is not None and user.user_chosen:
            ways.append(removal(name, user))
    precision = " (ROCMFT_PRECISION alone chooses the precision)" if {"bf16", "fp16", "pure_bf16"} & set(names) else ""
    return "Change the variables named above" + (f": {', or '.join(ways)}{precision}" if ways else "")


def _describe(name: str, plan: Plan) -> str:
    from rocmft.config.provenance import named_in

    if plan.arguments.get(name) is not None and name in plan.sources:
        return named_in(name, plan.arguments, plan.sources, plan.settings.given)
    return f"{name} (not set; the variable is {name.upper()})"


def validate(plan: Plan, keep: bool = False) -> ParseResult:
    """Parse ``plan.arguments`` with LLaMA-Factory's ``get_train_args`` in a child process.

    Paths under ``OUTPUT_DIR/rocmft`` are pointed at their staged copies for the check. With ``keep`` (a
    one-process `rocmft train`), the child stays alive after a successful parse, for :func:`take_kept`.

    Returns:
        The parser's :class:`~rocmft.records.ParseResult`: ``world_size``, ``parallel_mode``, ``compute_dtype``
        (the parser's, before rocmft's precision policy), ``seconds`` (the parse), ``import_s`` (the child's
        LLaMA-Factory import, which started with rocmft).

    Raises:
        ConfigError: the parser rejected the configuration; the message names the environment variables
            (or ROCMFT_CONFIG keys) involved. Or DeepSpeed's own config classes refused the ds_config
            (:func:`rocmft.validate.rules.dsconfig.deepspeed_refusal`, finding code ``dsconfig.deepspeed_model``).
    """
    arguments = dict(plan.arguments)
    if isinstance(arguments.get("deepspeed"), str):  # the ds_config is still in the staging folder
        arguments["deepspeed"] = str(plan.staged(arguments["deepspeed"]))
    environ = torchrun_rank0_env({}) if plan.launcher != "python" else {}  # never the job's own rendezvous
    validator = take_validator()
    try:
        result = validator.parse(ParseRequest(arguments, environ), TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        validator.cancel()
        locks = stale_extension_locks()
        raise ConfigError(
            f"LLaMA-Factory's argument parser did not finish in {TIMEOUT_S} s."
            + (f" A torch extension build lock is held: {', '.join(map(str, locks))}." if locks else ""),
            (f"If no other rocmft/DeepSpeed process is running, remove {locks[0]} (left by an interrupted "
             "DeepSpeed op build) and run again." if locks else
             "Run `rocmft render` again; if it hangs, look for a stuck process-group setup (MASTER_ADDR)."),
        ) from err  # fmt: skip
    global _kept
    log = validator.log()
    if keep and plan.launcher == "python" and result is not None and result.ok and not result.deepspeed:
        _kept = validator
    else:
        validator.cancel()
    if result is None:
        tail = "\n".join(log.strip().splitlines()[-15:])
        raise ConfigError(
            f"LLaMA-Factory's argument parser crashed (exit {validator.proc.returncode}):\n{tail}",
            "Check the installation with `rocmft env`.",
        )
    if not result.ok:
        message = result.error or ""
        names = _names_in(message)
        involved = [_describe(name, plan) for name in names]
        detail = f"\n  involved: {', '.join(involved)}" if involved else ""
        raise ConfigError(
            f"LLaMA-Factory {result.llamafactory or ''} rejected the configuration: {result.type}: {message}{detail}",
            _parser_fix(names, plan) + "; `rocmft render` checks again in seconds.",
        )
    if result.deepspeed:  # DeepSpeed's own config classes refused the ds_config (rocmft.validate.dsmodel)
        from rocmft.validate.rules.dsconfig import deepspeed_refusal

        raise deepspeed_refusal(plan, result.deepspeed)
    return result


class Validator:
    """A child process that imports LLaMA-Factory at once and then waits on stdin for one configuration to parse.

    Started first thing (:func:`start_validator`), it imports transformers while the entrypoint itself does,
    so the parse costs no second import on the critical path (measured on 2 x H200: the import is 10-20 s
    there). Not a fork of the entrypoint: importing LLaMA-Factory initialises CUDA (llamafactory.extras.misc
    asks torch for bf16 support at import time), and CUDA cannot be used again in a forked child. Secrets
    (by name, rocmft.config.lfargs.is_secret_name) are not in its environment.
    """

    def __init__(self) -> None:
        import atexit

        from rocmft.config.lfargs import is_secret_name

        self.folder = Path(tempfile.mkdtemp(prefix="rocmft-validate-"))
        self.result_path, self.log_path = self.folder / "result.json", self.folder / "parser.log"
        self.environ = {k: v for k, v in os.environ.items() if not is_secret_name(k)}
        self.log_path.touch()
        # stdout (stderr joined) is a pipe that stays silent while the child parses (it writes to parser.log
        # then) and carries the worker's output if the child becomes the worker (:meth:`train`)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocmft.validate.child", str(self.result_path), str(self.log_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.environ, text=True,
            bufsize=1, start_new_session=True,
        )  # fmt: skip
        atexit.register(self.cancel)

    def parse(self, request: ParseRequest | Mapping[str, Any], timeout: float) -> ParseResult | None:
        """Send one request (a :class:`~rocmft.records.ParseRequest`, or its ``{arguments, environ}`` mapping) and
        wait for the result (None when the child died first).

        Raises:
            subprocess.TimeoutExpired: no result within ``timeout`` seconds.
        """
        import time

        if not isinstance(request, ParseRequest):
            request = ParseRequest(request["arguments"], request.get("environ") or {})
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(request.to_line())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self.result()
        deadline = time.monotonic() + timeout
        while not self.result_path.is_file():
            if self.proc.poll() is not None:
                return self.result()
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.proc.args, timeout)
            time.sleep(0.02)
        return self.result()

    def can_train(self, command: list[str], environ: dict[str, str]) -> str | None:
        """Why this child cannot run the worker ``command`` with ``environ``, or None when it can: alive after a
        successful parse, one process (no numactl/torchrun prefix), and the environment it started with, secrets
        and PYTHONUNBUFFERED aside (secrets are handed over on :meth:`train`; the worker's output is
        line-buffered; :func:`environment_changes`)."""
        if not self.result_path.is_file() or self.proc.poll() is not None:
            return "the parser's process is gone"
        if command[1:3] != ["-m", "rocmft.worker"]:
            return "the launch is not one plain worker process"
        changed = environment_changes(self.environ, environ)
        return f"the launch changes {', '.join(changed)}" if changed else None

    def train(self, run_dir: Path, environ: dict[str, str]) -> subprocess.Popen:
        """Make the child the worker for ``run_dir`` with ``environ`` (secrets included, sent through its stdin,
        never a file); returns its process, whose stdout carries the worker's output."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(TrainOrder(str(run_dir), environ).to_line())
        self.proc.stdin.close()
        return self.proc

    def cancel(self) -> None:
        """Kill the child if it still runs, and remove its folder."""
        from rocmft.proc import kill_group

        kill_group(self.proc)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def result(self) -> ParseResult | None:
        """The parse's result (None when the child died without one)."""
        return read_parse_result(self.result_path)

    def log(self) -> str:
        """What the child printed (LLaMA-Factory's and transformers' messages)."""
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""


_validator: Validator | None = None


def start_validator() -> None:
    """Start the parser child now, so that it imports LLaMA-Factory while the entrypoint works (idempotent)."""
    global _validator
    if _validator is None:
        _validator = Validator()


_kept: Validator | None = None


def take_validator() -> Validator:
    """The started parser child (or a new one), handed over for its one parse."""
    global _validator
    validator, _validator = _validator or Validator(), None
    return validator


def take_kept() -> Validator | None:
    """The child kept after a successful parse for a one-process run (:func:`validate` with ``keep``), once."""
    global _kept
    kept, _kept = _kept, None
    return kept
