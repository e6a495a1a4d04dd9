"""The user's own LLaMA-Factory YAML (``ROCMFT_CONFIG``, or the YAML of ``rocmft train CONFIG.yaml``), read
the way LLaMA-Factory reads it, its keys checked against the installed LLaMA-Factory's arguments and its values
typed as the environment's are. The command line's ``key=value`` overrides are checked and typed by the same
helpers (:func:`rocmft.config.settings.load_settings`).
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rocmft.config.envargs import (
    _adapter,
    _admits,
    _did_you_mean,
    _process_variable_hint,
    _rocmft_setting_hint,
    replacement,
)
from rocmft.config.lfargs import COMMA_LIST_ARGUMENTS, lf_arguments, stack_versions
from rocmft.container import mount
from rocmft.errors import ConfigError
from rocmft.nesting import TOO_DEEP, TooDeep, check_depth


def load_user_config(path: Path, on_command_line: bool = False, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load ``ROCMFT_CONFIG`` (or, with ``on_command_line``, the YAML of ``rocmft train CONFIG.yaml``): a
    LLaMA-Factory training YAML, read the way LLaMA-Factory reads it.

    LLaMA-Factory loads YAML with OmegaConf, which rejects duplicate keys (DESIGN.md); so does this. Values are
    typed as the environment's are (:func:`_typed_values`).

    Raises:
        ConfigError: the file is missing, unreadable, not a mapping, or has keys that are not arguments
            of the installed LLaMA-Factory (listed with a did-you-mean), or values of the wrong type.
    """
    from omegaconf import OmegaConf

    where = f"The config file {path} (on the command line)" if on_command_line else f"ROCMFT_CONFIG={path}"
    if not path.is_file():
        what = ("a folder, not a YAML file" if path.is_dir() else "not a regular file (a device, a pipe or a socket)"
                if os.path.exists(path) else "no such file")  # fmt: skip
        raise ConfigError(
            f"{where}: {what}.",
            f"Check the path (a relative one is read from {Path.cwd()}); in a container, mount the YAML and give "
            f"its path inside: {mount('<your YAML on the host>', str(path), read_only=True)}." if on_command_line else
            f"Mount the YAML at that path: {mount('<your YAML on the host>', str(path), read_only=True)}.",
        )  # fmt: skip
    # Both parse: OmegaConf is LLaMA-Factory's reading (duplicate keys, ${...}); PyYAML's node keeps kind and raw text.
    node = _compose(path)
    shape = _not_a_mapping(node)
    if shape:  # before OmegaConf, which reads a lone `hello` as the key `hello` and refuses a lone number as an OSError
        raise ConfigError(f"{where} holds {shape}: {MAPPING}", MAPPING_FIX)
    try:
        loaded = check_depth(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    except (RecursionError, TooDeep) as err:  # OmegaConf recurses per level; PyYAML's scanner stops at its own
        raise ConfigError(f"{where} is {TOO_DEEP}.", "Write the values flat, as LLaMA-Factory's examples/ "
                          "do (a mapping of argument: value).") from err  # fmt: skip
    except Exception as err:  # OmegaConf raises many types (parser errors, duplicate keys, interpolation)
        if "exceeded maximum nesting depth" in str(err):  # libyaml (src/scanner.c, yaml_parser_increase_flow_level)
            raise ConfigError(f"{where} is {TOO_DEEP}.", "Write the values flat, as LLaMA-Factory's examples/ "
                              "do (a mapping of argument: value).") from err  # fmt: skip
        raise ConfigError(f"{where} is not valid YAML: {err}", "Fix the YAML syntax.") from err
    if not isinstance(loaded, dict):  # a shape _not_a_mapping could not read
        raise ConfigError(f"{where}: {MAPPING}", MAPPING_FIX)
    _refuse_unknown_keys(loaded, where, lambda key: key, lambda key: replacement(key, yaml_key=True))
    if raw is not None:  # the values as the YAML spells them, before typing (a "2k" or "1e-4" stays that text)
        raw.update(loaded)
        raw.update({key: text for key, text in _plain_scalars(node).items() if not isinstance(loaded.get(key), str)})
    return _typed_values(loaded, where, lambda key, value: f"{key}: {_yaml_text(value)}",
                         "Give each key a value of the type shown.")  # fmt: skip


# What a training YAML is, and how to write one (LLaMA-Factory's examples/train_lora/*.yaml).
MAPPING = "it must be a mapping of LLaMA-Factory arguments, one `argument: value` per line."
MAPPING_FIX = ("Write the settings as LLaMA-Factory's examples/ do (e.g. `learning_rate: 1.0e-4`), one per line; "
               "an empty file sets nothing.")  # fmt: skip


def _compose(path: Path):
    """The YAML at ``path`` composed by PyYAML (SafeLoader): its document's node (a ``yaml.Node``), or None for an
    empty file or one that cannot be read or composed (OmegaConf's own error then says why)."""
    import yaml

    try:
        return yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, ValueError, RecursionError, yaml.YAMLError):
        return None


def _not_a_mapping(node) -> str | None:
    """What a YAML document (its :func:`_compose` node) holds when it is a list or a lone scalar (``the text
    'hello'``, ``a list of 2 items``), else None: a mapping, an empty file (no settings, as LLaMA-Factory reads it),
    a lone ``null``, or a file PyYAML cannot compose (None). OmegaConf 2.4 reads a lone ``hello`` as
    ``{hello: None}``, which was reported as one unknown key (a break-it trial, 2026-12-05)."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return f"a list of {len(node.value)} item{'' if len(node.value) == 1 else 's'}"
    if not isinstance(node, yaml.ScalarNode) or node.tag == "tag:yaml.org,2002:null":
        return None
    kind = {"str": "the text", "int": "the number", "float": "the number", "bool": "the boolean"}.get(
        node.tag.rsplit(":", 1)[-1], "the value"
    )
    return f"only {kind} {node.value[:60]!r}"


def _plain_scalars(node) -> dict[str, str]:
    """The top-level keys of a YAML document (its :func:`_compose` node) whose value is a plain scalar, with its text
    as written: YAML reads ``learning_rate: 1e-4`` as a float and ``fp16: 1`` as an int, which messages would
    otherwise show as 0.0001 and true where the environment's LEARNING_RATE=1e-4 and the command line's fp16=1 show
    what the user typed. Interpolations (``${...}``) are left out (their resolved value is shown); a file that does
    not compose (None), empty."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: value.value for key, value in node.value
            if isinstance(key, yaml.ScalarNode) and isinstance(value, yaml.ScalarNode) and value.style is None
            and value.value and "${" not in value.value}  # fmt: skip


def _refuse_unknown_keys(values: Mapping[str, Any], where: str, shown: typing.Callable[[str], str],
                         replaced: typing.Callable[[str], str | None]) -> None:  # fmt: skip
    """Raise when a key of ``values`` (from a YAML file or the command line, ``where``) is not an argument of the
    installed LLaMA-Factory: each listed as ``shown(key)`` with its replacement (``replaced(key)``, phrased for the
    place), the rocmft setting it names, or a did-you-mean.

    Raises:
        ConfigError: one or more unknown keys (exit 2).
    """
    names = list(lf_arguments())
    unknown = [key for key in values if key not in lf_arguments()]
    if not unknown:
        return
    lines = []
    for key in unknown:
        hint = (replaced(key) or _rocmft_setting_hint(key, values[key]) or _process_variable_hint(key, values[key])
                or _case_hint(key))  # fmt: skip
        lines.append(f"  {shown(key)}: {hint}" if hint else f"  {shown(key)}:{_did_you_mean(key, names)}")
    raise ConfigError(
        f"{where} has keys that are not arguments of the installed LLaMA-Factory "
        f"{stack_versions()['llamafactory']} / transformers {stack_versions()['transformers']}:\n" + "\n".join(lines),
        "Remove or rename them.",
    )


def _case_hint(key: str) -> str | None:
    """For a key that is an argument's name in another case (``FP8``, ``Learning_Rate``): its spelling here, since
    YAML and command-line keys are LLaMA-Factory's lower-case names (the environment takes any case). None
    otherwise."""
    lower = key.lower()
    if lower == key or lower not in lf_arguments():
        return None
    return f"the argument is spelled {lower} here (keys are LLaMA-Factory's lower-case names)"


def _holds_nul(value: Any) -> bool:
    """Whether a (nested) value holds a NUL character in a string or a mapping key."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    return isinstance(value, list) and any(_holds_nul(v) for v in value)


def _typed_values(values: Mapping[str, Any], where: str, shown: typing.Callable[[str, Any], str],
                  fix: str) -> dict[str, Any]:  # fmt: skip
    """``values`` (argument name -> value, every name an argument) typed as the environment's are
    (:func:`_adapter`: the argument's annotation, read leniently).

    Raises:
        ConfigError: values of the wrong type, each as ``shown(key, value)``, pydantic's reason and the expected
            type (exit 2).
    """
    typed, bad = {}, []
    for key, value in values.items():
        value = _comma_list(key, value)
        if _holds_nul(value):  # YAML's "\0": no file name or argument holds it (os.stat raised ValueError)
            bad.append(f"  {shown(key, value)}: holds a NUL character (\\0), which no file name or argument can hold")
            continue
        if isinstance(value, bool) and _number_only(key):  # pydantic's lax mode reads true/false as 1/0
            bad.append(f"  {shown(key, value)}: a boolean where {key} takes a number "
                       f"(expected {lf_arguments()[key].type_text})")  # fmt: skip
            continue
        if value is None and _takes_no_null(key):  # a YAML `key: null`/`~`, or `key=null` on the command line
            argument = lf_arguments()[key]
            bad.append(
                f"  {shown(key, value)}: {key} takes no null (expected {argument.type_text}); remove it for "
                f"LLaMA-Factory's default ({argument.default_text})"
            )
            continue
        try:
            typed[key] = _adapter(key).validate_python(value)
        except ValidationError as err:
            bad.append(f"  {shown(key, value)}: {err.errors()[0]['msg']} (expected {lf_arguments()[key].type_text})")
    if bad:
        raise ConfigError(f"{where} has values of the wrong type:\n" + "\n".join(bad), fix)
    return typed


def _takes_no_null(key: str) -> bool:
    """Whether the argument ``key`` has a default that is not None and a type without None (``cutoff_len: int =
    2048``, ``learning_rate: float``). HfArgumentParser.parse_dict passes a null on as None, unchecked: LLaMA-Factory
    0.9.5's parse accepted ``learning_rate: null`` and ``cutoff_len: null``, and the run died after the model loaded
    (torch's AdamW: "'<=' not supported between instances of 'float' and 'NoneType'"; a break-it trial,
    2026-12-06)."""
    argument = lf_arguments()[key]
    return argument.default is not None and not _admits(argument.annotation, (type(None),))


def _yaml_text(value: Any) -> str:
    """A YAML value the way a YAML spells it, for messages: ``null``, ``true``, else its repr (``'qwen'``, ``8.5``)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def _number_only(key: str) -> bool:
    """Whether the argument ``key`` takes a number and no boolean (``lora_rank: int``). pydantic's lax mode turned a
    YAML's ``lora_rank: true`` into 1 and ``num_train_epochs: false`` into 0 (the environment's LORA_RANK=true was
    refused: a break-it trial, 2026-12-06)."""
    annotation = lf_arguments()[key].annotation
    return _admits(annotation, (int, float)) and not _admits(annotation, (bool,))


def _comma_list(key: str, value: Any) -> Any:
    """A YAML list (``dataset: [a, b]``) for an argument LLaMA-Factory splits at commas
    (:data:`rocmft.config.lfargs.COMMA_LIST_ARGUMENTS`) as the comma list it stands for (``a,b``); LLaMA-Factory
    takes either (``split_arg``), and rocmft's environment and train.yaml carry the text. Other values as given."""
    scalars = isinstance(value, list | tuple) and all(isinstance(i, str | int | float) and not isinstance(i, bool)
                                                       for i in value)  # fmt: skip
    return ",".join(str(item).strip() for item in value) if key in COMMA_LIST_ARGUMENTS and value and scalars else value


__all__ = ["load_user_config"]
