"""Settings of the fine-tuning method: another method's settings, LoRA targets the model does not have."""

from __future__ import annotations

from pathlib import Path

from rocmft.errors import ConfigError
from rocmft.render import Rendered, checkpointing
from rocmft.validate.rules import independent, rule
from rocmft.validate.rules.common import knob, named
from rocmft.validate.rules.common import user_set as _user_set


@rule("rendered", 60)
def method_settings(run: Rendered) -> None:
    """Settings of a fine-tuning method that is not the one chosen (LORA_RANK with FINETUNING_TYPE=full): they
    would be ignored without a word. The method's settings are the fields of LLaMA-Factory's own LoraArguments /
    FreezeArguments / OFTArguments dataclasses.

    Also, each a finding of its own (a break-it trial, 2026-12-05):

    * QUANTIZATION_BIT with FINETUNING_TYPE=full or freeze, ADAPTER_NAME_OR_PATH with any method but LoRA:
      LLaMA-Factory 0.9.5 refuses both in its parser (``_verify_model_args``: "Quantization is only compatible
      with the LoRA or OFT method", "Adapter is only valid for the LoRA method"), with a message that names no
      variable and only after this phase's other findings were reported.
    * PACKING=true with a STAGE other than sft or pt: LLaMA-Factory packs only for those two
      (``data/loader.py``, ``_get_dataset_processor``: pairwise, feedback and unsupervised data are never
      packed), so the setting is ignored without a word.

    Raises:
        ConfigError: naming the settings and the method or stage.
    """
    arguments, sources = run.arguments, run.sources
    from rocmft.config.lfargs import lf_arguments

    chosen = arguments.get("finetuning_type", "lora")
    owners = {"LoraArguments": "lora", "FreezeArguments": "freeze", "OFTArguments": "oft"}
    stray = [a for a in lf_arguments().values() if owners.get(a.group, chosen) != chosen and _user_set(a.name, sources)]
    with independent():
        if stray:
            shown = ", ".join(f"{named(run, a.name)}, a setting of {owners[a.group]}" for a in stray)
            raise ConfigError(f"{named(run, 'finetuning_type', 'lora')} ignores {shown}.",
                              f"Remove {', '.join(a.name.upper() for a in stray)}, or set FINETUNING_TYPE="
                              f"{owners[stray[0].group]} if that is the method you meant.")  # fmt: skip
    with independent():
        _adapters_only(run, chosen)
    stage = arguments.get("stage", "sft")
    if arguments.get("packing") is True and stage not in ("sft", "pt") and _user_set("packing", sources):
        raise ConfigError(f"{named(run, 'packing')} has no effect with {named(run, 'stage', 'sft')}: LLaMA-Factory "
                          "packs samples only for STAGE=sft and STAGE=pt (pairwise and feedback data are never "
                          "packed).", "Remove PACKING, or set STAGE=sft if that is the stage you meant.")  # fmt: skip


# Settings that need an adapter method, with the methods LLaMA-Factory 0.9.5 allows them with
# (hparams/parser.py, _verify_model_args).
ADAPTER_ONLY = {"quantization_bit": ("lora", "oft"), "adapter_name_or_path": ("lora",)}


def _adapters_only(run: Rendered, chosen: str) -> None:
    """Raise for the :data:`ADAPTER_ONLY` settings set with a method they do not work with.

    Raises:
        ConfigError: naming each setting and FINETUNING_TYPE, with the fix.
    """
    wrong = [name for name, methods in ADAPTER_ONLY.items()
             if run.arguments.get(name) is not None and chosen not in methods]  # fmt: skip
    if not wrong:
        return
    shown = " and ".join(f"{named(run, name)}, which needs FINETUNING_TYPE={' or '.join(ADAPTER_ONLY[name])}"
                         for name in wrong)  # fmt: skip
    quantized = "quantization_bit" in wrong
    raise ConfigError(
        f"{named(run, 'finetuning_type', 'lora')} cannot be combined with {shown}: "
        + ("a quantized model's weights cannot be trained themselves, only adapters on them (QLoRA)."
           if quantized else "an adapter is a LoRA adapter, loaded and trained by FINETUNING_TYPE=lora."),
        f"Set FINETUNING_TYPE=lora, or remove {' and '.join(name.upper() for name in wrong)}"
        + (" to train the full-precision weights." if quantized else "."),
    )  # fmt: skip


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


def _mode_named(run: Rendered, decided_by: str) -> str:
    """The settings that chose the run's checkpointing mode, named as every rule names them."""
    if decided_by == "use_reentrant_gc":
        return named(run, "use_reentrant_gc", True)
    if _user_set("gradient_checkpointing_kwargs", run.sources):
        return named(run, "gradient_checkpointing_kwargs")
    if _user_set("use_reentrant_gc", run.sources) and not run.arguments.get("disable_gradient_checkpointing"):
        return named(run, "use_reentrant_gc")  # rocmft wrote the Trainer's kwargs from it
    own = "transformers' own checkpointing: non-reentrant"
    return (f"{named(run, 'gradient_checkpointing')} with {named(run, 'disable_gradient_checkpointing')} and "
            f"{named(run, 'gradient_checkpointing_kwargs')} ({own})")  # fmt: skip


def _mode_fix(run: Rendered, reentrant: bool) -> str:
    """The settings that give the run the other checkpointing mode."""
    word = "true" if reentrant else "false"
    fix = f"USE_REENTRANT_GC={word}"
    if run.arguments.get("gradient_checkpointing"):
        fix += f' and GRADIENT_CHECKPOINTING_KWARGS={{"use_reentrant": {word}}}'
    if run.arguments.get("disable_gradient_checkpointing"):
        fix = f'GRADIENT_CHECKPOINTING_KWARGS={{"use_reentrant": {word}}}'
    return fix


@rule("rendered", 93)
def checkpointing_mode(run: Rendered) -> None:
    """Gradient checkpointing with adapters (LoRA, OFT): the mode the user wrote must work with frozen weights
    (rocmft.render.checkpointing, which renders the mode that does where the user wrote none).

    * Reentrant under DDP looking for unused parameters (DDP_FIND_UNUSED_PARAMETERS=true, or unset with OFT):
      "Expected to mark a variable ready only once" on the first backward (huggingface/peft#313,
      huggingface/trl#921; reproduced on two gloo ranks, tests/test_checkpointing.py).
    * Non-reentrant under DeepSpeed ZeRO-3 on more than one process with a DeepSpeed before 0.19.3: "Recomputed
      values for the following tensors have different metadata" (huggingface/transformers#47254,
      hiyouga/LlamaFactory#6438; DeepSpeed PR #8148).
    * USE_REENTRANT_GC=false undone by GRADIENT_CHECKPOINTING=true with reentrant GRADIENT_CHECKPOINTING_KWARGS: the
      Trainer enables checkpointing again with its kwargs (huggingface/transformers#26221).

    Raises:
        ConfigError: naming the settings, with the fix.
    """
    arguments = run.arguments
    method = arguments.get("finetuning_type", "lora")
    mode = checkpointing.reentrant(arguments) if method in checkpointing.ADAPTERS else None
    if mode is None:
        return
    reentrant, decided_by = mode
    what = f"{_mode_named(run, decided_by)} ({'' if reentrant else 'non-'}reentrant gradient checkpointing) with " \
           f"{named(run, 'finetuning_type', 'lora')}"  # fmt: skip
    ddp = run.world_size > 1 and not arguments.get("deepspeed") and not arguments.get("fsdp")
    given = arguments.get("ddp_find_unused_parameters")
    with independent():
        if reentrant and ddp and ((method != "lora") if given is None else bool(given)):
            unused = (named(run, "ddp_find_unused_parameters") if given is not None
                      else "DDP_FIND_UNUSED_PARAMETERS not set (transformers: true for an OFT model)")  # fmt: skip
            raise ConfigError(
                f"{what} and {unused} on {run.world_size} DDP processes: DDP marks the adapter weights ready at "
                "forward time and again when reentrant checkpointing recomputes their layer in backward, so the "
                'first backward fails ("Expected to mark a variable ready only once").',
                f"Non-reentrant checkpointing, rocmft's default for LoRA/OFT: {_mode_fix(run, False)}; or "
                "DDP_FIND_UNUSED_PARAMETERS=false.",
            )
    with independent():
        zero3 = checkpointing.sharded(arguments, run.ds_config) == "ZeRO-3" and run.world_size > 1
        if not reentrant and zero3 and checkpointing.deepspeed_partitions_frozen_in_recompute():
            stage = knob(run, "zero_stage") if run.ds_config is not None else named(run, "deepspeed")
            raise ConfigError(
                f"{what} under DeepSpeed ZeRO-3 ({stage}) on {run.world_size} processes: this DeepSpeed partitions "
                "the frozen weights again while backward recomputes a layer, so the first backward fails "
                '("Recomputed values for the following tensors have different metadata"; fixed in DeepSpeed 0.19.3).',
                f"Reentrant checkpointing, LLaMA-Factory's and rocmft's default under ZeRO-3: {_mode_fix(run, True)}; "
                "or ZeRO stage 2.",
            )
    with independent():
        own = arguments.get("use_reentrant_gc")
        if (
            decided_by == "gradient_checkpointing_kwargs"
            and reentrant
            and own is False
            and _user_set("use_reentrant_gc", run.sources)
        ):
            raise ConfigError(
                f"{named(run, 'use_reentrant_gc')} is undone by {named(run, 'gradient_checkpointing')} with "
                f"{named(run, 'gradient_checkpointing_kwargs')}: the Trainer enables checkpointing again with those "
                "kwargs, reentrant.",
                'Set GRADIENT_CHECKPOINTING_KWARGS={"use_reentrant": false}, or unset GRADIENT_CHECKPOINTING '
                "(LLaMA-Factory checkpoints by itself unless DISABLE_GRADIENT_CHECKPOINTING=true).",
            )
