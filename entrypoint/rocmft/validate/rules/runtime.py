"""The PyTorch runtime variables a user sets by hand: the caching allocator's configuration and TunableOp.

Both are read by torch itself, long after rocmft starts: a bad allocator string stops the run at the first GPU
allocation (while the model loads), and TunableOp's online tuning across ranks looks like a hang. Checked here,
before anything loads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rocmft.config.provenance import environment_variable
from rocmft.errors import ConfigError
from rocmft.findings import note
from rocmft.render import Plan
from rocmft.validate.rules import Inputs, independent, rule
from rocmft.values import truthy, whole_number

# The caching allocator's variables. Which one wins differs between torch releases: c10/cuda/CUDAAllocatorConfig.h
# read PYTORCH_CUDA_ALLOC_CONF, then (ROCm builds) PYTORCH_HIP_ALLOC_CONF, then PYTORCH_ALLOC_CONF; later releases
# read PYTORCH_ALLOC_CONF first and keep PYTORCH_CUDA_ALLOC_CONF "for backward compatibility" (pytorch/pytorch,
# c10/cuda/CUDAAllocatorConfig.h, ``instance()``, both versions).
ALLOC_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
# The options torch's parser accepts (c10/core/AllocatorConfig.cpp and c10/cuda/CUDAAllocatorConfig.h, ``parseArgs``
# and ``getKeys``); an option it does not know is an error in the releases whose parser ends in TORCH_CHECK(false,
# "Unrecognized CachingAllocator option").
ALLOC_OPTIONS = ("max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
                 "roundup_power2_divisions", "backend", "expandable_segments", "release_lock_on_cudamalloc",
                 "release_lock_on_hipmalloc", "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                 "pinned_num_register_threads", "pinned_use_background_threads")  # fmt: skip
BOOLEAN_OPTIONS = ("expandable_segments", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                   "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                   "pinned_use_background_threads")  # fmt: skip
MIN_SPLIT_SIZE_MB = 20  # kLargeBuffer / kMB: "max_split_size_mb too small, must be >= 20"


def parse_alloc_conf(name: str, text: str) -> dict[str, str]:
    """``key:value,key:value`` as torch's allocator parser reads it (spaces dropped; a bracketed
    ``roundup_power2_divisions:[64:8,>:1]`` kept whole).

    Once every entry is ``key:value``, each option's value is checked on its own: under
    :func:`rocmft.validate.rules.findings`, every value torch refuses is reported.

    Raises:
        ConfigError: an entry without ``:``, an unparsable value, or a value torch refuses (booleans are
            ``True``/``False`` exactly; ``max_split_size_mb`` an integer ≥ 20; ``garbage_collection_threshold``
            in (0, 1)), naming ``name`` and the entry.
    """
    options: dict[str, str] = {}
    for entry in re.split(r",(?![^\[]*\])", text.replace(" ", "")):
        if not entry:
            continue
        key, sep, value = entry.partition(":")
        if not sep or not key or not value:
            raise ConfigError(f"{name}={text!r}: {entry!r} is not option:value.",
                              f"Write {name} as option:value pairs separated by commas, e.g. "
                              "expandable_segments:True.")  # fmt: skip
        options[key] = value
    for key, value in options.items():
        with independent():  # each option is its own setting
            _option_value(name, text, key, value)
    return options


def _option_value(name: str, text: str, key: str, value: str) -> None:
    """Option ``key`` of allocator variable ``name`` (set to ``text``) has a value torch accepts.

    Raises:
        ConfigError: see :func:`parse_alloc_conf`.
    """
    if key in BOOLEAN_OPTIONS and value not in ("True", "False"):
        raise ConfigError(
            f"{name}={text!r}: {key}:{value} — torch accepts only True or False (capitalized) and "
            "stops at the first GPU allocation otherwise.",
            f"Write {key}:True or {key}:False.",
        )
    if key in ("max_split_size_mb", "max_non_split_rounding_mb") and ((whole_number(value) or 0) < MIN_SPLIT_SIZE_MB):
        raise ConfigError(
            f"{name}={text!r}: {key}:{value} — torch needs a whole number of MiB of at least {MIN_SPLIT_SIZE_MB}.",
            f"Write {key}:<MiB ≥ {MIN_SPLIT_SIZE_MB}>, or remove it.",
        )
    if key == "garbage_collection_threshold":
        try:
            ok = 0 < float(value) < 1
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"{name}={text!r}: garbage_collection_threshold:{value} — torch needs a number "
                              "between 0 and 1.", "Write e.g. garbage_collection_threshold:0.8.")  # fmt: skip


def allocator_findings(environ: Mapping[str, str]) -> list[str]:
    """The warnings for the allocator variables in ``environ`` (see :func:`allocator_variables`).

    Raises:
        ConfigError: two of them set to different values, or a value torch refuses (:func:`parse_alloc_conf`).
    """
    given = {name: environ[name].strip() for name in ALLOC_VARIABLES if (environ.get(name) or "").strip()}
    if not given:
        return []
    # single-shot: which value to parse is known only once the variables agree
    if len(set(given.values())) > 1:
        shown = ", ".join(environment_variable(name, environ) for name in given)
        others = [name for name in given if name != "PYTORCH_ALLOC_CONF"]
        raise ConfigError(f"Allocator settings disagree: {shown}. torch reads only one of them, and which one "
                          "depends on its release, so the run would get either.",
                          f"Put the value you want in PYTORCH_ALLOC_CONF (the current name) and unset "
                          f"{', '.join(others)}.")  # fmt: skip
    name, text = next(iter(given.items()))
    note(name, text, name, f"{name}={text!r}")  # the findings name the variable as their messages write it
    options = parse_alloc_conf(name, text)
    warnings = []
    unknown = [key for key in options if key not in ALLOC_OPTIONS]
    if unknown:
        warnings.append(f"{name}: {', '.join(unknown)} is not an allocator option torch 2.11 documents; some "
                        "releases stop at the first GPU allocation on it (\"Unrecognized CachingAllocator option\"). "
                        f"Known: {', '.join(ALLOC_OPTIONS)}.")  # fmt: skip
    if options.get("expandable_segments") == "True" and "max_split_size_mb" in options:
        warnings.append(f"{name}={text!r}: max_split_size_mb with expandable_segments:True keeps growing reserved "
                        "memory until the run is out of memory (pytorch/pytorch#123548). Use one of the two "
                        "(expandable_segments:True alone is the usual cure for fragmentation).")  # fmt: skip
    if "PYTORCH_CUDA_ALLOC_CONF" in given and "PYTORCH_ALLOC_CONF" not in given:
        warnings.append("PYTORCH_CUDA_ALLOC_CONF is the allocator variable's old name, kept by torch for backward "
                        "compatibility; PYTORCH_ALLOC_CONF is the current one.")  # fmt: skip
    return warnings


@rule("inputs", 50)
def allocator_variables(run: Inputs) -> list[str]:
    """Lint PYTORCH_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF before the model loads.

    Refused (exit 2): two of them with different values (which one torch reads depends on its release), a value
    torch's parser refuses (it would stop the run at the first allocation). Warned: an option torch 2.11 does not
    document, ``max_split_size_mb`` together with ``expandable_segments:True`` (pytorch/pytorch#123548), the old
    name PYTORCH_CUDA_ALLOC_CONF alone.

    Raises:
        ConfigError: naming the variables, their values and the fix.
    """
    return allocator_findings(run.settings.environ)


def tunableop_online_tuning(environ: Mapping[str, str], world_size: int) -> None:
    """Refuse TunableOp's online tuning in a job of more than one rank.

    ``PYTORCH_TUNABLEOP_ENABLED=1`` tunes every new GEMM shape on first use unless ``PYTORCH_TUNABLEOP_TUNING=0``
    (PyTorch's TunableOp docs: tuning is on by default once enabled). With several ranks each one tunes on its own
    while the others wait at the next collective; the tuning ignores its duration and iteration caps there and the
    job looks hung (pytorch/pytorch#190433).

    Raises:
        ConfigError: naming both variables and the world size.
    """
    if not truthy(environ.get("PYTORCH_TUNABLEOP_ENABLED", "0")) or world_size <= 1:
        return
    if not truthy(environ.get("PYTORCH_TUNABLEOP_TUNING", "1")):
        return
    where = environment_variable("PYTORCH_TUNABLEOP_TUNING", environ)
    where += " (tuning is on by default)" if "PYTORCH_TUNABLEOP_TUNING" not in environ else ""
    raise ConfigError(
        f"{environment_variable('PYTORCH_TUNABLEOP_ENABLED', environ)} with {where} in a job of {world_size} "
        "ranks: online tuning across ranks ignores its caps and looks like a hang (pytorch/pytorch#190433).",
        "Set PYTORCH_TUNABLEOP_TUNING=0 for this job, with PYTORCH_TUNABLEOP_FILENAME=<file> written by a "
        "one-process run of the same model and CUTOFF_LEN.",
    )


@rule("launch", 20)
def tunableop(plan: Plan) -> None:
    """:func:`tunableop_online_tuning` for this job's world size (NNODES × processes per node, or the
    scheduler's task count).

    Raises:
        ConfigError: see there.
    """
    tunableop_online_tuning(plan.settings.environ, plan.job.world_size)


# GPU visibility (ROCm docs, "GPU isolation techniques" and "HIP environment variables"): ROCR_VISIBLE_DEVICES is
# applied by the ROCm runtime to the physical GPUs (indices or UUIDs); HIP_VISIBLE_DEVICES, or CUDA_VISIBLE_DEVICES
# (its CUDA-compatible name), then indexes into the GPUs ROCR left. So ROCR_VISIBLE_DEVICES=2,3 with
# HIP_VISIBLE_DEVICES=2,3 leaves no GPU (Parsl#3858, ray-project/ray#53737). On NVIDIA only CUDA_VISIBLE_DEVICES counts.
VISIBILITY = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _devices(value: str) -> list[str]:
    return [token.strip() for token in value.split(",") if token.strip()]


def visible_gpus(environ: Mapping[str, str], backend: str) -> tuple[list[str] | None, list[str]]:
    """The physical GPUs the training processes see, in device order, and the warnings.

    Args:
        environ: the environment; backend: the probed device's ``rocm``, ``cuda`` or ``cpu``.

    Returns:
        ``(physical, warnings)``: ``physical[i]`` is what local device ``i`` (local rank ``i``) is, as ROCR names it
        (an index or a UUID) — a ``ROCR_VISIBLE_DEVICES``-relative index when only HIP/CUDA is set; None when no
        variable is set (every GPU, in the runtime's order).

    Raises:
        ConfigError: the variables together leave no GPU (an index beyond what the earlier one left), or
            HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES disagree on ROCm.
    """
    given = {name: environ[name] for name in VISIBILITY if name in environ}
    if backend == "cuda":
        given = {k: v for k, v in given.items() if k == "CUDA_VISIBLE_DEVICES"}
    if not given:
        return None, []
    shown = ", ".join(environment_variable(k, given) for k in given)
    warnings: list[str] = []
    hip, cuda = given.get("HIP_VISIBLE_DEVICES"), given.get("CUDA_VISIBLE_DEVICES")
    # single-shot: which of HIP/CUDA_VISIBLE_DEVICES indexes into ROCR's GPUs is known only once they agree
    if hip is not None and cuda is not None and _devices(hip) != _devices(cuda):
        raise ConfigError(f"GPU visibility disagrees: {shown}: HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are one "
                          "setting to ROCm's HIP runtime under two names.",
                          f"Unset CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES={hip} is ROCm's own name for the "
                          "setting), or give it the same list.")  # fmt: skip
    later = hip if hip is not None else cuda
    later_name = "HIP_VISIBLE_DEVICES" if hip is not None else "CUDA_VISIBLE_DEVICES"
    rocr = given.get("ROCR_VISIBLE_DEVICES")
    physical = _devices(rocr) if rocr is not None else None
    if later is not None:
        picks = _devices(later)
        if physical is None:
            physical = picks
        elif all(whole_number(p) is not None for p in picks):
            beyond = [p for p in picks if whole_number(p) >= len(physical)]
            if beyond:
                raise ConfigError(
                    f"GPU visibility hides GPUs: {shown}. {later_name} indexes into the {len(physical)} GPU(s) "
                    f"ROCR_VISIBLE_DEVICES leaves (0..{len(physical) - 1}), so {', '.join(beyond)} do not exist and "
                    f"the run would see {len(picks) - len(beyond)} GPU(s).",
                    f"Set only ROCR_VISIBLE_DEVICES={','.join(physical)} and unset {later_name}: they are applied "
                    "one after the other, not as one list.",
                )  # fmt: skip
            physical = [physical[int(p)] for p in picks]
        if rocr is not None:
            warnings.append(f"{shown}: several GPU-visibility variables are applied one after the other; "
                            "one (ROCR_VISIBLE_DEVICES on Linux) says the same and cannot hide GPUs "
                            "by accident.")  # fmt: skip
    return physical, warnings


@rule("inputs", 60)
def gpu_visibility(run: Inputs) -> list[str]:
    """Normalise ROCR/HIP/CUDA_VISIBLE_DEVICES to the GPUs the run will see, print the local rank → physical GPU
    map, and refuse combinations that hide GPUs (:func:`visible_gpus`).

    Raises:
        ConfigError: see :func:`visible_gpus`.
    """
    from rocmft.console import say

    environ = run.settings.environ
    physical, warnings = visible_gpus(environ, run.device.backend)
    if physical is not None:
        if not physical:
            warnings.append("the GPU-visibility variables hide every GPU: the run is on the CPU")
        else:
            say("GPUs: " + ", ".join(f"local rank {i} -> GPU {p}" for i, p in enumerate(physical)) +
                " (" + ", ".join(f"{k}={environ[k]}" for k in VISIBILITY if k in environ) + ")")  # fmt: skip
    return warnings


__all__ = [
    "allocator_findings",
    "allocator_variables",
    "gpu_visibility",
    "parse_alloc_conf",
    "tunableop",
    "tunableop_online_tuning",
    "visible_gpus",
]
