"""The activations of one decoder layer, for the memory estimate (:mod:`rocmft.render.memfit`): how a run's
tensors are typed (:class:`_Mode`), which attention kernel runs, and every tensor autograd keeps for one trainable
layer (:func:`layer_saved_tensors`). The rules and their sources are in :mod:`rocmft.render.memfit`'s docstring,
"What autograd keeps"."""

from __future__ import annotations

from dataclasses import dataclass

from rocmft.render.memfit_shape import LINEARS, ModelShape
from rocmft.render.memfit_spec import DTYPE_BYTES, TrainSpec


@dataclass(frozen=True)
class _Mode:
    """How the tensors of a run are typed, derived from a TrainSpec (see the module docstring)."""

    e: int  # bytes of the compute dtype
    amp: bool  # torch autocast (accelerate native AMP): bf16/fp16 without DeepSpeed and without pure_bf16
    trainable_bytes: int  # dtype of trainable parameters during forward/backward
    residual_bytes: int  # dtype of the residual stream
    lora_targets: frozenset[str]
    trainable_layers: int  # layers with trainable parameters (LoRA/full: all; freeze: n)


def _mode(shape: ModelShape, spec: TrainSpec) -> _Mode:
    e = DTYPE_BYTES[spec.compute_dtype]
    deepspeed = spec.zero_stage > 0
    amp = e == 2 and not deepspeed and not spec.pure_bf16
    # LF upcasts trainable params to fp32 (adapter.py, init_adapter); DeepSpeed then casts the module back to
    # e, and pure_bf16 skips the upcast.
    trainable_bytes = 4 if amp else e
    # Full tuning under autocast trains fp32 embeddings, whose output (the residual stream) stays fp32.
    residual_bytes = 4 if (amp and spec.method == "full") else e
    targets = set(spec.lora_targets) if spec.method == "lora" else set()
    if "all" in targets:
        targets = set(LINEARS)
    trainable_layers = shape.num_layers
    if spec.method == "freeze":
        trainable_layers = min(abs(spec.freeze_trainable_layers), shape.num_layers)
    return _Mode(e, amp, trainable_bytes, residual_bytes, frozenset(targets & set(LINEARS)), trainable_layers)


def _attention_kind(shape: ModelShape, spec: TrainSpec, mode: _Mode) -> str:
    """``flash`` (no T×T kept), ``masked`` (K/V repeated for a 4-D mask) or ``math`` (T×T probabilities kept).

    SDPA with bf16/fp16 runs the flash kernel (GQA native, ``enable_gqa``). With fp32 the flash kernel is out;
    the memory-efficient kernel takes fp32 but not GQA, so a GQA model falls to the math kernel (PyTorch's
    ``scaled_dot_product_attention`` docs: GQA "works only for Flash_attention and math kernel on CUDA").
    """
    if spec.attention == "eager":
        return "math"
    if spec.attention in ("fa2", "varlen"):  # varlen: rocmft.worker.attention, flash kernels, no mask
        return "flash"
    if spec.neat_packing:
        return "masked"
    if mode.e == 4 and shape.num_kv_heads < shape.num_heads:
        return "math"
    return "flash"


def _attention_saved_tensors(shape: ModelShape, spec: TrainSpec, mode: _Mode) -> list[tuple[str, float]]:
    """What self-attention keeps, as ``(name, bytes per token)``: q/k norms' fp32 copies (Qwen3), q and k after
    RoPE, v (repeated to every head when a 4-D mask or the math kernel needs it), the output, and the flash
    kernel's fp32 log-sum-exp or the math kernel's T×T probabilities (:func:`_attention_kind`)."""
    items: list[tuple[str, float]] = []
    e_out = 2 if mode.amp else mode.e  # dtype of Linear outputs (autocast computes in bf16/fp16)
    kind = _attention_kind(shape, spec, mode)
    q, kv = shape.q_dim, shape.kv_dim
    if shape.qk_norm:
        items.append(("q/k RMSNorm fp32 copies", 4 * (q + kv)))
    # repeat_kv expands K/V to every head for a 4-D mask or the math kernel; the flash kernels, rocmft's varlen
    # path included (rocmft.worker.attention.varlen), keep them at the Hkv heads
    kv_kept = q if kind in ("masked", "math") else kv
    items += [
        ("q after RoPE", e_out * q),
        ("k after RoPE" + (" (repeated to all heads)" if kv_kept == q else ""), e_out * kv_kept),
        ("v" + (" (repeated to all heads)" if kv_kept == q else ""), e_out * kv_kept),
        ("attention output", e_out * q),
    ]
    if kind == "math":
        # softmax probabilities (fp32 for eager: softmax(dtype=float32), then a compute-dtype copy for p·V)
        per_prob = (4 + mode.e) if spec.attention == "eager" and mode.e != 4 else mode.e
        items.append(("attention probabilities (T×T per head)", per_prob * shape.num_heads * spec.seq_len))
    else:
        items.append(("attention logsumexp (fp32)", 4 * shape.num_heads))
    return items


def layer_saved_tensors(
    shape: ModelShape, spec: TrainSpec, *, input_needs_grad: bool = True
) -> list[tuple[str, float]]:
    """The tensors autograd keeps for one trainable decoder layer, as ``(name, bytes per token)``.

    Multiply by the tokens of a micro-batch (:attr:`TrainSpec.tokens`). ``input_needs_grad`` is False for the
    first trainable layer when its input comes from frozen embeddings without checkpointing: its input norm
    then keeps nothing for the input's gradient. The rules are in the module docstring; sources: transformers
    ``modeling_qwen2.py`` (``Qwen2RMSNorm``, ``Qwen2Attention``, ``Qwen2MLP``), peft ``tuners/lora/layer.py``
    (``Linear.forward``), transformers ``integrations/sdpa_attention.py``.
    """
    mode = _mode(shape, spec)
    h, i, r = shape.hidden_size, shape.intermediate_size, spec.lora_rank
    full = spec.method in ("full", "freeze")  # every weight of the layer trains
    e_out = 2 if mode.amp else mode.e  # dtype of Linear outputs (autocast computes in bf16/fp16)
    lora_a_bytes = 2 if mode.amp else mode.e
    items: list[tuple[str, float]] = []

    def norm(label: str, needs_grad: bool) -> int:
        """RMSNorm: fp32 copy of the input (pow, mul) + rsqrt; the normalized tensor if the weight trains.
        Liger's RMSNorm keeps its input in its own dtype and the fp32 rstd, whether or not the weight trains."""
        if spec.liger:
            if needs_grad or full:
                items.append((f"{label}: its input (Liger RMSNorm)", mode.residual_bytes * h))
                items.append((f"{label}: rstd (fp32)", 4))
            return mode.residual_bytes
        if needs_grad:
            items.append((f"{label}: fp32 copy of its input (pow/mul)", 4 * h))
            items.append((f"{label}: rsqrt", 4))
        if full:
            items.append((f"{label}: normalized input (weight trains)", mode.residual_bytes * h))
            return max(mode.trainable_bytes, mode.residual_bytes)  # trainable weight × input: type promotion
        return mode.residual_bytes

    def consumers(label: str, width: int, in_bytes: int, names: tuple[str, ...], shared_saved: bool) -> None:
        """Linears reading one input: trainable bases and LoRA adapters save it (or a copy of it)."""
        shared = False
        for name in names:
            if full:  # a trainable Linear saves its input; autocast first casts an fp32 input to a new copy
                if mode.amp and in_bytes == 4:
                    items.append((f"{name}: bf16 cast of its fp32 input (autocast)", 2 * width))
                else:
                    shared = True
            if name in mode.lora_targets:
                # peft casts to the fp32 adapter dtype, autocast casts back: a new tensor; peft's bitsandbytes
                # layers (QLoRA) skip the cast under autocast, so their adapters share the input
                if mode.amp and spec.quantization_bit is None and spec.peft_casts_inputs:
                    items.append((f"{name}: LoRA input copy (peft cast + autocast)", 2 * width))
                else:
                    shared = True
                items.append((f"{name}: LoRA A output (saved by lora_B)", lora_a_bytes * r))
        if shared and not shared_saved:
            items.append((f"{label} (saved by {', '.join(names)})", in_bytes * width))

    y_bytes = norm("input RMSNorm", input_needs_grad)
    consumers("normalized input", h, y_bytes, ("q_proj", "k_proj", "v_proj"), shared_saved=False)

    items += _attention_saved_tensors(shape, spec, mode)
    consumers("attention output", shape.q_dim, e_out, ("o_proj",), shared_saved=True)

    y_bytes = norm("post-attention RMSNorm", True)
    consumers("normalized input", h, y_bytes, ("gate_proj", "up_proj"), shared_saved=False)
    items += [
        ("gate output (SiLU input)", e_out * i),
        ("up output (saved by the product)", e_out * i),
    ]
    if not spec.liger:  # Liger's SwiGLU recomputes SiLU(gate) in backward
        items.append(("SiLU(gate) (saved by the product)", e_out * i))
    consumers("gate·up product", i, e_out, ("down_proj",), shared_saved=False)
    return items


def _layer_workspace(shape: ModelShape, spec: TrainSpec) -> float:
    """Bytes per token alive only while one layer runs its backward: the MLP's gradients (d product, d SiLU,
    d up at once) and, for LoRA under autocast where peft casts the adapter's input to fp32, the fp32 gradient of
    down_proj's input copy. Without that cast (rocmft's worker, rocmft.worker.patches; peft's bitsandbytes layers
    under autocast, QLoRA) there is no fp32 copy and no fp32 gradient of it: counting one over-estimated
    rocmft's 7B run by 0.58 GiB (4·i bytes × 8192 tokens; one H200, 2026-12-05, BENCHMARKS.md)."""
    mode = _mode(shape, spec)
    e_out = 2 if mode.amp else mode.e
    casts = mode.amp and spec.peft_casts_inputs and spec.quantization_bit is None
    extra = 4 * shape.intermediate_size if (casts and "down_proj" in mode.lora_targets) else 0
    return 3 * e_out * shape.intermediate_size + extra


__all__ = ["layer_saved_tensors"]
