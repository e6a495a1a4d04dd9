"""The precision policy: which dtype the weights load in and which mixed precision the trainer uses.

Why rocmft decides this instead of passing BF16/FP16 through: LLaMA-Factory 0.9.5 sets a compute dtype
only for bf16/fp16; with both off its model loader picks bf16 where supported, else **fp16**, without loss
scaling, and logs ``compute dtype: None`` (DESIGN.md, "Facts found by measurement"); and it loads the
weights with ``torch_dtype="auto"``, so a bf16 checkpoint stays bf16. So "fp32" is not fp32 unless the
worker forces the dtype (:mod:`rocmft.worker`) — and it does, for policy ``fp32``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rocmft.config.provenance import named_in, removal, stated
from rocmft.config.settings import Settings
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.values import truthy

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Precision:
    """The resolved precision.

    Attributes:
        policy: ``bf16``, ``fp16`` or ``fp32`` (``auto`` is resolved away).
        compute_dtype: the torch dtype name the weights are loaded in (``bfloat16``/``float16``/``float32``).
        bf16, fp16: the trainer's mixed-precision flags rendered into train.yaml.
        reason: why this policy, for the log and the manifest.
        chosen_by: the training argument whose value chose the policy (``bf16``, ``pure_bf16``, ``fp16``), or
            None when rocmft's setting or default did.
    """

    policy: str
    compute_dtype: str
    bf16: bool
    fp16: bool
    reason: str
    chosen_by: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)


def resolve_precision(settings: Settings, arguments: dict[str, Any], device: DeviceFacts) -> Precision:
    """Resolve ``ROCMFT_PRECISION`` against BF16/FP16/PURE_BF16 and the device.

    Rules, in order:

    1. BF16 and FP16 both true (in any spelling LLaMA-Factory accepts) is an error.
    2. rocmft's own override wins over everything the user set (the restart in real fp32 after a non-finite
       loss, :attr:`Settings.overridden`: the user's BF16=true chose the first attempt's precision, not this one's).
       Else an explicit ROCMFT_PRECISION wins, but contradicting an explicit BF16/FP16 true is an error.
    3. Without ROCMFT_PRECISION, BF16=true (or PURE_BF16=true) means bf16, FP16=true means fp16, and both
       explicitly false means real fp32.
    4. ``auto``: bf16 where the GPU supports it, otherwise fp32. Never fp16 on its own: fp16 without bf16
       hardware is a user's explicit choice, with the trainer's dynamic loss scaling.

    Args:
        settings: the read settings (for ROCMFT_PRECISION and whether it was given).
        arguments: the user's training arguments (ROCMFT_CONFIG and environment merged).
        device: the probed device.

    Raises:
        ConfigError: for rule 1 or 2, or bf16 asked for on a GPU that has no bf16.
    """
    policy, reason, chosen_by = _chosen_policy(settings, arguments)
    to_fp32 = removal(chosen_by, settings.sources.get(chosen_by)) if chosen_by else "use ROCMFT_PRECISION=auto"
    policy, reason = _on_device(policy, reason, device, truthy(arguments.get("use_cpu")), to_fp32)
    return Precision(
        policy=policy,
        compute_dtype=_DTYPE[policy],
        bf16=policy == "bf16",
        fp16=policy == "fp16",
        reason=reason,
        chosen_by=chosen_by,
    )


def _chosen_policy(settings: Settings, arguments: dict[str, Any]) -> tuple[str, str, str | None]:
    """Rules 1-3 of :func:`resolve_precision`: the policy the settings and arguments ask for (maybe ``auto``).

    Returns:
        ``(policy, reason, chosen_by)``.

    Raises:
        ConfigError: for rule 1 or 2.
    """
    bf16_name = "pure_bf16" if truthy(arguments.get("pure_bf16")) else "bf16"
    bf16 = truthy(arguments.get(bf16_name))
    fp16 = truthy(arguments.get("fp16"))

    def named(name: str) -> str:
        return named_in(name, arguments, settings.sources, settings.given)

    def chose(name: str) -> str:  # the reason when the user's BF16/FP16 chose the policy
        return stated(name, arguments.get(name), settings.sources.get(name), settings.given.get(name))

    if bf16 and fp16:
        raise ConfigError(
            f"Both {named(bf16_name)} and {named('fp16')} are enabled; a run trains in one of them.",
            f"Choose with ROCMFT_PRECISION=bf16 or fp16 (or auto) alone: "
            f"{removal(bf16_name, settings.sources.get(bf16_name))} and "
            f"{removal('fp16', settings.sources.get('fp16'))}.",
        )
    asked = "bf16" if bf16 else "fp16" if fp16 else None
    chosen_by = None
    override = settings.overridden.get("precision")
    if override is not None:
        policy, reason = settings.rocmft.precision, f"ROCMFT_PRECISION={settings.rocmft.precision} ({override})"
    elif "precision" in settings.explicit_rocmft:
        policy = settings.rocmft.precision
        if asked and policy != "auto" and asked != policy:
            name = bf16_name if bf16 else "fp16"
            raise ConfigError(
                f"{settings.knob('precision')} contradicts {named(name)}.",
                f"{removal(name, settings.sources.get(name))}: ROCMFT_PRECISION alone chooses the precision.",
            )
        reason = f"ROCMFT_PRECISION={policy}"
        if policy == "auto" and asked:
            policy, reason, chosen_by = asked, chose(bf16_name if bf16 else "fp16"), bf16_name if bf16 else "fp16"
    elif asked:
        policy, reason, chosen_by = asked, chose(bf16_name if bf16 else "fp16"), bf16_name if bf16 else "fp16"
    elif "bf16" in arguments and "fp16" in arguments:
        policy, reason = "fp32", "bf16 and fp16 both set to false: real fp32"
    else:
        policy, reason = "auto", "ROCMFT_PRECISION=auto (default)"
    return policy, reason, chosen_by


def _on_device(policy: str, reason: str, device: DeviceFacts, use_cpu: bool, to_fp32: str) -> tuple[str, str]:
    """Rule 4 of :func:`resolve_precision`: resolve ``auto`` on the device, and refuse bf16 where it has none
    (``to_fp32``: the fix's words for going back to the default, e.g. "unset BF16").

    Returns:
        ``(policy, reason)``, the policy never ``auto``.

    Raises:
        ConfigError: bf16 asked for on a GPU that has no bf16; or where no GPU is visible and ``use_cpu`` is not
            set: transformers 5.6's ``TrainingArguments.__post_init__`` refuses bf16 without a bf16 GPU unless
            ``use_cpu`` ("Your setup doesn't support bf16/gpu"), which rocmft's fix used to leave to the user to
            decode (a newcomer's trial, 2026-12-05).
    """
    if policy == "auto":
        if device.bf16:
            policy, reason = "bf16", f"{reason}: the {device.backend} device supports bf16"
        else:
            where = "no GPU is visible" if device.backend == "cpu" else "this GPU has no bf16"
            policy, reason = "fp32", f"{reason}: {where}, so fp32 (fp16 without loss scaling is never chosen)"
    elif policy == "bf16" and device.backend == "cpu" and not use_cpu:
        raise ConfigError(
            f"bf16 was asked for ({reason}) but no GPU is visible: transformers refuses bf16 without a GPU that has "
            "it unless the run is told to train on the CPU ('Your setup doesn't support bf16/gpu').",
            "If this machine has GPUs, give the container or job their devices (`rocmft check` lists what it sees); "
            f"to train on the CPU, {to_fp32} (fp32 here), or add USE_CPU=true for bf16 autocast.",
        )
    elif policy == "bf16" and device.backend != "cpu" and not device.bf16:
        raise ConfigError(
            f"bf16 was asked for ({reason}) but {device.names[0] if device.names else 'this GPU'} has no bf16.",
            "Use ROCMFT_PRECISION=fp32 (or fp16 with loss scaling).",
        )
    return policy, reason
