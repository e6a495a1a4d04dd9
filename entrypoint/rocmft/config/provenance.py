"""Where a value came from, said one way in every message: the one place refusals and warnings name a setting.

A training argument's source is recorded as it is layered (:attr:`rocmft.config.settings.Settings.sources`, then
:mod:`rocmft.config.layers` and :mod:`rocmft.render`): the environment variable's name (``LEARNING_RATE``), the YAML
(``ROCMFT_CONFIG (/config/my.yaml)`` or ``the command line's CONFIG (/abs/my.yaml)``), a command-line override
(``command line (learning_rate=5e-5)``), the built-in or template default, rocmft's own decisions (the planner, the
precision policy, ROCMFT_DISTRIBUTED). :func:`named` turns a name, its value, that source and the text the user wrote
(:attr:`~rocmft.config.settings.Settings.given`) into ``LEARNING_RATE=1e-4 (set in the environment)``,
``cutoff_len: 2k (in ROCMFT_CONFIG (/config/my.yaml))`` or ``CUTOFF_LEN=1024 (the default in train.yaml.j2)``: the
name as the user would find it where they wrote it, the value spelled as they wrote it (``1e-4``, not ``0.0001``),
and where it came from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rocmft.findings import note

FROM_ENVIRONMENT = "set in the environment"
NOT_SET = "not set: the default"
_YAML_SOURCES = ("ROCMFT_CONFIG (", "the command line's CONFIG (")


def is_environment(name: str, source: str | None) -> bool:
    """Whether ``source`` says the value of argument ``name`` came from its environment variable."""
    return source is not None and re.fullmatch(r"[A-Z][A-Z0-9_]*", source) is not None


def origin(name: str, source: str | None) -> str:
    """Where argument ``name``'s value came from, in words (``set in the environment``, ``in ROCMFT_CONFIG (...)``,
    the source as recorded otherwise, :data:`NOT_SET` without one)."""
    if source is None:
        return NOT_SET
    if is_environment(name, source):
        return FROM_ENVIRONMENT if source == name.upper() else f"{FROM_ENVIRONMENT} as {source}"
    if source.startswith(_YAML_SOURCES):
        return f"in {source}"
    return source


def spelled(value: Any, given: str | None = None) -> str:
    """``value`` as the user wrote it (``given``, the text before typing) when known; else as YAML would print a
    number or flag (``1e-05``, ``true``), lists comma-joined."""
    if given is not None:
        return given
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ",".join(spelled(v) for v in value)
    return "" if value is None else str(value)


def removal(name: str, source: str | None) -> str:
    """How to take argument ``name`` away where the user set it, as a fix: ``unset FP16`` (its environment
    variable), ``delete bf16 from ROCMFT_CONFIG (x.yaml)``, ``drop fp16=... from the command line``; for a default or
    rocmft's own choice, ``leave NAME unset``."""
    if source is not None and is_environment(name, source):
        return f"unset {source}"
    if source is not None and source.startswith(_YAML_SOURCES):
        return f"delete {name} from {source}"
    if source is not None and source.startswith("command line"):
        return f"drop {name}=... from the command line"
    return f"leave {name.upper()} unset"


def named(name: str, value: Any, source: str | None, given: str | None = None) -> str:
    """One setting for a message: ``NAME=value (where from)``; a key of a YAML file as ``key: value (in <file>)``,
    a command-line key as ``key=value (command line ...)``. ``given`` is the user's text, used when the source is
    the user's (a default or rocmft's decision has no spelling of the user's)."""
    if value is None and source is None:
        text = f"{name.upper()} not set"
        note(name, None, None, text)  # the settings of a rule's finding (rocmft.findings)
        return text
    user = source is not None and (is_environment(name, source) or source.startswith(_YAML_SOURCES)
                                   or source.startswith("command line"))  # fmt: skip
    shown = spelled(value, given if user else None)
    if source is not None and source.startswith(_YAML_SOURCES):
        text = f"{name}: {shown} ({origin(name, source)})"
    elif source is not None and source.startswith("command line"):
        text = f"{name}={shown} ({source})"
    else:
        variable = source if source is not None and is_environment(name, source) else name.upper()
        text = f"{variable}={shown} ({origin(name, source)})"
    note(name, shown, source, text)
    return text


def named_in(name: str, arguments: Mapping[str, Any], sources: Mapping[str, str],
             given: Mapping[str, str] | None = None, default: Any = None) -> str:  # fmt: skip
    """:func:`named` for argument ``name`` of ``arguments`` with its source in ``sources`` and the user's text in
    ``given`` (:attr:`rocmft.config.settings.Settings.given`); ``default``, the value the consumer uses when the
    argument is not set, is shown as ``NAME=default (not set: the default)``."""
    value = arguments.get(name)
    if value is None and name not in sources and default is not None:
        text = f"{name.upper()}={spelled(default)} ({NOT_SET})"
        note(name, spelled(default), None, text)
        return text
    return named(name, value, sources.get(name), (given or {}).get(name))


def knob(field: str, value: Any, explicit: bool, given: str | None = None) -> str:
    """One of rocmft's own settings: ``ROCMFT_<FIELD>=value (set in the environment)`` or ``(rocmft's default)``."""
    where = FROM_ENVIRONMENT if explicit else "rocmft's default"
    variable, shown = f"ROCMFT_{field.upper()}", spelled(value, given if explicit else None)
    text = f"{variable}={shown} ({where})"
    note(variable, shown, variable if explicit else "rocmft's default", text)
    return text


def environment_variable(name: str, environ: Mapping[str, str]) -> str:
    """A variable read from the environment as it is (torch's, ROCm's, the launcher's): ``NAME=text (set in the
    environment)`` (``repr`` of the text when it holds spaces, quotes or control characters, so they show), or
    ``NAME not set``."""
    if name not in environ:
        note(name, None, None, f"{name} not set")
        return f"{name} not set"
    text = environ[name]
    plain = text and text.isprintable() and not any(c in text for c in " \"'")
    shown = f"{name}={text if plain else repr(text)} ({FROM_ENVIRONMENT})"
    note(name, text, name, shown)
    return shown


__all__ = ["FROM_ENVIRONMENT", "NOT_SET", "environment_variable", "is_environment", "knob", "named", "named_in",
           "origin", "spelled"]  # fmt: skip
