"""A LoRA Linear whose adapter product is added by the GEMMs themselves (issue 32: the steady step against Unsloth).

peft 0.18.1's ``lora.Linear.forward`` (``tuners/lora/layer.py``) computes ``result + lora_B(lora_A(x)) * scaling``:
lora_B's T x out output is written, scaled into a second tensor and added into a third, and in backward the
scaling runs again over the T x out gradient and autograd adds the adapter's input gradient to the base layer's in
one more pass over T x in. :class:`LoraLinear` does the same arithmetic with the adds folded into the matrix
products' epilogues (``addmm_``: C read once, D written once), as Unsloth's ``matmul_lora`` and ``LoRA_W`` do
(``unsloth/kernels/utils.py``, ``unsloth/kernels/fast_lora.py``): the base output takes ``s·(x Aᵀ) Bᵀ`` in place, and
``dX = dY W`` takes ``(s·dY B) A`` in place. Only the small r-wide factors are scaled.

Measured (BENCHMARKS.md, issue 32): on one H100, an out-of-place ``addmm`` alone cut the 7B step's element-wise
GPU time from 164 to 59 ms and raised the steady rate 4.6-5.5%; with this kernel, on one H200, rocmft's steady
rate is 16,504 tokens/s (15,274-15,862 before), 1.204x the expert's configuration and 0.963x Unsloth's.

Rounding: one bf16 rounding of the sum where peft rounds lora_B's output, its scaled copy and the sum, so values
are at least as close to a float64 reference as peft's, not bit-equal to them (tests/test_lora_kernel.py).
"""

from __future__ import annotations

import torch


class LoraLinear(torch.autograd.Function):
    """``y = x Wᵀ + bias + s·(x Aᵀ) Bᵀ`` for a frozen base Linear and one LoRA adapter, in one dtype.

    Inputs (all in the compute dtype, e.g. bf16; the caller casts the fp32 adapters so that autograd casts their
    gradients back): ``x`` (..., in), ``weight`` (out, in) and ``bias`` (out,) or None, frozen; ``lora_a`` (r, in),
    ``lora_b`` (out, r); ``scaling`` s, a float (peft's ``lora_alpha / r``, or ``/ sqrt(r)`` under rsLoRA).
    Returns y (..., out). Saves x, the T x r product x Aᵀ and the adapters, as peft's path saves them.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scaling):
        flat = x.reshape(-1, x.shape[-1])
        out = torch.nn.functional.linear(flat, weight, bias)  # the base layer's own product, bit for bit
        low = flat @ lora_a.t()
        out.addmm_(low, lora_b.t(), alpha=scaling)
        ctx.save_for_backward(flat, weight, low, lora_a, lora_b)
        ctx.scaling, ctx.x_shape = scaling, x.shape
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        flat, weight, low, lora_a, lora_b = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        d_low = g @ (lora_b * ctx.scaling)  # T x r
        d_x = d_a = d_b = None
        if ctx.needs_input_grad[0]:
            d_x = (g @ weight).addmm_(d_low, lora_a).view(ctx.x_shape)
        if ctx.needs_input_grad[3]:
            d_a = d_low.t() @ flat
        if ctx.needs_input_grad[4]:
            d_b = g.t() @ (low * ctx.scaling)
        return d_x, None, None, d_a, d_b, None


def plain_lora_dtype(layer, x: torch.Tensor, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The compute dtype when ``layer`` (a peft 0.18.1 ``lora.Linear``) can run as :class:`LoraLinear`, else None.

    That is plain LoRA under autocast: one active adapter, no dropout, no DoRA or other variant, no LoRA bias, not
    merged nor disabled, no extra forward arguments; a ``torch.nn.Linear`` base (not bitsandbytes' QLoRA layers)
    whose frozen weight is already in autocast's dtype and is not partitioned by DeepSpeed ZeRO-3 (``ds_id``: its
    parameters are gathered by hooks on the modules this path does not call). Everything else goes to peft;
    so does FSDP's ``full_shard`` with ``use_orig_params`` (rocmft's FSDP): the base weight it shows in forward is a
    view of a flat parameter that requires grad (seen with torch 2.11 on two gloo ranks: same loss and gradients).
    """
    if args or kwargs or layer.disable_adapters or layer.merged or layer.fan_in_fan_out:
        return None
    names = layer.active_adapters
    if len(names) != 1 or names[0] not in layer.lora_A or names[0] in layer.lora_variant:
        return None
    name, base = names[0], layer.base_layer
    if not isinstance(layer.lora_dropout[name], torch.nn.Identity) or layer.lora_B[name].bias is not None:
        return None
    if type(base) is not torch.nn.Linear or not torch.is_autocast_enabled(x.device.type):
        return None
    dtype = torch.get_autocast_dtype(x.device.type)
    frozen = [base.weight] + ([base.bias] if base.bias is not None else [])
    if any(p.requires_grad or p.dtype != dtype for p in frozen):
        return None
    params = [*frozen, layer.lora_A[name].weight, layer.lora_B[name].weight]
    return None if any(hasattr(p, "ds_id") for p in params) else dtype


def forward_with(original):
    """peft's ``lora.Linear.forward`` (``original``) with plain LoRA (:func:`plain_lora_dtype`) as
    :class:`LoraLinear`; any other case calls ``original`` unchanged."""

    def forward(self, x, *args, **kwargs):
        dtype = plain_lora_dtype(self, x, args, kwargs)
        if dtype is None:
            return original(self, x, *args, **kwargs)
        name, base = self.active_adapters[0], self.base_layer
        lora_a, lora_b = self.lora_A[name].weight.to(dtype), self.lora_B[name].weight.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            return LoraLinear.apply(x.to(dtype), base.weight, base.bias, lora_a, lora_b, self.scaling[name])

    forward._rocmft, forward.__wrapped__ = True, original
    return forward
