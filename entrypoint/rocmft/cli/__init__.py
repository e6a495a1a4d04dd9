"""The ``rocmft`` command: ``render | check | train | env``.

* ``render``: settings → rendered files → LLaMA-Factory's parser; writes OUTPUT_DIR/rocmft/ and prints it.
* ``plan``: the planner's choices for the GPU (rocmft.render.planner) as a table; writes nothing.
* ``check``: render, then the health checks; writes the files and checks.json. Never trains.
* ``train``: all of the above, then the worker; writes the manifest, the weights, the logs.
* ``status``: is the run making progress (the compose healthcheck); exit 0 yes, 1 no.
* ``env``: versions, device facts and the image build record; ``--docs`` prints the variable reference.
* ``export``: merge a finished run's LoRA adapter into its base, as a Hugging Face model folder (rocmft.outputs.export).
* ``chat``: answer prompts with an export or a run's adapter, with the model's chat template (rocmft.outputs.chat).
* ``serve --load RUN``: load a finished run's adapter into the running vLLM server and ask it (rocmft.outputs.serve).
* ``report``: (re)write a run's summary, run_summary.md/.png, from its files (rocmft.outputs.report; train too).

Exit codes: see :mod:`rocmft.errors` (0, 2 config, 3 check failed, 4 training failed, 5 non-finite loss,
143 interrupted). On 2 nothing is left in OUTPUT_DIR; on 3 only OUTPUT_DIR/rocmft/checks.json. A refusal prints
every finding of the rules' phase at once (rocmft.findings), and with ``--json`` (render, check, train, plan) also
as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from rocmft import __version__
from rocmft.cli import chat, check, env, export, plan, render, report, serve, status, train
from rocmft.console import say
from rocmft.errors import ConfigError, ExitCode, RocmftError
from rocmft.findings import ERROR, document


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (the configuration comes from environment variables, a LLaMA-Factory YAML and
    ``key=value`` overrides; see the README). Each command's module adds its subcommand (``register``) with its
    ``run(args) -> exit code`` as ``args.handler``."""
    parser = argparse.ArgumentParser(
        prog="rocmft",
        description="Fine-tune LLMs with LLaMA-Factory: configured by environment variables, a LLaMA-Factory YAML "
        "and key=value overrides (`rocmft train my.yaml learning_rate=5e-5`), checked before the model loads. "
        "Exit codes: 0 ok, 2 configuration error, 3 check failed, 4 training failed, 5 non-finite loss, "
        "143 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"rocmft {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    render.register(sub)
    plan.register(sub)
    check.register(sub)
    train.register(sub)
    status.register(sub)
    env.register(sub)
    export.register(sub)
    chat.register(sub)
    report.register(sub)
    serve.register(sub)
    return parser


def report_refusal(err: ConfigError, as_json: bool = False) -> None:
    """Print a refused configuration on stderr: one ``CONFIGURATION ERROR: message / fix: ...`` block per error
    finding, in rule order, and after several a count line (``3 configuration errors; nothing was written.``);
    with ``as_json``, also its findings (rocmft.findings.document) as one JSON line on stdout."""
    refused = [f for f in err.reported() if f.severity == ERROR]
    if len(refused) < 2:
        say(f"CONFIGURATION ERROR: {err}", stream=sys.stderr, all_ranks=True)
    else:
        for finding in refused:
            say(f"CONFIGURATION ERROR: {finding}", stream=sys.stderr, all_ranks=True)
        say(f"{len(refused)} configuration errors; nothing was written.", stream=sys.stderr, all_ranks=True)
    if as_json:
        print(json.dumps(document(err.reported(), err.code)), flush=True)


# DeepSpeed's notice when its accelerator detection finds no GPU (deepspeed/accelerator/real_accelerator.py,
# get_accelerator, DeepSpeed 0.18.4), logged at `import deepspeed` on its "DeepSpeed" logger
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


class _WithoutDeepSpeedsCpuNotice:
    """A logging filter for DeepSpeed's logger that drops :data:`DEEPSPEED_CPU_NOTICE` and nothing else."""

    @staticmethod
    def filter(record) -> bool:
        return DEEPSPEED_CPU_NOTICE not in record.getMessage()


def quiet_deepspeed_cpu_notice() -> None:
    """Drop DeepSpeed's "Setting accelerator to CPU" notice in this process (the entrypoint, which never trains).

    The entrypoint imports DeepSpeed only as a side effect (transformers' ``save_pretrained`` building the tiny demo
    model reaches accelerate's ``extract_model_from_parallel``, which imports it; the libraries check's CPU Adam
    probe), and the notice came first thing in `rocmft plan`, `check` and `train` on a machine without a GPU.
    DeepSpeed's own detection is left as it is; only that line goes (the filter sits on the "DeepSpeed" logger,
    which DeepSpeed's LoggerFactory configures on import without removing filters). Whether a GPU is visible is
    said by rocmft's own gpu-runtime check; the worker, which trains, names the CPU accelerator itself
    (rocmft.worker.patches.deepspeed_accelerator_without_gpu)."""
    import logging

    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _WithoutDeepSpeedsCpuNotice) for f in logger.filters):
        logger.addFilter(_WithoutDeepSpeedsCpuNotice())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rocmft`` console script; returns the exit code.

    A Ctrl-C (SIGINT) while the parser is built or the arguments are read ends as every stop does, "interrupted"
    and 143: it raised KeyboardInterrupt outside the ``try`` and Python printed a traceback and died by SIGINT (130)
    when Ctrl-C came in the first tenth of a second (a break-it trial, 2026-12-06)."""
    args = None
    try:
        quiet_deepspeed_cpu_notice()
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and hasattr(args, "config_args") and not any(token.startswith("-") for token in extra):
            # argparse ends a positional list at an option: `render my.yaml --json lr=1` leaves lr=1 over; keep order
            args.config_args = [*args.config_args, *extra]
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return int(args.handler(args))
    except ConfigError as err:
        report_refusal(err, as_json=getattr(args, "findings_json", False))
        return int(err.code)
    except RocmftError as err:
        say(str(err), stream=sys.stderr, all_ranks=True)
        return int(err.code)
    except KeyboardInterrupt:
        say("interrupted", stream=sys.stderr, all_ranks=True)
        return int(ExitCode.INTERRUPTED)
