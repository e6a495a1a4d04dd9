"""Peak GPU memory of one training process, estimated from config.json before the model loads.

The ``memory-fit`` health check uses this module to say, in seconds and without a GPU, whether a run will
fit, and if not, which settings would. The number estimated is what ``torch.cuda.max_memory_allocated()``
reports at the end of a run (the worker records it as ``peak_gpu_memory_gib``): bytes handed out by the
caching allocator. The CUDA/HIP context (~0.5 GiB per process) and the allocator's cached-but-free blocks are
not part of it; :meth:`MemoryEstimate.fits` leaves :data:`ALLOCATOR_HEADROOM` of the free memory for them.

Notation: ``h`` hidden size, ``i`` intermediate (MLP) size, ``L`` layers, ``nh`` attention heads, ``q = nh·d``
and ``kv = n_kv·d`` the query and key/value widths (``d`` head dim, grouped-query attention when n_kv < nh),
``V`` vocabulary, ``r`` LoRA rank, ``T = micro-batch × sequence length`` tokens per micro-batch, ``e`` bytes of
the compute dtype (2 for bf16/fp16, 4 for fp32), ``Φ`` parameters, ``Φt`` trainable parameters, ``N`` world size.

**What LLaMA-Factory 0.9.5 builds** (read from the installed code):

* ``model/adapter.py``, ``init_adapter``: trainable parameters are cast to fp32 ("Upcasting trainable params
  to float32") unless ``pure_bf16``/BAdam, or DeepSpeed ZeRO-3 without quantization; frozen weights stay in the
  compute dtype. ``_setup_lora_tuning``: LoRA with ``lora_rank`` 8 (``hparams/finetuning_args.py``),
  ``lora_dropout`` 0 (peft then uses ``nn.Identity``), ``lora_target: all`` → ``model_utils/misc.py``,
  ``find_all_linear_modules``: every ``Linear`` but ``lm_head``, i.e. q, k, v, o, gate, up, down.
* ``hparams/parser.py``, ``get_train_args``: ``compute_dtype`` from ``bf16``/``fp16``; the Trainer then runs
  the forward under ``torch.autocast`` (accelerate ``Accelerator.prepare_model``: ``native_amp`` for bf16/fp16
  except under DeepSpeed, plus ``convert_outputs_to_fp32`` on the model's outputs). DeepSpeed instead casts the
  whole module to bf16/fp16 (``deepspeed/runtime/engine.py``, ``_configure_distributed_model``) and keeps fp32
  master weights in its optimizer.
* ``model/model_utils/checkpointing.py``, ``prepare_model_for_training``: gradient checkpointing is ON unless
  ``disable_gradient_checkpointing`` (default False); ``use_reentrant_gc`` defaults to True (rocmft renders False
  for LoRA/OFT), and ``get_custom_gradient_checkpointing_func`` checkpoints only layers with trainable parameters
  and makes their hidden-state input require grad. ``torch.utils.checkpoint`` keeps only the layer's inputs
  (reentrant: the positional tensor; non-reentrant: every tensor the layer saves is a placeholder until backward
  recomputes it; ``transformers/modeling_layers.py`` passes the rest in a ``partial``); the layer is recomputed in
  backward.
* ``hparams/data_args.py`` + ``data/processor/supervised.py``, ``PackedSupervisedDatasetProcessor``: with
  ``packing``/``neat_packing`` every sequence is padded to exactly ``cutoff_len`` tokens (cutoff_len−1, plus
  one); without packing ``SFTDataCollatorWith4DAttentionMask`` pads to the batch's longest sample, a multiple of
  8 (``train/sft/workflow.py``), so the worst case — a batch of samples cut at ``cutoff_len`` — is
  ``ceil8(cutoff_len)``. Plain packing passes an all-ones attention mask, so transformers' ``sdpa_mask`` drops
  it and SDPA runs causal flash attention with ``enable_gqa`` (``integrations/sdpa_attention.py``): no T×T
  matrix is kept. ``neat_packing`` builds a 4-D mask (``prepare_4d_attention_mask``), which makes SDPA repeat
  K/V to all heads.
* Logits: ``Qwen2ForCausalLM.forward`` (and every ``*ForCausalLM`` in transformers 5) computes ``lm_head`` for
  all positions (``logits_to_keep=0``); ``loss/loss_utils.py``, ``ForCausalLMLoss`` upcasts them with
  ``logits.float()`` and calls ``cross_entropy`` = ``log_softmax`` (which keeps its fp32 output for backward)
  + ``nll_loss``.
* Optimizer: transformers' default ``optim`` is ``adamw_torch_fused`` with torch ≥ 2.8 (``adamw_torch``
  before): two states (exp_avg, exp_avg_sq) per trainable parameter, in the parameter's dtype.

**What autograd keeps.** A frozen ``Linear`` saves only its weight (grad-input needs W, not the input); a
trainable one also saves its input. peft's ``lora.Linear.forward`` casts the input to the adapter's dtype
(``_cast_input_dtype``: bf16 → fp32 copy) and, under autocast, ``lora_A`` casts it back to a *new* bf16 tensor
which it saves: one input copy per adapted Linear. peft's bitsandbytes layers (``tuners/lora/bnb.py``,
``Linear4bit.forward`` and ``Linear8bitLt.forward``, peft 0.18.1) cast only when autocast is off
(``requires_conversion = not torch.is_autocast_enabled()``), so under QLoRA the adapters of q, k, v (and of
gate, up) share one saved input: ~8·h bytes less per layer and token than bf16 LoRA (measured on an H200,
Llama-3-8B shape, 4 × 2048 tokens: 43.15 GiB peak for QLoRA against 61.27 GiB for bf16 LoRA; the estimate
without this rule was +15.8%, BENCHMARKS.md). Qwen2/Llama ``RMSNorm`` saves an fp32 copy of its input
(``pow`` and ``mul``) and the rsqrt; the normalized tensor only when the norm weight is trainable. SiLU saves its
input, the gate·up product both factors. Flash SDPA saves q, k, v, the output and the fp32 log-sum-exp.
Per layer and token, in bytes, for the acceptance case (LoRA on all seven Linears, bf16 autocast)::

    input RMSNorm fp32 copy + rsqrt           4h + 4
    LoRA input copies of q, k, v (bf16)       3·2h
    q, k after RoPE, v                        2q + 2kv + 2kv
    SDPA output + fp32 logsumexp              2q + 4nh
    LoRA input copy of o_proj                 2q
    post-attention RMSNorm + rsqrt            4h + 4
    LoRA input copies of gate, up             2·2h
    gate output (SiLU input), up, SiLU(gate)  3·2i
    LoRA input copy of down_proj              2i
    LoRA A outputs (saved by lora_B)          7·2r
    = 24h + 4kv + 8i + 4nh + 14r + 8          (Qwen2-7B: 239,848 B ≈ 234 KiB per token per layer)

Other cases follow from the same rules (:func:`layer_saved_tensors` names every tensor): under DeepSpeed
(no autocast, adapters in bf16) the LoRA input is the shared normalized tensor, not a copy; full fine-tuning
saves every Linear's input and the norms' outputs, and under autocast its fp32 weights are cast to bf16 copies
that autograd keeps (2 bytes per Linear weight), and its residual stream is fp32 (fp32 embeddings).
``tests/test_memfit.py`` checks these sums against the tensors autograd really saves
(``torch.autograd.graph.saved_tensors_hooks``) for a small Qwen2 in every mode.

**The peak.** Per process, with ``S`` = weights + master copies + gradients + optimizer states + buffers:

* checkpointing off: ``S + T·(L·layer + final) + 12·T·V`` at the start of backward — every layer's activations
  are alive, and the loss's backward holds three fp32 T×V tensors: log_softmax's saved output, nll_loss's
  gradient and log_softmax's input gradient. (The forward's loss holds ≤10 B/element: bf16 logits, their fp32
  upcast, the log_softmax output; accelerate's fp32 output conversion replaces the upcast.)
* checkpointing on: the largest of ``S + T·(L·e·h + final) + 12·T·V`` (backward start, only the layers'
  inputs kept), ``S + T·(L·e·h + layer + workspace)`` (recomputing the last layer and running its backward)
  and the forward's end (≤10 B/element logits plus autocast's cached half-precision weight copies).
* an optimizer step: ``S`` plus the foreach AdamW temporaries (none for the fused one).

Gradients (without DeepSpeed): with gradient accumulation they live across micro-batches and count at every
moment; with ``gradient_accumulation_steps: 1`` the Trainer frees them after each optimizer step
(``zero_grad(set_to_none=True)``), so the start of backward and the end of forward have none yet, and the later
moments count them all (an upper bound for a layer's backward).

**Weights, gradients, optimizer states** (bytes per parameter): frozen weights ``e`` (4-bit bitsandbytes
NF4 with double quantization 0.5 + 1/64 + 4/16384, 8-bit 1 + 4/in), trainable ones 4 under autocast (LF's
upcast); gradients as their parameter; AdamW 2 states as the parameter. DeepSpeed (ZeRO paper's accounting,
Rajbhandari et al. 2020): module in ``e`` (stage 3: ``Φ·e/N`` plus a gathered working set of
``stage3_max_live_parameters`` = 1e9), fp32 master copy ``4·Φt/N``, Adam ``8·Φt/N`` (both on the CPU with
``offload: optimizer``), gradients ``e·Φt`` (stage 1) or ``e·Φt/N`` (2, 3) plus the fp32 partition ``4·Φt/N``;
buffers: stage 1/2 two ``reduce_bucket_size`` (5e8, templates/deepspeed.json.j2) buckets in ``e``
(``stage_1_and_2.py``, ``setup_buckets``, double-buffered with ``overlap_comm``), stage 3 one of h² ("auto").
DDP (world size > 1 without DeepSpeed) keeps its own gradient buckets, one more copy of the gradients.

**Margin**: :data:`WORKSPACE_BYTES` (cuBLAS/cuBLASLt workspaces, the batch, small tensors not modelled) plus
:data:`MARGIN_FRACTION` of the rest (temporaries around the modelled moments, the allocator's 512-byte
rounding), so the estimate errs a few percent high.

**Measured** (one NVIDIA H200, torch 2.11.0+cu130, ``rocmft train`` with packing, cutoff 2048, gradient
accumulation 1, 2026-11-30; ``bench/memfit.py`` for the 7B runs). LoRA SFT of a random Qwen2-7B-shaped model:
``max_memory_allocated`` 22.26 / 45.61 / 47.09 GiB for micro-batch 2 and 8 with checkpointing and 2 without;
the modelled sum before the margin is 22.19 / 45.54 / 47.03 GiB, the estimate 22.89 / 46.70 / 48.22 GiB
(+3%). Micro-batch 8 without checkpointing ran out of memory in the forward's ``log_softmax`` with 130.85 GiB
allocated; the model puts that moment at 130.9 GiB (weights and optimizer 14.5, activations 102.5, bf16 logits
4.6, their fp32 upcast 9.3) and the step's peak at 144.8 (estimate 147.9). On a Qwen2-0.5B-shaped model (tied
embeddings), measured / modelled GiB: full bf16 mb4 with and without checkpointing 20.48 / 20.41 and
32.66 / 32.57; freeze mb4 16.19 / 16.12; LoRA neat_packing mb2 13.89 / 13.81; LoRA fp32 (SDPA's math kernel)
mb2 with checkpointing 9.25 / 9.19, mb1 without 15.57 / 15.50.

**Liger kernels** (``enable_liger_kernel``, liger-kernel 0.8.5 as LLaMA-Factory 0.9.5 applies it:
``model/model_utils/liger_kernel.py`` calls ``apply_liger_kernel_to_<model>()`` with its defaults — RoPE,
RMSNorm, SwiGLU and, for ``stage`` sft/pt, the fused linear cross-entropy): ``LigerRMSNorm`` saves its input in
its own dtype and the fp32 rstd (``ops/rms_norm.py``: ``save_for_backward(X, W, RSTD)``) instead of an fp32 copy;
``LigerSiLUMulFunction`` saves gate and up outputs and recomputes SiLU in backward (``ops/swiglu.py``); the fused
linear cross-entropy (``ops/fused_linear_cross_entropy.py``) computes the loss and the input gradient chunk by
chunk during forward and keeps only that gradient (T×h in the input dtype), the fp32 per-token loss and one
chunk of logits (``chunk = next_pow2(ceil(T / ceil(V/h)))`` rows of V, with ``_CHUNK_MEM_CONST`` = 1): the
T×V logits peak is gone. Measured with ``bench/throughput.py`` (one H200 or H100, BENCHMARKS.md): four Liger runs
of the 7B and 8B shapes, rocmft's varlen rows (K/V kept at their own heads) and plain packing, with and without
peft's casts, QLoRA included, are estimated +3.0% to +3.6% above their peaks.

Not modelled: vision towers, mixture-of-experts, non-gated MLPs, Unsloth kernels, FSDP (use ZeRO-3's
numbers), GaLore/APOLLO/BAdam optimizers. DPO/KTO with full or freeze tuning count a frozen reference copy of
the weights; with LoRA, LF computes the reference with the adapter disabled (no copy).

**Where the parts live**: the model's shape read from config.json in :mod:`rocmft.render.memfit_shape`, the
training set-up from LF's arguments in :mod:`rocmft.render.memfit_spec`, one layer's saved tensors in
:mod:`rocmft.render.memfit_layer`; here the estimate, the evaluation step's and the fixes (every name is
importable from here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from rocmft.render.memfit_layer import _attention_kind, _layer_workspace, _Mode, _mode, layer_saved_tensors
from rocmft.render.memfit_shape import ModelShape, read_model_shape
from rocmft.render.memfit_spec import DTYPE_BYTES, TrainSpec, spec_from_arguments

GiB = 2**30

# cuBLAS and cuBLASLt workspaces (up to 32 MiB each per stream on Hopper/CDNA3), the batch tensors, RoPE
# tables and the small tensors the formula leaves out.
WORKSPACE_BYTES = 256 * 2**20
# Temporaries just before or after the modelled moments (e.g. the fp32 copy peft makes of each LoRA input, the
# attention backward's fp32 dq accumulator) and the allocator's rounding of every block to 512 bytes.
MARGIN_FRACTION = 0.02
# Share of the free memory left unplanned by fits(): the caching allocator reserves more than it hands out
# (fragmentation; an OOM happens when *reserved* memory hits the device's size), typically a few percent.
ALLOCATOR_HEADROOM = 0.05
# DeepSpeed buffers from templates/deepspeed.json.j2: stage 2 reduce_bucket_size, stage 3 max live parameters.
ZERO2_REDUCE_BUCKET = 500_000_000
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000

# ---------------------------------------------------------------------------------------------------------
# The estimate


@dataclass
class MemoryEstimate:
    """Estimated peak of ``torch.cuda.max_memory_allocated()`` for one process, by component (bytes).

    Attributes:
        weights: model parameters held on this GPU (quantized, compute dtype or fp32 as trained; ZeRO-3: the
            partition plus the gathered working set; a DPO reference model).
        master_params: fp32 master copies of trainable parameters kept apart from the model (DeepSpeed).
        gradients: gradients of trainable parameters (and DeepSpeed's fp32 gradient partition).
        optimizer_states: optimizer states (AdamW: exp_avg and exp_avg_sq).
        buffers: communication buckets (DeepSpeed reduce buckets, DDP gradient buckets).
        activations: tensors saved for backward at the peak moment, autocast's half-precision weight copies,
            the recomputed layer and its backward workspace (or the optimizer step's temporaries).
        logits: logits and loss tensors alive at the peak moment (T × V elements).
        margin: workspaces and temporaries not modelled (:data:`WORKSPACE_BYTES` + :data:`MARGIN_FRACTION`).
        phase: the moment of the peak.
        details: intermediate numbers (per-token bytes, parameter counts, every phase's total), for reports.
    """

    weights: int
    master_params: int
    gradients: int
    optimizer_states: int
    buffers: int
    activations: int
    logits: int
    margin: int
    phase: str
    details: dict[str, Any] = field(default_factory=dict)

    _COMPONENTS = ("weights", "master_params", "gradients", "optimizer_states", "buffers", "activations", "logits",
                   "margin")  # fmt: skip

    @property
    def total(self) -> int:
        """The estimated peak in bytes: the sum of every component."""
        return sum(getattr(self, name) for name in self._COMPONENTS)

    def breakdown(self) -> dict[str, float]:
        """Every component and the total in GiB (2**30 bytes), rounded to 0.01."""
        parts = {name: round(getattr(self, name) / GiB, 2) for name in self._COMPONENTS}
        parts["total"] = round(self.total / GiB, 2)
        return parts

    def fits(self, free_bytes: int) -> bool:
        """Whether the peak fits in ``free_bytes`` with :data:`ALLOCATOR_HEADROOM` left for fragmentation."""
        return self.total <= free_bytes * (1 - ALLOCATOR_HEADROOM)

    def summary(self) -> str:
        """One line: the total and its largest parts, in GiB."""
        named = {"weights": "weights", "master_params": "fp32 masters", "gradients": "grads",
                 "optimizer_states": "optimizer", "buffers": "buffers", "activations": "activations",
                 "logits": "logits/loss", "margin": "margin"}  # fmt: skip
        parts = ", ".join(
            f"{named[name]} {getattr(self, name) / GiB:.1f}"
            for name in self._COMPONENTS
            if getattr(self, name) >= GiB / 20
        )
        return f"peak ≈ {self.total / GiB:.1f} GiB per GPU at {self.phase} ({parts})"


def _quantized_bytes_per_weight(shape: ModelShape, spec: TrainSpec) -> float:
    if spec.quantization_bit == 4:  # NF4: 4 bits + absmax per 64 (uint8 + fp32 per 256 blocks when doubled)
        return 0.5 + (1 / 64 + 4 / (64 * 256) if spec.double_quantization else 4 / 64)
    if spec.quantization_bit == 8:  # int8 + one fp32 scale per output row
        return 1 + 4 / shape.hidden_size
    return float(DTYPE_BYTES[spec.compute_dtype])


def _lora_params(shape: ModelShape, spec: TrainSpec, mode: _Mode) -> int:
    per_layer = sum(spec.lora_rank * (n_in + n_out) for name, (n_in, n_out, _) in shape.linears().items()
                    if name in mode.lora_targets)  # fmt: skip
    return per_layer * shape.num_layers


def _optimizer_state_bytes(spec: TrainSpec, param_bytes: int) -> tuple[float, float]:
    """(bytes of state per trainable parameter, bytes of step temporaries per trainable parameter)."""
    name = spec.optimizer.lower()
    if "8bit" in name:
        return 2.0, 0.0
    if name.startswith(("sgd", "adafactor")):
        return 0.0, 0.0
    if name.startswith(("lion", "adagrad", "rmsprop")):
        return float(param_bytes), 0.0
    temporaries = 0.0 if "fused" in name or spec.zero_stage > 0 else float(param_bytes)  # foreach: sqrt(v)
    return 2.0 * param_bytes, temporaries


@dataclass(frozen=True)
class _Held:
    """What one process holds at every moment of a step (bytes), and the counts they follow from."""

    params: int  # all parameters of the model
    trainable: int  # trainable parameters
    weights: float
    master: float  # fp32 master copies (DeepSpeed)
    gradients: float  # all of them, once backward has made them
    early_gradients: float  # gradients alive before backward has made any
    optimizer_states: float
    buffers: float
    step_temporaries: float  # per trainable parameter, during the optimizer step

    @property
    def static(self) -> float:
        """Weights, masters, optimizer states and buffers: what every moment holds (gradients vary)."""
        return self.weights + self.master + self.optimizer_states + self.buffers


def _parameter_counts(shape: ModelShape, spec: TrainSpec, mode: _Mode) -> tuple[int, int, int]:
    """(all parameters, trainable ones, frozen ones): LoRA adds its adapters to a frozen model, freeze trains
    the last layers, full trains everything."""
    base = shape.num_params
    if spec.method == "lora":
        trainable, frozen = _lora_params(shape, spec, mode), base
    elif spec.method == "freeze":
        trainable = mode.trainable_layers * shape.layer_params
        frozen = base - trainable
    else:
        trainable, frozen = base, 0
    return base, trainable, frozen


def _held_memory(shape: ModelShape, spec: TrainSpec, mode: _Mode) -> _Held:
    """Weights, fp32 masters, gradients, optimizer states and buffers of one process (the module docstring's
    "Weights, gradients, optimizer states": LF's fp32 upcast under autocast, DDP's buckets, ZeRO's partitions)."""
    e, n, stage, h = mode.e, spec.world_size, spec.zero_stage, shape.hidden_size
    base, trainable, frozen = _parameter_counts(shape, spec, mode)
    quantized_weights = shape.num_layers * shape.layer_linear_weights if spec.quantization_bit else 0
    frozen_bytes = (frozen - quantized_weights) * e + quantized_weights * _quantized_bytes_per_weight(shape, spec)
    offload_optimizer = spec.offload in ("optimizer", "optimizer+params") and stage > 0
    offload_params = spec.offload == "optimizer+params" and stage == 3

    if stage == 0:
        param_bytes = mode.trainable_bytes
        weights = frozen_bytes + trainable * param_bytes
        master = 0.0
        gradients = trainable * param_bytes
        buffers = trainable * param_bytes if n > 1 else 0.0  # DDP's own gradient buckets
    else:
        param_bytes = e  # the engine casts the module to bf16/fp16; fp32 masters live in the optimizer
        model_bytes = frozen_bytes + trainable * e
        if stage == 3:
            gathered = min(base, ZERO3_MAX_LIVE_PARAMETERS) * e + 0.9 * h * h * e  # live params + prefetch
            weights = gathered + (0 if offload_params else model_bytes / n)
            buffers = h * h * e  # reduce bucket ("auto" = h²)
        else:  # stage 1/2: two reduce buckets of reduce_bucket_size elements (setup_buckets, overlap_comm)
            weights = model_bytes
            buffers = 2 * ZERO2_REDUCE_BUCKET * e
        master = 0.0 if (offload_optimizer or e == 4) else 4 * trainable / n
        fp32_grads = 0.0 if (offload_optimizer or e == 4) else 4 * trainable / n
        gradients = (trainable * e if stage == 1 else trainable * e / n) + fp32_grads
    if spec.reference_model:
        weights += base * e
    state_per_param, step_temporaries = _optimizer_state_bytes(spec, 4 if (stage > 0 and e == 2) else param_bytes)
    optimizer_states = 0.0 if offload_optimizer else trainable * state_per_param / (n if stage > 0 else 1)
    # gradients alive before backward has made any: with accumulation (or DeepSpeed's flat buffers), all of them
    early_gradients = gradients if (stage > 0 or spec.gradient_accumulation_steps > 1) else 0.0
    return _Held(params=base, trainable=trainable, weights=weights, master=master, gradients=gradients,
                 early_gradients=early_gradients, optimizer_states=optimizer_states, buffers=buffers,
                 step_temporaries=step_temporaries)  # fmt: skip


@dataclass(frozen=True)
class _Activations:
    """The activation and logits sizes the candidate moments combine: bytes per token unless named otherwise."""

    layer: float  # one trainable layer's saved tensors
    first_layer: float  # the first trainable layer's (its input may need no gradient)
    final: float  # kept after the last layer (final norm, lm_head's input, RoPE tables, labels, a 4-D mask)
    workspace: float  # alive only while one layer runs its backward
    logits_backward: float  # at the start of backward
    logits_forward: float  # at the end of forward
    logits_fixed: float  # bytes, whatever the tokens: Liger's chunk of logits, lm_head's gradient
    amp_copies: float  # bytes: autocast's half-precision copies of fp32 trainable weights
    lm_head_copy: float  # bytes: autocast's copy of a trainable lm_head


def _final_bytes(shape: ModelShape, spec: TrainSpec, mode: _Mode) -> float:
    """Bytes per token kept after the last layer: the final RMSNorm (fp32 copy of its input, rsqrt), lm_head's
    input and the normalized tensor when they train, RoPE's cos/sin, the labels, and neat packing's 4-D mask."""
    h, e = shape.hidden_size, mode.e
    final = 4 * h + 4  # final RMSNorm: fp32 copy of its input, rsqrt
    if spec.method == "full":  # lm_head trains
        final += mode.residual_bytes * h  # normalized input (norm weight trains)
        final += 2 * h if (mode.amp and mode.trainable_bytes == 4) else mode.trainable_bytes * h  # lm_head input
    final += 2 * e * shape.head_dim + 8  # RoPE cos/sin, int64 labels kept by nll_loss
    if spec.neat_packing and spec.attention not in ("fa2", "varlen"):
        final += 2 * e * spec.seq_len  # LF's 4-D block-diagonal mask (T×T per row) and SDPA's aligned copy
    return final


def _logits_bytes(shape: ModelShape, spec: TrainSpec, mode: _Mode) -> tuple[float, float, float]:
    """(bytes per token at the start of backward, at the end of forward, bytes whatever the tokens) of the logits
    and the loss: three fp32 T×V tensors in backward; or, with Liger's fused cross-entropy, the input gradient,
    the loss per token and one chunk of logits (module docstring, "Liger kernels")."""
    e, h, v = mode.e, shape.hidden_size, shape.vocab_size
    logits_backward = 12 * v  # log_softmax output + nll_loss grad + log_softmax input grad, all fp32
    logits_forward = ((e + 4 + 4) if e != 4 else 8) * v  # logits, their fp32 upcast, log_softmax output
    logits_fixed = 0.0  # bytes independent of the tokens (Liger's chunk of logits, lm_head's gradient)
    if spec.fused_cross_entropy:
        # kept: the input gradient (T×h, input dtype), the fp32 loss per token, the label mask
        e_in = 2 if mode.amp else e
        logits_backward = logits_forward = e_in * h + 4 + 1
        tokens = spec.tokens
        chunk = 2 ** math.ceil(math.log2(max(1, math.ceil(tokens / math.ceil(v / h)))))
        logits_fixed = 2.0 * min(chunk, tokens) * v * e_in  # the chunk's logits and their gradient (bound)
        if spec.method == "full":  # lm_head trains
            logits_fixed += v * h * mode.trainable_bytes  # lm_head's gradient, made during forward
    return logits_backward, logits_forward, logits_fixed


def _activation_sizes(shape: ModelShape, spec: TrainSpec, mode: _Mode, trainable: int) -> _Activations:
    """What the layers, the final norm, the loss and autocast's weight copies keep (see :class:`_Activations`)."""
    h, v = shape.hidden_size, shape.vocab_size
    lm_head_trains = spec.method == "full"
    logits_backward, logits_forward, logits_fixed = _logits_bytes(shape, spec, mode)
    # autocast's bf16 copies of fp32 trainable weights (cached during forward, saved by their Linears)
    amp_copies = 0.0
    if mode.amp:
        amp_copies = 2 * (trainable if spec.method == "lora" else mode.trainable_layers * shape.layer_linear_weights)
    return _Activations(
        layer=sum(b for _, b in layer_saved_tensors(shape, spec)),
        first_layer=sum(b for _, b in layer_saved_tensors(shape, spec, input_needs_grad=spec.method == "full")),
        final=_final_bytes(shape, spec, mode),
        workspace=_layer_workspace(shape, spec),
        logits_backward=logits_backward,
        logits_forward=logits_forward,
        logits_fixed=logits_fixed,
        amp_copies=amp_copies,
        lm_head_copy=2 * v * h if (mode.amp and lm_head_trains) else 0.0,
    )


def _candidate_moments(
    shape: ModelShape, spec: TrainSpec, mode: _Mode, held: _Held, act: _Activations
) -> dict[str, tuple[float, float, float]]:
    """Every moment that can be the peak, by name -> (gradients, activations, logits) bytes alive then (module
    docstring, "The peak"): with checkpointing the start of backward, the end of forward and the last layer's
    recomputation; without it the start of backward (and the end of forward under Liger) and the last layer's
    backward; and the optimizer step."""
    tokens, layers = spec.tokens, mode.trainable_layers
    early_gradients = held.early_gradients
    phases: dict[str, tuple[float, float, float]] = {}  # name -> (gradients, activations, logits)
    if spec.gradient_checkpointing:
        checkpoints = layers * mode.residual_bytes * shape.hidden_size
        phases["the start of backward (loss gradient)"] = (
            early_gradients,
            tokens * (checkpoints + act.final) + act.lm_head_copy,
            tokens * act.logits_backward,
        )
        phases["the end of forward (loss)"] = (
            early_gradients,
            tokens * (checkpoints + act.final) + act.amp_copies + act.lm_head_copy,
            tokens * act.logits_forward + act.logits_fixed,
        )
        layer_copies = act.amp_copies / max(layers, 1)
        phases["the last layer's recomputation and backward"] = (
            held.gradients,
            tokens * (checkpoints + act.layer + act.workspace) + layer_copies,
            0.0,
        )
    else:
        saved = tokens * (act.first_layer + (layers - 1) * act.layer + act.final) + act.amp_copies + act.lm_head_copy
        phases["the start of backward (loss gradient)"] = (early_gradients, saved, tokens * act.logits_backward)
        if act.logits_fixed:
            phases["the end of forward (loss)"] = (
                early_gradients, saved, tokens * act.logits_forward + act.logits_fixed)  # fmt: skip
        phases["the last layer's backward"] = (held.gradients, saved - tokens * act.final + tokens * act.workspace, 0.0)
    phases["the optimizer step"] = (held.gradients, held.trainable * held.step_temporaries, 0.0)
    return phases


def estimate(shape: ModelShape, spec: TrainSpec) -> MemoryEstimate:
    """Estimate the peak GPU memory of one training process (see the module docstring for the formula).

    Returns:
        A :class:`MemoryEstimate` in bytes, per component, with the moment of the peak.
    """
    mode = _mode(shape, spec)
    held = _held_memory(shape, spec, mode)
    act = _activation_sizes(shape, spec, mode, held.trainable)
    phases = _candidate_moments(shape, spec, mode, held, act)
    phase = max(phases, key=lambda name: sum(phases[name]))
    gradients, activations, logits = phases[phase]  # fmt: skip

    static = held.static  # gradients are added per moment
    modelled = static + gradients + activations + logits
    margin = WORKSPACE_BYTES + MARGIN_FRACTION * modelled
    details = {
        "tokens_per_micro_batch": spec.tokens,
        "params": held.params,
        "trainable_params": held.trainable,
        "layer_bytes_per_token": act.layer,
        "logits_bytes_per_token_backward": act.logits_backward,
        "attention": _attention_kind(shape, spec, mode),
        "autocast": mode.amp,
        "phases_gib": {name: round((static + sum(parts)) / GiB, 2) for name, parts in phases.items()},
    }
    return MemoryEstimate(
        weights=round(held.weights), master_params=round(held.master), gradients=round(gradients),
        optimizer_states=round(held.optimizer_states), buffers=round(held.buffers), activations=round(activations),
        logits=round(logits), margin=round(margin), phase=phase, details=details,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# What to change when it does not fit


def eval_estimate(shape: ModelShape, spec: TrainSpec, eval_batch: int, generate_tokens: int = 0) -> int:
    """Peak bytes of one evaluation step between training steps, for ``eval_batch`` sequences of the training's
    sequence length (plus ``generate_tokens`` new tokens each with ``predict_with_generate``).

    Evaluation keeps what training holds between steps (weights, fp32 masters, optimizer states, buffers;
    gradients are freed: transformers zeroes them with ``set_to_none``) and adds, without autograd, the full logits:
    Liger's fused cross-entropy is for training only (liger-kernel 0.8.5 ``lce_forward``: ``skip_logits =
    self.training and labels is not None``), so transformers' loss makes the logits, their fp32 upcast and
    log_softmax's fp32 output (e + 4 + 4 bytes per element of T × V) — a training run that fits can run out of
    memory at its first evaluation (hiyouga/LlamaFactory#7781, #6676). Generation adds its KV cache
    (2 × layers × kv_dim per token). One layer's transient activations (~4·h + 2·i per token) and the margin
    (:data:`WORKSPACE_BYTES` + :data:`MARGIN_FRACTION`) complete it.
    """
    train = estimate(shape, spec)
    e = DTYPE_BYTES[spec.compute_dtype]
    static = train.weights + train.master_params + train.optimizer_states + train.buffers
    tokens = eval_batch * (spec.seq_len + generate_tokens)
    logits = eval_batch * spec.seq_len * shape.vocab_size * ((e + 4 + 4) if e != 4 else 8)
    if generate_tokens:  # generation scores one new token at a time: the prompt's logits are the peak
        logits = max(logits, eval_batch * shape.vocab_size * 8)
    transient = tokens * e * (4 * shape.hidden_size + 2 * shape.intermediate_size)
    kv_cache = 2 * shape.num_layers * shape.kv_dim * e * tokens if generate_tokens else 0
    modelled = static + logits + transient + kv_cache
    return round(modelled + WORKSPACE_BYTES + MARGIN_FRACTION * modelled)


def _gib(value: float) -> str:
    return f"{value / GiB:.1f} GiB"


def fixes(shape: ModelShape, spec: TrainSpec, free_bytes: int, limit: int = 3) -> list[str]:
    """Up to ``limit`` concrete changes that make the run fit in ``free_bytes``, most preferred first.

    Each is phrased with the environment variables users set and verified by re-running :func:`estimate`
    (:meth:`MemoryEstimate.fits`). Preference: turn checkpointing on (same results, ~30% slower); a smaller
    micro-batch with more accumulation (same effective batch); DeepSpeed ZeRO-3 / CPU offload (multi-GPU or
    slower steps); QLoRA or LoRA instead of the current method (different training); a shorter CUTOFF_LEN
    (truncates data). An empty list means none of these fits.
    """
    candidates: list[tuple[str, TrainSpec]] = []
    base_batch = spec.micro_batch * spec.gradient_accumulation_steps

    def smaller_batches(start: TrainSpec, prefix: str) -> None:
        """The largest divisor of the micro-batch that fits, with accumulation making up the difference."""
        for mb in [d for d in range(start.micro_batch - 1, 0, -1) if start.micro_batch % d == 0]:
            trial = replace(start, micro_batch=mb, gradient_accumulation_steps=base_batch // mb)
            if estimate(shape, trial).fits(free_bytes):
                candidates.append((
                    f"{prefix}PER_DEVICE_TRAIN_BATCH_SIZE={mb} with GRADIENT_ACCUMULATION_STEPS={base_batch // mb} "
                    f"(same effective batch of {base_batch} per GPU; peak ≈ {_gib(estimate(shape, trial).total)})",
                    trial,
                ))  # fmt: skip
                return

    if not spec.gradient_checkpointing:
        trial = replace(spec, gradient_checkpointing=True)
        candidates.append((
            "DISABLE_GRADIENT_CHECKPOINTING=false (checkpointing on: activations recomputed in backward, "
            f"~30% slower; peak ≈ {_gib(estimate(shape, trial).total)})", trial))  # fmt: skip
        if not estimate(shape, trial).fits(free_bytes):
            smaller_batches(trial, "DISABLE_GRADIENT_CHECKPOINTING=false and ")
    smaller_batches(spec, "")
    if spec.world_size > 1 and spec.zero_stage < 3:
        trial = replace(spec, zero_stage=3, offload="none")
        candidates.append((f"ROCMFT_DISTRIBUTED=deepspeed ROCMFT_ZERO_STAGE=3 (shards weights, gradients and "
                           f"optimizer states over {spec.world_size} GPUs; peak ≈ "
                           f"{_gib(estimate(shape, trial).total)})", trial))  # fmt: skip
    if spec.offload == "none" and spec.method != "lora":
        stage = max(spec.zero_stage, 2)
        trial = replace(spec, zero_stage=stage, offload="optimizer")
        candidates.append((f"ROCMFT_DISTRIBUTED=deepspeed ROCMFT_ZERO_STAGE={stage} ROCMFT_OFFLOAD=optimizer "
                           f"(optimizer states and fp32 masters in CPU memory; peak ≈ "
                           f"{_gib(estimate(shape, trial).total)})", trial))  # fmt: skip
    if spec.method == "lora" and spec.quantization_bit is None:
        trial = replace(spec, quantization_bit=4)
        candidates.append((f"QUANTIZATION_BIT=4 (QLoRA: frozen weights in 4-bit NF4, needs bitsandbytes; peak ≈ "
                           f"{_gib(estimate(shape, trial).total)})", trial))  # fmt: skip
    if spec.method != "lora":
        trial = replace(spec, method="lora", quantization_bit=None)
        candidates.append((f"FINETUNING_TYPE=lora (train adapters, not all weights; peak ≈ "
                           f"{_gib(estimate(shape, trial).total)})", trial))  # fmt: skip
    cutoff = spec.seq_len // 2
    while cutoff >= 256:
        trial = replace(spec, seq_len=cutoff)
        if estimate(shape, trial).fits(free_bytes):
            candidates.append((f"CUTOFF_LEN={cutoff} (longer samples are truncated; peak ≈ "
                               f"{_gib(estimate(shape, trial).total)})", trial))  # fmt: skip
            break
        cutoff //= 2

    chosen: list[str] = []
    for text, trial in candidates:
        if text not in chosen and estimate(shape, trial).fits(free_bytes):
            chosen.append(text)
        if len(chosen) == limit:
            break
    return chosen


__all__ = [
    "ALLOCATOR_HEADROOM",
    "MARGIN_FRACTION",
    "WORKSPACE_BYTES",
    "MemoryEstimate",
    "ModelShape",
    "TrainSpec",
    "estimate",
    "eval_estimate",
    "fixes",
    "layer_saved_tensors",
    "read_model_shape",
    "spec_from_arguments",
]
