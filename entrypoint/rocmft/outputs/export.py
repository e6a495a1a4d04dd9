"""``rocmft export``: a finished run's weights as a standard Hugging Face model folder.

A LoRA run's adapter is merged into its base model with LLaMA-Factory's own export path
(``llamafactory.train.tuner.export_model``: load base, load adapter, ``merge_and_unload``, save); a full or
freeze run's weights are re-saved the same way. The folder gets safetensors shards (EXPORT_SIZE GB each),
``config.json``, ``generation_config.json``, the tokenizer with the run's chat template, LLaMA-Factory's
ollama ``Modelfile``, a model card (``README.md``: base model, data sets, method, steps, final loss,
versions) and ``rocmft-export.json`` (the export manifest that the compose service ``serve`` reads). Before the
folder is renamed into place it is checked for serving (rocmft.outputs.servable: safetensors only, the base's
architecture, tokenizer and chat template; keys older transformers read added to config.json).

Everything comes from the run's own record (``OUTPUT_DIR/rocmft/manifest.json`` and ``train.yaml``), so after
a run, with the same ``.env``, ``rocmft export`` needs no other variable. Where things go:

* ``EXPORT_DIR`` (LLaMA-Factory's argument), default ``<OUTPUT_DIR>-merged`` beside the run; written into a
  temporary folder in the same parent and renamed into place (:func:`rocmft.fsutil.replace_dir`), so a
  reader never sees half an export. An earlier rocmft export there is replaced; anything else is refused.
* ``EXPORT_SIZE`` (GB per shard), ``EXPORT_DEVICE`` (``cpu`` or ``auto``; default ``auto`` when a GPU is
  visible), ``INFER_DTYPE`` (default: the base model's own dtype, so an fp32 base is not silently halved).
* ``ROCMFT_SAVES_DIR/rocmft-latest-export.json`` points at the newest export (for ``serve``).

Quantized bases: LoRA weights cannot be merged into packed quantized weights (LLaMA-Factory refuses too:
"Cannot merge adapters to a quantized model"). A QLoRA run that quantized an ordinary checkpoint on the fly
(``QUANTIZATION_BIT``) merges into that same checkpoint loaded unquantized — the standard QLoRA path. A run
whose base checkpoint is itself quantized (``quantization_config`` in its config.json: GPTQ, AWQ,
pre-quantized bitsandbytes) is refused with the unquantized model its card names, if any; with
``ROCMFT_EXPORT_BASE`` pointing at the unquantized model (same architecture and shapes) it merges into that.

Errors: :class:`~rocmft.errors.ConfigError` (exit 2) for a missing or unfinished run, a quantized base, a bad
EXPORT_DIR; :class:`~rocmft.errors.ChecksFailed` (exit 3) for too little disk space; a failure inside the
merge itself is a :class:`~rocmft.errors.RocmftError` with exit 4, and leaves no partial folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rocmft import __version__
from rocmft.console import say, warn
from rocmft.errors import ChecksFailed, ConfigError, ExitCode, RocmftError
from rocmft.facts.modeldir import MODEL_WEIGHT_FILES, ModelDir, quantization_label
from rocmft.fsutil import atomic_write_json, atomic_write_text, make_private_dir_public, replace_dir
from rocmft.outputs.servable import prepare_for_serving

EXPORT_MANIFEST = "rocmft-export.json"
LATEST_EXPORT = "rocmft-latest-export.json"
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
        manifest: ``OUTPUT_DIR/rocmft/manifest.json``.
        arguments: the training arguments as trained (``OUTPUT_DIR/rocmft/train.yaml``, else the manifest's).
    """

    output_dir: Path
    weights: Path
    manifest: dict[str, Any]
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
        manifest_path = output_dir / "rocmft" / "manifest.json"
        if not manifest_path.is_file():
            continue
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"The run record {manifest_path} ({how}) cannot be read: {err}.",
                "Point `rocmft export` at a run folder `rocmft train` finished.",
            ) from err
        try:
            arguments = yaml.safe_load((output_dir / "rocmft" / "train.yaml").read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            arguments = None
        if not isinstance(arguments, dict):
            arguments = manifest.get("arguments") or {}
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
        "Pass the run's folder (`rocmft export saves/<run>`), or set OUTPUT_DIR / ROCMFT_RUN_NAME as for training.",
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


def _inside(path: Path, folder: Path) -> bool:
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
    status = run.manifest.get("status")
    if run.weights == run.output_dir and status != "finished":
        stopped = (run.manifest.get("worker") or {}).get("stopped_at_step")
        what = (f"the weights at its top level are those of step {stopped}, where a stop request ended it early "
                "(LLaMA-Factory writes them at any end of training), not a finished run's" if stopped else
                "its final weights were never written")  # fmt: skip
        raise ConfigError(
            f"The run in {run.output_dir} did not finish (status {status!r}, exit code "
            f"{run.manifest.get('exit_code')}): {what}.",
            "Finish it first (`rocmft train` / `docker compose up train` resumes from its last checkpoint), or "
            f"export a checkpoint: `rocmft export {run.output_dir}/checkpoint-<step>`.",
        )
    method = str(args.get("finetuning_type") or "lora")
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

    notes: list[str] = []
    trained_on = str(args.get("model_name_or_path") or "")
    base = trained_on if method == "lora" else str(run.weights)
    override = settings.rocmft.export_base
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
        base, base_config = override, override_config
        notes.append(f"merging into ROCMFT_EXPORT_BASE={override} instead of the run's base {trained_on}")
    if method == "lora" and args.get("quantization_bit") and not quantized:
        notes.append(
            f"the run trained QLoRA on {args['quantization_bit']}-bit weights of {trained_on}; the adapter "
            "is merged into the same model loaded unquantized (the standard QLoRA merge)"
        )

    export_dir = default_export_dir(run, settings)
    base_folder = Path(base).expanduser()
    for folder, what in ((run.output_dir, "the run's OUTPUT_DIR"), (base_folder, "the base model")):
        if folder.is_dir() and (_inside(export_dir, folder) or _inside(folder, export_dir)):
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

    dtype = str(given.get("infer_dtype") or "auto")
    if dtype == "auto":
        own = str((base_config or {}).get("dtype") or (base_config or {}).get("torch_dtype") or "")
        dtype = own if own in DTYPE_BYTES else "auto"
    device = str(given.get("export_device") or "")
    if not device:
        import torch

        device = "auto" if torch.cuda.is_available() else "cpu"

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
    served = settings.rocmft.serve_name or run.name
    return ExportPlan(
        run=run,
        base=base,
        export_dir=export_dir,
        dtype=dtype,
        device=device,
        served_name=served,
        lf_args=lf_args,
        notes=notes,
    )


def _weights_bytes(model: str) -> int | None:
    """Bytes of the safetensors weights of a local model folder (None elsewhere)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    return sum(p.stat().st_size for p in ModelDir(folder).safetensors_files()) or None


def check_disk(plan: ExportPlan, base_dtype: str | None) -> None:
    """Refuse when the export's file system has less free space than the export needs: the base's weights
    rescaled from its dtype to the export dtype, plus 5% (a local base only; a hub id is not measured).

    Raises:
        ChecksFailed: too little space (exit 3), with the numbers.
    """
    import psutil

    size = _weights_bytes(plan.base)
    if size is None:
        return
    ratio = DTYPE_BYTES.get(plan.dtype, 2) / DTYPE_BYTES.get(base_dtype or "", DTYPE_BYTES.get(plan.dtype, 2))
    need = size * ratio * 1.05
    parent = plan.export_dir.parent
    while not parent.exists():
        parent = parent.parent
    free = psutil.disk_usage(str(parent)).free
    if free < need:
        raise ChecksFailed(
            f"Not enough disk space for the export in {plan.export_dir.parent}: {free / 2**30:.1f} GiB free, about "
            f"{need / 2**30:.1f} GiB needed ({plan.dtype} weights of {plan.base}).",
            "Free space there, or set EXPORT_DIR to a larger file system.",
        )


def model_card(plan: ExportPlan, facts: dict[str, Any], versions: dict[str, str]) -> str:
    """The exported model's ``README.md``: Hugging Face card metadata (base_model, library_name, tags) and
    what the run did. Holds no secrets: every value comes from the run's record (secrets are never in it)."""
    args = plan.run.arguments
    method = str(args.get("finetuning_type") or "lora")
    base = str(args.get("model_name_or_path") or plan.base)
    meta: dict[str, Any] = {"library_name": "transformers", "tags": ["rocmft", "llama-factory", method]}
    chosen_base = plan.base if method == "lora" else base
    # the card's base_model is a hub id; a local folder (a host path, meaningless elsewhere) is named in the text
    if not Path(chosen_base).expanduser().is_absolute() and not chosen_base.startswith("."):
        meta["base_model"] = chosen_base
    if facts["data_sets"]:
        meta["datasets"] = facts["data_sets"]
    how = f"{method} fine-tuning"
    if method == "lora":
        rank = int(args.get("lora_rank") or 8)
        name = "LoRA"
        if args.get("quantization_bit"):
            name = f"QLoRA ({args['quantization_bit']}-bit {args.get('quantization_method') or 'bnb'})"
        alpha = args.get("lora_alpha") or 2 * rank  # LLaMA-Factory's default alpha is twice the rank
        how = f"{name}, rank {rank}, alpha {alpha}, target {args.get('lora_target', 'all')}; merged into the base"

    def num(value: Any) -> str:
        return "–" if value is None else f"{value:.5g}" if isinstance(value, float) else str(value)

    rows = [
        (
            "base model",
            f"`{base}`" + (f" (merged into `{plan.base}`)" if method == "lora" and plan.base != base else ""),
        ),
        ("data sets", ", ".join(f"`{d}`" for d in facts["data_sets"]) or "–"),
        ("method", f"{args.get('stage', 'sft')}, {how}"),
        ("template", f"`{args.get('template', 'default')}`"),
        ("steps", f"{num(facts['steps'])} of {num(facts['max_steps'])}"),
        ("final train loss", num(facts["final_loss"])),
        ("final eval loss", num(facts["final_eval_loss"])),
        ("learning rate", num(args.get("learning_rate"))),
        ("cutoff length", num(args.get("cutoff_len"))),
        ("exported dtype", plan.dtype),
        ("exported from", f"`{plan.run.weights}`"),
        (
            "versions",
            f"rocmft {__version__}, LLaMA-Factory {versions.get('llamafactory')}, transformers "
            f"{versions.get('transformers')}, peft {versions.get('peft')}, torch {versions.get('torch')}",
        ),
    ]
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()
    lines = [
        f"---\n{front}\n---",
        "",
        f"# {plan.served_name}",
        "",
        "Fine-tuned with rocmft (LLaMA-Factory on ROCm) and exported by `rocmft export`.",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += [
        "",
        "Load it with `AutoModelForCausalLM.from_pretrained(<this folder>)`; the tokenizer carries the chat "
        "template it was trained with. The run's full record (settings, data, checks, versions) is in its "
        "`rocmft/manifest.json`.",
        "",
    ]
    return "\n".join(lines)


def _lora_rank(run: Run) -> int | None:
    """The LoRA rank ``r`` of the run's adapter (its adapter_config.json, as peft wrote it); None for a full
    or freeze run or an unreadable file."""
    if not run.is_adapter:
        return None
    try:
        rank = json.loads((run.weights / "adapter_config.json").read_text(encoding="utf-8")).get("r")
    except (OSError, ValueError, AttributeError):
        return None
    return rank if isinstance(rank, int) else None


def _normal_modes(folder: Path) -> None:
    """Give every file the mode a plain ``open()`` would (some writers use mkstemp's 0600), so that the host
    user can read what the container wrote."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file():
            os.chmod(path, 0o666 & ~mask)


def _terminate_as_interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def export(plan: ExportPlan, saves_dir: Path | None = None) -> dict[str, Any]:
    """Run the export described by ``plan`` and return the export manifest (also written into the folder).

    Writes into ``.<name>-staging-*`` beside EXPORT_DIR and renames it into place; SIGTERM/SIGINT or an error
    remove the staging folder. Also records the export in ``saves_dir/rocmft-latest-export.json`` when given.

    Raises:
        ChecksFailed: too little disk space.
        RocmftError: (exit 4) LLaMA-Factory's export raised.
    """
    from rocmft.config.lfargs import stack_versions
    from rocmft.outputs.manifest import now
    from rocmft.outputs.report import run_facts

    base_dtype = str(
        (model_config(plan.base) or {}).get("dtype") or (model_config(plan.base) or {}).get("torch_dtype") or ""
    )
    check_disk(plan, base_dtype)
    for note in plan.notes:
        say(note, all_ranks=True)
    if "adapter_name_or_path" in plan.lf_args:
        what = f"merging the adapter in {plan.run.weights} into {plan.base}"
    else:
        what = f"re-saving the {plan.lf_args['finetuning_type']}-tuned weights in {plan.run.weights}"
    say(f"{what} ({plan.dtype}, device {plan.device}) -> {plan.export_dir}", all_ranks=True)
    plan.export_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = make_private_dir_public(
        Path(tempfile.mkdtemp(prefix=f".{plan.export_dir.name}-staging-", dir=plan.export_dir.parent))
    )
    try:
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    except ValueError:  # not the main thread (an embedding program): its own signal handling stands
        previous = None
    started = time.monotonic()
    try:
        from llamafactory.train.tuner import export_model

        try:
            export_model({**plan.lf_args, "export_dir": str(staging)})
        except (KeyboardInterrupt, RocmftError):
            raise
        except Exception as err:
            raise RocmftError(
                f"LLaMA-Factory's export of {plan.run.weights} failed: {type(err).__name__}: {err}",
                "Read the message above; nothing was written to EXPORT_DIR.",
                code=ExitCode.TRAINING_FAILED,
            ) from err
        serve = prepare_for_serving(staging, model_config(plan.base), _lora_rank(plan.run))
        seconds = time.monotonic() - started
        versions = stack_versions()
        facts = run_facts(plan.run.output_dir)
        atomic_write_text(staging / "README.md", model_card(plan, facts, versions))
        _normal_modes(staging)
        files = {p.name: p.stat().st_size for p in sorted(staging.iterdir()) if p.is_file()}
        record = {
            "rocmft_version": __version__,
            "exported_at": now(),
            "seconds": round(seconds, 2),
            "export_dir": str(plan.export_dir),
            "served_model_name": plan.served_name,
            "run": {
                "output_dir": str(plan.run.output_dir),
                "weights": str(plan.run.weights),
                "status": plan.run.manifest.get("status"),
                "started_at": plan.run.manifest.get("started_at"),
            },
            "base_model": str(plan.run.arguments.get("model_name_or_path") or ""),
            "merged_into": plan.base if "adapter_name_or_path" in plan.lf_args else None,
            "finetuning_type": plan.lf_args["finetuning_type"],
            "template": plan.lf_args["template"],
            "dtype": plan.dtype,
            "device": plan.device,
            "data_sets": facts["data_sets"],
            "steps": facts["steps"],
            "final_loss": facts["final_loss"],
            "final_eval_loss": facts["final_eval_loss"],
            "notes": plan.notes,
            "serve": serve,
            "versions": versions,
            "files": files,
        }
        atomic_write_json(staging / EXPORT_MANIFEST, record)
        _normal_modes(staging)
        replace_dir(staging, plan.export_dir)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(staging, ignore_errors=True)
    total = sum(files.values())
    size = f"{total / 2**30:.2f} GiB" if total >= 2**30 else f"{total / 2**20:.1f} MiB"
    say(f"exported {plan.export_dir} ({size}, {len(files)} files) in {seconds:.1f} s", all_ranks=True)
    if saves_dir is not None:
        record_latest(saves_dir, plan.export_dir, plan.served_name)
    return record


def record_latest(saves_dir: Path, export_dir: Path, served_name: str) -> Path | None:
    """Write ``saves_dir/rocmft-latest-export.json``: the newest export's folder (absolute, and relative to
    saves_dir when inside it, so that a container that mounts saves_dir elsewhere still finds it) and its served
    name. Returns the file, or None when saves_dir cannot be written (a warning)."""
    saves_dir = saves_dir.expanduser().absolute()
    data = {"model_path": str(export_dir), "served_model_name": served_name}
    if _inside(export_dir, saves_dir):
        data["model_path_in_saves"] = str(export_dir.resolve().relative_to(saves_dir.resolve()))
    else:
        warn(
            f"{export_dir} is outside {saves_dir}: the compose service `serve` mounts only the saves "
            "folder, so set ROCMFT_SERVE_MODEL to where it sees this export (or export under the saves folder)",
            all_ranks=True,
        )
    try:
        return atomic_write_json(saves_dir / LATEST_EXPORT, data)
    except OSError as err:
        warn(
            f"cannot record the export in {saves_dir / LATEST_EXPORT} ({err}); "
            "the serve service then needs ROCMFT_SERVE_MODEL",
            all_ranks=True,
        )
        return None


def default_export_dir(run: Run, settings) -> Path:
    """Where the export of ``run`` goes: EXPORT_DIR, else ``<OUTPUT_DIR>-merged``."""
    given = settings.arguments.get("export_dir")
    return Path(str(given)).expanduser().absolute() if given else run.output_dir.parent / f"{run.name}{MERGED_SUFFIX}"


__all__ = [
    "EXPORT_MANIFEST",
    "LATEST_EXPORT",
    "ExportPlan",
    "Run",
    "default_export_dir",
    "export",
    "find_run",
    "model_card",
    "plan_export",
    "quantization_of",
    "record_latest",
    "unquantized_candidates",
]
