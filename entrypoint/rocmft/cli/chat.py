"""``rocmft chat``: answer prompts with an export or a run's adapter, with the model's chat template
(rocmft.outputs.chat)."""

from __future__ import annotations

import argparse
import os

from rocmft.cli.common import given_path
from rocmft.errors import ExitCode
from rocmft.values import whole_number


def register(sub) -> None:
    """Add ``chat`` and its options to the subcommands ``sub``."""
    chat = sub.add_parser("chat", help="answer prompts with an exported model or a run's adapter (greedy)")
    chat.add_argument("model", nargs="?", help="an export folder or a run's OUTPUT_DIR (default: the export of the "
                      "run of these settings, else the run)")  # fmt: skip
    chat.add_argument("--prompt", "-p", action="append", help="a prompt (repeatable)")
    chat.add_argument("--file", "-f", help="a file with one prompt per line (- for standard input)")
    chat.add_argument("--system", help="a system message before each prompt")
    chat.add_argument("--max-new-tokens", type=_positive_int, default=128,
                      help="tokens to generate per prompt (default 128)")  # fmt: skip
    chat.add_argument("--json", action="store_true", help="one JSON line per prompt: {prompt, completion}")
    chat.set_defaults(handler=run)


def _positive_int(text: str) -> int:
    """argparse type: a whole number above 0 (argparse prints the error with the option's name and exits 2)."""
    number = whole_number(text)
    if number is None or number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number above 0, not {text!r}")
    return number


def run(args) -> int:
    """Answer prompts with an export or a run (rocmft.outputs.chat)."""
    from rocmft.config.settings import load_settings
    from rocmft.outputs.chat import main as chat_main
    from rocmft.outputs.chat import read_prompts

    prompts = read_prompts(args.prompt, args.file)
    model = given_path(args.model, "rocmft chat")
    chat_main(model, prompts, args.max_new_tokens, args.system, args.json, load_settings(os.environ))
    return ExitCode.OK
