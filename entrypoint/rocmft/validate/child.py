"""The parser child: ``python -m rocmft.validate.child RESULT LOG``, started by :class:`rocmft.validate.Validator`.

It imports LLaMA-Factory at once, reads one ``{arguments, environ}`` line from stdin
(:class:`rocmft.records.ParseRequest`), runs LLaMA-Factory's ``get_train_args`` on it and writes the result to
RESULT (:class:`rocmft.records.ParseResult`); on a second ``{train, environ}`` line
(:class:`rocmft.records.TrainOrder`) it becomes the worker of that run. Its own module, so that the parent side
(rocmft.validate) imports nothing of the child's.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from rocmft.records import ParseRequest, ParseResult, TrainOrder


def _child(result_path: str, log_path: str) -> int:
    """In the child: import LLaMA-Factory, read {arguments, environ} from stdin, parse, write the result; then,
    if a second line ``{train, environ}`` comes, become the worker (``python -m rocmft.worker``) on the stdout pipe."""
    pipe = os.dup(1)  # the parent's pipe: silent until this process becomes the worker
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    import time

    started = time.monotonic()
    import llamafactory.hparams  # noqa: F401  (the slow import, done while the entrypoint renders)

    imported = time.monotonic() - started
    request = ParseRequest.from_line(sys.stdin.readline())
    os.environ.update(request.environ)
    _parse(dict(request.arguments), result_path, imported)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    order = TrainOrder.from_line(line)
    os.environ.update(order.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(pipe, 1)
    os.dup2(pipe, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115  (the process's own stdout)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    # run the worker module as `python -m rocmft.worker RUN_DIR` would (the launch step names it the same way):
    # this process is a warmed-up interpreter, not a caller of the later step's code
    sys.argv = ["rocmft.worker", order.run_dir]
    runpy.run_module("rocmft.worker", run_name="__main__", alter_sys=True)
    return 0


def _parse(arguments: dict[str, Any], result_path: str, import_s: float) -> None:
    """Parse with ``get_train_args`` and write the :class:`~rocmft.records.ParseResult` (ok, error or facts,
    seconds of the parse, import_s of the child's LLaMA-Factory import, measured for the check-time benchmark)
    to ``result_path``. With a DeepSpeed config, DeepSpeed's own config classes judge it too
    (:func:`rocmft.validate.dsmodel.judge`). Never raises."""
    import time
    from importlib import metadata

    started = time.monotonic()
    facts: dict[str, Any]
    try:
        from llamafactory.hparams import get_train_args

        model_args, _data, training_args, _ft, _gen = get_train_args(arguments)
        facts = {
            "ok": True,
            "world_size": training_args.world_size,
            "parallel_mode": str(training_args.parallel_mode),
            "compute_dtype": str(model_args.compute_dtype),
        }
        hf_config = getattr(getattr(training_args, "hf_deepspeed_config", None), "config", None)
        if isinstance(hf_config, dict):  # DeepSpeed judges the ds_config as transformers read and filled it
            from rocmft.validate.dsmodel import judge

            facts["deepspeed"], deepspeed_s = judge(hf_config)
            facts["deepspeed_s"] = round(deepspeed_s, 2)
    except BaseException as err:  # the parser raises ValueError, TypeError, SystemExit (argparse), ...
        facts = {"ok": False, "type": type(err).__name__, "error": str(err)}
    try:
        facts["llamafactory"] = metadata.version("llamafactory")
    except metadata.PackageNotFoundError:
        pass
    seconds = round(time.monotonic() - started, 2)
    ParseResult(**facts, seconds=seconds, import_s=round(import_s, 2)).write(Path(result_path))


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1], sys.argv[2]))
