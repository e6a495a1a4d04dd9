"""The configuration on a command line: ``rocmft train [CONFIG.yaml] [key=value ...]``.

It reads the way ``llamafactory-cli train my.yaml key=value ...`` does (LLaMA-Factory 0.9.5,
``llamafactory/hparams/parser.py``, ``read_args``): the first argument is the training YAML when it ends in
``.yaml``/``.yml`` (or ``.json``), the rest go through ``OmegaConf.from_cli`` (``from_dotlist``: each token split at
its first unescaped ``=``, the value read by OmegaConf's YAML loader, so ``5e-5`` is a float, ``true`` a bool,
``[q_proj,v_proj]`` a list, ``'1e-4'`` a string, ``a.b=1`` the mapping ``{a: {b: 1}}``; a later token wins), merged
over the YAML. OmegaConf itself does the splitting and the typing here, not hand-written code, so the syntax is the
installed OmegaConf's, exactly LLaMA-Factory's.

Where rocmft refuses what LLaMA-Factory would take (each a :class:`~rocmft.errors.ConfigError`, exit 2):

* a token without ``=`` (OmegaConf makes it ``key: null``; on a command line it is a typo or a misplaced file);
* an empty key (``=5e-5``), and an empty value (``learning_rate=``: OmegaConf's null, but in a batch script it is
  almost always an unset shell variable, ``learning_rate=$LR``; ``learning_rate=null`` still says null);
* a secret (``hf_hub_token=...``, by name, :func:`rocmft.config.lfargs.is_secret_name`): a command line is visible
  to every user in ``ps`` and lands in shell histories and job logs;
* a first argument without ``=`` that is not a ``.yaml``/``.yml``/``.json`` file name (a first argument with ``=``
  is an override, so a YAML whose path holds ``=`` goes in ROCMFT_CONFIG instead).

Whether each key is an argument of the installed LLaMA-Factory, and each value of its type, is checked with the
environment's and ROCMFT_CONFIG's rules by :func:`rocmft.config.settings.load_settings`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rocmft.config.lfargs import is_secret_name
from rocmft.config.provenance import Kind, Source
from rocmft.errors import ConfigError

# The file names LLaMA-Factory 0.9.5's read_args takes as a config file (str.endswith, case-sensitive).
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
USAGE = "[CONFIG.yaml] [key=value ...]"
SECRET_FIX = (
    "Pass secrets as environment variables (HF_TOKEN=..., or the argument's UPPER_CASE name such as HF_HUB_TOKEN): "
    "they reach training and are never written to any file or log."
)


@dataclass(frozen=True)
class CommandLine:
    """A command's configuration arguments, parsed (values as OmegaConf reads them, not yet typed).

    Attributes:
        config: the training YAML given first, as an absolute path (not yet read), or None.
        overrides: top-level argument name -> value, in command-line order (a later token for the same name has
            been merged over an earlier one, as ``OmegaConf.from_dotlist`` does); a dotted token gives a mapping.
        tokens: top-level argument name -> the tokens that set it, as typed (``("learning_rate=5e-5",)``), for the
            settings' sources and messages.
    """

    config: Path | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    tokens: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def source(self, name: str, merged_into: Source | None = None) -> Source:
        """Where ``name`` came from, for ``Settings.sources``: rendered ``command line (learning_rate=5e-5)``;
        ``merged_into``: the source of the mapping below that the tokens were merged into."""
        return Source(Kind.COMMAND_LINE, " ".join(self.tokens[name]), basis=merged_into)

    def shown(self, name: str) -> str:
        """The tokens of ``name`` as the user typed them, for messages (``learning_rte=5e-5``)."""
        return " ".join(self.tokens[name])


def parse_command_line(arguments: Sequence[str]) -> CommandLine:
    """Parse ``[CONFIG.yaml] [key=value ...]`` (see the module docstring for the rules and the refusals).

    Args:
        arguments: the command's positional arguments, as the shell passed them.

    Returns:
        The :class:`CommandLine`; the config file is not opened here (``load_settings`` reads it).

    Raises:
        ConfigError: a malformed token (no ``=``, an empty key or value, a value OmegaConf cannot read), a secret,
            or a first argument that is neither ``key=value`` nor a YAML file name. Never echoes a secret's value.
    """
    from omegaconf import OmegaConf

    tokens = list(arguments)
    config = None
    if tokens and "=" not in tokens[0]:
        first = tokens.pop(0)
        if not first.endswith(CONFIG_SUFFIXES):
            raise ConfigError(
                f"{first!r} on the command line is not a YAML file name (LLaMA-Factory's rule: it ends in "
                f"{', '.join(CONFIG_SUFFIXES)}) and not a key=value override.",
                f"Give the training YAML first, then overrides: rocmft train {USAGE} "
                "(e.g. rocmft train my.yaml learning_rate=5e-5)"
                + (f"; a flag needs a value: {first}=true." if first.isidentifier() else "."),
            )
        config = Path(first).expanduser().absolute()
    problems: list[str] = []
    merged = OmegaConf.create()
    by_name: dict[str, list[str]] = {}
    for token in tokens:
        problem, parsed = _parse_token(token)
        if problem:
            problems.append(f"  {problem}")
            continue
        name = next(iter(parsed))
        if is_secret_name(name) or any(is_secret_name(str(part)) for part in _paths(parsed[name])):
            raise ConfigError(
                f"`{name}` on the command line is a secret: a command line shows in `ps` to every user of the "
                "machine, in shell histories and in the job's logs (the value is not repeated here).",
                SECRET_FIX,
            )
        merged = OmegaConf.merge(merged, OmegaConf.create(parsed))
        by_name.setdefault(name, []).append(token)
    if problems:
        raise ConfigError(
            "Malformed arguments on the command line (each must be key=value, as for llamafactory-cli train):\n"
            + "\n".join(problems),
            f"Write each override as name=value after the YAML: rocmft train {USAGE} (e.g. learning_rate=5e-5 "
            "lora_target=q_proj,v_proj); quote a token that holds spaces ('run_name=my run').",
        )
    try:
        overrides = OmegaConf.to_container(merged, resolve=True)  # resolved like ROCMFT_CONFIG (load_user_config)
    except Exception as err:  # OmegaConf's interpolation errors have many types
        raise ConfigError(
            f"The command line's overrides cannot be resolved: {str(err).strip().splitlines()[0]}",
            "Interpolations (${...}) may name only other command-line keys; or let the shell expand variables.",
        ) from err
    assert isinstance(overrides, dict)
    return CommandLine(
        config=config,
        overrides=MappingProxyType(overrides),
        tokens=MappingProxyType({name: tuple(seen) for name, seen in by_name.items()}),
    )


def _parse_token(token: str) -> tuple[str | None, dict[str, Any]]:
    """One ``key=value`` token through OmegaConf: ``(None, {top-level key: value})``, or ``(problem, {})``."""
    from omegaconf import OmegaConf

    if "=" not in token:
        hint = " (the YAML file goes first)" if token.endswith(CONFIG_SUFFIXES) else ""
        return f"{token!r}: no `=`{hint}; a flag needs a value, e.g. {token}=true", {}
    key, _, value = token.partition("=")
    if not key.strip():
        return f"{token!r}: the key before `=` is empty", {}
    if value == "" and not key.endswith("\\"):  # an escaped `\=` belongs to the key (OmegaConf >= 2.4)
        return f"{token!r}: no value after `=` (an unset shell variable?); write {key}=null to mean null", {}
    # a malformed secret (hub_token='hf_...) is named without its value, as parse_command_line names a well-formed one
    secret = any(is_secret_name(part) for part in re.split(r"[.\[\]]", key))
    shown = repr(f"{key}=<a secret's value, not repeated>") if secret else repr(token)
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([token]), resolve=False)
    except Exception as err:  # yaml's ParserError/ScannerError, OmegaConf's key grammar errors
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"{shown}: OmegaConf cannot read it" + ("" if secret else f" ({first_line})"), {}
    assert isinstance(parsed, dict)
    if len(parsed) != 1 or not str(next(iter(parsed))).strip():
        return f"{shown}: the key before `=` is empty", {}
    return None, parsed


def _paths(value: Any) -> list[Any]:
    """The keys inside a (nested) mapping value, to find a secret given as ``a.hub_token=...``."""
    if isinstance(value, dict):
        return [*value, *(key for inner in value.values() for key in _paths(inner))]
    return []


__all__ = ["CONFIG_SUFFIXES", "SECRET_FIX", "USAGE", "CommandLine", "parse_command_line"]
