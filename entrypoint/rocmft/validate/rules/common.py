"""Small readings the rules share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rocmft.config.provenance import Source, named_in


def user_set(name: str, sources: Mapping[str, Source]) -> bool:
    """Whether the user chose ``name`` (the environment, a YAML or the command line), not a default, the planner
    or a restart: read from the source's kind (:attr:`rocmft.config.provenance.Source.user_chosen`), never its
    text (a file named default-qwen.yaml is the user's choice too)."""
    source = sources.get(name)
    return source is not None and source.user_chosen


def named(run: Any, name: str, default: Any = None) -> str:
    """Argument ``name`` of a rule's subject (:class:`~rocmft.validate.rules.Inputs` or
    :class:`~rocmft.render.Rendered`) for a message: its variable, its value as the user wrote it, and where it came
    from (:func:`rocmft.config.provenance.named`), the one way every rule says so; ``default`` is the value used
    when it is not set."""
    return named_in(name, run.arguments, run.sources, run.settings.given, default)


def knob(run: Any, field: str) -> str:
    """rocmft's own setting ``field`` (``distributed``) of a rule's subject for a message
    (:meth:`rocmft.config.settings.Settings.knob`)."""
    return run.settings.knob(field)


__all__ = ["knob", "named", "user_set"]
