"""Validate: the rendered configuration goes through LLaMA-Factory's own argument parser, no model load.

``llamafactory.hparams.get_train_args`` is the parser the training run will use, with every cross-field
rule LLaMA-Factory and transformers have (removed arguments, DeepSpeed without torchrun, quantization with
full fine-tuning, ...). rocmft runs it in a child process because it has side effects that must not leak
into the entrypoint: it initialises a (one-rank) process group for DeepSpeed/FSDP, sets environment
variables (ACCELERATE_USE_DEEPSPEED) and configures logging. For torchrun launches the child gets the
environment torchrun would give rank 0 of a one-process job, so the distributed rules are checked too.
The child starts when the entrypoint does and imports LLaMA-Factory meanwhile (:class:`Validator`), so the
parse itself adds about a second once the configuration is rendered.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .render import Plan

TIMEOUT_S = 180


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for a one-process rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    from .lfargs import lf_arguments

    quoted = re.findall(r"`([a-z0-9_]+)`", message) + re.findall(r"'([a-z0-9_]+)'", message)
    bare = re.findall(r"[a-z][a-z0-9_]+", message)
    # quoted unknown names are kept (a removed argument the parser rejects by name); bare words only if arguments
    names = [n for n in quoted if n in lf_arguments() or "_" in n] + [w for w in bare if w in lf_arguments()]
    return list(dict.fromkeys(names))


def _describe(name: str, plan: Plan) -> str:
    if plan.arguments.get(name) is not None and name in plan.sources:
        return f"{name} (from {plan.sources[name]})"
    return f"{name} (not set; the variable is {name.upper()})"


def validate(plan: Plan) -> dict[str, Any]:
    """Parse ``plan.arguments`` with LLaMA-Factory's ``get_train_args`` in a child process.

    Paths under ``OUTPUT_DIR/rocmft`` are pointed at their staged copies for the check.

    Returns:
        Facts the parser derived: ``world_size``, ``parallel_mode``, ``compute_dtype`` (the parser's,
        before rocmft's precision policy), ``seconds``.

    Raises:
        ConfigError: the parser rejected the configuration; the message names the environment variables
            (or ROCMFT_CONFIG keys) involved.
    """
    arguments = dict(plan.arguments)
    if isinstance(arguments.get("deepspeed"), str):  # the ds_config is still in the staging folder
        arguments["deepspeed"] = str(plan.staged(arguments["deepspeed"]))
    environ = torchrun_rank0_env({}) if plan.launcher == "torchrun" else {}
    validator = take_validator()
    try:
        validator.proc.communicate(json.dumps({"arguments": arguments, "environ": environ}), timeout=TIMEOUT_S)
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
    result, log = validator.result(), validator.log()
    validator.cancel()
    if result is None:
        tail = "\n".join(log.strip().splitlines()[-15:])
        raise ConfigError(
            f"LLaMA-Factory's argument parser crashed (exit {validator.proc.returncode}):\n{tail}",
            "Check the installation with `rocmft env`.",
        )
    if not result["ok"]:
        message = result["error"]
        involved = [_describe(name, plan) for name in _names_in(message)]
        detail = f"\n  involved: {', '.join(involved)}" if involved else ""
        raise ConfigError(
            f"LLaMA-Factory {result.get('llamafactory', '')} rejected the configuration: "
            f"{result['type']}: {message}{detail}",
            ("Change the variables named above" if involved else "Change the settings LLaMA-Factory's message names")
            + "; `rocmft render` checks again in seconds.",
        )
    return result


class Validator:
    """A child process that imports LLaMA-Factory at once and then waits on stdin for one configuration to parse.

    Started first thing (:func:`start_validator`), it imports transformers while the entrypoint itself does,
    so the parse costs no second import on the critical path (measured on 2 x H200: the import is 10-20 s
    there). Not a fork of the entrypoint: importing LLaMA-Factory initialises CUDA (llamafactory.extras.misc
    asks torch for bf16 support at import time), and CUDA cannot be used again in a forked child. Secrets
    (by name, rocmft.lfargs.is_secret_name) are not in its environment.
    """

    def __init__(self) -> None:
        import atexit

        from .lfargs import is_secret_name

        self.folder = Path(tempfile.mkdtemp(prefix="rocmft-validate-"))
        self.result_path, self.log_path = self.folder / "result.json", self.folder / "parser.log"
        environ = {k: v for k, v in os.environ.items() if not is_secret_name(k)}
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocmft.validate", str(self.result_path)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=self._log, env=environ, text=True, start_new_session=True,
        )  # fmt: skip
        atexit.register(self.cancel)

    def cancel(self) -> None:
        """Kill the child if it still runs, and remove its folder."""
        from .probe import kill_group

        kill_group(self.proc)
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def result(self) -> dict[str, Any] | None:
        """The parse's result (None when the child died without one)."""
        return json.loads(self.result_path.read_text()) if self.result_path.is_file() else None

    def log(self) -> str:
        """What the child printed (LLaMA-Factory's and transformers' messages)."""
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""


_validator: Validator | None = None


def start_validator() -> None:
    """Start the parser child now, so that it imports LLaMA-Factory while the entrypoint works (idempotent)."""
    global _validator
    if _validator is None:
        _validator = Validator()


def take_validator() -> Validator:
    """The started parser child (or a new one), handed over for its one parse."""
    global _validator
    validator, _validator = _validator or Validator(), None
    return validator


def _child(result_path: str) -> int:
    """In the child: import LLaMA-Factory, read {arguments, environ} from stdin, parse, write the result."""
    import llamafactory.hparams  # noqa: F401  (the slow import, done while the entrypoint renders)

    request = json.loads(sys.stdin.read())
    os.environ.update(request["environ"])
    _parse(request["arguments"], result_path)
    return 0


def _parse(arguments: dict[str, Any], result_path: str) -> None:
    """Parse with ``get_train_args`` and write {ok, error|facts} as JSON to ``result_path``. Never raises."""
    import time
    from importlib import metadata

    started = time.monotonic()
    result: dict[str, Any]
    try:
        from llamafactory.hparams import get_train_args

        model_args, _data, training_args, _ft, _gen = get_train_args(arguments)
        result = {
            "ok": True,
            "world_size": training_args.world_size,
            "parallel_mode": str(training_args.parallel_mode),
            "compute_dtype": str(model_args.compute_dtype),
        }
    except BaseException as err:  # the parser raises ValueError, TypeError, SystemExit (argparse), ...
        result = {"ok": False, "type": type(err).__name__, "error": str(err)}
    try:
        result["llamafactory"] = metadata.version("llamafactory")
    except metadata.PackageNotFoundError:
        pass
    result["seconds"] = round(time.monotonic() - started, 2)
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1]))
