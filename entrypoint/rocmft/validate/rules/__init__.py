"""Rules: the misconfigurations rocmft refuses before anything loads (docs/rules.md lists them with the reports
behind them). A violation is a :class:`~rocmft.errors.ConfigError` (exit 2) naming the variables and files
involved; a few rules return warnings instead, printed once the phase has passed.

A rule is a function ``subject -> list[str] | None`` registered with :func:`rule` for a phase, in a module of
its concern (precision, distributed, hygiene, paths, template, method, ranges, data, model). :func:`apply` runs
a phase's rules by their ``order``, the first error wins; ``order`` keeps the sequence in which the rules have
always fired, so the first error reported for an input does not depend on which module a rule lives in:

* ``inputs`` (:class:`Inputs`: the layered arguments of :mod:`rocmft.config.layers`, the settings, the device),
  before anything is rendered or any folder made: precision conflicts, then distributed settings that cannot
  work together, then quantization that cannot be sharded;
* ``rendered`` (:class:`rocmft.render.Rendered`: the arguments parsed back from the rendered train.yaml, so
  what is checked is what would run), before any file is written: text hygiene first (stray spaces and CRs would
  mislead every later message) ... the chat template last;
* ``launch`` (:class:`rocmft.render.Plan`), as the launch is prepared (:func:`rocmft.launch.prepare_launch`):
  NNODES / NODE_RANK / WORLD_SIZE.

Refusals that are part of a decision stay where the decision is made, each its only home: the precision policy's
(:func:`rocmft.render.precision.resolve_precision`, which the ``precision`` rule calls to refuse early),
ROCMFT_RESUME's choice of a checkpoint (:func:`rocmft.render.resume.choose`: refusing is one of its outcomes),
ROCMFT_NUMA_BIND's binding plan (:func:`rocmft.facts.topology.binding_plan`: the refusal is the parse of the
host's layout), the settings' types and names (pydantic in :mod:`rocmft.config.settings`), and a template that
drops given arguments (:mod:`rocmft.render`, the only place that sees both sides).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from rocmft.config.settings import Settings
from rocmft.console import warn
from rocmft.facts.device import DeviceFacts
from rocmft.facts.modeldir import ModelDir

PHASES = ("inputs", "rendered", "launch")
# The concern modules, imported (and so registered) on first use.
MODULES = ("precision", "distributed", "hygiene", "paths", "template", "method", "ranges", "data", "model", "runtime")


@dataclass(frozen=True)
class Rule:
    """A registered rule: ``fn(subject)`` in ``phase`` at ``order`` (lower first); returns warnings or None."""

    name: str
    phase: str
    order: int
    fn: Callable[[Any], list[str] | None]


REGISTRY: list[Rule] = []


def rule(phase: str, order: int):
    """Register ``fn`` as a rule of ``phase`` (one of :data:`PHASES`), applied at ``order``.

    Raises:
        ValueError: an unknown phase, or an order another rule of the phase already has.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown rule phase {phase!r}")

    def register(fn: Callable[[Any], list[str] | None]) -> Callable[[Any], list[str] | None]:
        if any(r.phase == phase and r.order == order for r in REGISTRY):
            raise ValueError(f"two rules of phase {phase} at order {order}")
        REGISTRY.append(Rule(name=fn.__name__, phase=phase, order=order, fn=fn))
        return fn

    return register


def registered(phase: str) -> list[Rule]:
    """The rules of ``phase`` in the order :func:`apply` runs them."""
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return sorted((r for r in REGISTRY if r.phase == phase), key=lambda r: r.order)


def apply(phase: str, subject: Any) -> None:
    """Run the rules of ``phase`` on ``subject``; print their warnings (``[rocmft] WARNING: ...``) after the last.

    Raises:
        ConfigError: the first rule that fails.
    """
    warnings: list[str] = []
    for item in registered(phase):
        warnings += item.fn(subject) or []
    for warning in warnings:
        warn(warning, all_ranks=True)  # the entrypoint's line, printed whatever RANK says, as always


@dataclass(frozen=True)
class Inputs:
    """The subject of the ``inputs`` phase.

    Attributes:
        settings: the read settings.
        arguments: the layered training arguments (:attr:`rocmft.config.layers.Layers.arguments`).
        device: the probed device.
        sources: where each layered argument came from (:attr:`rocmft.config.layers.Layers.sources`).
    """

    settings: Settings
    arguments: Any
    device: DeviceFacts
    sources: Any = None

    def __post_init__(self) -> None:
        if self.sources is None:
            object.__setattr__(self, "sources", dict(self.settings.sources))

    @cached_property
    def model(self) -> ModelDir:
        """The model folder MODEL_NAME_OR_PATH names (read once for all rules)."""
        return ModelDir(str(self.arguments.get("model_name_or_path") or ""))


def render_checked(settings: Settings, device: DeviceFacts, make_staging):
    """Settings to a staged :class:`rocmft.render.Plan`, each phase's rules where they have always run: layer the
    arguments, the ``inputs`` rules, render, the ``rendered`` rules, write the files. (The ``launch`` rules run in
    :func:`rocmft.launch.prepare_launch`.)

    Args:
        settings: the read settings.
        device: the probed device.
        make_staging: ``callable(output_dir) -> Path`` creating the staging folder (the caller owns its clean-up).

    Raises:
        ConfigError: a rule, or rendering (a bad template, a template that dropped a given argument, ...).
    """
    from rocmft.config.layers import layer
    from rocmft.render import render, write

    layers = layer(settings)
    apply("inputs", Inputs(settings=settings, arguments=layers.arguments, device=device, sources=layers.sources))
    rendered = render(settings, device, layers, make_staging)
    apply("rendered", rendered)
    return write(rendered)


__all__ = ["MODULES", "PHASES", "REGISTRY", "Inputs", "Rule", "apply", "registered", "render_checked", "rule"]
