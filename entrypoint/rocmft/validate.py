"""Validate: the rendered configuration goes through LLaMA-Factory's own argument parser, no model load.

``llamafactory.hparams.get_train_args`` is the parser the training run will use, with every cross-field
rule LLaMA-Factory and transformers have (removed arguments, DeepSpeed without torchrun, quantization with
full fine-tuning, ...). rocmft runs it in a child process because it has side effects that must not leak
into the entrypoint: it initialises a (one-rank) process group for DeepSpeed/FSDP, sets environment
variables (ACCELERATE_USE_DEEPSPEED) and configures logging. For torchrun launches the child gets the
environment torchrun would give rank 0 of a one-process job, so the distributed rules are checked too.
The child is forked from the entrypoint, which has imported LLaMA-Factory already to read the settings, so
it costs only the parse itself (about a second).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import socket
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
    environ = {k: v for k, v in os.environ.items() if k not in plan.settings.secrets}
    if plan.launcher == "torchrun":
        environ = torchrun_rank0_env(environ)
    with tempfile.TemporaryDirectory(prefix="rocmft-validate-") as tmp:
        result_path, log_path = Path(tmp) / "result.json", Path(tmp) / "parser.log"
        # fork, not spawn: the child inherits the LLaMA-Factory modules the settings step already imported
        # (a fresh interpreter spent 5-20 s importing transformers again; measured on 2 x H200, BENCHMARKS.md)
        child = multiprocessing.get_context("fork").Process(
            target=_forked_child, args=(arguments, environ, str(result_path), str(log_path)), daemon=True
        )
        child.start()
        child.join(TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join()
            locks = stale_extension_locks()
            raise ConfigError(
                f"LLaMA-Factory's argument parser did not finish in {TIMEOUT_S} s."
                + (f" A torch extension build lock is held: {', '.join(map(str, locks))}." if locks else ""),
                (f"If no other rocmft/DeepSpeed process is running, remove {locks[0]} (left by an interrupted "
                 "DeepSpeed op build) and run again." if locks else
                 "Run `rocmft render` again; if it hangs, look for a stuck process-group setup (MASTER_ADDR)."),
            )  # fmt: skip
        result = json.loads(result_path.read_text()) if result_path.is_file() else None
        if result is None:
            log = log_path.read_text(errors="replace") if log_path.is_file() else ""
            tail = "\n".join(log.strip().splitlines()[-15:])
            raise ConfigError(
                f"LLaMA-Factory's argument parser crashed (exit {child.exitcode}):\n{tail}",
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


def _forked_child(arguments: dict[str, Any], environ: dict[str, str], result_path: str, log_path: str) -> None:
    """In the forked child: the validation environment, output to ``log_path``, then :func:`_parse`."""
    os.environ.clear()
    os.environ.update(environ)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    _parse(arguments, result_path)


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
