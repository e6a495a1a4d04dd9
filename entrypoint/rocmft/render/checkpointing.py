"""Gradient checkpointing's mode for adapters (LoRA, OFT: the base weights stay frozen): what rocmft renders, and what
``rocmft.validate.rules.method.checkpointing_mode`` reads.

LLaMA-Factory 0.9.5 (``model/model_utils/checkpointing.py``, ``prepare_model_for_training``) checkpoints unless
``disable_gradient_checkpointing``, reentrant unless ``use_reentrant_gc: false``; its wrapper makes each checkpointed
layer's hidden-state input require grad, so one process trains adapters either way. Where the modes differ:

* DDP looking for unused parameters (``ddp_find_unused_parameters`` true; transformers' own default for a model that
  is no PreTrainedModel, such as an OFT PeftModel; LLaMA-Factory sets it False for LoRA only): reentrant fails the
  first backward, "Expected to mark a variable ready only once" (huggingface/peft#313, huggingface/trl#921;
  reproduced on two gloo ranks in tests/test_checkpointing.py); non-reentrant trains.
* DeepSpeed ZeRO-3 on more than one process: non-reentrant fails the first backward, "Recomputed values for the
  following tensors have different metadata" (frozen parameters are partitioned again by the recompute:
  huggingface/transformers#47254, huggingface/trl#2514, hiyouga/LlamaFactory#6438) until DeepSpeed 0.19.3 (PR
  #8148, "Z3: Support for activation ckpt with frozen params"); reentrant trains. FSDP, which shards the weights
  too, is left to LLaMA-Factory (it turns reentrant off itself for FSDP2; huggingface/transformers#34928 converged
  with reentrant under FSDP1).

So rocmft renders non-reentrant for adapters unless the weights are sharded (ZeRO-3 or FSDP), as rocmft's default
(never over a value of the user's). transformers' ``gradient_checkpointing: true`` makes the Trainer enable
checkpointing again with ``gradient_checkpointing_kwargs`` (LLaMA-Factory's replacement reads None as reentrant:
huggingface/transformers#26221), so those kwargs are rendered to say the same. The memory estimate
(rocmft.render.memfit) holds for both modes: the peak of live tensors of a LoRA step was 433 MiB non-reentrant
against 441 MiB reentrant (869 MiB without checkpointing; tests/test_checkpointing.py measures it op by op).
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from rocmft.config.provenance import Kind, Source
from rocmft.nesting import loads_json

ADAPTERS = ("lora", "oft")  # LLaMA-Factory 0.9.5's methods that train adapters on frozen base weights
ZERO3_FROZEN_FIX = (0, 19, 3)  # DeepSpeed's first release with PR #8148 (git tag --contains a31eb3165)
SOURCE = Source(Kind.ROCMFT_DEFAULT, "non-reentrant gradient checkpointing for adapters on frozen weights")


def zero_stage(arguments: dict[str, Any], ds_config: dict[str, Any] | None) -> int | None:
    """The run's ZeRO stage: rocmft's rendered ds_config's, else the user's DEEPSPEED file's (or mapping's); None
    without DeepSpeed, or when the file cannot be read (the ds_config rules say why)."""
    tree: Any = ds_config
    given = arguments.get("deepspeed")
    if tree is None and isinstance(given, dict):
        tree = given
    elif tree is None and given:
        try:
            tree = loads_json(Path(str(given)).expanduser().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    zero = tree.get("zero_optimization") if isinstance(tree, dict) else None
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0 if isinstance(tree, dict) else None
    try:
        return int(stage) if stage is not None and not isinstance(stage, bool) else None
    except (TypeError, ValueError):
        return None


def sharded(arguments: dict[str, Any], ds_config: dict[str, Any] | None) -> str | None:
    """``"ZeRO-3"`` or ``"FSDP"`` when the run shards the weights, else None."""
    if arguments.get("fsdp"):
        return "FSDP"
    return "ZeRO-3" if zero_stage(arguments, ds_config) == 3 else None


def deepspeed_partitions_frozen_in_recompute() -> bool:
    """Whether the installed DeepSpeed predates :data:`ZERO3_FROZEN_FIX` (False when it is not installed)."""
    try:
        version = metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return False
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) < ZERO3_FROZEN_FIX


def reentrant(arguments: dict[str, Any]) -> tuple[bool, str] | None:
    """Whether the run's gradient checkpointing is reentrant and the argument that decides it; None when it is off.
    With ``gradient_checkpointing`` the Trainer's ``gradient_checkpointing_kwargs`` decide (LLaMA-Factory's
    replacement method reads a missing ``use_reentrant`` as True; transformers' own, used when LLaMA-Factory's
    checkpointing is disabled, as False); otherwise ``use_reentrant_gc`` (LLaMA-Factory's default True)."""
    patched = not bool(arguments.get("disable_gradient_checkpointing", False))
    kwargs = arguments.get("gradient_checkpointing_kwargs")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if bool(arguments.get("gradient_checkpointing", False)):
        return bool(kwargs.get("use_reentrant", patched)), "gradient_checkpointing_kwargs"
    if patched:
        return bool(arguments.get("use_reentrant_gc", True)), "use_reentrant_gc"
    return None


def safe_mode(layered: dict[str, Any], sources: dict, fixed: dict[str, Any],
              ds_config: dict[str, Any] | None) -> tuple[dict[str, Any], dict, bool]:  # fmt: skip
    """``layered`` and ``sources`` with the non-reentrant mode put in where it applies (see the module docstring):
    an adapter method, checkpointing on, weights not sharded, a value the user did not set. ``fixed``: rocmft's own
    values (the FSDP switch). Returns new dicts and whether anything changed."""
    view = {**layered, **fixed}
    if view.get("finetuning_type", "lora") not in ADAPTERS or reentrant(view) is None or sharded(view, ds_config):
        return layered, sources, False
    layered, sources, changed = dict(layered), dict(sources), False
    wanted = {"use_reentrant_gc": False}
    if view.get("gradient_checkpointing"):
        wanted["gradient_checkpointing_kwargs"] = {"use_reentrant": bool(view.get("use_reentrant_gc", False))}
    for name, value in wanted.items():
        source = sources.get(name)
        if (source is None or not source.user_chosen) and layered.get(name) != value:
            layered[name], sources[name], changed = value, SOURCE, True
    return layered, sources, changed


def said(arguments: dict[str, Any], sources: dict) -> str | None:
    """The console line for the mode :func:`safe_mode` rendered (``gradient checkpointing: use_reentrant_gc=false
    (...)``), None when it rendered nothing."""
    names = [name for name, source in sources.items() if source == SOURCE and name in arguments]
    if not names:
        return None
    shown = ", ".join(f"{name}={json.dumps(arguments[name])}" for name in names)
    return (f"gradient checkpointing: {shown} (rocmft's default for LoRA/OFT on frozen weights: LLaMA-Factory's "
            "reentrant default fails under DDP looking for unused parameters; docs/rules.md row 80)")  # fmt: skip


__all__ = ["ADAPTERS", "SOURCE", "ZERO3_FROZEN_FIX", "deepspeed_partitions_frozen_in_recompute", "reentrant",
           "safe_mode", "said", "sharded", "zero_stage"]  # fmt: skip
