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

from rocmft.errors import ConfigError
from rocmft.facts.modeldir import MARKER, ModelDir, looks_like_path

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
    offload settings DeepSpeed can honour (:func:`ds_offload`);
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
    ds_offload(ds, path)
    unfilled = [key for key in _autos(ds) if key not in AUTO_FILLED]
    if unfilled:
        raise ConfigError(
            f'DEEPSPEED={path} leaves "auto" in keys nothing fills: {", ".join(unfilled)}; DeepSpeed would get '
            'the string "auto".',
            f'Give them values (only these may be "auto": {", ".join(sorted(AUTO_FILLED))}).',
        )
    return []


def ds_offload(ds: dict[str, Any], path: Path) -> None:
    """Offload settings of a user's ds_config that DeepSpeed cannot honour (DeepSpeed's config docs,
    "ZeRO optimizations"): ``offload_param`` exists only in ZeRO stage 3 (lower stages keep whole parameters
    on every GPU) and ``offload_optimizer`` needs stage 1 or more; ``device: nvme`` needs ``nvme_path``, a folder
    that exists (DeepSpeed's AIO swapper writes its swap files there and fails at the first swap otherwise).

    Raises:
        ConfigError: naming the file, the keys and the stage.
    """
    zero = ds.get("zero_optimization") or {}
    try:
        stage = int(zero.get("stage", 0))
    except (TypeError, ValueError):
        return
    problems = []
    for key, lowest in (("offload_param", 3), ("offload_optimizer", 1)):
        block = zero.get(key)
        if not isinstance(block, dict) or str(block.get("device", "none")).lower() in ("none", ""):
            continue
        if stage < lowest:
            problems.append(f"zero_optimization.{key} (device {block.get('device')}) needs ZeRO stage {lowest}, "
                            f"the file has stage {stage}")  # fmt: skip
        if str(block.get("device")).lower() == "nvme":
            nvme = block.get("nvme_path")
            if not nvme:
                problems.append(f"zero_optimization.{key}.device is nvme but there is no nvme_path")
            elif not Path(str(nvme)).is_dir():
                problems.append(f"zero_optimization.{key}.nvme_path={nvme} is not a folder here")
    if problems:
        raise ConfigError(
            f"DEEPSPEED={path}: " + "; ".join(problems) + ".",
            "Use ZeRO stage 3 for parameter offload (ROCMFT_DISTRIBUTED=deepspeed with ROCMFT_ZERO_STAGE=3 and "
            "ROCMFT_OFFLOAD=optimizer+params renders it), or remove the offload block; for nvme, set nvme_path to "
            "a folder on a fast local disk mounted into the container.",
        )


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
    found = ModelDir(model_dir).linear_names() if model_dir.is_dir() else None
    if not found:
        return
    unknown = [t for t in wanted if t not in found]
    spaced = [t for t in unknown if len(t.split()) > 1 and all(part in found for part in t.split())]
    if spaced:
        raise ConfigError(f"LORA_TARGET={','.join(wanted)} ({source}) separates module names with spaces.",
                          f"Separate them with commas: LORA_TARGET={','.join(spaced[0].split())}.")  # fmt: skip
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
    model = ModelDir(str(arguments.get("model_name_or_path", "")))
    config = model.config_path
    cutoff = arguments.get("cutoff_len")
    if config.is_file() and isinstance(cutoff, int):
        context = model.max_position_embeddings()
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
    model = ModelDir(str(arguments.get("model_name_or_path", "")))
    config = model.config_path
    try:
        loaded = model.config_json()
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

    from rocmft.config.lfargs import chat_templates

    names = chat_templates()
    name = arguments.get("template")
    if name is None or name in names:
        return
    close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.6)
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
    from rocmft.config.lfargs import lf_arguments

    chosen = arguments.get("finetuning_type", "lora")
    owners = {"LoraArguments": "lora", "FreezeArguments": "freeze", "OFTArguments": "oft"}
    stray = [f"{a.name.upper()} ({owners[a.group]})" for a in lf_arguments().values()
             if owners.get(a.group, chosen) != chosen and _user_set(a.name, sources)]  # fmt: skip
    if stray:
        raise ConfigError(f"FINETUNING_TYPE={chosen} ignores {', '.join(stray)}.",
                          "Remove them, or set FINETUNING_TYPE to the method they belong to.")  # fmt: skip


def output_not_input(arguments: dict[str, Any], sources: dict[str, str], data_dir: Path | None = None) -> None:
    """OUTPUT_DIR is neither the model's folder (or inside it) nor the data folder ``data_dir`` (DATASET_DIR, or
    inside it): saving there overwrites the base weights (`model.safetensors`) or writes into the data, which
    the README promises is never written to (and is often a read-only mount).

    Raises:
        ConfigError: naming both paths.
    """
    output = Path(str(arguments.get("output_dir", ""))).expanduser().resolve()
    model = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    if model.is_dir() and (output == model.resolve() or model.resolve() in output.parents):
        raise ConfigError(f"OUTPUT_DIR {output} ({sources.get('output_dir')}) is the model's folder "
                          f"{model} or inside it: saving would overwrite the base model.",
                          "Set OUTPUT_DIR to a folder of its own (saves/<run name> by default).")  # fmt: skip
    if data_dir is not None and data_dir.is_dir() and (output == data_dir.resolve() or data_dir.resolve() in
                                                       output.parents):  # fmt: skip
        raise ConfigError(f"OUTPUT_DIR {output} ({sources.get('output_dir')}) is the data folder DATASET_DIR "
                          f"{data_dir} or inside it: results and checkpoints would be written into the data.",
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
            fix = (f"A fraction: {name.upper()}={value / 100:g} if you meant {value:g} %." if value >= 1
                   else f"A fraction between 0 and 1 (e.g. {name.upper()}=0.05), or 0 for none.")  # fmt: skip
            raise ConfigError(f"{name.upper()}={value} ({sources[name]}) must be in [0, 1).", fix)
    epochs, steps = arguments.get("num_train_epochs"), arguments.get("max_steps")
    if isinstance(epochs, (int, float)) and epochs <= 0 and not (isinstance(steps, int) and steps > 0):
        raise ConfigError(f"NUM_TRAIN_EPOCHS={epochs} ({sources.get('num_train_epochs', 'default')}) and no "
                          "MAX_STEPS: the run would train nothing and save the base model as its result.",
                          "Set NUM_TRAIN_EPOCHS > 0 or MAX_STEPS > 0.")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Rules found by trying wrong .env files as a new user (docs/rules.md, "Tried as a new user")

# Arguments that hold a path (a folder or file inside the container).
PATH_ARGUMENTS = ("model_name_or_path", "adapter_name_or_path", "dataset_dir", "output_dir", "deepspeed",
                  "resume_from_checkpoint", "cache_dir", "tokenized_path", "media_dir", "logging_dir")  # fmt: skip


def text_hygiene(arguments: dict[str, Any], sources: dict[str, str]) -> None:
    """Values the user set that carry invisible characters or a host path the container cannot have:
    leading/trailing spaces and tabs (``DATASET=alpaca_en_demo `` in a .env file), a carriage return (a .env
    saved with Windows CRLF line endings: ``docker --env-file`` keeps the ``\r``), a Windows path
    (``C:\\models\\qwen``; the container sees Linux paths of mounted volumes only).

    Raises:
        ConfigError: naming each variable with its value shown by ``repr``.
    """
    empty = [name.upper() for name, value in arguments.items() if value == "" and _user_set(name, sources)]
    if empty:
        raise ConfigError(f"Empty values: {', '.join(f'{n}=' for n in empty)}.",
                          "Give each a value, or remove the line (unset means the default).")  # fmt: skip
    spaced = [(name, value) for name, value in arguments.items()
              if isinstance(value, str) and value != value.strip() and _user_set(name, sources)]  # fmt: skip
    if spaced:
        shown = ", ".join(f"{name.upper()}={value!r} ({sources[name]})" for name, value in spaced)
        if any("\r" in value for _, value in spaced):
            raise ConfigError(f"Values end in a carriage return: {shown}: the .env file has Windows (CRLF) line "
                              "endings, which docker --env-file keeps.",
                              "Save the .env file with Unix (LF) line endings (dos2unix .env, or your editor's "
                              "line-ending setting).")  # fmt: skip
        raise ConfigError(f"Values with spaces around them: {shown}.", "Remove the spaces in the .env file.")
    windows = [
        f"{name.upper()}={value} ({sources.get(name, 'default')})"
        for name in PATH_ARGUMENTS
        if isinstance(value := arguments.get(name), str) and (value[1:3] in (":\\", ":/") or "\\" in value)
    ]
    if windows:
        raise ConfigError(f"Windows paths: {', '.join(windows)}; inside the container only Linux paths of mounted "
                          "folders exist.",
                          "Mount the folder into the container (compose: volumes, e.g. ./models:/models) and use the "
                          "path inside it (/models/<name>), with forward slashes.")  # fmt: skip


def folders(arguments: dict[str, Any], sources: dict[str, str], source_dir: Path, dataset_names: list[str]) -> None:
    """Paths that are the wrong kind of thing: MODEL_NAME_OR_PATH, DATASET_DIR or OUTPUT_DIR naming a file
    where a folder is needed; ADAPTER_NAME_OR_PATH or RESUME_FROM_CHECKPOINT naming a path that does not exist;
    a DATASET that is a model folder or a MODEL_NAME_OR_PATH that is a data set name (the two swapped).

    Raises:
        ConfigError: naming the variable, the path and what it is.
    """
    model = str(arguments.get("model_name_or_path") or "")
    checks = [
        ("MODEL_NAME_OR_PATH", Path(model).expanduser() if model else None, sources.get("model_name_or_path")),
        ("DATASET_DIR", source_dir, "DATASET_DIR" if "(DATASET_DIR)" in sources.get("dataset_dir", "") else "default"),
        ("OUTPUT_DIR", Path(str(arguments.get("output_dir", ""))).expanduser(), sources.get("output_dir")),
    ]
    for variable, path, source in checks:
        if path is not None and path.is_file():
            parent = f" (its folder {path.parent} may be what you meant)" if variable != "OUTPUT_DIR" else ""
            raise ConfigError(f"{variable}={path} ({source}) is a file, not a folder{parent}.",
                              f"Set {variable} to a folder: " + {
                                  "MODEL_NAME_OR_PATH": "the model's folder, with config.json and the weights.",
                                  "DATASET_DIR": "the folder holding the data files (and dataset_info.json); name "
                                                 "the file in DATASET.",
                                  "OUTPUT_DIR": "a new or empty folder for the run's results.",
                              }[variable])  # fmt: skip
    for name in ("adapter_name_or_path", "resume_from_checkpoint"):
        value = arguments.get(name)
        if not isinstance(value, str) or not _user_set(name, sources):
            continue
        missing = [item.strip() for item in value.split(",")
                   if looks_like_path(item.strip()) and not Path(item.strip()).expanduser().exists()]  # fmt: skip
        if missing:
            raise ConfigError(
                f"{name.upper()}={value} ({sources[name]}): {', '.join(missing)} does not exist here.",
                "Mount the folder into the container and use the path inside it, or remove the "
                f"variable{' (ROCMFT_RESUME=auto resumes from OUTPUT_DIR by itself)' if 'resume' in name else ''}.",
            )
    for name in dataset_names:
        folder = Path(name).expanduser()
        if (folder / "config.json").is_file() or (source_dir / name / "config.json").is_file():
            raise ConfigError(f"DATASET={name} ({sources.get('dataset', 'default')}) is a model folder (it has "
                              "config.json): MODEL_NAME_OR_PATH and DATASET look swapped.",
                              "MODEL_NAME_OR_PATH is the model (folder or hub id); DATASET names data sets in "
                              "DATASET_DIR (dataset_info.json names or .json/.jsonl file names).")  # fmt: skip
    if model and not looks_like_path(model) and not Path(model).exists() and source_dir.is_dir():
        from rocmft.render.datasets import available_names

        if model in available_names(source_dir) or model.removesuffix(".json") in available_names(source_dir):
            raise ConfigError(f"MODEL_NAME_OR_PATH={model} ({sources.get('model_name_or_path')}) is the name of a "
                              f"data set in {source_dir}, not a model: MODEL_NAME_OR_PATH and DATASET look swapped.",
                              "Set MODEL_NAME_OR_PATH to the model's folder or hub id and DATASET to the data set "
                              "name.")  # fmt: skip


# Stages that train on pairwise (chosen/rejected) data: LLaMA-Factory's DPO workflow loads its data as stage
# "rm" and llamafactory/data/loader.py refuses ranking data elsewhere ("The dataset is not applicable in the
# current training stage"), only after the model has loaded.
PAIRWISE_STAGES = ("rm", "dpo")


def stage_data(arguments: dict[str, Any], sources: dict[str, str], entries: dict[str, dict[str, Any]]) -> None:
    """The data sets fit STAGE: pairwise data (``"ranking": true`` with chosen/rejected) for rm and dpo and
    only there; kto needs a ``kto_tag`` column (LLaMA-Factory's data/README.md).

    Raises:
        ConfigError: naming STAGE, the data set and its dataset_info entry's relevant keys.
    """
    from rocmft.render.datasets import first_record

    stage = str(arguments.get("stage") or "sft")
    where = sources.get("stage", "default")
    for name, entry in entries.items():
        ranking = bool(entry.get("ranking"))
        columns = entry.get("columns", {})
        if stage in PAIRWISE_STAGES and not ranking:
            path = Path(str(entry.get("file_name", "")))
            record = first_record(path) if path.is_file() else None
            pairs = bool(record) and {"chosen", "rejected"} <= set(record)
            fix = (f'Add "ranking": true and "columns": {{..., "chosen": "chosen", "rejected": "rejected"}} to '
                   f"{name!r} in dataset_info.json." if pairs else
                   "Use a preference data set (chosen/rejected answers, \"ranking\": true in dataset_info.json; "
                   "LLaMA-Factory's data/README.md), or STAGE=sft for this one.")  # fmt: skip
            raise ConfigError(f"STAGE={stage} ({where}) trains on pairwise data, but data set {name!r} is not "
                              f"pairwise (no \"ranking\": true in its dataset_info entry"
                              f"{'; its records do have chosen/rejected' if pairs else ''}).", fix)  # fmt: skip
        if stage not in PAIRWISE_STAGES and ranking:
            raise ConfigError(f"STAGE={stage} ({where}) with data set {name!r}, which is pairwise (\"ranking\": "
                              "true, chosen/rejected answers): LLaMA-Factory refuses it after loading the model.",
                              "Set STAGE=dpo (or rm) for preference training, or use a data set of plain "
                              "instructions or conversations.")  # fmt: skip
        if stage == "kto" and "kto_tag" not in columns:
            raise ConfigError(f"STAGE=kto ({where}) needs a kto_tag column (true for a desirable answer, false for "
                              f"an undesirable one), and data set {name!r} maps none.",
                              f'Add "kto_tag": "<column>" to the "columns" of {name!r} in dataset_info.json, or '
                              "use STAGE=dpo with pairwise data.")  # fmt: skip


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def more_values(arguments: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """Values that are legal types but mean nothing useful, or settings that silently cancel each other.

    Errors: LORA_ALPHA ≤ 0 (the adapter's scale alpha/rank is then 0 or negative, peft's LoRA formula);
    WARMUP_STEPS < 0; MAX_GRAD_NORM < 0 (transformers clips only when > 0, so a negative value turns clipping
    off without a word); MAX_SAMPLES ≤ 0; QUANTIZATION_BIT other than 4 or 8 with bitsandbytes (its only
    widths, LLaMA-Factory's quantization docs); WARMUP_STEPS and WARMUP_RATIO both set (transformers uses the
    steps and ignores the ratio); INTERLEAVE_PROBS with MIX_STRATEGY=concat, of another length than the data
    sets, or not summing to 1 (datasets' interleave_datasets samples with these probabilities and fails at
    load time otherwise); STREAMING with a fractional VAL_SIZE (a stream has no length: LLaMA-Factory wants a
    count of records); EVAL_STEPS with EVAL_STRATEGY=no (evaluation would never run).

    Returns:
        Warnings: eval data that is never evaluated, SAVE_TOTAL_LIMIT=0 (keeps every checkpoint, transformers
        reads ≤ 0 as no limit), SAVE_STEPS beyond MAX_STEPS (no checkpoint before the end), an EVAL_DATASET
        that is also in DATASET.

    Raises:
        ConfigError: naming the variables and the fix.
    """

    def where(name: str) -> str:
        return sources.get(name, "default")

    def user(name: str) -> float | None:
        return _number(arguments.get(name)) if _user_set(name, sources) else None

    alpha = user("lora_alpha")
    if arguments.get("finetuning_type", "lora") == "lora" and alpha is not None and alpha <= 0:
        raise ConfigError(f"LORA_ALPHA={arguments['lora_alpha']} ({where('lora_alpha')}) must be positive: the "
                          "adapter's output is scaled by alpha / rank, so the fine-tune would change nothing.",
                          "Set LORA_ALPHA to a positive number (commonly 2 x LORA_RANK), or leave it unset "
                          "(LLaMA-Factory then uses 2 x LORA_RANK).")  # fmt: skip
    for name, fix in (
        ("warmup_steps", "Set WARMUP_STEPS to 0 or more (a count of steps, or a fraction below 1)."),
        ("max_grad_norm", "Set MAX_GRAD_NORM to a positive number (1.0 is usual), or 0 for no clipping."),
    ):
        value = user(name)
        if value is not None and value < 0:
            raise ConfigError(f"{name.upper()}={arguments[name]} ({where(name)}) is negative.", fix)
    samples = user("max_samples")
    if samples is not None and samples <= 0:
        raise ConfigError(f"MAX_SAMPLES={arguments['max_samples']} ({where('max_samples')}) leaves no records to "
                          "train on.", "Remove MAX_SAMPLES (all records) or set it to a positive count.")  # fmt: skip
    bits = _number(arguments.get("quantization_bit"))
    method = str(arguments.get("quantization_method") or "bnb").lower()
    if bits is not None and method in ("bnb", "bitsandbytes") and bits not in (4, 8):
        raise ConfigError(f"QUANTIZATION_BIT={arguments['quantization_bit']} ({where('quantization_bit')}) with "
                          "bitsandbytes, which quantizes to 4 or 8 bits only.",
                          "Set QUANTIZATION_BIT=4 (QLoRA) or 8, or choose another QUANTIZATION_METHOD that has "
                          "this width (hqq).")  # fmt: skip
    steps, ratio = user("warmup_steps"), user("warmup_ratio")
    if steps and ratio:
        raise ConfigError(f"WARMUP_STEPS={arguments['warmup_steps']} ({where('warmup_steps')}) and WARMUP_RATIO="
                          f"{arguments['warmup_ratio']} ({where('warmup_ratio')}) are both set: transformers uses the "
                          "steps and ignores the ratio.", "Keep one of them.")  # fmt: skip
    _interleave(arguments, where)
    val_size = _number(arguments.get("val_size")) or 0.0
    if arguments.get("streaming") and 0 < val_size < 1:
        raise ConfigError(f"STREAMING=true ({where('streaming')}) with VAL_SIZE={arguments['val_size']} "
                          f"({where('val_size')}): a streamed data set has no known length, so a fraction of it "
                          "cannot be held out.",
                          "Give VAL_SIZE as a count of records (VAL_SIZE=500), or set STREAMING=false.")  # fmt: skip
    strategy = str(arguments.get("eval_strategy") or "no").lower()
    has_eval = val_size > 0 or bool(arguments.get("eval_dataset"))
    if strategy == "no" and _user_set("eval_steps", sources):
        raise ConfigError(f"EVAL_STEPS={arguments['eval_steps']} ({where('eval_steps')}) with EVAL_STRATEGY=no "
                          f"({where('eval_strategy')}): evaluation would never run.",
                          "Set EVAL_STRATEGY=steps (and VAL_SIZE or EVAL_DATASET for the data), or remove "
                          "EVAL_STEPS.")  # fmt: skip
    warnings = []
    if strategy == "no" and has_eval:
        given = "VAL_SIZE" if val_size > 0 else "EVAL_DATASET"
        warnings.append(f"{given} is set but EVAL_STRATEGY=no: the evaluation data is never evaluated; set "
                        "EVAL_STRATEGY=steps (or epoch) to see an eval loss.")  # fmt: skip
    if _user_set("save_total_limit", sources) and _number(arguments.get("save_total_limit")) == 0:
        warnings.append("SAVE_TOTAL_LIMIT=0 keeps every checkpoint (transformers reads 0 as no limit); to save "
                        "none, set SAVE_STRATEGY=no; to keep the last N, SAVE_TOTAL_LIMIT=N.")  # fmt: skip
    max_steps, save_steps = _number(arguments.get("max_steps")), _number(arguments.get("save_steps"))
    if (max_steps and max_steps > 0 and save_steps and save_steps > max_steps
            and str(arguments.get("save_strategy") or "steps") == "steps"):  # fmt: skip
        warnings.append(
            f"SAVE_STEPS={arguments['save_steps']:g} is beyond MAX_STEPS={arguments['max_steps']}: no "
            "checkpoint is saved before the end, so an interrupted run starts over; lower SAVE_STEPS."
        )
    if (_user_set("save_steps", sources) and save_steps == 0
            and str(arguments.get("save_strategy") or "steps") == "steps"):  # fmt: skip
        warnings.append("SAVE_STEPS=0 with SAVE_STRATEGY=steps saves no checkpoint during the run (an interrupted "
                        "run starts over); set SAVE_STEPS to a number of steps, or SAVE_STRATEGY=no.")  # fmt: skip
    if _user_set("num_train_epochs", sources) and _user_set("max_steps", sources) and max_steps and max_steps > 0:
        warnings.append(f"NUM_TRAIN_EPOCHS={arguments['num_train_epochs']:g} is ignored: MAX_STEPS={max_steps:g} "
                        "decides the length of the run (transformers); unset one of them.")  # fmt: skip
    from rocmft.render.datasets import split_names

    both = set(split_names(arguments.get("dataset"))) & set(split_names(arguments.get("eval_dataset")))
    if both:
        warnings.append(
            f"EVAL_DATASET and DATASET share {', '.join(sorted(both))}: the eval loss is measured on "
            "training data and says nothing about generalisation; use VAL_SIZE or a held-out set."
        )
    return warnings


def _interleave(arguments: dict[str, Any], where) -> None:
    """INTERLEAVE_PROBS: only with an interleave MIX_STRATEGY, one number per data set, summing to 1."""
    from rocmft.render.datasets import split_names

    value = arguments.get("interleave_probs")
    if value in (None, ""):
        return
    source = where("interleave_probs")
    if str(arguments.get("mix_strategy") or "concat") == "concat":
        raise ConfigError(f"INTERLEAVE_PROBS={value} ({source}) with MIX_STRATEGY=concat, which ignores it.",
                          "Set MIX_STRATEGY=interleave_under (stop at the shortest data set) or interleave_over, "
                          "or remove INTERLEAVE_PROBS.")  # fmt: skip
    try:
        probs = [float(p) for p in split_names(value)]
    except ValueError as err:
        raise ConfigError(
            f"INTERLEAVE_PROBS={value} ({source}) is not a list of numbers.",
            "Give one probability per data set, comma-separated: INTERLEAVE_PROBS=0.7,0.3.",
        ) from err
    for variable in ("dataset", "eval_dataset"):
        names = split_names(arguments.get(variable))
        if names and len(names) != len(probs):
            raise ConfigError(
                f"INTERLEAVE_PROBS={value} ({source}) has {len(probs)} probabilities for the "
                f"{len(names)} data sets of {variable.upper()}={','.join(names)}.",
                f"Give exactly one probability per data set, in the order of {variable.upper()}.",
            )
    if any(p < 0 for p in probs) or abs(sum(probs) - 1) > 1e-6:
        raise ConfigError(
            f"INTERLEAVE_PROBS={value} ({source}) sums to {sum(probs):g}; sampling probabilities "
            "must be 0 or more and sum to 1.",
            f"Scale them: INTERLEAVE_PROBS={','.join(f'{p / sum(probs):.3g}' for p in probs)}"
            if sum(probs) > 0 and all(p >= 0 for p in probs)
            else "Give probabilities that sum to 1.",
        )


# Chat-template markers: the special tokens a template writes around turns (<|im_start|>, <|start_header_id|>,
# <｜User｜>, <start_of_turn>). A template whose markers the tokenizer does not have as tokens belongs to another
# model family: the markers would be cut into ordinary pieces the model never learned as turn boundaries.
_MARKER = MARKER


def _template_markers(slots: list[str]) -> set[str]:
    import re

    return {m for slot in slots for m in re.findall(_MARKER, slot)}


def chat_template_fits(arguments: dict[str, Any], sources: dict[str, str]) -> list[str]:
    """TEMPLATE's turn markers are tokens of the model's tokenizer (a local folder's tokenizer.json /
    tokenizer_config.json). When they are not and other LLaMA-Factory templates' markers all are, the template
    is another family's: an error naming the fitting TEMPLATE values (ranked by closeness of their name to the
    model_type in config.json). When no template fits (a base model without chat tokens), a warning.

    Returns:
        Warnings.

    Raises:
        ConfigError: naming TEMPLATE, its source, the missing markers and the templates that fit.
    """
    from rocmft.config.lfargs import chat_template_slots

    TEMPLATES = chat_template_slots()  # name -> text slots
    name = arguments.get("template")
    model_dir = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    if name not in TEMPLATES or not model_dir.is_dir():
        return []
    model = ModelDir(model_dir)
    tokens = model.tokenizer_tokens()
    markers = _template_markers(TEMPLATES[name])
    if tokens is None or not markers or markers <= tokens:
        return []
    try:
        model_type = str(model.config_json().get("model_type", ""))
    except (OSError, ValueError):
        model_type = ""

    def closeness(other: str) -> tuple[int, int, int]:
        shared = next(
            (i for i, (a, b) in enumerate(zip(other, model_type, strict=False)) if a != b),
            min(len(other), len(model_type)),
        )
        # the longest common start with model_type, less what the name adds beyond it (qwen before qwen2_vl)
        return (-(2 * shared - len(other)), -len(_template_markers(TEMPLATES[other])), len(other))

    fitting = sorted((other for other, template in TEMPLATES.items()
                      if (found := _template_markers(template)) and found <= tokens), key=closeness)  # fmt: skip
    missing = ", ".join(sorted(markers - tokens))
    source = sources.get("template", "default")
    if not fitting:
        return [f"TEMPLATE={name} ({source}) writes {missing}, which the tokenizer of {model_dir} does not have as "
                "tokens (a base model?): they are split into ordinary pieces; TEMPLATE=default or alpaca avoids "
                "special markers."]  # fmt: skip
    raise ConfigError(f"TEMPLATE={name} ({source}) does not match the model's tokenizer: {missing} are not tokens of "
                      f"{model_dir}, whose chat markers fit {', '.join(fitting[:3])}.",
                      f"Set TEMPLATE={fitting[0]} (the template of the model's family).")  # fmt: skip


def model_shapes(arguments: dict[str, Any], sources: dict[str, str]) -> None:
    """config.json agrees with the weights' shapes: the input embedding is vocab_size x hidden_size and the
    decoder has num_hidden_layers layers (the ``layers.<n>.`` indices in the tensor names). A config.json from
    another size of the family (a 7B config beside 1.5B weights) loads with a size-mismatch error after minutes,
    or not at all. Skipped for quantized checkpoints (packed shapes) and configs without these keys.

    Raises:
        ConfigError: naming the config key, its value, the tensor and its shape.
    """
    import re

    model = ModelDir(str(arguments.get("model_name_or_path", "")))
    config_path = model.config_path
    if not config_path.is_file():
        return
    try:
        config = model.config_json()
        shapes = model.safetensors_shapes()
    except (OSError, ValueError, struct.error):
        return
    if not shapes or not isinstance(config, dict) or config.get("quantization_config"):
        return
    config = config.get("text_config") or config
    embed = next((k for k in shapes if re.search(r"(embed_tokens|wte|word_embeddings)\.weight$", k)), None)
    problems = []
    if embed and len(shapes[embed] or []) == 2:
        rows, cols = shapes[embed]
        for key, have in (("vocab_size", rows), ("hidden_size", cols)):
            if isinstance(config.get(key), int) and config[key] != have:
                problems.append(f"{key}={config[key]} but {embed} is {rows} x {cols}")
    layers = {int(m.group(1)) for k in shapes if (m := re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", k))}
    wanted = config.get("num_hidden_layers")
    if layers and isinstance(wanted, int) and wanted != max(layers) + 1:
        problems.append(f"num_hidden_layers={wanted} but the weights have {max(layers) + 1} layers")
    if problems:
        raise ConfigError(f"{config_path} does not describe the weights beside it "
                          f"(MODEL_NAME_OR_PATH, {sources.get('model_name_or_path', 'default')}): "
                          + "; ".join(problems) + ".",
                          "The config.json belongs to another model or size: put back the config.json that came "
                          "with these weights (download the folder again).")  # fmt: skip
