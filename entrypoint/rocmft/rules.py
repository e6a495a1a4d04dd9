"""Rules over the rendered configuration, the user's DeepSpeed config and the model's metadata, checked before
anything loads. Each rule catches a kind of mistake (docs/rules.md lists them with the reports behind them);
violations are :class:`ConfigError` (exit 2) naming the variables and files involved, and a few are warnings.

Run by :func:`rocmft.render.render` on the parsed-back arguments, so what is checked is what would run.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from .errors import ConfigError

# ds_config keys transformers fills when they are "auto" (transformers.integrations.deepspeed,
# HfTrainerDeepSpeedConfig.trainer_config_process/_finalize); "auto" anywhere else reaches DeepSpeed as a string.
AUTO_FILLED = {
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.total_num_steps",
    "scheduler.params.warmup_num_steps", "fp16.enabled", "bf16.enabled", "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
}  # fmt: skip
# Learning rates outside this range are almost always a typo (1e4 for 1e-4) or a units mistake: a warning.
# Fine-tuning recipes use 1e-6 (full) to 5e-4 (LoRA) (LLaMA-Factory's examples/, the PEFT docs).
SANE_LEARNING_RATE = (1e-7, 1e-2)


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _autos(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict):
        return [p for key, value in tree.items() for p in _autos(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if tree == "auto" else []


def user_ds_config(arguments: dict[str, Any], world_size: int, source: str) -> list[str]:
    """Check a DeepSpeed config the user gave (DEEPSPEED=path) against the trainer arguments.

    Rules: ``train_batch_size`` = micro-batch × accumulation × world size (DeepSpeed's own identity);
    literals that transformers would compare (batch, accumulation, clipping, learning rate, warmup, fp16/bf16)
    must equal the trainer's values, every mismatched pair listed; ``"auto"`` only in keys transformers fills
    (:data:`AUTO_FILLED`). Returns nothing; raises on the first rule that fails.

    Raises:
        ConfigError: the file is missing or not JSON, or a rule fails (message lists every offending key).
    """
    path = Path(str(arguments["deepspeed"])).expanduser()
    try:
        ds = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"DEEPSPEED={path} ({source}) cannot be read as JSON: {err}.",
                          "Point DEEPSPEED at a DeepSpeed JSON config, or use ROCMFT_DISTRIBUTED=deepspeed "
                          "(rocmft renders one from the same settings as the trainer).") from err  # fmt: skip
    micro = int(arguments.get("per_device_train_batch_size") or 8)
    accumulation = int(arguments.get("gradient_accumulation_steps") or 1)
    expected = {
        "train_micro_batch_size_per_gpu": (micro, "PER_DEVICE_TRAIN_BATCH_SIZE"),
        "gradient_accumulation_steps": (accumulation, "GRADIENT_ACCUMULATION_STEPS"),
        "train_batch_size": (micro * accumulation * world_size,
                             f"micro-batch {micro} x accumulation {accumulation} x world size {world_size}"),
        "gradient_clipping": (float(arguments.get("max_grad_norm", 1.0)), "MAX_GRAD_NORM"),
        "optimizer.params.lr": (float(arguments.get("learning_rate", 5e-5)), "LEARNING_RATE"),
        "scheduler.params.warmup_max_lr": (float(arguments.get("learning_rate", 5e-5)), "LEARNING_RATE"),
        "fp16.enabled": (bool(arguments.get("fp16")), "FP16 (rocmft's precision policy)"),
        "bf16.enabled": (bool(arguments.get("bf16")), "BF16 (rocmft's precision policy)"),
    }  # fmt: skip
    warmup = arguments.get("warmup_steps")
    if isinstance(warmup, int) and warmup >= 1:
        expected["scheduler.params.warmup_num_steps"] = (warmup, "WARMUP_STEPS")
    mismatched = []
    for key, (want, name) in expected.items():
        have = _get(ds, key)
        if have is None or have == "auto":
            continue
        if isinstance(want, bool) and isinstance(have, str):
            have = have.strip().lower() in ("true", "1", "yes")
        if have != want:
            mismatched.append(f"{key}={have!r} vs {name}={want!r}")
    if mismatched:
        raise ConfigError(
            f"DEEPSPEED={path} contradicts the trainer: " + "; ".join(mismatched) + ".",
            'Set those keys to "auto" (transformers fills them from the trainer arguments), or change the '
            "variables named; or use ROCMFT_DISTRIBUTED=deepspeed and let rocmft render the config.",
        )
    unfilled = [key for key in _autos(ds) if key not in AUTO_FILLED]
    if unfilled:
        raise ConfigError(
            f'DEEPSPEED={path} leaves "auto" in keys nothing fills: {", ".join(unfilled)}; DeepSpeed would get '
            'the string "auto".',
            f'Give them values (only these may be "auto": {", ".join(sorted(AUTO_FILLED))}).',
        )
    return []


def model_linear_names(model_dir: Path) -> set[str] | None:
    """Names of the model's 2-D weight modules (``q_proj``, ``down_proj``, …), from the weight index or the
    safetensors headers, without loading a weight; None when the model is not a local folder with them."""
    keys: list[str] = []
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        keys = list(json.loads(index.read_text()).get("weight_map", {}))
        shapes = None
    else:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            return None
        shapes = {}
        for file in files:
            with file.open("rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
            shapes.update({k: v.get("shape") for k, v in header.items() if k != "__metadata__"})
        keys = list(shapes)
    names = set()
    for key in keys:
        if not key.endswith(".weight"):
            continue
        if shapes is not None and len(shapes.get(key) or []) != 2:
            continue
        names.add(key[: -len(".weight")].split(".")[-1])
    # embeddings and norms are not LoRA targets; the index gives no shapes, so drop them by name
    return {n for n in names if "norm" not in n and "embed" not in n and n != "lm_head"}


def lora_target(arguments: dict[str, Any], source: str) -> None:
    """LORA_TARGET names only modules the model has (``all`` always does).

    Raises:
        ConfigError: listing the unknown names and the model's linear module names.
    """
    if arguments.get("finetuning_type", "lora") != "lora":
        return
    value = arguments.get("lora_target", "all")
    wanted = [t.strip() for t in (value if isinstance(value, list) else str(value).split(",")) if t.strip()]
    if not wanted or wanted == ["all"]:
        return
    model_dir = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    found = model_linear_names(model_dir) if model_dir.is_dir() else None
    if not found:
        return
    unknown = [t for t in wanted if t not in found]
    if unknown:
        raise ConfigError(
            f"LORA_TARGET={','.join(wanted)} ({source}) names no module of {model_dir}: {', '.join(unknown)}.",
            f"Use `all`, or names among the model's linear modules: {', '.join(sorted(found))}.",
        )


def ranges(arguments: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """Values by meaning: LORA_RANK and CUTOFF_LEN positive, CUTOFF_LEN within the model's context length
    (max_position_embeddings of config.json; a warning when the value is the template's default, not the
    user's); a learning rate outside :data:`SANE_LEARNING_RATE` is a warning.

    Returns:
        Warnings (one line each).

    Raises:
        ConfigError: naming the variable, its value and where it came from.
    """

    def where(name: str) -> str:
        return sources.get(name, "default")

    for name in ("lora_rank", "cutoff_len", "per_device_train_batch_size", "gradient_accumulation_steps"):
        value = arguments.get(name)
        if isinstance(value, (int, float)) and value <= 0:
            raise ConfigError(f"{name.upper()}={value} ({where(name)}) must be positive.",
                              f"Set {name.upper()} to a positive number.")  # fmt: skip
    rate = arguments.get("learning_rate")
    if isinstance(rate, (int, float)) and rate <= 0:
        raise ConfigError(f"LEARNING_RATE={rate} ({where('learning_rate')}) must be positive.",
                          "Set LEARNING_RATE, e.g. 1e-4 for LoRA, 1e-5 for full fine-tuning.")  # fmt: skip
    warnings = []
    if isinstance(rate, (int, float)) and not SANE_LEARNING_RATE[0] <= rate <= SANE_LEARNING_RATE[1]:
        warnings.append(f"LEARNING_RATE={rate} ({where('learning_rate')}) is outside {SANE_LEARNING_RATE[0]:g}.."
                        f"{SANE_LEARNING_RATE[1]:g}, where fine-tuning recipes live: a typo?")  # fmt: skip
    config = Path(str(arguments.get("model_name_or_path", ""))).expanduser() / "config.json"
    cutoff = arguments.get("cutoff_len")
    if config.is_file() and isinstance(cutoff, int):
        try:
            context = json.loads(config.read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            context = None
        if isinstance(context, int) and cutoff > context and not arguments.get("rope_scaling"):
            message = (f"CUTOFF_LEN={cutoff} ({where('cutoff_len')}) is beyond the model's context length "
                       f"({context}, max_position_embeddings in {config})")  # fmt: skip
            if "cutoff_len" in sources and "default" not in sources["cutoff_len"]:
                fix = f"Set CUTOFF_LEN to at most {context}, or extend the context with ROPE_SCALING."
                raise ConfigError(message + ".", fix)
            # a template default the user never chose: only samples longer than the context are affected
            warnings.append(message + f": set CUTOFF_LEN to at most {context}.")
    return warnings


def fp16_on_bf16_model(arguments: dict[str, Any], bf16_gpu: bool, source: str) -> None:
    """fp16 training of a model whose weights are bf16 on a GPU that has bf16: bf16-trained weights and
    activations exceed fp16's range (max 65504), the known cause of NaN or zero losses; bf16 is the fix.

    Raises:
        ConfigError: naming the precision setting and the model's dtype.
    """
    if not arguments.get("fp16") or not bf16_gpu:
        return
    config = Path(str(arguments.get("model_name_or_path", ""))).expanduser() / "config.json"
    try:
        loaded = json.loads(config.read_text())
    except (OSError, ValueError):
        return
    dtype = loaded.get("torch_dtype") or loaded.get("dtype")
    if dtype == "bfloat16":
        raise ConfigError(
            f"fp16 ({source}) for {config.parent}, whose weights are bfloat16, on a GPU with bf16: values beyond "
            "fp16's range turn into Inf/NaN (NaN or zero loss).",
            "Use ROCMFT_PRECISION=bf16 (or auto, which picks it here).",
        )


def _user_set(name: str, sources: dict[str, str]) -> bool:
    """Whether the user chose ``name`` (environment or ROCMFT_CONFIG), not a template or built-in default."""
    return name in sources and "default" not in sources[name]


def quoted_values(arguments: dict[str, Any], sources: dict[str, str]) -> None:
    """Text values wrapped in matching quotes: ``docker run --env-file`` and some .env loaders keep them, so
    TEMPLATE="qwen" reaches LLaMA-Factory as the seven characters ``"qwen"``.

    Raises:
        ConfigError: naming each variable.
    """
    quoted = [f"{name.upper()}={value}" for name, value in arguments.items()
              if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"
              and _user_set(name, sources)]  # fmt: skip
    if quoted:
        fix = "Remove the quotes in the .env file (docker --env-file passes them on as they are)."
        raise ConfigError(f"Values with their quotes still on: {', '.join(quoted)}.", fix)


def template(arguments: dict[str, Any], sources: dict[str, str]) -> None:
    """TEMPLATE is one of the installed LLaMA-Factory's chat templates (llamafactory.data.template.TEMPLATES);
    LLaMA-Factory itself finds out only after loading the tokenizer.

    Raises:
        ConfigError: with a did-you-mean among the template names.
    """
    import difflib

    from llamafactory.data.template import TEMPLATES

    name = arguments.get("template")
    if name is None or name in TEMPLATES:
        return
    close = difflib.get_close_matches(str(name), list(TEMPLATES), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    raise ConfigError(
        f"TEMPLATE={name} ({sources.get('template', 'default')}) is not a chat template of the installed "
        f"LLaMA-Factory.{hint}",
        "Use the template of the model's family (qwen for Qwen2/2.5, llama3 for Llama 3, ...): LLaMA-Factory's "
        "README lists them.",
    )


def method_settings(arguments: dict[str, Any], sources: dict[str, str]) -> None:
    """Settings of a fine-tuning method that is not the one chosen (LORA_RANK with FINETUNING_TYPE=full): they
    would be ignored without a word. The method's settings are the fields of LLaMA-Factory's own LoraArguments /
    FreezeArguments / OFTArguments dataclasses.

    Raises:
        ConfigError: naming the settings and the method.
    """
    import dataclasses

    from llamafactory.hparams.finetuning_args import FreezeArguments, LoraArguments, OFTArguments

    chosen = arguments.get("finetuning_type", "lora")
    owners = {"lora": LoraArguments, "freeze": FreezeArguments, "oft": OFTArguments}
    stray = [f"{f.name.upper()} ({method})" for method, cls in owners.items() if method != chosen
             for f in dataclasses.fields(cls) if _user_set(f.name, sources)]  # fmt: skip
    if stray:
        raise ConfigError(f"FINETUNING_TYPE={chosen} ignores {', '.join(stray)}.",
                          "Remove them, or set FINETUNING_TYPE to the method they belong to.")  # fmt: skip


def output_not_input(arguments: dict[str, Any], sources: dict[str, str]) -> None:
    """OUTPUT_DIR is neither the model's folder (or inside it) nor the data folder: saving there overwrites the
    base weights (`model.safetensors`) or mixes results into the data.

    Raises:
        ConfigError: naming both paths.
    """
    output = Path(str(arguments.get("output_dir", ""))).expanduser().resolve()
    model = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    if model.is_dir() and (output == model.resolve() or model.resolve() in output.parents):
        raise ConfigError(f"OUTPUT_DIR {output} ({sources.get('output_dir')}) is the model's folder "
                          f"{model} or inside it: saving would overwrite the base model.",
                          "Set OUTPUT_DIR to a folder of its own (saves/<run name> by default).")  # fmt: skip


# Fields that are probabilities or fractions: a value of 1 or more is a percent typed as a number (5 for 5%).
FRACTIONS = ("lora_dropout", "hidden_dropout", "attention_dropout", "val_size", "warmup_ratio", "weight_decay")


def more_ranges(arguments: dict[str, Any], sources: dict[str, str]) -> None:
    """Dropouts and fractions in [0, 1); a run with no epochs and no max steps trains nothing.

    Raises:
        ConfigError: naming the variable and its value.
    """
    for name in FRACTIONS:
        value = arguments.get(name)
        if isinstance(value, (int, float)) and not 0 <= value < 1 and _user_set(name, sources):
            raise ConfigError(f"{name.upper()}={value} ({sources[name]}) must be in [0, 1).",
                              f"A fraction: {name.upper()}={value / 100:g} if you meant {value:g} %.")  # fmt: skip
    epochs, steps = arguments.get("num_train_epochs"), arguments.get("max_steps")
    if isinstance(epochs, (int, float)) and epochs <= 0 and not (isinstance(steps, int) and steps > 0):
        raise ConfigError(f"NUM_TRAIN_EPOCHS={epochs} ({sources.get('num_train_epochs', 'default')}) and no "
                          "MAX_STEPS: the run would train nothing and save the base model as its result.",
                          "Set NUM_TRAIN_EPOCHS > 0 or MAX_STEPS > 0.")  # fmt: skip
