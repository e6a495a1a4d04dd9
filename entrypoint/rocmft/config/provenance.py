"""Where a value came from: a typed :class:`Source` for every argument, said one way in every message.

Every training argument's source is recorded as it is layered (:attr:`rocmft.config.settings.Settings.sources`,
then :mod:`rocmft.config.layers` and :mod:`rocmft.render`) as a :class:`Source`: its :class:`Kind` (an environment
variable, ROCMFT_CONFIG's file, the command line's YAML, a command-line ``key=value``, the template's default, the
built-in recipe, rocmft's default, a decision rocmft derived from its own settings, the planner, a restart) and its
detail (the variable, the file, the tokens, the reason). Decisions read the kind (:attr:`Source.user_chosen`:
did the user choose this?), never the text; ``str(source)`` is the one rendering, used by every message, the
manifest and ``rocmft plan``. :func:`named` turns a name, its value, its source and the text the user wrote
(:attr:`~rocmft.config.settings.Settings.given`) into ``LEARNING_RATE=1e-4 (set in the environment)``,
``cutoff_len: 2k (in ROCMFT_CONFIG (/config/my.yaml))`` or ``CUTOFF_LEN=1024 (the default in train.yaml.j2)``: the
name as the user would find it where they wrote it, the value spelled as they wrote it, and where it came from.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rocmft.findings import note

FROM_ENVIRONMENT = "set in the environment"
NOT_SET = "not set: the default"


class Kind(enum.Enum):
    """The kinds of :class:`Source`; the value is the manifest's word for it (``argument_source_kinds``)."""

    ENVIRONMENT = "environment"  # detail: the variable (LEARNING_RATE, or an alias of the argument)
    CONFIG_FILE = "rocmft_config"  # detail: the file ROCMFT_CONFIG names
    COMMAND_LINE_YAML = "command_line_yaml"  # detail: the CONFIG.yaml of `rocmft train CONFIG.yaml`
    COMMAND_LINE = "command_line"  # detail: the key=value tokens as typed
    TEMPLATE = "template"  # train.yaml.j2's own default
    BUILTIN = "builtin"  # the built-in recipe (templates/demo.yaml), only when no model is given
    ROCMFT_DEFAULT = "rocmft_default"  # a default of rocmft's (detail: what it is made of)
    ROCMFT = "rocmft"  # a value rocmft derives from its own settings (detail: which); ``basis``: the user's input
    PLAN = "plan"  # the planner (rocmft.render.planner; detail: the reason)
    RESTART = "restart"  # an automatic restart (detail: why, e.g. after a non-finite loss at step 15)


# The kinds that are the user's own choice (the answer to "did the user set this?").
USER_KINDS = frozenset({Kind.ENVIRONMENT, Kind.CONFIG_FILE, Kind.COMMAND_LINE_YAML, Kind.COMMAND_LINE})
YAML_KINDS = frozenset({Kind.CONFIG_FILE, Kind.COMMAND_LINE_YAML})


@dataclass(frozen=True)
class Source:
    """Where one value came from.

    Attributes:
        kind: the :class:`Kind`.
        detail: the variable, file, tokens or reason (see :class:`Kind`); part of the rendering only.
        basis: for :attr:`Kind.ROCMFT` and a command line merged into a mapping, the source of the input the
            value was made from (DATASET_DIR's for the data set registry; the mapping's own below a merge).
    """

    kind: Kind
    detail: str = ""
    basis: Source | None = None

    @classmethod
    def environment(cls, variable: str) -> Source:
        """An environment variable (``LEARNING_RATE``)."""
        return cls(Kind.ENVIRONMENT, variable)

    @property
    def user_chosen(self) -> bool:
        """Whether the user chose this value: their environment, YAML or command line, or a value rocmft derived
        from one of those (a merge into the user's mapping). Template, built-in and rocmft's defaults, the planner
        and a restart are not the user's choice."""
        if self.kind in USER_KINDS:
            return True
        return self.kind is Kind.ROCMFT and self.basis is not None and self.basis.user_chosen

    def __str__(self) -> str:
        """The one rendering of a source, as the manifest, ``rocmft plan`` and messages show it."""
        kind, detail = self.kind, self.detail
        if kind is Kind.ENVIRONMENT:
            return detail
        if kind is Kind.CONFIG_FILE:
            return f"ROCMFT_CONFIG ({detail})"
        if kind is Kind.COMMAND_LINE_YAML:
            return f"the command line's CONFIG ({detail})"
        if kind is Kind.COMMAND_LINE:
            return f"command line ({detail})" + (f", merged into {self.basis}" if self.basis is not None else "")
        if kind is Kind.TEMPLATE:
            return "the default in train.yaml.j2"
        if kind is Kind.BUILTIN:
            return "the built-in default (templates/demo.yaml)"
        if kind is Kind.ROCMFT_DEFAULT:
            return f"rocmft's default ({detail})"
        if kind is Kind.PLAN:
            return f"rocmft plan: {detail}"
        if kind is Kind.RESTART:
            return f"the restart {detail}"
        return detail  # Kind.ROCMFT: the decision in words


def texts(sources: Mapping[str, Source]) -> dict[str, str]:
    """``sources`` rendered for JSON (the manifest's ``argument_sources``)."""
    return {name: str(source) for name, source in sources.items()}


def kinds(sources: Mapping[str, Source]) -> dict[str, str]:
    """Each source's :class:`Kind` word, for tools reading the manifest (``argument_source_kinds``)."""
    return {name: source.kind.value for name, source in sources.items()}


def origin(name: str, source: Source | None) -> str:
    """Where argument ``name``'s value came from, in words (``set in the environment``, ``in ROCMFT_CONFIG (...)``,
    the source as rendered otherwise, :data:`NOT_SET` without one)."""
    if source is None:
        return NOT_SET
    if source.kind is Kind.ENVIRONMENT:
        return FROM_ENVIRONMENT if source.detail == name.upper() else f"{FROM_ENVIRONMENT} as {source.detail}"
    if source.kind in YAML_KINDS:
        return f"in {source}"
    return str(source)


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


def removal(name: str, source: Source | None) -> str:
    """How to take argument ``name`` away where the user set it, as a fix: ``unset FP16`` (its environment
    variable), ``delete bf16 from ROCMFT_CONFIG (x.yaml)``, ``drop fp16=... from the command line``; for a default or
    rocmft's own choice, ``leave NAME unset``."""
    if source is not None and source.kind is Kind.ENVIRONMENT:
        return f"unset {source.detail}"
    if source is not None and source.kind in YAML_KINDS:
        return f"delete {name} from {source}"
    if source is not None and source.kind is Kind.COMMAND_LINE:
        return f"drop {name}=... from the command line"
    return f"leave {name.upper()} unset"


def changed_where(name: str, source: Source | None) -> str:
    """Where the user changes argument ``name``, for a fix: its variable (``LORA_RANK``, or the alias they set),
    ``lora_rank in ROCMFT_CONFIG (x.yaml)``, ``lora_rank on the command line``; ``NAME`` for a default. A fix that
    named the variable of a value given on the command line sent the user to a setting that value overrides (a
    break-it trial, 2026-12-06: LORA_RANK=8 set, ``lora_rank=0`` refused with "Set LORA_RANK")."""
    if source is not None and source.kind is Kind.ROCMFT and source.basis is not None and source.basis.user_chosen:
        source = source.basis
    if source is not None and source.kind is Kind.ENVIRONMENT:
        return source.detail
    if source is not None and source.kind in YAML_KINDS:
        return f"{name} in {source}"
    if source is not None and source.kind is Kind.COMMAND_LINE:
        return f"{name} on the command line"
    return name.upper()


def _parts(name: str, value: Any, source: Source | None, given: str | None) -> tuple[str, str, str, Source | None]:
    """The setting as the user would find it where it was set (``LEARNING_RATE=1e-4``, ``cutoff_len: 2k``), where
    that is in words, the value as shown, and the source named; a value rocmft derived from one of the user's
    settings is named as that setting."""
    if source is not None and source.kind is Kind.ROCMFT and source.basis is not None and source.basis.user_chosen:
        source = source.basis
    kind = source.kind if source is not None else None
    shown = spelled(value, given if kind in USER_KINDS else None)
    if kind in YAML_KINDS:
        return f"{name}: {shown}", origin(name, source), shown, source
    if kind is Kind.COMMAND_LINE:
        return f"{name}={shown}", str(source), shown, source
    variable = source.detail if source is not None and kind is Kind.ENVIRONMENT else name.upper()
    return f"{variable}={shown}", origin(name, source), shown, source


def named(name: str, value: Any, source: Source | None, given: str | None = None) -> str:
    """One setting for a message: ``NAME=value (where from)``; a key of a YAML file as ``key: value (in <file>)``,
    a command-line key as ``key=value (command line ...)``. ``given`` is the user's text, used when the source is
    the user's (a default or rocmft's decision has no spelling of the user's). A value rocmft derived from the
    user's setting (BF16 of the precision policy that followed a YAML's ``bf16: true``) is named as that setting."""
    if value is None and source is None:
        text = f"{name.upper()} not set"
        note(name, None, None, text)  # the settings of a rule's finding (rocmft.findings)
        return text
    setting, where, shown, said = _parts(name, value, source, given)
    text = f"{setting} ({where})"
    note(name, shown, said, text)
    return text


def stated(name: str, value: Any, source: Source | None, given: str | None = None) -> str:
    """:func:`named` as a clause, for text already in parentheses: ``bf16: true, in ROCMFT_CONFIG (x.yaml)``."""
    setting, where, _, _ = _parts(name, value, source, given)
    return f"{setting}, {where}"


def written(name: str, value: Any, source: Source | None) -> str:
    """Argument ``name`` set to ``value`` the way the user writes it where ``source`` says it was set, for a fix to
    paste back: ``DATASET=a`` (its environment variable), ``dataset: a`` (a YAML), ``dataset=a`` (the command
    line) (:func:`named` without the source's words)."""
    return _parts(name, value, source, None)[0]


def named_in(name: str, arguments: Mapping[str, Any], sources: Mapping[str, Source],
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


def knob(field: str, value: Any, explicit: bool, given: str | None = None, override: Source | None = None) -> str:
    """One of rocmft's own settings: ``ROCMFT_<FIELD>=value (set in the environment)``, ``(rocmft's default)``, or
    with the source of rocmft's own ``override`` (``(the restart after a non-finite loss at step 15)``)."""
    if override is not None:
        text = f"ROCMFT_{field.upper()}={spelled(value)} ({override})"
        note(f"ROCMFT_{field.upper()}", spelled(value), override, text)
        return text
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


__all__ = ["FROM_ENVIRONMENT", "NOT_SET", "USER_KINDS", "Kind", "Source", "changed_where", "environment_variable",
           "kinds", "knob", "named", "named_in", "origin", "removal", "spelled", "texts", "written"]  # fmt: skip
