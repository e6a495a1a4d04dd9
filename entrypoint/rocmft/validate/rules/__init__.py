"""Rules: the misconfigurations rocmft refuses before anything loads (docs/rules.md lists them with the reports
behind them). A violation is a :class:`~rocmft.errors.ConfigError` (exit 2) naming the variables and files
involved; a few rules return warnings instead, printed once every rule of the phase has run.

A rule is a function ``subject -> list[str] | None`` registered with :func:`rule` for a phase, in a module of
its concern (precision, distributed, hygiene, paths, template, method, ranges, data, model). :func:`apply` runs
every rule of a phase by their ``order`` and reports all they found at once: each rule's errors and warnings
become :class:`~rocmft.findings.Finding` s with the rule's code (``<module>.<function>``, :attr:`Rule.code`), and
the settings each message names (noted by :mod:`rocmft.config.provenance` while the rule runs). A rule reports
every problem it finds: each check that does not depend on another passing runs in ``with independent():``
(:func:`independent`), so its refusal is recorded as a finding of its own and the rule goes on; a refusal raised
outside such a block ends the rule, as a check whose failure makes the later ones meaningless should. ``order``
keeps the sequence in which the rules have always fired, so the findings of an input come in the same order
whichever module a rule lives in:

* ``inputs`` (:class:`Inputs`: the layered arguments of :mod:`rocmft.config.layers`, the settings, the device),
  before anything is rendered or any folder made: precision conflicts, then distributed settings that cannot
  work together, then quantization that cannot be sharded;
* ``rendered`` (:class:`rocmft.render.Rendered`: the arguments parsed back from the rendered train.yaml, so
  what is checked is what would run), before any file is written: text hygiene first (stray spaces and CRs would
  mislead every later message: its findings mask later ones about the same settings) ... the chat template last;
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
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from rocmft.config.settings import Settings
from rocmft.console import warn
from rocmft.errors import ConfigError, ConfigErrors
from rocmft.facts.device import DeviceFacts
from rocmft.facts.modeldir import ModelDir
from rocmft.findings import ERROR, WARNING, Finding, Setting, noting

PHASES = ("inputs", "rendered", "launch")
# The concern modules, imported (and so registered) on first use.
MODULES = ("precision", "distributed", "dsconfig", "hygiene", "paths", "template", "method", "ranges", "data", "model",
           "runtime")  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """A registered rule: ``fn(subject)`` in ``phase`` at ``order`` (lower first); returns warnings or None.
    ``masks``: the rule refuses a value for its own text (stray spaces, quotes), so later findings that name the
    same setting are about that broken text and are left out (:func:`findings`)."""

    name: str
    phase: str
    order: int
    fn: Callable[[Any], list[str] | None]
    masks: bool = False

    @property
    def code(self) -> str:
        """The findings' stable code: ``<module>.<function>`` (``ranges.more_ranges``); docs/rules.md lists them."""
        return f"{self.fn.__module__.rsplit('.', 1)[-1]}.{self.name}"


REGISTRY: list[Rule] = []


def rule(phase: str, order: int, masks: bool = False):
    """Register ``fn`` as a rule of ``phase`` (one of :data:`PHASES`), applied at ``order``; ``masks`` see
    :class:`Rule`.

    Raises:
        ValueError: an unknown phase, or an order another rule of the phase already has.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown rule phase {phase!r}")

    def register(fn: Callable[[Any], list[str] | None]) -> Callable[[Any], list[str] | None]:
        if any(r.phase == phase and r.order == order for r in REGISTRY):
            raise ValueError(f"two rules of phase {phase} at order {order}")
        REGISTRY.append(Rule(name=fn.__name__, phase=phase, order=order, fn=fn, masks=masks))
        return fn

    return register


def registered(phase: str) -> list[Rule]:
    """The rules of ``phase`` in the order :func:`apply` runs them."""
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return sorted((r for r in REGISTRY if r.phase == phase), key=lambda r: r.order)


def _settings(message: str, fix: str, noted: list[Setting], subject: Any) -> tuple[Setting, ...]:
    """The settings a finding names: those noted while the rule ran that its message or fix shows (a rule may word
    a setting it then does not use), then any argument of ``subject`` the message writes as ``NAME=`` by hand;
    each once, in the order the text names them."""
    from rocmft.config.provenance import spelled

    text = f"{message}\n{fix}"
    chosen: dict[str, tuple[int, Setting]] = {}
    for setting in noted:
        if setting.name not in chosen and setting.text and setting.text in text:
            chosen[setting.name] = (text.index(setting.text), setting)
    arguments, sources = getattr(subject, "arguments", None), getattr(subject, "sources", None)
    if isinstance(arguments, Mapping):
        sources = sources if isinstance(sources, Mapping) else {}
        for name, value in arguments.items():
            if not isinstance(name, str) or name in chosen:
                continue
            if found := re.search(rf"(?<![A-Za-z0-9_]){re.escape(name.upper())}=", message):
                source = sources.get(name)
                setting = Setting(name, spelled(value), None if source is None else str(source))
                chosen[name] = (found.start(), setting)
    return tuple(setting for _, setting in sorted(chosen.values(), key=lambda pair: pair[0]))


# While :func:`findings` runs a rule: the refusals :func:`independent` recorded, each with how many settings had been
# noted when it was raised, and the list the settings are noted in.
_RECORDING: ContextVar[tuple[list[tuple[ConfigError, int]], list[Setting]] | None] = ContextVar(
    "rocmft_rule_refusals", default=None
)


class _Independent:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        recording = _RECORDING.get()
        if recording is None or not isinstance(error, ConfigError):
            return False  # not inside findings(): the refusal propagates as the plain raise it is
        refusals, noted = recording
        refusals.append((error, len(noted)))
        return True


def independent() -> _Independent:
    """One check of a rule that does not depend on the rule's other checks: ``with independent(): ...`` around it.

    While :func:`findings` runs the rule, a ConfigError raised in the block is recorded as a finding of its own,
    naming the settings noted up to its raise, and the rule goes on with its next check; anywhere else (a rule or a
    helper called directly) the error propagates as a plain raise does. Checks that depend on each other share one
    block (the first refusal ends the block), or stay outside any block (it ends the rule).
    """
    return _Independent()


_Refusal = tuple[ConfigError, list[Setting]]


def _run(item: Rule, subject: Any, refused_before: bool) -> tuple[list[_Refusal], list[str], list[Setting]]:
    """Run one rule: its refusals in the order it raised them, each with the settings noted up to its raise, its
    warnings, and every setting noted while it ran. A rule that fails with another exception is passed over
    (its refusals so far kept, no warnings) when it or an earlier rule already refused: it met input the refusal
    is about.

    Raises:
        Exception: the rule's own failure (not a ConfigError) when nothing was refused before it (a bug).
    """
    refusals: list[tuple[ConfigError, int]] = []
    warnings: list[str] = []
    with noting() as noted:
        token = _RECORDING.set((refusals, noted))
        try:
            warnings = item.fn(subject) or []
        except ConfigError as caught:
            refusals.append((caught, len(noted)))
        except Exception:
            if not (refused_before or refusals):
                raise
        finally:
            _RECORDING.reset(token)
    return [(err, noted[:count]) for err, count in refusals], warnings, noted


def findings(phase: str, subject: Any) -> tuple[list[Finding], list[ConfigError]]:
    """Run every rule of ``phase`` on ``subject``; the findings in rule order (within a rule, its errors in the order
    it checks them, then its warnings) and the ConfigError behind each error finding.

    A finding that names a setting whose text a ``masks`` rule already refused is left out (TEMPLATE="qwen" is
    refused for its quotes, not also as an unknown template); a masking rule's own findings are each kept. A rule
    that fails with another exception after a refusal is passed over (:func:`_run`).

    Raises:
        Exception: a rule's own failure (not a ConfigError) when no earlier rule refused anything (a bug).
    """
    found: list[Finding] = []
    raised: list[ConfigError] = []
    masked: set[str] = set()
    for item in registered(phase):
        refusals, warnings, noted = _run(item, subject, bool(raised))
        refused: set[str] = set()
        for err, seen in refusals:
            settings = _settings(err.message, err.remedy, seen, subject)
            if masked & {s.name for s in settings}:
                continue
            found.append(Finding(item.code, ERROR, err.message, err.remedy, settings))
            raised.append(err)
            refused |= {s.name for s in settings}
        for warning in warnings:
            settings = _settings(warning, "", noted, subject)
            if not masked & {s.name for s in settings}:
                found.append(Finding(item.code, WARNING, warning, "", settings))
        if item.masks:
            masked |= refused
    return found, raised


def apply(phase: str, subject: Any) -> tuple[Finding, ...]:
    """Run every rule of ``phase`` on ``subject`` (:func:`findings`); print the warnings (``[rocmft] WARNING:
    ...``), then refuse if any rule did. Returns the findings (warnings only, when it returns).

    Raises:
        ConfigError: the one rule that refused, as it raised it, with :attr:`~rocmft.errors.ConfigError.findings`
            set to the phase's findings; :class:`~rocmft.errors.ConfigErrors` (a ConfigError, exit 2) when several
            did, carrying every finding in rule order.
    """
    found, raised = findings(phase, subject)
    for finding in found:
        if finding.severity == WARNING:
            warn(finding.message, all_ranks=True)  # the entrypoint's line, printed whatever RANK says, as always
    if len(raised) == 1:
        raised[0].findings = tuple(found)
        raise raised[0]
    if raised:
        raise ConfigErrors(tuple(found), tuple(raised))
    return tuple(found)


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


def render_checked(settings: Settings, device: DeviceFacts, make_staging, shm_bytes: int | None = None):
    """Settings to a staged :class:`rocmft.render.Plan`, each phase's rules where they have always run: layer the
    arguments, the ``inputs`` rules, render, the ``rendered`` rules, write the files. (The ``launch`` rules run in
    :func:`rocmft.launch.prepare_launch`.)

    Args:
        settings: the read settings.
        device: the probed device.
        make_staging: ``callable(output_dir) -> Path`` creating the staging folder (the caller owns its clean-up).
        shm_bytes: the size of /dev/shm, for the loader workers render plans (rocmft.render.loader); None: unknown.

    Variables rocmft does not understand (:attr:`Settings.unknown`, when the settings deferred them) are ignored
    while rendering and refused here with whatever the rules found, first.

    Raises:
        ConfigError: a rule, or rendering (a bad template, a template that dropped a given argument, ...), or the
            unknown variables; :class:`~rocmft.errors.ConfigErrors` when several refuse (:func:`apply`).
    """
    from rocmft.config.layers import layer
    from rocmft.errors import combined
    from rocmft.render import render, write

    unknown = settings.unknown_refusal()
    try:
        layers = layer(settings)
        # a refusal of the inputs phase ends the run here (rendering needs what it refuses): the rendered phase's
        # findings are reported once the inputs pass
        apply("inputs", Inputs(settings=settings, arguments=layers.arguments, device=device, sources=layers.sources))
        rendered = render(settings, device, layers, make_staging, shm_bytes)
        apply("rendered", rendered)
    except ConfigError as error:
        if unknown is None:
            raise
        raise combined(unknown, error) from error
    if unknown:
        raise unknown
    return write(rendered)


__all__ = ["MODULES", "PHASES", "REGISTRY", "Inputs", "Rule", "apply", "findings", "independent", "registered",
           "render_checked", "rule"]  # fmt: skip
