"""The precision policy, with the device probe's result injected (the CPU cannot show a GPU's answer)."""

from __future__ import annotations

import pytest

from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.render.precision import resolve_precision

CPU = DeviceFacts(backend="cpu")
# What probe_device() returns on an MI300X (gcnArchName and bf16 support as torch reports them on ROCm).
MI300X = DeviceFacts(backend="rocm", count=8, names=["AMD Instinct MI300X"] * 8,
                     archs=["gfx942:sramecc+:xnack-"] * 8, memory_gib=[192.0] * 8, bf16=True)  # fmt: skip
NO_BF16_GPU = DeviceFacts(backend="rocm", count=1, names=["AMD Instinct MI100"], archs=["gfx908"], bf16=False)


def resolve(environ, device):
    settings = load_settings(environ)
    return resolve_precision(settings, settings.arguments, device)


def test_auto_is_bf16_on_a_bf16_gpu_and_fp32_on_cpu():
    assert resolve({}, MI300X).policy == "bf16"
    cpu = resolve({}, CPU)
    assert (cpu.policy, cpu.compute_dtype, cpu.bf16, cpu.fp16) == ("fp32", "float32", False, False)
    assert resolve({}, NO_BF16_GPU).policy == "fp32"  # never fp16 without being asked


def test_explicit_flags_are_honoured():
    assert resolve({"BF16": "true"}, MI300X).policy == "bf16"
    assert resolve({"FP16": "1"}, MI300X).policy == "fp16"
    both_off = resolve({"BF16": "false", "FP16": "false"}, MI300X)
    assert both_off.policy == "fp32" and both_off.compute_dtype == "float32"  # the "fp32 that is not fp32" fix
    assert resolve({"ROCMFT_PRECISION": "fp32"}, MI300X).compute_dtype == "float32"


@pytest.mark.parametrize("environ", [
    {"FP16": "true", "BF16": "true"},
    {"FP16": "True", "PURE_BF16": "true"},
    {"ROCMFT_PRECISION": "fp32", "BF16": "true"},
    {"ROCMFT_PRECISION": "bf16", "FP16": "true"},
])  # fmt: skip
def test_contradictions_are_errors(environ):
    with pytest.raises(ConfigError) as caught:
        resolve(environ, MI300X)
    for name in environ:
        assert name in str(caught.value)


def test_bf16_on_a_gpu_without_bf16_is_an_error():
    with pytest.raises(ConfigError, match="MI100"):
        resolve({"ROCMFT_PRECISION": "bf16"}, NO_BF16_GPU)


@pytest.mark.parametrize(("environ", "to_fp32"), [
    ({"ROCMFT_PRECISION": "bf16"}, "use ROCMFT_PRECISION=auto"),
    ({"BF16": "true"}, "unset BF16"),
])  # fmt: skip
def test_bf16_without_a_visible_gpu_is_refused_unless_use_cpu_says_so(environ, to_fp32):
    """transformers 5.6 refuses bf16 without a bf16 GPU unless use_cpu ("Your setup doesn't support bf16/gpu"),
    once LLaMA-Factory parses; rocmft says so first, with the way back to fp32 for how bf16 was asked for, and the
    GPU that may not be visible to the container. USE_CPU=true trains bf16 on the CPU as asked."""
    with pytest.raises(ConfigError) as caught:
        resolve(environ, CPU)
    assert (
        "no GPU is visible" in str(caught.value)
        and to_fp32 in caught.value.remedy
        and "USE_CPU=true" in caught.value.remedy
    )
    assert resolve({**environ, "USE_CPU": "true"}, CPU).policy == "bf16"


def test_the_precision_refusals_say_how_to_remove_each_setting_where_it_was_set(tmp_path):
    """BF16 in the user's YAML and FP16 in the environment: the fix deletes the one from that file and unsets the
    other (the tester found "Remove both … BF16 and FP16 are then not needed" for a key the user wrote in YAML)."""
    from rocmft.config.settings import load_settings
    from rocmft.errors import ConfigError
    from rocmft.render.precision import resolve_precision

    config = tmp_path / "run.yaml"
    config.write_text("bf16: true\n")
    settings = load_settings({"ROCMFT_CONFIG": str(config), "FP16": "true"})
    with pytest.raises(ConfigError) as caught:
        resolve_precision(settings, settings.arguments, None)
    assert f"delete bf16 from ROCMFT_CONFIG ({config})" in caught.value.remedy and "unset FP16" in (
        caught.value.remedy)  # fmt: skip


def test_fp16_without_a_gpu_is_said_with_what_happens_and_the_choices(render_env, capsys):
    """Issue 30: ROCMFT_PRECISION=fp16 on a machine without a GPU trained in fp16 without a word. What it means
    there is measured on the installed accelerate (the trainer's: transformers 5 hands TrainingArguments'
    mixed_precision to it): on the CPU an fp16 Accelerator has no autocast and no GradScaler, so the weights
    LLaMA-Factory loads in float16 (compute dtype float16 for FP16) run in plain fp16 without loss scaling. It
    trains, so a warning, not a refusal (LLaMA-Factory's maintainer answers fp16 on a CPU with "remove --fp16 or
    choose fp32 training": hiyouga/LlamaFactory#2329; a CPU run with --fp16 True "doesn't seem to do anything":
    hiyouga/LlamaFactory#8982). On a GPU fp16 stays silent."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    try:
        accelerator = Accelerator(mixed_precision="fp16", cpu=True)
        assert accelerator.device.type == "cpu" and accelerator.native_amp is False and accelerator.scaler is None
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    plan = render_env({"ROCMFT_PRECISION": "fp16", "DATASET": "identity"})
    assert plan.arguments["fp16"] is True  # the user's choice stands
    printed = capsys.readouterr().out
    assert "WARNING: fp16 without a GPU (ROCMFT_PRECISION=fp16)" in printed, printed
    assert "no autocast, no loss scaling" in printed and "ROCMFT_PRECISION=fp32" in printed
    assert "ROCMFT_PRECISION=bf16" in printed
    render_env({"FP16": "true", "DATASET": "identity"})
    assert "WARNING: fp16 without a GPU (FP16=true, set in the environment)" in capsys.readouterr().out
    render_env({"ROCMFT_PRECISION": "fp16", "DATASET": "identity"}, device=MI300X)
    assert "without a GPU" not in capsys.readouterr().out
