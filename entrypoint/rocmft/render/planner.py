"""The planner: defaults that use the GPU, chosen from the model's shape and the device's memory.

The template's defaults (templates/train.yaml.j2) are the seed recipe users copy from blogs: micro-batch 2 ×
gradient accumulation 8, no packing, gradient checkpointing on. On one H200 that recipe ran a Qwen2-7B-shaped
LoRA SFT at ~1.7k tokens/s, about a tenth of the GPU (DESIGN.md, "Facts found by measurement"). The planner
replaces the template's defaults — never a value the user gave (environment or ROCMFT_CONFIG) — with:

* ``neat_packing`` (SFT only): LLaMA-Factory 0.9.5 packs several samples into one row of ``cutoff_len``
  tokens and gives each token the index of its sample (``data/processor/supervised.py``,
  ``PackedSupervisedDatasetProcessor``); the collator turns the indices into a block-diagonal causal 4-D mask
  (``data/collator.py``, ``prepare_4d_attention_mask``; with FlashAttention-2 the per-sample position ids do
  it), and position ids restart at 0 in each sample. A token therefore attends to exactly the tokens it would
  see unpacked, at the same positions: what the model learns from each sample does not change. Plain
  ``packing`` is not used for SFT: its all-ones mask lets a sample attend to the samples packed before it.
  Under SDPA (no flash_attn package) the plan adds ``packed_attention: varlen``: the worker replaces the dense
  mask by variable-length attention over the samples (rocmft.worker.attention; measured against SDPA with the
  mask at start, the faster kept), and the micro-batch's rows are flattened into one, so it is not limited to
  one row as LLaMA-Factory's FlashAttention-2 path is.
  The loss is the mean over the label tokens of the whole accumulated batch in both cases (transformers'
  ``num_items_in_batch``), so every label token weighs the same; what changes is how many samples one
  optimizer step sees (a row of ``cutoff_len`` tokens holds several short samples). ``stage: pt`` already
  packs (continuous text has no sample boundaries to respect); other stages (DPO, RM, KTO, PPO) do not pack.
* micro-batch and gradient accumulation: the largest micro-batch that fits (rocmft.render.memfit's estimate against
  the GPU's memory, :data:`USABLE_FRACTION`) among the divisors of the effective batch per GPU in rows, with the
  accumulation making up the rest. The requested effective batch (micro-batch × accumulation, the template's
  2 × 8 = 16 unless the user gave them) counts *samples*; with planned packing a row holds several, so it
  becomes rows = samples × mean sample tokens / CUTOFF_LEN (rounded, at least 1; the mean of the training
  data's first 500 records per file, trainable text with the model's tokenizer, chat markup not counted).
  Without that conversion each step saw ~4.2x the samples of the recipe and the loss per token fell slower
  (measured on an H200, BENCHMARKS.md): the same samples per step keep what the recipe trains.
* gradient checkpointing off whenever some micro-batch fits without it: recomputation costs one more
  forward per step (+50% of a LoRA step's FLOPs, whose backward computes no weight gradients: 2N of 4N per
  token; +33% for full fine-tuning: 2N of 6N), more than a smaller micro-batch loses once a micro-batch holds
  a full row of ``cutoff_len`` tokens. On only when nothing fits without it.
* the attention implementation (``flash_attn``): FlashAttention-2 where the image's architecture has a
  backend (Composable Kernel on gfx90a/gfx942/gfx950; none on gfx1100, where torch's own AOTriton kernels
  serve: ``FLASH_ATTN_BACKEND`` in docker/arch/<ARCH>.env, the one place that names it and says why) *and*
  ``flash_attn`` is importable; PyTorch SDPA otherwise, with the reason printed.
* ``enable_liger_kernel`` (Liger's fused RMSNorm, SwiGLU, RoPE and fused linear cross-entropy) where
  liger-kernel and triton are importable, the device is a GPU, the model family is one Liger patches and the
  stage is SFT or pre-training (LLaMA-Factory keeps plain logits for the others,
  ``model/model_utils/liger_kernel.py``). The fused cross-entropy never materializes the T×V logits: the
  9.3 GiB logits allocation that ran micro-batch 8 out of memory is gone (rocmft.render.memfit models it).

Every choice carries its reason; :func:`plan_defaults` returns them, render puts the planned values into the
run's arguments with the source ``rocmft plan: <reason>``, and the manifest keeps the whole :class:`PerfPlan`.
On machines without a GPU, and for the built-in default (a fixed recipe), the planner changes nothing.
Per-architecture choices: docs/planner.md.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rocmft.config.provenance import Kind, Source
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.facts.image import ARCH_PROFILE, profile_for
from rocmft.render import memfit
from rocmft.values import truthy

# Share of a GPU's total memory the plan may fill, before memfit's own ALLOCATOR_HEADROOM (5%) and margin:
# the HIP/CUDA context (~0.5 GiB per process), and whatever else the process or a neighbour holds.
USABLE_FRACTION = 0.97
# Model families whose decoder layers memfit models (gated MLP, RMSNorm) and Liger patches (LLaMA-Factory
# 0.9.5, model/model_utils/liger_kernel.py; liger-kernel 0.8.5's apply_liger_kernel_to_<family>).
LIGER_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
# Stages whose loss is a token-level cross-entropy: LLaMA-Factory applies Liger's fused cross-entropy there.
FUSED_CE_STAGES = ("sft", "pt")


@dataclass(frozen=True)
class Choice:
    """One decision.

    Attributes:
        name: the LLaMA-Factory argument (``per_device_train_batch_size``, ``neat_packing``, ...).
        value: its value in the run.
        reason: why, in words a user can check.
        planned: True when the planner set it; False when it kept a value (the user's, or the default).
    """

    name: str
    value: Any
    reason: str
    planned: bool


@dataclass
class PerfPlan:
    """What the planner decided for one run (saved in the manifest as ``plan``).

    Attributes:
        active: whether the planner looked at the run at all (False without a GPU or for the built-in default).
        note: one line on why it is inactive, or what it planned against.
        choices: every decision, in order.
        estimate_gib: rocmft.render.memfit's peak estimate for the planned configuration (GiB per GPU), when known.
        breakdown_gib: that estimate by component.
        usable_gib: the memory planned against (GiB per GPU).
        arch: the GPU's gfx target or compute capability.
        packed_attention: ``varlen`` when neat-packed rows are to take variable-length attention instead of
            SDPA with LLaMA-Factory's dense block mask (rocmft.worker.attention, which measures both at start and
            keeps the faster); None otherwise. Not a LLaMA-Factory argument: it reaches the worker in run.json.
        sample_tokens: the mean tokens per training sample the plan used (None: unknown).
    """

    active: bool
    note: str
    choices: list[Choice] = field(default_factory=list)
    estimate_gib: float | None = None
    breakdown_gib: dict[str, float] | None = None
    usable_gib: float | None = None
    arch: str | None = None
    packed_attention: str | None = None
    sample_tokens: float | None = None

    def planned_arguments(self) -> dict[str, Any]:
        """The arguments the planner sets (those it kept are not repeated)."""
        return {c.name: c.value for c in self.choices if c.planned}

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy for the manifest."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> PerfPlan:
        """The plan of an :meth:`as_dict` object (the manifest's ``plan``, read back by the run report); keys it
        does not know are left out, missing ones take their defaults.

        Raises:
            ValueError: ``data`` is not an object, a key holds a value of another JSON type (the numbers: a number
                or null), or ``choices`` holds an entry that is not a choice.
        """
        if not isinstance(data, dict):
            raise ValueError(f"the plan is {type(data).__name__}, not a JSON object")
        number, text, table = (int, float, type(None)), (str, type(None)), (dict, type(None))
        kinds = {"active": (bool,), "note": (str,), "estimate_gib": number, "usable_gib": number, "arch": text,
                 "breakdown_gib": table, "packed_attention": text, "sample_tokens": number}  # fmt: skip
        for key, allowed in kinds.items():
            value = data.get(key)
            if key in data and (not isinstance(value, allowed) or (allowed is number and isinstance(value, bool))):
                raise ValueError(f"the plan's {key!r} is {type(value).__name__} {str(value)[:40]!r}")
        try:
            choices = [Choice(str(c["name"]), c.get("value"), str(c.get("reason", "")), bool(c.get("planned")))
                       for c in data.get("choices") or []]  # fmt: skip
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"the plan's 'choices' holds an entry that is not a choice ({err!r})") from err
        values = {k: data[k] for k in kinds if k in data}
        return cls(**{"active": False, "note": "", **values}, choices=choices)


def has_module(name: str) -> bool:
    """Whether ``name`` can be imported (looked up without importing it: triton/flash_attn imports are slow)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def gfx_target(device: DeviceFacts) -> str | None:
    """The first GPU's target without feature flags (``gfx942:sramecc+:xnack-`` → ``gfx942``), or None."""
    return device.archs[0].split(":")[0] if device.archs else None


def flash_backend(arch: str | None, profile: Path = ARCH_PROFILE) -> str:
    """The flash-attention backend for ``arch``: FLASH_ATTN_BACKEND of its architecture profile (the image's, else
    the shipped docker/arch/<arch>.env: rocmft.facts.image.profile_for); ``none`` when no profile names ``arch``."""
    values = profile_for(arch, profile) if arch else None
    return (values or {}).get("FLASH_ATTN_BACKEND", "none")


def plan_defaults(
    arguments: dict[str, Any],
    explicit: set[str],
    device: DeviceFacts,
    *,
    compute_dtype: str,
    zero_stage: int = 0,
    offload: str = "none",
    world_size: int = 1,
    demo: bool = False,
    liger_available: bool | None = None,
    flash_available: bool | None = None,
    sample_tokens: float | None = None,
) -> PerfPlan:
    """Choose the performance settings of a run (see the module docstring for every rule and its source).

    Args:
        arguments: the run's arguments as rendered from the template and the user's values (template
            defaults included).
        explicit: names the user gave (environment or ROCMFT_CONFIG): never changed.
        device: the probed device; without a GPU nothing is planned.
        compute_dtype: the precision policy's dtype (``bfloat16``/``float16``/``float32``).
        zero_stage, offload, world_size: the distributed set-up, as rocmft.render.memfit takes them (FSDP as stage 3).
        demo: the built-in default (a fixed recipe): nothing is planned.
        liger_available, flash_available: whether liger-kernel (with triton) and flash_attn can be imported;
            looked up when None (tests inject them).
        sample_tokens: mean tokens per training sample (rocmft.render.datasets.sample_token_lengths), for the rows
            of a packed step; None when unknown (the effective batch is then kept in rows, and said so).

    Returns:
        The :class:`PerfPlan`. Never raises for a run that does not fit: the ``memory-fit`` check reports that
        with its remedies.
    """
    if demo:
        return PerfPlan(False, "the built-in default keeps its fixed recipe (templates/demo.yaml)")
    if device.backend == "cpu" or device.count < 1 or not device.memory_gib:
        return PerfPlan(False, "no GPU visible: the template's defaults are kept")
    arch = gfx_target(device)
    usable = min(device.memory_gib) * USABLE_FRACTION
    plan = PerfPlan(True, "", usable_gib=round(usable, 2), arch=arch)
    model_dir = Path(str(arguments.get("model_name_or_path") or "")).expanduser()
    shape = _model_shape(model_dir)
    stage = str(arguments.get("stage") or "sft")
    method = str(arguments.get("finetuning_type") or "lora")
    choose = _Chooser(plan, explicit, arguments)
    attention = _plan_attention(choose, device, arch, compute_dtype, flash_available)
    _plan_packing(choose, arguments, explicit, stage, attention, compute_dtype)
    plan.sample_tokens = sample_tokens
    _plan_liger(choose, shape, stage, liger_available)
    batch = _requested_batch(choose, arguments, explicit, sample_tokens)
    if batch.micro < 1 or batch.accumulation < 1:  # refused by the ranges rule, with the setting named
        plan.note = "the micro-batch or gradient accumulation given is below 1: memory-based choices were not made"
        return plan
    if shape is None:
        choose.keep("per_device_train_batch_size", batch.micro, f"{model_dir}/config.json is not on disk: not planned")
        choose.keep("gradient_accumulation_steps", batch.accumulation, "kept with the micro-batch")
        plan.note = "the model's config.json is not local: memory-based choices were not made"
        return plan
    _plan_fit(choose, arguments, explicit, shape, batch, attention, usable, compute_dtype=compute_dtype,
              zero_stage=zero_stage, offload=offload, world_size=world_size)  # fmt: skip
    plan.note = f"planned for {arch} with {usable:.1f} GiB per GPU ({method}, {stage}, {compute_dtype})"
    return plan


def _model_shape(model_dir: Path) -> memfit.ModelShape | None:
    """The model's shape from its local config.json; None when it is not on disk (or broken: the model check
    reports that)."""
    shape = None
    if (model_dir / "config.json").is_file():
        try:
            shape = memfit.read_model_shape(model_dir)
        except ConfigError:  # the model check reports a broken config; plan without the shape
            shape = None
    return shape


def _plan_attention(choose: _Chooser, device: DeviceFacts, arch: str | None, compute_dtype: str,
                    flash_available: bool | None) -> str:  # fmt: skip
    """Choose ``flash_attn``: FlashAttention-2 where the architecture has a backend and flash_attn is installed
    (not in fp32), else PyTorch SDPA. Returns the attention the run gets (``fa2``, ``sdpa``, or the user's)."""
    backend = flash_backend(arch) if device.backend == "rocm" else ("cuda" if device.backend == "cuda" else "none")
    flash_ok = has_module("flash_attn") if flash_available is None else flash_available
    if backend != "none" and flash_ok and compute_dtype != "float32":
        choose.set("flash_attn", "fa2", f"FlashAttention-2 ({backend} backend for {arch}) is installed")
    elif backend == "none":
        choose.set("flash_attn", "sdpa", f"no flash-attention backend for {arch} (FLASH_ATTN_BACKEND in "
                   f"docker/arch/{arch or '<ARCH>'}.env): PyTorch SDPA")  # fmt: skip
    elif compute_dtype == "float32":
        choose.set("flash_attn", "sdpa", "FlashAttention-2 has no fp32 kernels: PyTorch SDPA")
    else:
        choose.set("flash_attn", "sdpa", f"{arch} has a {backend} flash-attention backend, but flash_attn is "
                   "not installed here: PyTorch SDPA (build the image with FLASH_ATTN_BACKEND for speed)")  # fmt: skip
    return str(choose.value("flash_attn") or "auto")


def _plan_packing(choose: _Chooser, arguments: dict[str, Any], explicit: set[str], stage: str, attention: str,
                  compute_dtype: str) -> None:  # fmt: skip
    """Choose packing: neat packing for SFT unless the user chose, pre-training's own packing kept; and
    variable-length attention for neat-packed rows under SDPA (``plan.packed_attention``)."""
    if stage == "sft":
        if "packing" in explicit and not truthy(arguments.get("packing")):
            choose.keep("neat_packing", False, "PACKING=false is yours: no packing")
        elif "packing" in explicit and "neat_packing" not in explicit:
            choose.keep("neat_packing", False, "PACKING=true is yours (plain packing: samples see each other)")
        else:
            choose.set("neat_packing", True, "SFT: samples packed into rows of CUTOFF_LEN tokens, each "
                       "attending only to itself (block-diagonal mask, positions restart): same learning, "
                       "no padding")  # fmt: skip
    elif stage == "pt":
        choose.keep("packing", truthy(arguments.get("packing", True)), "pre-training packs continuous text already")
    if stage == "sft" and truthy(choose.value("neat_packing")) and attention == "sdpa" and compute_dtype != "float32":
        # the dense 4-D mask keeps SDPA off its flash kernel (~9% of a 7B LoRA step on an H200, BENCHMARKS.md)
        choose.plan.packed_attention = "varlen"


def _plan_liger(choose: _Chooser, shape: memfit.ModelShape | None, stage: str,
                liger_available: bool | None) -> None:  # fmt: skip
    """Choose ``enable_liger_kernel``: on where liger-kernel is installed, the model family is one it patches and
    the stage takes a fused cross-entropy."""
    liger_ok = (has_module("liger_kernel") and has_module("triton")) if liger_available is None else liger_available
    family = shape.model_type if shape else ""
    if not liger_ok:
        choose.set("enable_liger_kernel", False, "liger-kernel (with triton) is not installed: the logits are "
                   "materialized (T×V fp32 for the loss)")  # fmt: skip
    elif family not in LIGER_FAMILIES:
        choose.set("enable_liger_kernel", False, f"model type {family or 'unknown'!r} is not one Liger patches "
                   "that rocmft's memory model covers")  # fmt: skip
    elif stage not in FUSED_CE_STAGES:
        choose.set("enable_liger_kernel", False, f"stage {stage} needs the logits (no fused cross-entropy)")
    else:
        choose.set("enable_liger_kernel", True, "Liger's fused linear cross-entropy: no T×V logits in memory; "
                   "fused RMSNorm/SwiGLU/RoPE")  # fmt: skip


class _Batch(NamedTuple):
    """The batch the run asks for: the micro-batch and accumulation as given or templated, the effective batch in
    rows (converted from samples when packed), whether the user fixed it, and the reason the plan keeps it."""

    micro: int
    accumulation: int
    effective: int
    fixed: bool
    keeps: str


def _requested_batch(choose: _Chooser, arguments: dict[str, Any], explicit: set[str],
                     sample_tokens: float | None) -> _Batch:  # fmt: skip
    """The effective batch to keep: micro-batch × accumulation samples, as packed rows when the plan packs."""
    micro = int(arguments.get("per_device_train_batch_size") or 8)
    accumulation = int(arguments.get("gradient_accumulation_steps") or 1)
    samples = effective = micro * accumulation
    batch_fixed = bool({"per_device_train_batch_size", "gradient_accumulation_steps"} & explicit)
    packed = truthy(choose.value("neat_packing")) or truthy(choose.value("packing"))
    keeps = f"keeps the effective batch of {effective} rows per GPU"
    if packed and not batch_fixed:
        cutoff = int(arguments.get("cutoff_len") or 2048)
        if sample_tokens:
            per_row = cutoff / min(max(sample_tokens, 1.0), cutoff)
            effective = max(1, round(samples / per_row))
            keeps = (f"keeps ~{samples} samples per optimizer step: {effective} packed rows of ~{per_row:.1f} samples "
                     f"(mean {sample_tokens:.0f} tokens per sample, CUTOFF_LEN {cutoff})")  # fmt: skip
        else:
            keeps = (f"keeps {effective} rows per GPU; the sample length is unknown, so a packed step holds more "
                     "samples than the unpacked recipe")  # fmt: skip
    return _Batch(micro, accumulation, effective, batch_fixed, keeps)


def _plan_fit(choose: _Chooser, arguments: dict[str, Any], explicit: set[str], shape: memfit.ModelShape,
              batch: _Batch, attention: str, usable: float, *, compute_dtype: str, zero_stage: int, offload: str,
              world_size: int) -> None:  # fmt: skip
    """Choose the micro-batch, accumulation and checkpointing that fit in ``usable`` GiB (checkpointing off
    first), record memfit's estimate in the plan, and plan the eval batch."""
    plan = choose.plan
    micro, accumulation, effective, batch_fixed = batch.micro, batch.accumulation, batch.effective, batch.fixed
    gc_fixed = bool({"disable_gradient_checkpointing", "gradient_checkpointing"} & explicit)

    def spec_for(mb: int, ga: int, checkpointing: bool, packed_attention: str | None = "plan") -> memfit.TrainSpec:
        trial = {**arguments, **plan.planned_arguments(), "per_device_train_batch_size": mb,
                 "gradient_accumulation_steps": ga, "disable_gradient_checkpointing": not checkpointing}  # fmt: skip
        trial.pop("gradient_checkpointing", None)
        if gc_fixed:
            trial["disable_gradient_checkpointing"] = arguments.get("disable_gradient_checkpointing", False)
            trial["gradient_checkpointing"] = arguments.get("gradient_checkpointing", False)
        return memfit.spec_from_arguments(trial, compute_dtype=compute_dtype, zero_stage=zero_stage,
                                          offload=offload, world_size=world_size,
                                          packed_attention=plan.packed_attention if packed_attention == "plan"
                                          else packed_attention)  # fmt: skip

    free = int(usable * memfit.GiB)
    gc_now = spec_for(micro, accumulation, True).gradient_checkpointing if gc_fixed else None
    one_row = attention == "fa2" and truthy(choose.value("neat_packing"))
    if batch_fixed:
        sizes = [(micro, accumulation)]
        why_batch = "yours (PER_DEVICE_TRAIN_BATCH_SIZE / GRADIENT_ACCUMULATION_STEPS given)"
    elif one_row:
        sizes = [(1, effective)]
        why_batch = ("FlashAttention-2 with neat_packing takes one packed row per micro-batch (LLaMA-Factory "
                     "0.9.5, data/collator.py)")  # fmt: skip
    else:
        sizes = [(mb, effective // mb) for mb in range(effective, 0, -1) if effective % mb == 0]
        why_batch = f"the largest divisor of the effective batch {effective} that fits"
    options = [False, True] if gc_now is None else [gc_now]
    picked = _first_fit(shape, spec_for, sizes, options, free, check_fallback=plan.packed_attention is not None)
    fitted = picked is not None
    if picked is None:  # nothing fits: the smallest, with checkpointing; the memory-fit check explains
        mb, ga = sizes[-1]
        checkpointing = True if gc_now is None else gc_now
        picked = (mb, ga, checkpointing, memfit.estimate(shape, spec_for(mb, ga, checkpointing)))
    mb, ga, checkpointing, estimate = picked
    peak = f"peak ≈ {estimate.total / memfit.GiB:.1f} of {usable:.1f} GiB"
    if not fitted:
        why_batch = f"nothing fits in {usable:.1f} GiB (the memory-fit check lists remedies)"
    _record_fit(choose, explicit, batch, mb, ga, checkpointing, f"{why_batch}; {peak}", gc_fixed=gc_fixed)
    plan.estimate_gib = round(estimate.total / memfit.GiB, 2)
    plan.breakdown_gib = estimate.breakdown()
    _plan_eval_batch(choose, arguments, explicit, shape, spec_for(mb, ga, checkpointing), free)


def _first_fit(shape: memfit.ModelShape, spec_for: Callable[..., memfit.TrainSpec], sizes: list[tuple[int, int]],
               options: list[bool], free: int, *,
               check_fallback: bool) -> tuple[int, int, bool, memfit.MemoryEstimate] | None:  # fmt: skip
    """The first (micro-batch, accumulation, checkpointing, estimate) that fits in ``free`` bytes, checkpointing
    off first; with ``check_fallback`` LLaMA-Factory's dense mask must fit too. None when nothing fits."""
    picked = None
    for checkpointing in options:  # checkpointing off first: recomputation costs a forward per step
        for mb, ga in sizes:
            estimate = memfit.estimate(shape, spec_for(mb, ga, checkpointing))
            # the worker keeps LLaMA-Factory's mask when varlen measures slower or fails: that must fit too
            fallback_fits = not check_fallback or memfit.estimate(
                shape, spec_for(mb, ga, checkpointing, None)).fits(free)  # fmt: skip
            if estimate.fits(free) and fallback_fits:
                picked = (mb, ga, checkpointing, estimate)
                break
        if picked:
            break
    return picked


def _record_fit(choose: _Chooser, explicit: set[str], batch: _Batch, mb: int, ga: int, checkpointing: bool,
                why: str, *, gc_fixed: bool) -> None:  # fmt: skip
    """Record the fitted micro-batch, accumulation and checkpointing (kept where the user gave them)."""
    if batch.fixed:
        choose.keep("per_device_train_batch_size", mb, why)
        choose.keep("gradient_accumulation_steps", ga, "yours" if "gradient_accumulation_steps" in explicit
                    else "kept with your micro-batch")  # fmt: skip
    else:
        choose.set("per_device_train_batch_size", mb, why)
        choose.set("gradient_accumulation_steps", ga, batch.keeps)
    if gc_fixed:
        choose.keep("disable_gradient_checkpointing", not checkpointing, "yours")
    elif checkpointing:
        choose.set("disable_gradient_checkpointing", False, "on: no micro-batch fits without it")
    else:
        choose.set("disable_gradient_checkpointing", True, f"off: micro-batch {mb} fits without recomputation "
                   "(which costs one more forward per step)")  # fmt: skip


EVAL_BATCHES = (8, 4, 2, 1)  # transformers' default per_device_eval_batch_size is 8; halved until it fits


def _plan_eval_batch(choose: _Chooser, arguments: dict[str, Any], explicit: set[str], shape: memfit.ModelShape,
                     spec: memfit.TrainSpec, free: int) -> None:  # fmt: skip
    """``per_device_eval_batch_size`` when the run evaluates (``eval_strategy`` steps/epoch or ``do_eval``): the
    largest of :data:`EVAL_BATCHES` whose evaluation peak (rocmft.render.memfit.eval_estimate: the full logits,
    a KV cache with ``predict_with_generate``) fits; a value of yours is kept, and said when it does not fit."""
    evaluates = str(arguments.get("eval_strategy") or "no").lower() in ("steps", "epoch") or truthy(
        arguments.get("do_eval"))  # fmt: skip
    if not evaluates:
        return
    generate = int(arguments.get("max_new_tokens") or 1024) if truthy(arguments.get("predict_with_generate")) else 0
    budget = free * (1 - memfit.ALLOCATOR_HEADROOM)

    def peak(batch: int) -> float:
        return memfit.eval_estimate(shape, spec, batch, generate) / memfit.GiB

    what = "evaluation makes the full T×V logits (Liger's fused loss is for training only)" + (
        f" and a KV cache for {generate} new tokens (predict_with_generate)" if generate else "")  # fmt: skip
    if "per_device_eval_batch_size" in explicit:
        batch = int(arguments.get("per_device_eval_batch_size") or 8)
        fits = peak(batch) <= budget / memfit.GiB
        choose.keep("per_device_eval_batch_size", batch, f"yours; {what}: peak ≈ {peak(batch):.1f} GiB" + (
            "" if fits else f", more than the {budget / memfit.GiB:.1f} GiB usable: the first evaluation would run "
            "out of memory; lower PER_DEVICE_EVAL_BATCH_SIZE"))  # fmt: skip
        return
    batch = next((b for b in EVAL_BATCHES if peak(b) <= budget / memfit.GiB), 1)
    choose.set("per_device_eval_batch_size", batch, f"{what}: {batch} fits, peak ≈ {peak(batch):.1f} GiB")


class _Chooser:
    """Records choices; a name the user gave is kept with "yours" whatever the planner would pick."""

    def __init__(self, plan: PerfPlan, explicit: set[str], arguments: dict[str, Any]) -> None:
        self.plan, self.explicit, self.arguments = plan, explicit, arguments

    def set(self, name: str, value: Any, reason: str) -> None:
        if name in self.explicit:
            self.keep(name, self.arguments.get(name), f"yours (the planner would pick {value!r}: {reason})")
        else:
            self.plan.choices.append(Choice(name, value, reason, planned=True))

    def keep(self, name: str, value: Any, reason: str) -> None:
        self.plan.choices.append(Choice(name, value, reason, planned=False))

    def value(self, name: str) -> Any:
        for choice in self.plan.choices:
            if choice.name == name:
                return choice.value
        return self.arguments.get(name)


def apply(plan: PerfPlan, layered: dict[str, Any],
          sources: dict[str, Source]) -> tuple[dict[str, Any], dict[str, Source], bool]:  # fmt: skip
    """Render's layered arguments and their sources with the planned values put in (source ``rocmft plan:
    <reason>``), as new dicts (the given ones are not changed), and whether any value changed."""
    layered, sources = dict(layered), dict(sources)
    changed = False
    for choice in plan.choices:
        if choice.planned:
            changed = changed or layered.get(choice.name) != choice.value
            layered[choice.name] = choice.value
            sources[choice.name] = Source(Kind.PLAN, choice.reason)
    return layered, sources, changed


__all__ = ["Choice", "PerfPlan", "apply", "flash_backend", "gfx_target", "has_module", "plan_defaults"]
