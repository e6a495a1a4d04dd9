"""Precision: the policy's refusals, and fp16 on a bf16 model."""

from __future__ import annotations

from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.render.precision import resolve_precision
from rocmft.validate.rules import Inputs, rule
from rocmft.validate.rules.common import named


@rule("inputs", 10)
def precision(run: Inputs) -> None:
    """BF16/FP16/PURE_BF16 against ROCMFT_PRECISION and the device: the refusals of
    :func:`rocmft.render.precision.resolve_precision` (both on, a contradiction, bf16 on a GPU without it), whose
    decision render makes again (the refusals live with the decision they belong to).

    Raises:
        ConfigError: from resolve_precision.
    """
    resolve_precision(run.settings, run.arguments, run.device)


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
