"""Training arguments from the environment: every argument of the installed LLaMA-Factory read by its
UPPER_SNAKE_CASE name, typed by its own annotation and read leniently (``true``, ``a,b``), and the refusal of
variables that look meant for rocmft but are not understood (a misspelled ``ROCMFT_`` variable, a removed or
misspelled argument), with a did-you-mean. Also: pydantic-settings models read from a mapping (the run's
snapshot) instead of ``os.environ``. Used by :func:`rocmft.config.settings.load_settings`.
"""

from __future__ import annotations

import difflib
import functools
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, create_model
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from rocmft.config.knobs import PREFIX, RocmftSettings
from rocmft.config.lfargs import NOT_FROM_ENVIRONMENT, env_arguments, lf_arguments, stack_versions
from rocmft.testhooks import VARIABLES as TEST_HOOK_VARIABLES


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


# Variables that torch, ROCm and the launcher read from the process's environment (rocmft's runtime and launch rules
# check several: the allocator's, GPU visibility, WORLD_SIZE, TunableOp's): a YAML or command-line key by such a name
# is told where it goes.
PROCESS_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "NPROC_PER_NODE", "MASTER_ADDR",
                 "MASTER_PORT")  # fmt: skip
PROCESS_PREFIXES = ("PYTORCH_", "TORCH_", "CUDA_", "HIP_", "HSA_", "ROCR_", "ROCM_", "NCCL_", "RCCL_", "MIOPEN_",
                    "HIPBLASLT_", "OMP_")  # fmt: skip


def _process_variable_hint(key: str, value: Any = None) -> str | None:
    """For a YAML or command-line key that names a variable of the process's environment (``pytorch_alloc_conf``,
    ``hip_visible_devices``, ``world_size``): where it goes instead, since those keys take LLaMA-Factory's
    arguments only. None for other keys, and for one that comes close to an argument's name (a typo of
    ``torch_compile`` is told the argument). A secret's value is not repeated."""
    from rocmft.config.lfargs import is_secret_name

    upper = key.upper()
    if upper not in PROCESS_NAMES and not upper.startswith(PROCESS_PREFIXES):
        return None
    if key.lower() in lf_arguments() or difflib.get_close_matches(key.lower(), list(lf_arguments()), 1, TYPO_CUTOFF):
        return None
    variable = upper + ("" if value is None or is_secret_name(key) else f"={value}")
    return ("a variable torch, ROCm or the launcher reads from the process's environment, not a LLaMA-Factory "
            f"argument: set {variable} in the environment")  # fmt: skip


def _is_foreign(name: str) -> bool:
    owned_elsewhere = {n.upper() for n in NOT_FROM_ENVIRONMENT}
    return name in FOREIGN_NAMES or name in owned_elsewhere or name.startswith(FOREIGN_PREFIXES)


def _did_you_mean(name: str, candidates: list[str], cutoff: float = 0.6) -> str:
    matches = difflib.get_close_matches(name, candidates, n=3, cutoff=cutoff)
    return f" Did you mean {' or '.join(matches)}?" if matches else ""


def _rocmft_variables() -> list[str]:
    """The environment variable of every rocmft setting (``ROCMFT_`` + a :class:`RocmftSettings` field), sorted."""
    return sorted(PREFIX + name.upper() for name in RocmftSettings.model_fields)


def unknown_variable_errors(environ: Mapping[str, str]) -> dict[str, str]:
    """Messages for variables that look meant for rocmft but are not understood by it, by variable name (sorted).

    * every ``ROCMFT_*`` variable that is not a field of :class:`RocmftSettings`, the test hooks' variables
      (rocmft.testhooks: ROCMFT_TEST_PROBES, ROCMFT_FAULT_*) named as such;
    * every other variable that is not a training argument of the installed LLaMA-Factory, does not belong
      to known other software (:data:`FOREIGN_PREFIXES`, :data:`FOREIGN_NAMES`) and comes within
      :data:`TYPO_CUTOFF` of an argument name.
    """
    known_rocmft = _rocmft_variables()
    arguments = env_arguments()
    versions = stack_versions()
    errors: dict[str, str] = {}
    for name in sorted(environ):
        upper = name.upper()
        if upper.startswith(PREFIX):
            if upper in TEST_HOOK_VARIABLES:
                errors[name] = f"{name} is a test hook of rocmft's own tests; the rocmft command does not read it."
            elif upper not in known_rocmft:
                errors[name] = f"{name} is not a rocmft setting.{_did_you_mean(upper, known_rocmft)}"
            continue
        if upper in arguments or _is_foreign(upper) or not name.isupper():
            continue
        if replacement(upper):
            errors[name] = (
                f"{name} is not an argument of the installed LLaMA-Factory {versions['llamafactory']} / "
                f"transformers {versions['transformers']}: {replacement(upper)}."
            )
            continue
        close = difflib.get_close_matches(upper, list(arguments), n=2, cutoff=TYPO_CUTOFF)
        if close:
            errors[name] = (
                f"{name} is not an argument of the installed LLaMA-Factory {versions['llamafactory']} / "
                f"transformers {versions['transformers']} (it may have been removed or renamed). "
                f"Did you mean {' or '.join(close)}?"
            )
    return errors


def case_twin_errors(environ: Mapping[str, str]) -> list[str]:
    """Messages for one setting given twice in ``environ`` under names that differ only in case, with different
    values (``LEARNING_RATE=1e-4`` and ``learning_rate=-1``). rocmft reads names in any case (pydantic-settings'
    ``case_sensitive=False``) and keeps whichever spelling comes last in the environment's order, so the value a run
    used, and the name its messages gave it, depended on that order (a newcomer's trial, 2026-12-05). Only names
    rocmft reads count: training arguments and ``ROCMFT_`` settings. A secret's values are not repeated."""
    from rocmft.config.lfargs import is_secret_name

    known = set(env_arguments()) | set(_rocmft_variables())
    spellings: dict[str, list[str]] = {}
    for name in sorted(environ):
        if name.upper() in known:
            spellings.setdefault(name.upper(), []).append(name)
    errors = []
    for names in spellings.values():
        if len({environ[name] for name in names}) > 1:
            shown = " and ".join(name if is_secret_name(name) else f"{name}={environ[name]}" for name in names)
            errors.append(f"{shown} are set in the environment and name one setting (rocmft reads a name in any "
                          "case), so which value the run takes would depend on the environment's order.")  # fmt: skip
    return errors


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


__all__ = ["FOREIGN_NAMES", "FOREIGN_PREFIXES", "REPLACED", "TYPO_CUTOFF", "replacement", "unknown_variable_errors"]
