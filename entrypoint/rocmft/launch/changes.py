"""The launch's automatic changes (rocmft.changes.Change), gathered where they are decided.

Two kinds, both in :attr:`rocmft.launch.LaunchSpec.changes` (printed as one block by rocmft.changes.say_changes,
recorded in the manifest's ``launch.changes``):

* **variables the launch adds** to the workers' environment: every one goes through :meth:`Added.add` (the value and
  its change together, so no variable is added unsaid), the arch profile's runtime defaults among them
  (rocmft.launch.spec.runtime_environment);
* **training arguments rocmft set** rather than the user (:func:`argument_changes`): every value whose source
  (rocmft.config.provenance.Source) is the planner, a restart, or rocmft itself and not the user's (the precision
  policy's flag, the resume decision, a value derived for ROCMFT_ON_HANG), but :data:`PLUMBING`; and the settings a
  restart overrode (rocmft.config.settings.Settings.overridden).

ROCMFT_COLLECTIVES=safe's variables (:data:`SAFE_COLLECTIVES`) are decided here too: RCCL's known fallbacks for hangs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rocmft.changes import Change
from rocmft.config.lfargs import is_secret_name
from rocmft.config.provenance import Kind, spelled
from rocmft.render import Plan

# ROCMFT_COLLECTIVES=safe: variable -> (value, why). Each is a documented RCCL/HIP runtime variable (AMD's "RCCL
# environment variables" reference, rocm.docs.amd.com/projects/rccl/en/latest/api-reference/env-variables.html, and
# NVIDIA's NCCL environment variables, whose names RCCL reads) and a public report's workaround for a hang.
SAFE_COLLECTIVES: dict[str, tuple[str, str]] = {
    "NCCL_P2P_DISABLE": ("1", "no direct GPU peer-to-peer transport (traffic through host memory): multi-GPU AMD "
                              "setups hung without it (ROCm/vllm#390)"),
    "HSA_ENABLE_SDMA": ("0", "copies by shader kernels instead of the SDMA engines, whose copies hung "
                             "(ROCm/legacy-rocm-build#2781)"),
    "NCCL_PROTO": ("Simple", "RCCL's Simple protocol only: its LL protocol deadlocked all-reduces "
                             "(vllm-project/vllm#40980, ROCm/rocm-systems#5480; ROCm/rccl#1946 fixed an LL hang on "
                             "MI350)"),
}  # fmt: skip

LAUNCH = "rocmft.launch"
# The training arguments rocmft sets (Kind.ROCMFT) that are not decisions taken for the user but where the user's own
# settings put things (the run's folder, its data set registry, the rendered DeepSpeed/FSDP config): not changes.
# Every other value rocmft sets is one (the precision policy's flag, the resume decision, ROCMFT_ON_HANG's timeout).
PLUMBING = ("output_dir", "dataset_dir", "deepspeed", "fsdp", "fsdp_config")
# why a restart overrides each of rocmft's settings (rocmft.cli.train.restart_overrides)
OVERRIDE_WHY = {
    "precision": "train in real fp32 from here, to rule out mixed precision",
    "resume": "continue from the last complete checkpoint saved before the failure",
    "collectives": "RCCL's safe fallbacks (the NCCL_/HSA_ lines below)",
}


class Added:
    """The variables a launch adds, each with its :class:`~rocmft.changes.Change`: :meth:`add` is the one way in."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.changes: dict[str, Change] = {}

    def add(self, name: str, value: str, why: str, source: str) -> None:
        """Add ``name=value`` to the workers' environment, said as ``why`` (``source``); a later add of the same name
        replaces both. A secret-named variable's value is recorded and shown as ``<redacted>``."""
        self.values[name] = value
        self.changes[name] = Change(name, value, why, source, secret=is_secret_name(name))

    def add_all(self, values: Mapping[str, str], why: Mapping[str, str] | str, source: str) -> None:
        """:meth:`add` each of ``values``; ``why``: one reason for all, or name -> reason."""
        for name, value in values.items():
            self.add(name, value, why if isinstance(why, str) else why.get(name, ""), source)


def cache_why(reason: str) -> str:
    """A node-local cache's reason (rocmft.facts.caches.CacheChoice.reason, ``<marker> is set: <why, with its
    sources>``) in one short clause for the console: ``APPTAINER_CONTAINER is set: Triton's kernel cache, kept
    node-local (shared file systems break it)``; the whole reason stays in rocmft.facts.caches."""
    marker, _, detail = reason.partition(": ")
    what = re.split(r" \(|; |: |, ", detail)[0] if detail else marker
    return f"{marker}: {what}, kept node-local (shared file systems break it)" if detail else reason


def safe_collectives(plan: Plan, environ: Mapping[str, str], added: Added) -> None:
    """ROCMFT_COLLECTIVES=safe: add :data:`SAFE_COLLECTIVES` to ``added``, but none that ``environ`` (the launch's
    starting environment) sets already, with the source of the setting (the user's, or the restart after a
    collectives hang)."""
    settings = plan.settings
    if settings.rocmft.collectives != "safe":
        return
    overridden = settings.overridden.get("collectives")
    source = f"ROCMFT_COLLECTIVES=safe, {overridden}" if overridden else "ROCMFT_COLLECTIVES=safe"
    for name, (value, why) in SAFE_COLLECTIVES.items():
        if name not in environ:
            added.add(name, value, why, source)


def argument_changes(plan: Plan) -> list[Change]:
    """The settings a restart overrode (``ROCMFT_PRECISION``), then the training arguments rocmft set for this run
    (see the module docstring), each named by its variable (``PER_DEVICE_TRAIN_BATCH_SIZE``)."""
    changes = [Change(f"ROCMFT_{field.upper()}", _text(getattr(plan.settings.rocmft, field)),
                      OVERRIDE_WHY.get(field, "this attempt's"), str(source))
               for field, source in plan.settings.overridden.items()]  # fmt: skip
    for name, source in plan.sources.items():
        value = plan.arguments.get(name)
        if source.kind is Kind.PLAN:
            changes.append(Change(name.upper(), _text(value), source.detail, "rocmft plan"))
        elif source.kind is Kind.RESTART or (
            source.kind is Kind.ROCMFT and name not in PLUMBING and not source.user_chosen and value is not None
            and value is not False  # a flag rocmft leaves off (fp16 under bf16) changes nothing
        ):  # fmt: skip
            changes.append(Change(name.upper(), _text(value), source.detail, "rocmft"))
    return changes


def _text(value: Any) -> str:
    return spelled(value)


__all__ = ["PLUMBING", "SAFE_COLLECTIVES", "Added", "argument_changes", "cache_why", "safe_collectives"]  # fmt: skip
