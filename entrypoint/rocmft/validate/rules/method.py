"""Settings of the fine-tuning method: another method's settings, LoRA targets the model does not have."""

from __future__ import annotations

from pathlib import Path

from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.validate.rules import independent, rule
from rocmft.validate.rules.common import named
from rocmft.validate.rules.common import user_set as _user_set


@rule("rendered", 60)
def method_settings(run: Rendered) -> None:
    """Settings of a fine-tuning method that is not the one chosen (LORA_RANK with FINETUNING_TYPE=full): they
    would be ignored without a word. The method's settings are the fields of LLaMA-Factory's own LoraArguments /
    FreezeArguments / OFTArguments dataclasses.

    Raises:
        ConfigError: naming the settings and the method.
    """
    arguments, sources = run.arguments, run.sources
    from rocmft.config.lfargs import lf_arguments

    chosen = arguments.get("finetuning_type", "lora")
    owners = {"LoraArguments": "lora", "FreezeArguments": "freeze", "OFTArguments": "oft"}
    stray = [a for a in lf_arguments().values() if owners.get(a.group, chosen) != chosen and _user_set(a.name, sources)]
    if stray:
        shown = ", ".join(f"{named(run, a.name)}, a setting of {owners[a.group]}" for a in stray)
        raise ConfigError(f"{named(run, 'finetuning_type', 'lora')} ignores {shown}.",
                          f"Remove {', '.join(a.name.upper() for a in stray)}, or set FINETUNING_TYPE="
                          f"{owners[stray[0].group]} if that is the method you meant.")  # fmt: skip


@rule("rendered", 90)
def lora_target(run: Rendered) -> None:
    """LORA_TARGET names only modules the model has (``all`` always does).

    Raises:
        ConfigError: listing the unknown names and the model's linear module names.
    """
    arguments = run.arguments
    if arguments.get("finetuning_type", "lora") != "lora":
        return
    value = arguments.get("lora_target", "all")
    wanted = [t.strip() for t in (value if isinstance(value, list) else str(value).split(",")) if t.strip()]
    if not wanted or wanted == ["all"]:
        return
    model_dir = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    found = run.model.linear_names() if model_dir.is_dir() else None
    if not found:
        return
    unknown = [t for t in wanted if t not in found]
    spaced = [t for t in unknown if len(t.split()) > 1 and all(part in found for part in t.split())]
    # single-shot: the spaced names are among the unknown ones, which the spaces alone may explain
    if spaced:
        raise ConfigError(f"{named(run, 'lora_target')} separates module names with spaces.",
                          f"Separate them with commas: LORA_TARGET={','.join(spaced[0].split())}.")  # fmt: skip
    if unknown:
        raise ConfigError(
            f"{named(run, 'lora_target')} names no module of {named(run, 'model_name_or_path')}: {', '.join(unknown)}.",
            f"Use `all`, or names among the model's linear modules: {', '.join(sorted(found))}.",
        )


ADAPTERS = ("lora", "oft")  # LLaMA-Factory 0.9.5's methods that train adapters on frozen base weights


def _reentrant(arguments: dict) -> tuple[bool, str] | None:
    """Whether the run's gradient checkpointing is reentrant, and the argument that decides it; None when
    checkpointing is off. LLaMA-Factory 0.9.5 (``prepare_model_for_training``) checkpoints unless
    ``disable_gradient_checkpointing``, with ``use_reentrant_gc`` (default True); transformers'
    ``gradient_checkpointing`` makes the Trainer enable it again with ``gradient_checkpointing_kwargs``
    (LLaMA-Factory's replacement method reads None as reentrant; transformers' own, when LLaMA-Factory's is off,
    as non-reentrant)."""
    patched = not bool(arguments.get("disable_gradient_checkpointing", False))
    kwargs = arguments.get("gradient_checkpointing_kwargs")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if bool(arguments.get("gradient_checkpointing", False)):
        return bool(kwargs.get("use_reentrant", patched)), "gradient_checkpointing_kwargs"
    if patched:
        return bool(arguments.get("use_reentrant_gc", True)), "use_reentrant_gc"
    return None


@rule("rendered", 93)
def checkpointing_mode(run: Rendered) -> None:
    """Gradient checkpointing with adapters (LoRA, OFT): the mode the user wrote must work with frozen weights.

    * Reentrant checkpointing under DDP that looks for unused parameters (DDP_FIND_UNUSED_PARAMETERS=true; for OFT
      transformers' own default, LLaMA-Factory sets it False for LoRA only): DDP walks the autograd graph at forward
      time, finds the adapter weights outside it (reentrant checkpointing runs the layer without a graph and again
      inside backward), marks them ready, and their gradients arrive a second time: "Expected to mark a variable
      ready only once" on the first backward (huggingface/peft#313, huggingface/trl#921; reproduced on the CPU with
      two gloo ranks, tests/test_checkpointing.py). Non-reentrant checkpointing has no second backward.
    * USE_REENTRANT_GC=false undone by GRADIENT_CHECKPOINTING=true with GRADIENT_CHECKPOINTING_KWARGS saying
      reentrant: the Trainer enables checkpointing again with its kwargs (huggingface/transformers#26221).

    Raises:
        ConfigError: naming the settings, with the fix.
    """
    arguments = run.arguments
    method = arguments.get("finetuning_type", "lora")
    mode = _reentrant(arguments) if method in ADAPTERS else None
    if mode is None:
        return
    reentrant, decided_by = mode
    if decided_by == "gradient_checkpointing_kwargs" and not _user_set(decided_by, run.sources):
        decided_by = "use_reentrant_gc"  # the template wrote the kwargs from it
    ddp = run.world_size > 1 and not arguments.get("deepspeed") and not arguments.get("fsdp")
    given = arguments.get("ddp_find_unused_parameters")
    with independent():
        if reentrant and ddp and ((method != "lora") if given is None else bool(given)):
            unused = (named(run, "ddp_find_unused_parameters") if given is not None
                      else "DDP_FIND_UNUSED_PARAMETERS not set (transformers: true for an OFT model)")  # fmt: skip
            fix = ("unset USE_REENTRANT_GC (or USE_REENTRANT_GC=false)" if decided_by == "use_reentrant_gc"
                   else 'GRADIENT_CHECKPOINTING_KWARGS={"use_reentrant": false}')  # fmt: skip
            raise ConfigError(
                f"{named(run, decided_by)} (reentrant gradient checkpointing) with "
                f"{named(run, 'finetuning_type', 'lora')} and {unused} on {run.world_size} DDP processes: DDP marks "
                "the adapter weights ready at forward time and again when reentrant checkpointing recomputes their "
                'layer in backward, so the first backward fails ("Expected to mark a variable ready only once").',
                f"Non-reentrant checkpointing, rocmft's default for LoRA/OFT: {fix}; or "
                "DDP_FIND_UNUSED_PARAMETERS=false.",
            )
    with independent():
        own = arguments.get("use_reentrant_gc")
        if (
            decided_by == "gradient_checkpointing_kwargs"
            and own is False
            and reentrant
            and _user_set("use_reentrant_gc", run.sources)
        ):
            raise ConfigError(
                f"{named(run, 'use_reentrant_gc')} is undone by {named(run, 'gradient_checkpointing')} with "
                f"{named(run, 'gradient_checkpointing_kwargs')}: the Trainer enables checkpointing again with those "
                "kwargs, reentrant.",
                'Set GRADIENT_CHECKPOINTING_KWARGS={"use_reentrant": false}, or unset GRADIENT_CHECKPOINTING '
                "(LLaMA-Factory checkpoints by itself unless DISABLE_GRADIENT_CHECKPOINTING=true).",
            )
