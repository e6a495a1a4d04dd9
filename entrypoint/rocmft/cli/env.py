"""``rocmft env``: versions, device facts and the image build record; ``--docs`` prints the variable reference."""

from __future__ import annotations

import json

from rocmft import __version__
from rocmft.errors import ExitCode


def register(sub) -> None:
    """Add ``env`` and its options to the subcommands ``sub``."""
    env = sub.add_parser("env", help="print versions, device facts and the image build record as JSON")
    env.add_argument("--docs", action="store_true", help="print the environment-variable reference (Markdown)")
    env.add_argument("--full", action="store_true", help="with --docs: list every training argument too")
    env.set_defaults(handler=run)


def run(args) -> int:
    """Print the facts as JSON (or with ``--docs`` the variable reference); exit 0."""
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
