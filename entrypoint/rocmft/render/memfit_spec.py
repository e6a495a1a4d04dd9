"""What one training process does, for the memory estimate (:mod:`rocmft.render.memfit`): :class:`TrainSpec`,
built from LLaMA-Factory's arguments as the rendered train.yaml holds them (:func:`spec_from_arguments`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rocmft.config.stages import TWO_SEQUENCE_STAGES
from rocmft.values import truthy

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


@dataclass(frozen=True)
class TrainSpec:
    """What one training process does, in LLaMA-Factory's terms.

    Attributes:
        method: ``full``, ``freeze`` or ``lora`` (LF's ``finetuning_type``; ``oft`` is estimated as LoRA).
        lora_rank: LoRA rank r (LF default 8).
        lora_targets: Linear names adapted, or ``("all",)`` = every Linear of the layers (LF default).
        freeze_trainable_layers: with ``freeze``, the last n layers train (LF default 2; negative = first n).
        quantization_bit: None, 4 (bitsandbytes NF4, QLoRA) or 8 (LLM.int8).
        double_quantization: 4-bit absmax quantized again (LF default True).
        compute_dtype: ``bfloat16``, ``float16`` or ``float32`` (rocmft's precision policy).
        micro_batch: ``per_device_train_batch_size`` (samples per forward).
        seq_len: tokens per sequence (see :func:`spec_from_arguments`).
        gradient_accumulation_steps: 1 = gradients are freed after every step (not alive at the start of
            backward); more = they live across micro-batches. Also used in the fixes' wording.
        gradient_checkpointing: LF's default True (``disable_gradient_checkpointing: false``).
        zero_stage: 0 = no DeepSpeed (torch autocast, DDP when world_size > 1); 1, 2, 3 = DeepSpeed ZeRO.
        offload: ``none``, ``optimizer`` or ``optimizer+params`` (DeepSpeed CPU offload; params need stage 3).
        world_size: data-parallel processes (GPUs) in the run.
        optimizer: transformers' ``optim`` name (default ``adamw_torch_fused``).
        pure_bf16: LF's ``pure_bf16`` (or BAdam): trainable weights stay in bf16, no autocast.
        attention: ``sdpa`` (LF's ``flash_attn: auto`` → transformers' default), ``fa2``, ``eager``, or
            ``varlen`` (neat-packed rows under rocmft.worker.attention: flash kernels, no 4-D mask).
        neat_packing: LF's ``neat_packing`` (block-diagonal 4-D mask).
        sequences_per_sample: 2 for pairwise stages (DPO, RM, KTO: chosen + rejected in one forward).
        reference_model: a frozen copy of the model is loaded (DPO/KTO full or freeze tuning).
        liger: LF's ``enable_liger_kernel`` (Liger's RMSNorm, SwiGLU and RoPE kernels).
        fused_cross_entropy: Liger's fused linear cross-entropy is used (``liger`` with ``stage`` sft or pt:
            LF keeps plain logits for the other stages); the T×V logits are never materialized.
        peft_casts_inputs: peft's own fp32 cast of each adapter's input under autocast is in effect (plain
            LLaMA-Factory); False for rocmft's worker, which skips it
            (rocmft.worker.patches.lora_inputs_uncast_under_autocast).
    """

    method: str = "lora"
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = ("all",)
    freeze_trainable_layers: int = 2
    quantization_bit: int | None = None
    double_quantization: bool = True
    compute_dtype: str = "bfloat16"
    micro_batch: int = 2
    seq_len: int = 2048
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = True
    zero_stage: int = 0
    offload: str = "none"
    world_size: int = 1
    optimizer: str = "adamw_torch_fused"
    pure_bf16: bool = False
    attention: str = "sdpa"
    neat_packing: bool = False
    sequences_per_sample: int = 1
    reference_model: bool = False
    liger: bool = False
    fused_cross_entropy: bool = False
    peft_casts_inputs: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.method not in ("full", "freeze", "lora"):
            problems.append(f"method {self.method!r} (full, freeze, lora)")
        if self.compute_dtype not in DTYPE_BYTES:
            problems.append(f"compute_dtype {self.compute_dtype!r} ({', '.join(DTYPE_BYTES)})")
        if self.quantization_bit not in (None, 4, 8):
            problems.append(f"quantization_bit {self.quantization_bit!r} (None, 4, 8)")
        if self.zero_stage not in (0, 1, 2, 3):
            problems.append(f"zero_stage {self.zero_stage!r} (0-3)")
        if self.offload not in ("none", "optimizer", "optimizer+params"):
            problems.append(f"offload {self.offload!r}")
        if self.attention not in ("sdpa", "fa2", "eager", "varlen"):
            problems.append(f"attention {self.attention!r} (sdpa, fa2, eager, varlen)")
        for name in ("micro_batch", "seq_len", "world_size", "lora_rank", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                problems.append(f"{name} {getattr(self, name)!r} (≥ 1)")
        if problems:
            raise ValueError("invalid TrainSpec: " + "; ".join(problems))

    @property
    def tokens(self) -> int:
        """Tokens in one forward pass: micro-batch × sequences per sample × sequence length."""
        return self.micro_batch * self.sequences_per_sample * self.seq_len


def _split(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return tuple(str(item).strip() for item in items if str(item).strip())


def _flag(value: Any, default: bool) -> bool:
    """``default`` for an unset value, else :func:`rocmft.values.truthy`."""
    return default if value is None else truthy(value)


def spec_from_arguments(
    arguments: dict[str, Any],
    *,
    compute_dtype: str,
    zero_stage: int,
    offload: str = "none",
    world_size: int = 1,
    packed_attention: str | None = None,
    peft_casts_inputs: bool = False,
) -> TrainSpec:
    """Build a :class:`TrainSpec` from LLaMA-Factory arguments as they appear in the rendered train.yaml.

    Missing arguments take LLaMA-Factory's / transformers' defaults: ``finetuning_type`` lora, ``lora_rank`` 8,
    ``lora_target`` all, ``per_device_train_batch_size`` 8, ``cutoff_len`` 2048, gradient checkpointing on
    (``disable_gradient_checkpointing: false``; transformers' ``gradient_checkpointing: true`` also turns it
    on), ``optim`` adamw_torch_fused. The sequence length is ``cutoff_len`` with or without packing: packing
    (and neat_packing, which implies it; ``stage: pt`` packs by default) makes every sequence exactly
    ``cutoff_len`` tokens; without it a batch is padded to its longest sample (a multiple of 8), and the
    worst case, which is what must fit, is a batch of samples cut at ``cutoff_len``.

    Args:
        arguments: training arguments by LF name (``finetuning_type``, ``lora_rank``, ``lora_target``,
            ``quantization_bit``, ``per_device_train_batch_size``, ``gradient_accumulation_steps``,
            ``cutoff_len``, ``packing``, ``neat_packing``, ``disable_gradient_checkpointing``, ``optim``,
            ``pure_bf16``, ``flash_attn``, ``stage``, ...).
        compute_dtype: ``bfloat16``/``float16``/``float32`` (or ``bf16``/``fp16``/``fp32``), rocmft's policy.
        zero_stage: 0 without DeepSpeed, else the ZeRO stage.
        offload: rocmft's ROCMFT_OFFLOAD (``none``, ``optimizer``, ``optimizer+params``).
        world_size: processes training together (GPUs per node × nodes).
        packed_attention: the plan's ``packed_attention`` (``varlen``: neat-packed rows without the 4-D mask).
        peft_casts_inputs: the run is plain LLaMA-Factory, not rocmft's worker (:attr:`TrainSpec.peft_casts_inputs`).
    """
    dtype = _DTYPE_ALIASES.get(compute_dtype, compute_dtype)
    method = str(arguments.get("finetuning_type") or "lora")
    method = "lora" if method == "oft" else method
    cutoff = int(arguments.get("cutoff_len") or 2048)
    stage = str(arguments.get("stage") or "sft")
    neat = _flag(arguments.get("neat_packing"), False)
    packing = _flag(arguments.get("packing"), stage == "pt") or neat
    seq_len = cutoff if packing else 8 * math.ceil(cutoff / 8)
    gradient_checkpointing = not _flag(arguments.get("disable_gradient_checkpointing"), False) or _flag(
        arguments.get("gradient_checkpointing"), False
    )
    quantization = arguments.get("quantization_bit")
    flash = str(arguments.get("flash_attn") or "auto").lower()
    attention = {"disabled": "eager", "fa2": "fa2", "fa3": "fa2"}.get(flash, "sdpa")
    if packed_attention == "varlen" and neat and attention == "sdpa":
        attention = "varlen"
    pref_loss = str(arguments.get("pref_loss") or "sigmoid")
    reference = stage in ("dpo", "kto") and method != "lora" and pref_loss not in ("orpo", "simpo")
    liger = _flag(arguments.get("enable_liger_kernel"), False)
    return TrainSpec(
        method=method,
        lora_rank=int(arguments.get("lora_rank") or 8),
        lora_targets=_split(arguments.get("lora_target")) or ("all",),
        freeze_trainable_layers=int(arguments.get("freeze_trainable_layers") or 2),
        quantization_bit=int(quantization) if quantization not in (None, "") else None,
        double_quantization=_flag(arguments.get("double_quantization"), True),
        compute_dtype=dtype,
        micro_batch=int(arguments.get("per_device_train_batch_size") or 8),
        seq_len=seq_len,
        gradient_accumulation_steps=int(arguments.get("gradient_accumulation_steps") or 1),
        gradient_checkpointing=gradient_checkpointing,
        zero_stage=int(zero_stage),
        offload=offload,
        world_size=int(world_size),
        optimizer=str(arguments.get("optim") or "adamw_torch_fused"),
        pure_bf16=_flag(arguments.get("pure_bf16"), False) or _flag(arguments.get("use_badam"), False),
        attention=attention,
        neat_packing=neat,
        sequences_per_sample=2 if stage in TWO_SEQUENCE_STAGES else 1,
        reference_model=reference,
        liger=liger,
        fused_cross_entropy=liger and stage in ("sft", "pt"),
        peft_casts_inputs=peft_casts_inputs,
    )


__all__ = ["DTYPE_BYTES", "TrainSpec", "spec_from_arguments"]
