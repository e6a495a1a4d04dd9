"""``rocmft serve --load RUN``: load a finished run's LoRA adapter into a running vLLM server and ask it a prompt
(rocmft.outputs.serve)."""

from __future__ import annotations

import os

from rocmft.cli.chat import _positive_int
from rocmft.cli.common import given_path
from rocmft.errors import ExitCode


def register(sub) -> None:
    """Add ``serve`` and its options to the subcommands ``sub``."""
    serve = sub.add_parser(
        "serve", help="load a finished run's LoRA adapter into the running vLLM server (no restart) and ask it"
    )
    serve.add_argument("--load", required=True, metavar="RUN", help="the run's OUTPUT_DIR or a checkpoint-N folder, "
                       "as the server sees it (compose: /saves/<run>)")  # fmt: skip
    serve.add_argument("--url", help="the vLLM server (default ROCMFT_SERVE_URL, else http://127.0.0.1:8000)")
    serve.add_argument("--name", help="the adapter's model name in the API (default: the run's folder name)")
    serve.add_argument("--prompt", "-p", action="append", help="a prompt (repeatable; default: one of the run's)")
    serve.add_argument("--max-tokens", type=_positive_int, default=64, help="tokens per answer (default 64)")
    serve.add_argument("--json", action="store_true", help="one JSON line per prompt: {prompt, completion, model}")
    serve.set_defaults(handler=run)


def run(args) -> int:
    """Load the adapter and ask (rocmft.outputs.serve.load_and_ask)."""
    from rocmft.config.settings import load_settings
    from rocmft.outputs.serve import load_and_ask, server_url

    settings = load_settings(os.environ)
    prompts = [p for p in args.prompt or [] if p.strip()] or None
    run = given_path(args.load, "rocmft serve --load")
    load_and_ask(run, server_url(args.url, settings), args.name, prompts, args.max_tokens, args.json, settings)
    return ExitCode.OK
