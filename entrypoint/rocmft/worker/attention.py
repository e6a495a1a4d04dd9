"""Neat-packed rows without a dense mask: variable-length attention over the samples of a packed micro-batch.

LLaMA-Factory 0.9.5's neat packing gives each token the index of its sample (a 2-D ``attention_mask`` such as
``1 1 2 2 2 0``, 0 for padding; ``data/processor/supervised.py``) and, under SDPA or eager attention, turns it
into a dense (B, 1, T, T) block-diagonal mask (``data/collator.py``, ``prepare_4d_attention_mask``). With a dense
mask SDPA cannot use its flash kernel and computes every block of the row: ~9% of a 7B LoRA step on an H200
(12,514 against 13,710 tokens/s without the mask, BENCHMARKS.md). Under FlashAttention-2 LLaMA-Factory drops the
mask instead, but only for one row per micro-batch (the collator asserts ``bsz == 1``).

Where the planner chose it (run.json ``packed_attention: varlen``) and the kernel measured faster
(:func:`choose`), the worker:

* keeps the collator's 2-D index mask for batches of packed rows (:func:`is_packed_batch`; no 4-D mask is built)
  and adds ``cu_seq_lens_q``/``cu_seq_lens_k`` (the samples' boundaries in the B·T tokens read row after row,
  int32, shape (S+1,)) and ``max_length_q``/``max_length_k`` (:func:`pack_kwargs`): the keyword arguments of
  transformers' own padding-free path, which its models pass down to the attention function. Positions restart
  at 0 in each sample; the mask becomes 1 for a token and 0 for padding, which transformers' non-padding token
  count reads. Rows stay rows, so labels, the loss and per-row metrics are LLaMA-Factory's. Computed on the CPU
  in the data loader: no GPU synchronisation per step.
* registers the attention function :data:`NAME` and its mask function through transformers'
  ``AttentionInterface`` / ``AttentionMaskInterface`` and sets it on the model after LLaMA-Factory loads it
  (``set_attn_implementation``). On a packed batch no mask is built and the attention runs over the B·T tokens as
  one sequence of segments: on a GPU PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2
  kernels shipped in torch), on the CPU one SDPA call per segment. Any other call (evaluation batches that are not
  packed, generation with a KV cache) is transformers' own SDPA, with its own mask.

Each token attends to exactly the tokens of its own sample, as under the block-diagonal mask:
tests/test_packed_attention.py compares the packed rows' logits with each sample's unpacked logits.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import json
import time
from pathlib import Path
from typing import Any

NAME = "rocmft_varlen"
# transformers' padding-free keyword arguments (modeling_flash_attention_utils.FlashAttentionKwargs)
KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def segments(index_mask) -> tuple[Any, int]:
    """The samples of a neat-packed micro-batch, in its B·T tokens read row after row.

    Args:
        index_mask: LLaMA-Factory's 2-D packed mask, shape (B, T): the sample's index (1, 2, ...) per token, 0 for
            padding. A run of equal values is one sample; a row's padding is one more segment (its labels are
            ignored; no real token attends to it).

    Returns:
        ``(cu_seqlens, max_len)``: int32 tensor of shape (S+1,) with the segments' start offsets in the B·T
        flattened tokens and B·T last; the longest segment's length in tokens. A row boundary always starts a
        segment.
    """
    import torch

    rows, length = index_mask.shape
    flat = index_mask.reshape(-1)
    start = torch.ones(rows * length, dtype=torch.bool)
    start[1:] = flat[1:] != flat[:-1]
    start[::length] = True
    starts = start.nonzero().flatten()
    cu = torch.cat([starts, torch.tensor([rows * length])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def is_packed_batch(features: dict[str, Any]) -> bool:
    """Whether ``features`` is a batch of neat-packed rows this module handles: a 2-D ``attention_mask`` of sample
    indices whose every row starts with a token (LLaMA-Factory pads packed rows on the right), and 2-D position
    ids if any (3-D mrope ids of vision-language models are left to LLaMA-Factory). A left-padded batch
    (generation prompts) is not one."""
    import torch

    mask = features.get("attention_mask")
    if not torch.is_tensor(mask) or mask.dim() != 2 or mask.numel() == 0 or not bool((mask[:, 0] != 0).all()):
        return False
    position_ids = features.get("position_ids")
    return not (torch.is_tensor(position_ids) and position_ids.dim() != 2)


def pack_kwargs(features: dict[str, Any]) -> dict[str, Any]:
    """A neat-packed batch with the padding-free keyword arguments (module docstring); shapes are kept.

    Args:
        features: the collator's batch: ``input_ids``/``labels`` (B, T), ``attention_mask`` (B, T) sample indices.

    Returns:
        The same dict with ``position_ids`` (B, T) restarting at 0 in each segment, ``attention_mask`` (B, T)
        1 for a token and 0 for padding, and :data:`KWARGS`: the segments' offsets in the B·T tokens read row after
        row (int32, (S+1,)) and the longest segment. Rows stay rows, so labels, their shift, the loss's token
        count and per-row metrics are exactly LLaMA-Factory's.
    """
    import torch

    mask = features["attention_mask"]
    cu, longest = segments(mask)
    total = mask.numel()
    lengths = (cu[1:] - cu[:-1]).to(torch.int64)
    starts = torch.repeat_interleave(cu[:-1].to(torch.int64), lengths)
    features["position_ids"] = (torch.arange(total) - starts).reshape(mask.shape)
    features["attention_mask"] = (mask != 0).to(torch.int64)
    features.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    return features


@functools.cache  # looked up once per process, not in every layer of every forward
def _varlen_kernel():
    """``(function, gqa_keyword, causal_keywords)`` for torch's varlen_attn, or None when torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    # torch 2.13: causal is window_size=(-1, 0); earlier releases took is_causal
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return varlen_attn, "enable_gqa" in params, causal


def varlen(query, key, value, cu, max_len: int, scale: float | None):
    """Causal attention within each segment of a packed micro-batch's tokens, read row after row.

    Args:
        query: (T, Hq, D); key, value: (T, Hkv, D) with Hq a multiple of Hkv (GQA).
        cu: int32 (S+1,) segment offsets on the same device; max_len: the longest segment.
        scale: softmax scale (None: 1/sqrt(D)).

    Returns:
        (T, Hq, D). On a GPU torch's varlen_attn (fp16/bf16; fp32 inputs under autocast are cast to its dtype, as
        SDPA would run them); on the CPU, in real fp32 and where torch has no varlen_attn, one SDPA call per
        segment — the reference the GPU kernel is tested against.
    """
    import torch

    kernel = _varlen_kernel() if query.is_cuda else None
    if kernel is not None and query.dtype not in (torch.float16, torch.bfloat16):
        # torch's varlen kernel is FlashAttention's: fp16/bf16 only ("FlashAttention only support fp16 and bf16
        # data type", seen on the H200 under DDP, where the trainer's bf16 autocast hands attention fp32 q/k/v).
        # Under autocast, run it in autocast's dtype as SDPA would; real fp32 goes per segment below.
        if torch.is_autocast_enabled(query.device.type):
            dtype = torch.get_autocast_dtype(query.device.type)
            query, key, value = (t.to(dtype) for t in (query, key, value))
        else:
            kernel = None
    groups = query.shape[1] // key.shape[1]
    if kernel is not None:
        function, gqa, causal = kernel
        # K and V go to the kernel with their own Hkv heads, never repeated: torch 2.11's varlen_attn calls
        # aten::_flash_attention_forward/_backward, whose kernels take Hq a multiple of Hkv and give dK/dV in Hkv
        # heads (FlashAttention-2 ``mha_varlen_fwd``/``mha_varlen_bwd`` on CUDA; AOTriton's ``mha_varlen_fwd_aot``
        # on ROCm, aten/src/ATen/native/transformers/hip/flash_attn/aot/mha_all_aot.hip at pytorch 0119c205:
        # "Number of heads in key/value must divide number of heads in query"). Repeating them cost 2.62 GiB of
        # saved copies and 6.1 ms a step on the 7B shape (an H100 profile, BENCHMARKS.md); the gradients are
        # checked on a GPU (tests/test_packed_attention.py). A later torch's ``enable_gqa`` is passed if it exists.
        extra = {"enable_gqa": True} if gqa and groups > 1 else {}
        return function(query, key, value, cu, cu, max_len, max_len, scale=scale, **causal, **extra)
    out = torch.empty_like(query)
    for a, b in itertools.pairwise(cu.tolist()):
        q, k, v = (t[a:b].transpose(0, 1) for t in (query, key, value))
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=groups > 1
        ).transpose(0, 1)
    return out


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function interface (``AttentionInterface``) for :data:`NAME`.

    Args:
        query: (B, Hq, T, D); key, value: (B, Hkv, T, D), as transformers' models pass them.
        attention_mask: what :func:`mask_function` built: None on packed batches, transformers' SDPA mask otherwise.
        kwargs: ``cu_seq_lens_q`` and ``max_length_q`` from :func:`pack_kwargs` select the varlen path.

    Returns:
        ``(output (B, T, Hq, D), None)``. Without ``cu_seq_lens_q`` (evaluation batches that are not packed,
        generation with a KV cache) transformers' own SDPA function runs, with its own mask. Raises ValueError
        for dropout > 0 on the varlen path (no kernel here takes it; attention dropout is 0 for every family
        rocmft plans).
    """
    import torch

    cu = kwargs.get("cu_seq_lens_q")
    rows, heads, length, dim = query.shape
    # the offsets were checked against the forward's tokens once, by use_on's hook (reading cu[-1] from the GPU in
    # every layer would wait for the GPU in every layer); the same tensor comes back in a checkpointed layer's
    # recomputation, after the forward
    if cu is None or cu is not _PACKED["checked"] or key.shape[2] != length:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        CALLS["sdpa"] += 1
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **{k: v for k, v in kwargs.items() if k not in KWARGS})  # fmt: skip
    if dropout:
        raise ValueError(f"{NAME}: attention dropout {dropout} is not supported on packed rows")
    CALLS["varlen"] += 1
    q, k, v = (t.transpose(1, 2).reshape(rows * length, t.shape[1], dim) for t in (query, key, value))
    out = varlen(q, k, v, cu.to(device=query.device, dtype=torch.int32), int(kwargs["max_length_q"]), scaling)
    return out.reshape(rows, length, heads, dim), None


CALLS = {"varlen": 0, "sdpa": 0}  # attention calls of this process by path (the worker records them at train end)
# "active": while a decoder forward runs with cu_seq_lens_q covering its tokens; "checked": that cu_seq_lens_q
# (kept after the forward, for the recomputation of checkpointed layers). Set by :func:`use_on`'s hooks.
_PACKED: dict[str, Any] = {"active": False, "checked": None}


def mask_function(*args, **kwargs):
    """transformers' mask interface for :data:`NAME`: no mask while a packed forward runs (the varlen kernel needs
    none: building transformers' dense block mask there is what this module avoids); otherwise its SDPA mask."""
    from transformers.masking_utils import sdpa_mask

    return None if _PACKED["active"] else sdpa_mask(*args, **kwargs)


def register() -> None:
    """Register :data:`NAME` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_function)


def use_on(model) -> None:
    """Set :data:`NAME` as the attention of ``model`` (a PEFT wrapper or a transformers model), with the forward
    hooks that tell :func:`mask_function` and :func:`attention_forward` when a packed batch is running.

    The hooks sit on the decoder (``get_decoder()``: the module that builds the mask), which the causal-LM forward
    calls as a module; peft calls the causal-LM's ``forward`` itself, where a hook on it would never fire."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(NAME)
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else base
    if getattr(decoder, "_rocmft_packed_hooks", False):
        return

    def before(_module, args, kwargs):
        cu = kwargs.get("cu_seq_lens_q")
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None and kwargs.get("inputs_embeds") is not None:
            tokens = kwargs["inputs_embeds"][..., 0]
        _PACKED["active"] = cu is not None and tokens is not None and int(cu[-1]) == tokens.numel()
        _PACKED["checked"] = cu if _PACKED["active"] else None

    def after(_module, _args, _kwargs, _output):
        _PACKED["active"] = False

    decoder.register_forward_pre_hook(before, with_kwargs=True)
    decoder.register_forward_hook(after, with_kwargs=True)
    decoder._rocmft_packed_hooks = True


# ------------------------------------------------------------------------------------------------ the measurement


def _time_ms(step, repeat: int) -> float:
    import torch

    step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeat):
        step()
    torch.cuda.synchronize()
    return round(1000 * (time.perf_counter() - started) / repeat, 3)


MASK_ELEMENTS_LIMIT = 2**30  # a (B, T, T) bf16 mask of 2 GiB: beyond it the mask path is not measured, varlen wins


def measure(heads: int, kv_heads: int, head_dim: int, rows: int, cutoff: int, sample_tokens: float,
            repeat: int = 10) -> dict[str, Any]:  # fmt: skip
    """Time one layer's attention forward + backward on the GPU, both ways, for a neat-packed micro-batch.

    Args:
        heads, kv_heads, head_dim: the model's attention shape; rows × cutoff: the micro-batch in tokens;
        sample_tokens: the mean sample length (the planner's), which sets how many samples a row holds.

    Returns:
        ``{"varlen_ms", "sdpa_mask_ms", "error"}``: milliseconds per forward + backward (bf16, mean of ``repeat``
        after one warm-up); ``varlen_ms`` is None with ``error`` when the kernel raised (e.g. a ROCm torch
        without it).
    """
    import torch

    device, dtype = torch.device("cuda"), torch.bfloat16
    per_row = max(1, int(cutoff // max(1.0, min(sample_tokens, cutoff))))
    sizes = [cutoff // per_row] * per_row
    sizes[-1] += cutoff - sum(sizes)
    index = torch.cat([torch.full((n,), i + 1) for i, n in enumerate(sizes)]).repeat(rows, 1)
    cu, longest = segments(index)
    cu = cu.to(device)
    shape_q, shape_kv = (rows, heads, cutoff, head_dim), (rows, kv_heads, cutoff, head_dim)
    q = torch.randn(shape_q, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(shape_kv, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    grad = torch.randn(rows, heads, cutoff, head_dim, device=device, dtype=dtype)
    result: dict[str, Any] = {"sdpa_mask_ms": None, "varlen_ms": None, "error": None}
    if rows * cutoff * cutoff <= MASK_ELEMENTS_LIMIT:
        index = index.to(device)
        same = index[:, :, None] == index[:, None, :]  # built on the GPU: no (B, T, T) tensor on the host
        allowed = same & torch.ones(cutoff, cutoff, dtype=torch.bool, device=device).tril()
        dense = torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)[:, None]  # LLaMA-Factory's mask
        del same, allowed

        def sdpa_step():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense,
                                                                   enable_gqa=heads != kv_heads)  # fmt: skip
            out.backward(grad)

        result["sdpa_mask_ms"] = _time_ms(sdpa_step, repeat)
        del sdpa_step, dense
    else:  # the dense mask alone would be GiBs: not built to be weighed, varlen is the only sane path
        result["note"] = f"a {rows} x {cutoff} x {cutoff} dense mask was not built to be measured"

    def varlen_step():
        flat = [t.transpose(1, 2).reshape(rows * cutoff, t.shape[1], head_dim) for t in (q, k, v)]
        out = varlen(*flat, cu, longest, None)
        out.backward(grad.transpose(1, 2).reshape(rows * cutoff, heads, head_dim))

    try:
        result["varlen_ms"] = _time_ms(varlen_step, repeat)
    except Exception as err:  # a kernel that is missing or refuses the shape: SDPA with the mask stays
        result["error"] = f"{type(err).__name__}: {err}"[:300]
    return result


def choose(config: dict[str, Any], rows: int, cutoff: int, sample_tokens: float, cache_dir: Path | None,
           ) -> dict[str, Any]:  # fmt: skip
    """Measure (or read from the cache) both ways for this device and shape; pick the faster.

    Args:
        config: the model's config.json (``num_attention_heads``, ``num_key_value_heads``, ``hidden_size``,
            ``head_dim``); rows, cutoff, sample_tokens: as :func:`measure`.
        cache_dir: ROCMFT_CACHE_DIR; the result is kept under ``attention/`` keyed by device name, torch version
            and shape (None: measured every time).

    Returns:
        The measurement plus ``chosen`` (:data:`NAME` or ``"sdpa"``), ``device``, ``torch``, ``cached``.
    """
    import torch

    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    facts = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads": heads,
             "kv_heads": kv_heads, "head_dim": head_dim, "rows": rows, "cutoff": cutoff,
             "samples_per_row": max(1, int(cutoff // max(1.0, min(sample_tokens, cutoff))))}  # fmt: skip
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir / "attention" / f"{key}.json" if cache_dir else None
    if path and path.is_file():
        try:
            return {**json.loads(path.read_text()), "cached": True}
        except (OSError, ValueError):
            pass
    result = {**facts, **measure(heads, kv_heads, head_dim, rows, cutoff, sample_tokens)}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()  # the run's recorded peak is training's, not this measurement's
    fast = result["varlen_ms"] is not None and (result["sdpa_mask_ms"] is None
                                                or result["varlen_ms"] < result["sdpa_mask_ms"])  # fmt: skip
    result["chosen"] = NAME if fast else "sdpa"
    if path:
        from rocmft.fsutil import atomic_write_json

        try:
            atomic_write_json(path, result)
        except OSError:
            pass  # a read-only cache: measured again next time
    return {**result, "cached": False}


def decide(arguments: dict[str, Any], sample_tokens: float | None) -> dict[str, Any]:
    """The worker's choice for a run whose plan asked for varlen (run.json ``packed_attention``).

    On a GPU :func:`choose` measures on this rank's GPU (LOCAL_RANK; cached in ROCMFT_CACHE_DIR, else rocmft's
    default cache folder); without one there is nothing to measure and :data:`NAME` is taken (its CPU path is
    exact, tests use it). Never raises: a model whose config cannot be read (transformers' AutoConfig, so hub ids
    and ``~`` paths are found as LLaMA-Factory finds them), an unreadable value, or a kernel that fails keeps SDPA
    with the mask (``chosen: sdpa``, ``error`` says why).

    Args:
        arguments: the run's train.yaml (``model_name_or_path``, ``per_device_train_batch_size``, ``cutoff_len``).
        sample_tokens: the plan's mean sample length in tokens (None: a row is taken as one sample).
    """
    import os

    import torch

    from rocmft.fsutil import default_cache_dir

    if not torch.cuda.is_available():
        return {"chosen": NAME, "reason": "no GPU: nothing to measure (the CPU path is one SDPA call per sample)"}
    try:
        from transformers import AutoConfig

        rows = int(arguments.get("per_device_train_batch_size") or 1)
        cutoff = int(arguments.get("cutoff_len") or 2048)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
        model = os.path.expanduser(str(arguments.get("model_name_or_path")))
        config = AutoConfig.from_pretrained(model, trust_remote_code=bool(arguments.get("trust_remote_code")))
        config = (config.get_text_config() if hasattr(config, "get_text_config") else config).to_dict()
        cache = Path(os.environ.get("ROCMFT_CACHE_DIR") or default_cache_dir())
        result = choose(config, rows, cutoff, float(sample_tokens or cutoff), cache)
    except Exception as err:  # anything here only costs the faster kernel: the run goes on with LLaMA-Factory's mask
        return {"chosen": "sdpa", "error": f"{type(err).__name__}: {err}"[:300]}
    faster = result["chosen"] == NAME
    result["reason"] = (f"varlen {result['varlen_ms']} ms against SDPA with the block mask {result['sdpa_mask_ms']} "
                        f"ms per layer forward+backward" if result["varlen_ms"] is not None else
                        f"varlen failed ({result['error']}): SDPA with the block mask")  # fmt: skip
    if not faster and result["varlen_ms"] is not None:
        result["reason"] += ": SDPA with the mask is faster here"
    return result


__all__ = ["KWARGS", "NAME", "attention_forward", "choose", "decide", "is_packed_batch", "mask_function", "measure",
           "pack_kwargs", "register", "segments", "use_on", "varlen"]  # fmt: skip
