"""The plan of ``rocmft export``, decided before any weights load: which run, which base the weights merge into,
where the folder goes, the dtype and the device, and LLaMA-Factory's export arguments (:func:`plan_export`).

Everything comes from the run's own record (``OUTPUT_DIR/rocmft/manifest.json`` and ``train.yaml``) and the
settings; what cannot work is refused here, before anything is written (the rules are in
:mod:`rocmft.outputs.export`'s docstring, the public face of the export: a quantized base, ROCMFT_EXPORT_BASE,
EXPORT_DIR, INFER_DTYPE, EXPORT_DEVICE). :func:`find_run` and :func:`model_config` are shared with ``rocmft chat``
and ``rocmft serve --load``.

Errors: :class:`~rocmft.errors.ConfigError` (exit 2) for a missing or unfinished run, a quantized base, a bad
ROCMFT_EXPORT_BASE or EXPORT_DIR.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rocmft.errors import ConfigError
from rocmft.facts.modeldir import MODEL_WEIGHT_FILES, quantization_label
from rocmft.records import MANIFEST_FILE, Manifest, read_manifest

EXPORT_MANIFEST = "rocmft-export.json"
MERGED_SUFFIX = "-merged"
# Config fields that must agree between the run's base and ROCMFT_EXPORT_BASE for the adapter's matrices to fit.
SHAPE_FIELDS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "head_dim",
)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass
class Run:
    """A training run as its output folder records it.

    Attributes:
        output_dir: the run's OUTPUT_DIR.
        weights: the folder with the weights to export: OUTPUT_DIR, or one of its ``checkpoint-N`` folders.
        manifest: ``OUTPUT_DIR/rocmft/manifest.json`` (rocmft.records.read_manifest).
        arguments: the training arguments as trained (``OUTPUT_DIR/rocmft/train.yaml``, else the manifest's).
    """

    output_dir: Path
    weights: Path
    manifest: Manifest
    arguments: dict[str, Any]

    @property
    def is_adapter(self) -> bool:
        """Whether the weights are a (LoRA) adapter rather than a whole model."""
        return (self.weights / "adapter_config.json").is_file()

    @property
    def name(self) -> str:
        """The run's folder name, plus ``-checkpoint-N`` for a checkpoint."""
        extra = f"-{self.weights.name}" if self.weights != self.output_dir else ""
        return self.output_dir.name + extra


def _run_from_folder(folder: Path, how: str) -> Run | None:
    """The run whose OUTPUT_DIR (or checkpoint folder, or OUTPUT_DIR/rocmft) is ``folder``; None when there is none."""
    folder = folder.expanduser().absolute()
    candidates = [(folder, folder), (folder.parent, folder)]  # OUTPUT_DIR itself; a checkpoint-N inside one
    if folder.name == "rocmft":
        candidates.insert(0, (folder.parent, folder.parent))
    for output_dir, weights in candidates:
        manifest_path = output_dir / "rocmft" / MANIFEST_FILE
        if not manifest_path.is_file():
            continue
        manifest = read_manifest(
            manifest_path, how=how, fix="Give a run folder `rocmft train` finished (its OUTPUT_DIR, or a checkpoint-N)."
        )
        try:
            arguments = yaml.safe_load((output_dir / "rocmft" / "train.yaml").read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            arguments = None
        if not isinstance(arguments, dict):
            arguments = dict(manifest.arguments)
        return Run(output_dir=output_dir, weights=weights, manifest=manifest, arguments=arguments)
    return None


def find_run(given: str | None, settings) -> Run:
    """The run to export or chat with.

    Args:
        given: a folder from the command line (OUTPUT_DIR, OUTPUT_DIR/rocmft or OUTPUT_DIR/checkpoint-N), or None:
            then the OUTPUT_DIR that ``rocmft train`` would use with the same settings (OUTPUT_DIR,
            ROCMFT_RUN_NAME, ROCMFT_SAVES_DIR, MODEL_NAME_OR_PATH; :func:`rocmft.render.default_output_dir`).
        settings: the read settings (:func:`rocmft.config.settings.load_settings`).

    Raises:
        ConfigError: no run record there (naming the runs found in ROCMFT_SAVES_DIR).
    """
    from rocmft.render import default_output_dir

    if given:
        folder, how = Path(given), f"given as {given}"
    else:
        demo = "model_name_or_path" not in settings.arguments
        folder = default_output_dir(settings.arguments, settings.rocmft.saves_dir, settings.rocmft.run_name, demo)
        how = f"the run of these settings ({settings.source_of('output_dir')})"
    run = _run_from_folder(folder, how)
    if run is not None:
        return run
    saves = settings.rocmft.saves_dir.expanduser().absolute()
    found = sorted(p.parent.parent.name for p in saves.glob("*/rocmft/manifest.json")) if saves.is_dir() else []
    listed = f" Runs in {saves}: {', '.join(found)}." if found else f" There are no runs in {saves}."
    raise ConfigError(
        f"No rocmft run in {folder.absolute()} ({how}): it has no rocmft/manifest.json.{listed}",
        "Pass the run's folder (its OUTPUT_DIR: saves/<run>), or set OUTPUT_DIR / ROCMFT_RUN_NAME as for training.",
    )


def _model_file(model: str, name: str) -> Path | None:
    """``name`` (e.g. config.json) of a model folder or hub id (from the Hugging Face cache or the hub, which
    HF_HUB_OFFLINE turns off); None when it cannot be had."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        return folder / name if (folder / name).is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(model, name))
    except Exception:  # not a hub id, offline and not cached, no such file, no network: all mean "unknown"
        return None


def model_config(model: str) -> dict[str, Any] | None:
    """The raw ``config.json`` of a model folder or hub id, or None when it cannot be read."""
    path = _model_file(model, "config.json")
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None


def quantization_of(config: dict[str, Any] | None) -> str | None:
    """The quantization method of a checkpoint (``gptq``, ``awq``, ``bitsandbytes``...) from its config's
    ``quantization_config`` (where transformers records it), or None for an unquantized one
    (:func:`rocmft.facts.modeldir.quantization_label`)."""
    return quantization_label(config)


def unquantized_candidates(model: str, config: dict[str, Any] | None) -> list[str]:
    """Where a quantized checkpoint says it came from: ``base_model`` in its model card's metadata (the hub's
    convention), then a ``-bnb-4bit``/``-GPTQ``/``-AWQ``-style suffix taken off its name."""
    found: list[str] = []
    card = _model_file(model, "README.md")
    if card is not None:
        try:
            text = card.read_text(encoding="utf-8")
            if text.startswith("---"):
                meta = yaml.safe_load(text.split("---", 2)[1]) or {}
                bases = meta.get("base_model") or []
                found += [bases] if isinstance(bases, str) else [str(b) for b in bases]
        except (OSError, yaml.YAMLError, IndexError):
            pass
    stripped = re.sub(r"[-_.](bnb[-_]?4bit|bnb[-_]?8bit|4bit|8bit|gptq.*|awq.*|int4.*|int8.*)$", "", model, flags=re.I)
    if stripped != model:
        found.append(stripped)
    return list(dict.fromkeys(found))


@dataclass
class ExportPlan:
    """What :func:`export` will do, decided before any weights load.

    Attributes:
        run: the run.
        base: the model the weights are merged into / loaded from (for LoRA: the base; ROCMFT_EXPORT_BASE when set).
        export_dir: the final folder.
        dtype: the saved dtype (INFER_DTYPE, else the base's own).
        device: ``cpu`` or ``auto`` (LLaMA-Factory's EXPORT_DEVICE).
        served_name: the name the serve service gives the model (ROCMFT_SERVE_NAME, else the run's name).
        lf_args: the arguments for LLaMA-Factory's export_model.
        notes: decisions worth telling the user (QLoRA merged into the unquantized base, ...).
    """

    run: Run
    base: str
    export_dir: Path
    dtype: str
    device: str
    served_name: str
    lf_args: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def is_inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it, both resolved (symlinks followed)."""
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def plan_export(run: Run, settings) -> ExportPlan:
    """Decide the base, the folder, the dtype and the device, and refuse what cannot work (see the module
    docstring).

    Raises:
        ConfigError: the run did not finish, has no weights, uses an unsupported method, its base is quantized
            without ROCMFT_EXPORT_BASE, ROCMFT_EXPORT_BASE does not match, or EXPORT_DIR is unsafe.
    """
    args, given = run.arguments, settings.arguments
    method = _exportable_method(run)
    trained_on = str(args.get("model_name_or_path") or "")
    base, base_config, notes = _merge_base(run, method, trained_on, settings.rocmft.export_base)
    export_dir = _checked_export_dir(run, settings, base)
    dtype = _export_dtype(given, base_config)
    device = _export_device(given)
    served = settings.rocmft.serve_name or run.name
    return ExportPlan(
        run=run,
        base=base,
        export_dir=export_dir,
        dtype=dtype,
        device=device,
        served_name=served,
        lf_args=_lf_args(run, method, base, given, device, dtype),
        notes=notes,
    )


def _exportable_method(run: Run) -> str:
    """The run's FINETUNING_TYPE (``lora``, ``full`` or ``freeze``), once its weights are there to export.

    Raises:
        ConfigError: the run's top-level weights are not a finished run's, the method is another, a LoRA run's
            adapter_config.json or a full/freeze run's weights are missing.
    """
    status = run.manifest.status
    if run.weights == run.output_dir and status != "finished":
        stopped = (run.manifest.worker or {}).get("stopped_at_step")
        what = (f"the weights at its top level are those of step {stopped}, where a stop request ended it early "
                "(LLaMA-Factory writes them at any end of training), not a finished run's" if stopped else
                "its final weights were never written")  # fmt: skip
        raise ConfigError(
            f"The run in {run.output_dir} did not finish (status {status!r}, exit code "
            f"{run.manifest.exit_code}): {what}.",
            "Finish it first (`rocmft train` / `docker compose up train` resumes from its last checkpoint), or "
            f"export a checkpoint: `rocmft export {run.output_dir}/checkpoint-<step>`.",
        )
    method = str(run.arguments.get("finetuning_type") or "lora")
    if method not in ("lora", "full", "freeze"):
        raise ConfigError(
            f"The run in {run.output_dir} used FINETUNING_TYPE={method}; rocmft exports lora, full and freeze runs.",
            "Export it with LLaMA-Factory directly (`llamafactory-cli export`).",
        )
    if method == "lora" and not run.is_adapter:
        raise ConfigError(
            f"The LoRA run's adapter (adapter_config.json) is missing in {run.weights}.",
            "Point `rocmft export` at the run's OUTPUT_DIR or a complete checkpoint-N folder.",
        )
    if method != "lora" and not any((run.weights / n).is_file() for n in MODEL_WEIGHT_FILES):
        raise ConfigError(
            f"No model weights (model.safetensors) in {run.weights}.",
            "Point `rocmft export` at the run's OUTPUT_DIR or a complete checkpoint-N folder.",
        )
    return method


def _merge_base(run: Run, method: str, trained_on: str, override: str | None) -> tuple[str, dict | None, list[str]]:
    """The model the export loads: for LoRA the run's base ``trained_on`` (ROCMFT_EXPORT_BASE, ``override``, in
    place of a quantized one), else the run's own weights; with the config.json that decides the dtype and the
    notes for the user (merging into ROCMFT_EXPORT_BASE, a QLoRA adapter merged into the unquantized base).

    Raises:
        ConfigError: a LoRA run's base is quantized and no ROCMFT_EXPORT_BASE is set (naming the unquantized
            original its card or name suggests), ROCMFT_EXPORT_BASE is set where it replaces nothing, or it does
            not fit (:func:`_checked_override`).
    """
    notes: list[str] = []
    base = trained_on if method == "lora" else str(run.weights)
    base_config = model_config(trained_on) if trained_on else None
    quantized = quantization_of(base_config)
    if method == "lora" and quantized and not override:
        names = unquantized_candidates(trained_on, base_config)
        hint = f" Its unquantized original is probably {' or '.join(names)} (model card, name)." if names else ""
        example = f" (e.g. ROCMFT_EXPORT_BASE={names[0]})" if names else ""
        raise ConfigError(
            f"The run's base model {trained_on} is quantized ({quantized}: quantization_config in its config.json); "
            "LoRA weights cannot be merged into packed quantized weights (LLaMA-Factory refuses too). QLoRA "
            f"adapters merge into the unquantized base.{hint}",
            f"Set ROCMFT_EXPORT_BASE to the unquantized model{example}, a folder under /models or a hub id, and "
            "run `rocmft export` again.",
        )
    if override and not (method == "lora" and quantized):
        what = (
            f"a {method} run (its own weights are exported)"
            if method != "lora"
            else (f"a LoRA run whose base {trained_on} is not quantized (the adapter merges into it)")
        )
        raise ConfigError(
            f"ROCMFT_EXPORT_BASE={override} is set for {what}: it only replaces a quantized base, and merging an "
            "adapter into any other model of the same shape gives a model that was never trained.",
            "Unset ROCMFT_EXPORT_BASE (or export the run it belongs to).",
        )
    if override and method == "lora":
        base, base_config = override, _checked_override(override, trained_on, base_config)
        notes.append(f"merging into ROCMFT_EXPORT_BASE={override} instead of the run's base {trained_on}")
    if method == "lora" and run.arguments.get("quantization_bit") and not quantized:
        notes.append(
            f"the run trained QLoRA on {run.arguments['quantization_bit']}-bit weights of {trained_on}; the adapter "
            "is merged into the same model loaded unquantized (the standard QLoRA merge)"
        )
    return base, base_config, notes


def _checked_override(override: str, trained_on: str, base_config: dict | None) -> dict[str, Any]:
    """The config.json of ROCMFT_EXPORT_BASE (``override``), once it is an unquantized model with the shape of the
    run's quantized base (:data:`SHAPE_FIELDS`, compared in the ``text_config`` where there is one).

    Raises:
        ConfigError: no config.json there, it is quantized itself, or a shape field differs.
    """
    override_config = model_config(override)
    if override_config is None:
        raise ConfigError(
            f"ROCMFT_EXPORT_BASE={override}: no config.json there (not a model folder, or a hub "
            "id that is not cached while HF_HUB_OFFLINE is set).",
            "Point it at the unquantized model's folder (mounted under /models) or hub id.",
        )
    if quantization_of(override_config):
        raise ConfigError(
            f"ROCMFT_EXPORT_BASE={override} is itself quantized ({quantization_of(override_config)}).",
            "Point it at the unquantized (float16/bfloat16/float32) model.",
        )
    text_config = (base_config or {}).get("text_config") or base_config or {}
    other = override_config.get("text_config") or override_config
    differ = [
        f"{k} {text_config[k]} vs {other.get(k)}"
        for k in SHAPE_FIELDS
        if k in text_config and text_config[k] != other.get(k)
    ]
    if differ:
        raise ConfigError(
            f"ROCMFT_EXPORT_BASE={override} does not have the shape of the run's base {trained_on}: "
            + "; ".join(differ)
            + ". The adapter's matrices would not fit.",
            "Use the unquantized release of the same model the run trained on.",
        )
    return override_config


def _checked_export_dir(run: Run, settings, base: str) -> Path:
    """EXPORT_DIR (:func:`default_export_dir`), once the export may replace it whole.

    Raises:
        ConfigError: it overlaps the run's OUTPUT_DIR or the base model's folder, is a file, or is a non-empty
            folder that is not an earlier rocmft export (no :data:`EXPORT_MANIFEST`).
    """
    export_dir = default_export_dir(run, settings)
    base_folder = Path(base).expanduser()
    for folder, what in ((run.output_dir, "the run's OUTPUT_DIR"), (base_folder, "the base model")):
        if folder.is_dir() and (is_inside(export_dir, folder) or is_inside(folder, export_dir)):
            raise ConfigError(
                f"EXPORT_DIR={export_dir} would overlap {what} {folder}; the export replaces its folder whole.",
                f"Set EXPORT_DIR to a folder of its own (the default is {run.output_dir}{MERGED_SUFFIX}).",
            )
    if export_dir.exists() and not export_dir.is_dir():
        raise ConfigError(f"EXPORT_DIR={export_dir} is a file; the export is a folder.",
                          "Set EXPORT_DIR to a folder path (it is created).")  # fmt: skip
    if export_dir.exists() and any(export_dir.iterdir()) and not (export_dir / EXPORT_MANIFEST).is_file():
        raise ConfigError(
            f"EXPORT_DIR={export_dir} exists and is not an earlier rocmft export (no {EXPORT_MANIFEST}); rocmft "
            "replaces only its own exports.",
            "Choose another EXPORT_DIR, or move that folder away.",
        )
    return export_dir


def _export_dtype(given: dict[str, Any], base_config: dict | None) -> str:
    """The saved dtype: INFER_DTYPE, else (``auto``) the base's own ``dtype``/``torch_dtype`` when it is one of
    :data:`DTYPE_BYTES`, else ``auto``."""
    dtype = str(given.get("infer_dtype") or "auto")
    if dtype == "auto":
        own = str((base_config or {}).get("dtype") or (base_config or {}).get("torch_dtype") or "")
        dtype = own if own in DTYPE_BYTES else "auto"
    return dtype


def _export_device(given: dict[str, Any]) -> str:
    """EXPORT_DEVICE, else ``auto`` when torch sees a GPU and ``cpu`` otherwise."""
    device = str(given.get("export_device") or "")
    if not device:
        import torch

        device = "auto" if torch.cuda.is_available() else "cpu"
    return device


def _lf_args(run: Run, method: str, base: str, given: dict[str, Any], device: str, dtype: str) -> dict[str, Any]:
    """The arguments of LLaMA-Factory's ``export_model`` (its ``export_dir`` is added at the export): the base,
    the run's template, method and stage, EXPORT_SIZE (GB per shard, default 5), the device and dtype, the
    adapter for LoRA, and the run's cache_dir, model_revision, rope_scaling and resize_vocab where set."""
    args = run.arguments
    lf_args: dict[str, Any] = {
        "model_name_or_path": base,
        "template": args.get("template") or "default",
        "finetuning_type": method,
        "stage": args.get("stage") or "sft",
        "trust_remote_code": bool(args.get("trust_remote_code", True)),
        "export_size": int(given.get("export_size") or 5),
        "export_device": device,
        "infer_dtype": dtype,
    }
    if method == "lora":
        lf_args["adapter_name_or_path"] = str(run.weights)
    for key in ("cache_dir", "model_revision", "rope_scaling", "resize_vocab"):
        if args.get(key) is not None:
            lf_args[key] = args[key]
    return lf_args


def default_export_dir(run: Run, settings) -> Path:
    """Where the export of ``run`` goes: EXPORT_DIR, else ``<OUTPUT_DIR>-merged``."""
    given = settings.arguments.get("export_dir")
    return Path(str(given)).expanduser().absolute() if given else run.output_dir.parent / f"{run.name}{MERGED_SUFFIX}"
