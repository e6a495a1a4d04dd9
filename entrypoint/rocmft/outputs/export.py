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

This module runs the export and writes its records; the plan (what is refused, which base, folder, dtype and
device) is :mod:`rocmft.outputs.export_plan`, the model card :mod:`rocmft.outputs.model_card`. Every name of both
that callers use is importable from here too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rocmft import __version__
from rocmft.console import say, warn
from rocmft.errors import ChecksFailed, ExitCode, RocmftError
from rocmft.facts.modeldir import ModelDir
from rocmft.fsutil import (
    atomic_write_json,
    atomic_write_text,
    make_private_dir_public,
    replace_dir,
    stale_staging_notes,
)
from rocmft.outputs.export_plan import (
    DTYPE_BYTES,
    EXPORT_MANIFEST,
    MERGED_SUFFIX,
    SHAPE_FIELDS,
    ExportPlan,
    Run,
    default_export_dir,
    find_run,
    is_inside,
    model_config,
    plan_export,
    quantization_of,
    unquantized_candidates,
)
from rocmft.outputs.model_card import model_card
from rocmft.outputs.servable import prepare_for_serving
from rocmft.stopsignals import StopOnSignals

LATEST_EXPORT = "rocmft-latest-export.json"


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


def export(plan: ExportPlan, saves_dir: Path | None = None) -> dict[str, Any]:
    """Run the export described by ``plan`` and return the export manifest (also written into the folder).

    Writes into ``.<name>-staging-*`` beside EXPORT_DIR and renames it into place; SIGTERM/SIGINT (the first one:
    rocmft.stopsignals.StopOnSignals) or an error remove the staging folder. Also records the export in
    ``saves_dir/rocmft-latest-export.json`` when given.

    Raises:
        ChecksFailed: too little disk space.
        RocmftError: (exit 4) LLaMA-Factory's export raised.
    """
    base_dtype = str(
        (model_config(plan.base) or {}).get("dtype") or (model_config(plan.base) or {}).get("torch_dtype") or ""
    )
    check_disk(plan, base_dtype)
    _announce(plan)
    plan.export_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    staging = None
    with StopOnSignals("during the export") as stops:  # the first SIGTERM/SIGINT ends it: exit 143
        try:
            prefix = f".{plan.export_dir.name}-staging-"
            for note in stale_staging_notes(plan.export_dir.parent, prefix, f"an export to {plan.export_dir}"):
                warn(note)
            with stops.held():  # the folder is noted before a signal can stop the export
                staging = Path(tempfile.mkdtemp(prefix=prefix, dir=plan.export_dir.parent))
            make_private_dir_public(staging)
            _merge(plan, staging)
            serve = prepare_for_serving(staging, model_config(plan.base), _lora_rank(plan.run))
            seconds = time.monotonic() - started
            record, files = _write_card_and_record(plan, staging, serve, seconds)
            with stops.held():  # the export folder is absent between replace_dir's two renames: not cut there
                replace_dir(staging, plan.export_dir)
                staging = None
        finally:
            if staging is not None:
                with stops.held(then_stop=False):  # a merged 7B is GBs: no signal leaves half of it behind
                    shutil.rmtree(staging, ignore_errors=True)
    total = sum(files.values())
    size = f"{total / 2**30:.2f} GiB" if total >= 2**30 else f"{total / 2**20:.1f} MiB"
    say(f"exported {plan.export_dir} ({size}, {len(files)} files) in {seconds:.1f} s", all_ranks=True)
    if saves_dir is not None:
        record_latest(saves_dir, plan.export_dir, plan.served_name)
    return record


def _announce(plan: ExportPlan) -> None:
    """Tell the user the plan's notes and what the export does (merge an adapter, or re-save tuned weights), with
    the dtype, the device and the folder."""
    for note in plan.notes:
        say(note, all_ranks=True)
    if "adapter_name_or_path" in plan.lf_args:
        what = f"merging the adapter in {plan.run.weights} into {plan.base}"
    else:
        what = f"re-saving the {plan.lf_args['finetuning_type']}-tuned weights in {plan.run.weights}"
    say(f"{what} ({plan.dtype}, device {plan.device}) -> {plan.export_dir}", all_ranks=True)


def _merge(plan: ExportPlan, staging: Path) -> None:
    """LLaMA-Factory's ``export_model`` with the plan's arguments, into ``staging``.

    Raises:
        RocmftError: (exit 4) for anything it raises but an interrupt or a RocmftError (passed on as they are).
    """
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


def _write_card_and_record(
    plan: ExportPlan, staging: Path, serve: dict[str, Any], seconds: float
) -> tuple[dict[str, Any], dict[str, int]]:
    """Write the model card (``README.md``) and the export manifest (:data:`EXPORT_MANIFEST`) into ``staging``,
    giving every file a plain file's mode. Returns the manifest and the folder's files (name → bytes) as the
    manifest lists them (before the manifest itself was written).

    ``serve`` is what :func:`rocmft.outputs.servable.prepare_for_serving` found; ``seconds`` the merge's time.
    """
    from rocmft.config.lfargs import stack_versions
    from rocmft.outputs.manifest import now
    from rocmft.outputs.report import run_facts

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
            "status": plan.run.manifest.status,
            "started_at": plan.run.manifest.started_at,
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
    return record, files


def record_latest(saves_dir: Path, export_dir: Path, served_name: str) -> Path | None:
    """Write ``saves_dir/rocmft-latest-export.json``: the newest export's folder (absolute, and relative to
    saves_dir when inside it, so that a container that mounts saves_dir elsewhere still finds it) and its served
    name. Returns the file, or None when saves_dir cannot be written (a warning)."""
    saves_dir = saves_dir.expanduser().absolute()
    data = {"model_path": str(export_dir), "served_model_name": served_name}
    if is_inside(export_dir, saves_dir):
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


__all__ = [
    "DTYPE_BYTES",
    "EXPORT_MANIFEST",
    "LATEST_EXPORT",
    "MERGED_SUFFIX",
    "SHAPE_FIELDS",
    "ExportPlan",
    "Run",
    "check_disk",
    "default_export_dir",
    "export",
    "find_run",
    "model_card",
    "model_config",
    "plan_export",
    "quantization_of",
    "record_latest",
    "unquantized_candidates",
]
