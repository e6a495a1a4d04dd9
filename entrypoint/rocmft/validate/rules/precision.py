"""Precision: the policy's refusals, and fp16 on a bf16 model."""

from __future__ import annotations

from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.render.precision import resolve_precision
from rocmft.validate.rules import Inputs, rule
from rocmft.validate.rules.common import named

# What fp16 means without a GPU (accelerate 1.11, accelerator.py, Accelerator.__init__): fp16 mixed precision sets up
# autocast and a GradScaler only where `self.device.type != "cpu"`, so on the CPU there is neither; LLaMA-Factory
# 0.9.5 still sets compute_dtype float16 for FP16 (hparams/parser.py) and loads the frozen weights in it.
CPU_FP16 = (
    "fp16 without a GPU ({policy}): on the CPU accelerate turns fp16 mixed precision off (no autocast, no "
    "loss scaling: accelerator.py sets up both only for a non-CPU device), while LLaMA-Factory still loads "
    "the model's weights in float16. So this run computes in plain fp16 without loss scaling (small gradients "
    "underflow to zero, large activations overflow to inf) and slowly (a CPU has little fp16 arithmetic). "
    "Choose ROCMFT_PRECISION=fp32 (the default without a GPU, exact) or ROCMFT_PRECISION=bf16 (CPU autocast, "
    "fp32's range)."
)


@rule("inputs", 10)
def precision(run: Inputs) -> list[str]:
    """BF16/FP16/PURE_BF16 against ROCMFT_PRECISION and the device: the refusals of
    :func:`rocmft.render.precision.resolve_precision` (both on, a contradiction, bf16 on a GPU without it), whose
    decision render makes again (the refusals live with the decision they belong to); and a warning for fp16
    without a GPU (:data:`CPU_FP16`: it trains, but not as fp16 mixed precision does on a GPU).

    Raises:
        ConfigError: from resolve_precision.
    """
    chosen = resolve_precision(run.settings, run.arguments, run.device)
    if chosen.policy == "fp16" and run.device.backend == "cpu":
        return [CPU_FP16.format(policy=chosen.reason)]
    return []


@rule("rendered", 100)
def fp16_on_bf16_model(run: Rendered) -> None:
    """fp16 training of a model whose weights are bf16 on a GPU that has bf16: bf16-trained weights and
    activations exceed fp16's range (max 65504), the known cause of NaN or zero losses; bf16 is the fix.

    Raises:
        ConfigError: naming the precision setting and the model's dtype.
    """
    arguments, bf16_gpu = run.arguments, run.device.bf16
    if not arguments.get("fp16") or not bf16_gpu:
        return
    model = run.model
    config = model.config_path
    try:
        loaded = model.config_json()
    except (OSError, ValueError):
        return
    dtype = loaded.get("torch_dtype") or loaded.get("dtype")
    if dtype == "bfloat16":
        raise ConfigError(
            f"{named(run, 'fp16')} for {named(run, 'model_name_or_path')}, whose weights are bfloat16 (torch_dtype "
            f"in {config}), on a GPU with bf16: values beyond fp16's range turn into Inf/NaN (NaN or zero loss).",
            "Use ROCMFT_PRECISION=bf16 (auto picks it here) and unset FP16.",
        )
