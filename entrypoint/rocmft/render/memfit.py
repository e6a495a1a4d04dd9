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
  ``disable_gradient_checkpointing`` (default False); ``use_reentrant_gc`` defaults to True, and
  ``get_custom_gradient_checkpointing_func`` checkpoints only layers with trainable parameters and makes their
  hidden-state input require grad. ``torch.utils.checkpoint`` (reentrant) saves only the layer's positional
  tensor input (``transformers/modeling_layers.py``, ``GradientCheckpointingLayer`` passes hidden states
  positionally, the rest in a ``partial``); the layer is recomputed with grad in backward.
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
T×V logits peak is gone. Not measured on a GPU yet (the throughput benchmark, ``bench/throughput.py``, does).

Not modelled: vision towers, mixture-of-experts, non-gated MLPs, Unsloth kernels, FSDP (use ZeRO-3's
numbers), GaLore/APOLLO/BAdam optimizers. DPO/KTO with full or freeze tuning count a frozen reference copy of
the weights; with LoRA, LF computes the reference with the adapter disabled (no copy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rocmft.config.stages import TWO_SEQUENCE_STAGES
from rocmft.errors import ConfigError
from rocmft.facts.modeldir import ModelDir
from rocmft.values import truthy

GiB = 2**30
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

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
# The model's shape


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer with a gated MLP (Llama, Qwen2/3, Mistral, ...).

    Attributes:
        hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim, vocab_size: as in the
            model's config.json (``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``).
        tie_word_embeddings: lm_head shares the embedding matrix (no separate parameters).
        dtype: the checkpoint's dtype name (``torch_dtype``/``dtype``); informational, training loads weights in
            the compute dtype.
        qkv_bias, o_bias, mlp_bias: which Linears have a bias (Qwen2 always has q/k/v biases:
            ``transformers/models/qwen2/modeling_qwen2.py``, ``Qwen2Attention``; Llama-style models follow
            ``attention_bias``/``mlp_bias``).
        qk_norm: per-head RMSNorm on q and k (Qwen3).
        model_type: config.json's ``model_type``.
        source: the config.json read, for messages.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    model_type: str = ""
    source: str | None = None

    @property
    def q_dim(self) -> int:
        """Width of the query projection, ``num_heads × head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections, ``num_kv_heads × head_dim``."""
        return self.num_kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int, bool]]:
        """The Linears of one layer: name -> (in_features, out_features, has bias)."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim, self.qkv_bias),
            "k_proj": (h, self.kv_dim, self.qkv_bias),
            "v_proj": (h, self.kv_dim, self.qkv_bias),
            "o_proj": (self.q_dim, h, self.o_bias),
            "gate_proj": (h, i, self.mlp_bias),
            "up_proj": (h, i, self.mlp_bias),
            "down_proj": (i, h, self.mlp_bias),
        }

    @property
    def layer_linear_weights(self) -> int:
        """Weight elements of one layer's Linears (no biases): what quantization and autocast copies act on."""
        return sum(n_in * n_out for n_in, n_out, _ in self.linears().values())

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: Linears with biases, two RMSNorms, optional q/k norms."""
        biases = sum(n_out for _, n_out, bias in self.linears().values() if bias)
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return self.layer_linear_weights + biases + norms

    @property
    def embedding_params(self) -> int:
        """The input embedding matrix, ``vocab_size × hidden_size``."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The output projection's parameters (0 when tied to the embeddings)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: embeddings, layers, the final RMSNorm, lm_head unless tied."""
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + self.lm_head_params


_REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_QKV_BIAS_TYPES = ("qwen2", "qwen2_vl", "qwen2_5_vl")  # q/k/v biases hard-coded in their attention classes
_QK_NORM_TYPES = ("qwen3", "qwen3_vl", "olmo2", "gemma3", "gemma3_text")


def read_model_shape(model_dir: Path | str | ModelDir) -> ModelShape:
    """Read a model's shape from ``<model_dir>/config.json`` alone (no weights, no transformers import; a
    :class:`~rocmft.facts.modeldir.ModelDir` is read through its cache).

    Composite configs whose language model sits under ``text_config`` are read from there.

    Raises:
        ConfigError: config.json is missing, not JSON, or lacks one of hidden_size, intermediate_size,
            num_hidden_layers, num_attention_heads, vocab_size (the message names the file and the keys).
    """
    model = model_dir if isinstance(model_dir, ModelDir) else ModelDir(Path(model_dir))
    path = model.config_path
    remedy = "Point MODEL_NAME_OR_PATH at a Hugging Face model folder with a complete config.json."
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; the memory estimate reads the model's shape from it.", remedy)
    try:
        config = model.config_json()
    except (OSError, ValueError) as err:  # not JSON, not UTF-8, or JSON that is not an object
        raise ConfigError(f"{path} cannot be read as JSON: {err}", remedy) from err
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object of model settings.", remedy)
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    missing = [
        key
        for key in _REQUIRED_KEYS
        if not isinstance(config.get(key), int) or isinstance(config[key], bool) or config[key] <= 0
    ]
    odd = [key for key in ("num_key_value_heads", "head_dim") if config.get(key) is not None
           and (not isinstance(config[key], int) or isinstance(config[key], bool) or config[key] <= 0)]  # fmt: skip
    if missing or odd:
        raise ConfigError(f"{path} lacks positive integer values for: {', '.join(missing + odd)}.", remedy)
    heads = config["num_attention_heads"]
    model_type = str(config.get("model_type") or "")
    qkv_bias = model_type in _QKV_BIAS_TYPES or bool(config.get("attention_bias", False))
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16").replace("torch.", "")
    return ModelShape(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        vocab_size=config["vocab_size"],
        # transformers' own default is True, but the decoder families this targets default to False; a missing
        # key is rare (save_pretrained writes it), and False counts lm_head separately (the larger estimate).
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        dtype=dtype,
        qkv_bias=qkv_bias,
        o_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type in _QK_NORM_TYPES,
        model_type=model_type,
        source=str(path),
    )


# ---------------------------------------------------------------------------------------------------------
# The training set-up


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

    kind = _attention_kind(shape, spec, mode)
    q, kv = shape.q_dim, shape.kv_dim
    if shape.qk_norm:
        items.append(("q/k RMSNorm fp32 copies", 4 * (q + kv)))
    kv_kept = q if kind in ("masked", "math") else kv  # repeat_kv expands K/V to every head
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
    consumers("attention output", q, e_out, ("o_proj",), shared_saved=True)

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
    d up at once) and, for LoRA under autocast, the fp32 gradient of down_proj's input copy."""
    mode = _mode(shape, spec)
    e_out = 2 if mode.amp else mode.e
    extra = 4 * shape.intermediate_size if (mode.amp and "down_proj" in mode.lora_targets) else 0
    return 3 * e_out * shape.intermediate_size + extra


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


def estimate(shape: ModelShape, spec: TrainSpec) -> MemoryEstimate:
    """Estimate the peak GPU memory of one training process (see the module docstring for the formula).

    Returns:
        A :class:`MemoryEstimate` in bytes, per component, with the moment of the peak.
    """
    mode = _mode(shape, spec)
    e, n = mode.e, spec.world_size
    stage = spec.zero_stage
    h, v = shape.hidden_size, shape.vocab_size
    tokens = spec.tokens

    # -- parameters --------------------------------------------------------------------------------------
    base = shape.num_params
    if spec.method == "lora":
        trainable, frozen = _lora_params(shape, spec, mode), base
    elif spec.method == "freeze":
        trainable = mode.trainable_layers * shape.layer_params
        frozen = base - trainable
    else:
        trainable, frozen = base, 0
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
    static = weights + master + optimizer_states + buffers  # gradients are added per moment, below
    # gradients alive before backward has made any: with accumulation (or DeepSpeed's flat buffers), all of them
    early_gradients = gradients if (stage > 0 or spec.gradient_accumulation_steps > 1) else 0.0

    # -- activations at each candidate moment -----------------------------------------------------------
    per_layer = sum(b for _, b in layer_saved_tensors(shape, spec))
    first_layer = sum(b for _, b in layer_saved_tensors(shape, spec, input_needs_grad=spec.method == "full"))
    final = 4 * h + 4  # final RMSNorm: fp32 copy of its input, rsqrt
    lm_head_trains = spec.method == "full"
    if lm_head_trains:
        final += mode.residual_bytes * h  # normalized input (norm weight trains)
        final += 2 * h if (mode.amp and mode.trainable_bytes == 4) else mode.trainable_bytes * h  # lm_head input
    final += 2 * e * shape.head_dim + 8  # RoPE cos/sin, int64 labels kept by nll_loss
    if spec.neat_packing and spec.attention not in ("fa2", "varlen"):
        final += 2 * e * spec.seq_len  # LF's 4-D block-diagonal mask (T×T per row) and SDPA's aligned copy
    logits_backward = 12 * v  # log_softmax output + nll_loss grad + log_softmax input grad, all fp32
    logits_forward = ((e + 4 + 4) if e != 4 else 8) * v  # logits, their fp32 upcast, log_softmax output
    logits_fixed = 0.0  # bytes independent of the tokens (Liger's chunk of logits, lm_head's gradient)
    if spec.fused_cross_entropy:
        # kept: the input gradient (T×h, input dtype), the fp32 loss per token, the label mask
        e_in = 2 if mode.amp else e
        logits_backward = logits_forward = e_in * h + 4 + 1
        chunk = 2 ** math.ceil(math.log2(max(1, math.ceil(tokens / math.ceil(v / h)))))
        logits_fixed = 2.0 * min(chunk, tokens) * v * e_in  # the chunk's logits and their gradient (bound)
        if lm_head_trains:
            logits_fixed += v * h * mode.trainable_bytes  # lm_head's gradient, made during forward
    # autocast's bf16 copies of fp32 trainable weights (cached during forward, saved by their Linears)
    amp_copies = 0.0
    if mode.amp:
        amp_copies = 2 * (trainable if spec.method == "lora" else mode.trainable_layers * shape.layer_linear_weights)
    lm_head_copy = 2 * v * h if (mode.amp and lm_head_trains) else 0.0
    workspace = _layer_workspace(shape, spec)
    layers = mode.trainable_layers

    phases: dict[str, tuple[float, float, float]] = {}  # name -> (gradients, activations, logits)
    if spec.gradient_checkpointing:
        checkpoints = layers * mode.residual_bytes * h
        phases["the start of backward (loss gradient)"] = (
            early_gradients,
            tokens * (checkpoints + final) + lm_head_copy,
            tokens * logits_backward,
        )
        phases["the end of forward (loss)"] = (
            early_gradients,
            tokens * (checkpoints + final) + amp_copies + lm_head_copy,
            tokens * logits_forward + logits_fixed,
        )
        layer_copies = amp_copies / max(layers, 1)
        phases["the last layer's recomputation and backward"] = (
            gradients,
            tokens * (checkpoints + per_layer + workspace) + layer_copies,
            0.0,
        )
    else:
        saved = tokens * (first_layer + (layers - 1) * per_layer + final) + amp_copies + lm_head_copy
        phases["the start of backward (loss gradient)"] = (early_gradients, saved, tokens * logits_backward)
        if logits_fixed:
            phases["the end of forward (loss)"] = (early_gradients, saved, tokens * logits_forward + logits_fixed)
        phases["the last layer's backward"] = (gradients, saved - tokens * final + tokens * workspace, 0.0)
    phases["the optimizer step"] = (gradients, trainable * step_temporaries, 0.0)
    phase = max(phases, key=lambda name: sum(phases[name]))
    gradients, activations, logits = phases[phase]  # fmt: skip

    modelled = static + gradients + activations + logits
    margin = WORKSPACE_BYTES + MARGIN_FRACTION * modelled
    details = {
        "tokens_per_micro_batch": tokens,
        "params": base,
        "trainable_params": trainable,
        "layer_bytes_per_token": per_layer,
        "logits_bytes_per_token_backward": logits_backward,
        "attention": _attention_kind(shape, spec, mode),
        "autocast": mode.amp,
        "phases_gib": {name: round((static + sum(parts)) / GiB, 2) for name, parts in phases.items()},
    }
    return MemoryEstimate(
        weights=round(weights), master_params=round(master), gradients=round(gradients),
        optimizer_states=round(optimizer_states), buffers=round(buffers), activations=round(activations),
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
