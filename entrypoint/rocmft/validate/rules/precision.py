"""Precision: the policy's refusals, fp16 on a bf16 model, and FP8 that would train in another precision."""

from __future__ import annotations

from rocmft.config.provenance import removal
from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.render.precision import resolve_precision
from rocmft.validate.rules import Inputs, independent, rule
from rocmft.validate.rules.common import named, user_set
from rocmft.values import truthy

# What fp16 means without a GPU (accelerate 1.11, accelerator.py, Accelerator.__init__): fp16 mixed precision sets up
# autocast and a GradScaler only where `self.device.type != "cpu"`, so on the CPU there is neither; LLaMA-Factory
# 0.9.5 still sets compute_dtype float16 for FP16 (hparams/parser.py) and loads the frozen weights in it.
CPU_FP16 = (
    "fp16 without a GPU ({policy}): on the CPU accelerate turns fp16 mixed precision off (no autocast, no "
    "loss scaling: accelerator.py sets up both only for a non-CPU device), while LLaMA-Factory still loads "
    "the model's weights in float16. So this run computes in plain fp16 without loss scaling (small gradients "
    "underflow to zero, large activations overflow to inf) and slowly (a CPU has little fp16 arithmetic). "
    "Choose ROCMFT_PRECISION=fp32 (the default without a GPU, exact) or ROCMFT_PRECISION=bf16 with USE_CPU=true "
    "(CPU autocast, fp32's range)."
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


# Why FP8 trains in another precision with the pinned LLaMA-Factory 0.9.5 and transformers 5.6.0 (read in both
# packages, and measured: BENCHMARKS.md, "Issue 32 on one H200"). LLaMA-Factory turns FP8 on only in its pt and sft
# trainers' __init__ (llamafactory/train/sft/trainer.py, pt/trainer.py; the other stages never read `fp8`), by
# configure_fp8_environment (llamafactory/train/fp8_utils.py) setting ACCELERATE_MIXED_PRECISION=fp8. transformers'
# TrainingArguments.__post_init__ (transformers/training_args.py, "Mixed Precision") has already read that variable
# and chosen bf16/fp16 from the flags (else the variable's value before LLaMA-Factory set it), and the Trainer hands
# that choice to Accelerator(mixed_precision=...) (trainer.py, _build_accelerator_args); the AORecipeKwargs
# LLaMA-Factory builds are only logged. fp8_backend te's patch_accelerator_for_fp8 injects its recipe only when no
# kwargs_handlers are passed, and the Trainer always passes its DDP kwargs; it first imports transformer_engine,
# which rocmft's images do not install. tests/test_fp8.py checks this against the installed packages.
FP8_IGNORED = (
    "{fp8} would not train in FP8: with LLaMA-Factory 0.9.5 and transformers 5.6.0 (rocmft's pins) the run trains "
    "in {policy} instead ({precision}), without an error. LLaMA-Factory turns FP8 on in its trainer's __init__ "
    "(llamafactory/train/fp8_utils.py), after transformers' TrainingArguments (transformers/training_args.py) has "
    "chosen the precision accelerate gets: on an H200 the log said 'Accelerate FP8 status - enabled: False' "
    "(BENCHMARKS.md, issue 32; hiyouga/LlamaFactory#9500)."
)
FP8_FIX = (
    "{remove}; rocmft's precision plan trains in {policy} here (bf16 on a GPU that has it). For LoRA, FP8 on the "
    "frozen weights ran at 0.42x bf16's tokens/s on an H200 (BENCHMARKS.md); docs/planner.md, 'FP8', says what FP8 "
    "on ROCm would need."
)
ALL_GATHER_IGNORED = (
    "{all_gather} does not turn FP8 on: LLaMA-Factory 0.9.5 logs 'Setting fp8=True' but sets it where nothing "
    "reads it (llamafactory/hparams/parser.py), so the run trains in {policy} ({precision}); FP8=true would not "
    "train in FP8 either with rocmft's pinned LLaMA-Factory and transformers."
)


def _trained_in(run: Rendered) -> tuple[str, str]:
    """The precision a run trains in (``bf16``, ``fp16`` or ``fp32``) and the rendered flag that says so, named."""
    policy = run.precision.policy
    flag = run.precision.chosen_by or ("fp16" if policy == "fp16" else "bf16")
    return policy, named(run, flag)


@rule("rendered", 102)
def fp8_training(run: Rendered) -> list[str]:
    """FP8 training asked for where it would silently train in bf16 (or the policy's fp16/fp32): ``fp8`` true, or
    ``fp8_enable_fsdp_float8_all_gather`` true (LLaMA-Factory says it turns fp8 on; it does not), both refused
    (:data:`FP8_IGNORED`, :data:`ALL_GATHER_IGNORED`: the source files and the H200 measurement). ``fp8_backend``
    set by the user without ``fp8`` does nothing (fp8_utils.py reads it only when fp8 is true): a warning.

    Raises:
        ConfigError: ``fp8`` or ``fp8_enable_fsdp_float8_all_gather`` true, naming it, the precision the run would
            train in, and the fix.
    """
    arguments, sources = run.arguments, run.sources
    if truthy(arguments.get("fp8")):
        policy, precision = _trained_in(run)
        with independent():
            raise ConfigError(
                FP8_IGNORED.format(fp8=named(run, "fp8"), policy=policy, precision=precision),
                FP8_FIX.format(remove=removal("fp8", sources.get("fp8")), policy=policy),
            )
        return []
    if truthy(arguments.get("fp8_enable_fsdp_float8_all_gather")):
        policy, precision = _trained_in(run)
        with independent():
            all_gather = named(run, "fp8_enable_fsdp_float8_all_gather")
            raise ConfigError(
                ALL_GATHER_IGNORED.format(all_gather=all_gather, policy=policy, precision=precision),
                FP8_FIX.format(remove=removal("fp8_enable_fsdp_float8_all_gather",
                                              sources.get("fp8_enable_fsdp_float8_all_gather")), policy=policy),
            )  # fmt: skip
    if user_set("fp8_backend", sources):
        return [
            f"{named(run, 'fp8_backend')} does nothing without FP8=true: LLaMA-Factory 0.9.5 reads it only when fp8 "
            f"is on (llamafactory/train/fp8_utils.py): {removal('fp8_backend', sources.get('fp8_backend'))}."
        ]
    return []
