"""Resume: find the newest complete checkpoint in OUTPUT_DIR and decide whether this run continues from it.

transformers writes a checkpoint in place (``checkpoint-<step>/``: the model or adapter, then the optimizer,
scheduler and RNG states, and ``trainer_state.json`` last; transformers' Trainer._save_checkpoint), and
deletes older ones beyond SAVE_TOTAL_LIMIT only after that. So a checkpoint is complete when its
trainer_state.json parses and says the same step as its name, its weights are there with readable headers, and
its optimizer and scheduler states are there (unless only the model was saved). A process killed mid-save
leaves a checkpoint without trainer_state.json: skipped with a warning, never loaded.

``ROCMFT_RESUME``: ``auto`` (default: resume from the newest complete checkpoint when the settings that matter
are unchanged, refuse with the differences otherwise), ``never`` (start over; checkpoints are left alone),
``force`` (resume from the newest complete checkpoint whatever changed), or a checkpoint folder.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmft.errors import ConfigError
from rocmft.facts.modeldir import CHECKPOINT_WEIGHT_FILES
from rocmft.nesting import loads_json

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# Settings that make a checkpoint meaningless for this run when they change (the model, the data, the method,
# the batch geometry the optimizer state and the data order were built for).
MUST_MATCH = ("model_name_or_path", "stage", "finetuning_type", "dataset", "template", "cutoff_len", "packing",
              "lora_rank", "lora_target", "quantization_bit", "per_device_train_batch_size",
              "gradient_accumulation_steps")  # fmt: skip


def _safetensors_readable(path: Path) -> bool:
    """The safetensors header (8-byte length + JSON) is complete and parses: a truncated write fails here."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100 * 2**20 or path.stat().st_size < 8 + length:
                return False
            loads_json(handle.read(length))
        return True
    except (OSError, ValueError, struct.error):
        return False


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or None when it is (see the module docstring)."""
    match = CHECKPOINT.match(folder.name)
    if not match:
        return "not a checkpoint-<step> folder"
    try:
        state = loads_json((folder / "trainer_state.json").read_text())
    except FileNotFoundError:
        return "no trainer_state.json (written last: the save did not finish)"
    except (OSError, ValueError) as err:
        return f"trainer_state.json unreadable ({err})"
    if not isinstance(state, dict):
        return f"trainer_state.json holds a JSON {type(state).__name__}, not the trainer's state object"
    if state.get("global_step") != int(match.group(1)):
        return f"trainer_state.json says step {state.get('global_step')}"
    weights = [folder / name for name in CHECKPOINT_WEIGHT_FILES if (folder / name).is_file()]
    deepspeed = any(folder.glob("global_step*"))
    if not weights and not deepspeed:
        return "no weights"
    broken = [w.name for w in weights if w.suffix == ".safetensors" and not _safetensors_readable(w)]
    if broken:
        return f"{', '.join(broken)} truncated"
    if not deepspeed and not (folder / "optimizer.pt").is_file():
        return "no optimizer.pt"
    return None


@dataclass
class ResumeChoice:
    """What ROCMFT_RESUME decided. ``checkpoint``: the folder to resume from (None: start over); ``skipped``:
    incomplete checkpoints with the reason; ``note``: one line for the log."""

    checkpoint: Path | None
    note: str
    skipped: list[tuple[str, str]] = field(default_factory=list)


def checkpoints(output_dir: Path) -> list[Path]:
    """``checkpoint-<step>`` folders in ``output_dir``, newest (highest step) first."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and CHECKPOINT.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT.match(p.name).group(1)), reverse=True)


def newest_complete(output_dir: Path, at_most_step: int | None = None) -> ResumeChoice:
    """The newest complete checkpoint (at or below ``at_most_step`` when given), with the skipped ones."""
    skipped = []
    for folder in checkpoints(output_dir):
        step = int(CHECKPOINT.match(folder.name).group(1))
        if at_most_step is not None and step > at_most_step:
            continue
        problem = checkpoint_problem(folder)
        if problem is None:
            return ResumeChoice(folder, f"resuming from {folder} (step {step})", skipped)
        skipped.append((folder.name, problem))
    return ResumeChoice(None, "no complete checkpoint: starting from step 0", skipped)


def last_good_checkpoint(output_dir: Path, losses: list[dict[str, Any]]) -> Path | None:
    """After a divergence: the newest complete checkpoint at or before the last finite logged loss (``losses``:
    the worker's ``{"step", "loss"}`` records). A checkpoint saved between that log and the detection may
    already hold NaN weights, so it is never chosen."""
    good_step = max((entry["step"] for entry in losses), default=0)
    return newest_complete(output_dir, at_most_step=good_step).checkpoint


def differences(previous: dict[str, Any], current: dict[str, Any], named=None) -> list[str]:
    """``name: before -> now`` for each setting of :data:`MUST_MATCH` (and ``world_size``) that changed; with
    ``named`` (``name -> text``, :func:`rocmft.config.provenance.named_in`), ``now`` is said with its variable and
    where it came from."""
    changed = []
    for name in (*MUST_MATCH, "world_size"):
        before, now = previous.get(name), current.get(name)
        if before != now:
            shown = named(name) if named is not None and name != "world_size" else repr(now)
            changed.append(f"{name}: {before!r} -> {shown}")
    return changed


def choose(setting: str, output_dir: Path, previous: dict[str, Any] | None, current: dict[str, Any],
           named=None, record: Path | None = None) -> ResumeChoice:  # fmt: skip
    """Apply ROCMFT_RESUME.

    Args:
        setting: ``auto``, ``never``, ``force`` or a checkpoint folder.
        output_dir: where the checkpoints are.
        previous: the earlier run's settings (its rocmft/train.yaml plus ``world_size``), None if unknown.
        current: this run's arguments plus ``world_size``.
        named: ``name -> text`` naming a current setting and its source for the message (see :func:`differences`).
        record: the earlier run's train.yaml, named in the message as where the earlier values came from.

    Raises:
        ConfigError: a given folder that is not a complete checkpoint; under ``auto``, settings that changed
            since the checkpoint was written (listed).
    """
    if setting == "never":
        return ResumeChoice(None, "ROCMFT_RESUME=never: starting from step 0")
    if setting not in ("auto", "force"):
        folder = Path(setting).expanduser()
        problem = checkpoint_problem(folder) if folder.is_dir() else "no such folder"
        if problem:
            raise ConfigError(f"ROCMFT_RESUME={setting} is not a complete checkpoint: {problem}.",
                              "Point it at a checkpoint-<step> folder, or use auto, never or force.")  # fmt: skip
        return ResumeChoice(folder, f"resuming from {folder} (ROCMFT_RESUME)")
    choice = newest_complete(output_dir)
    if choice.checkpoint is None or setting == "force" or previous is None:
        return choice
    changed = differences(previous, current, named)
    if changed:
        raise ConfigError(
            f"ROCMFT_RESUME={setting}: OUTPUT_DIR {output_dir} holds {choice.checkpoint.name} of a run with other "
            f"settings (earlier values from {record or 'its rocmft/train.yaml'} -> this run's): "
            + "; ".join(changed)
            + "."
            + world_size_note(choice.checkpoint, previous.get("world_size"), current.get("world_size")),
            "Set OUTPUT_DIR to a new folder for the new settings (ROCMFT_RESUME=never starts over here instead, "
            "ROCMFT_RESUME=force continues from the checkpoint anyway).",
        )
    return choice


def world_size_note(checkpoint: Path, before: Any, now: Any) -> str:
    """What a changed world size (nodes × processes per node) does to a resume from ``checkpoint``; "" when it did
    not change. A ZeRO checkpoint (``global_step*/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt``, one per
    rank: DeepSpeed 0.18.4's engine ``_get_zero_ckpt_name``) holds each rank's partition of the optimizer states,
    so it loads only on the same world size unless it is first converted to a universal checkpoint (DeepSpeed's
    ``deepspeed/checkpoint/ds_to_universal.py``, then ``"checkpoint": {"load_universal": true}`` in the ds_config;
    DeepSpeed's universal-checkpointing tutorial). Any world size also changes the effective batch
    (micro-batch × gradient accumulation × world size) and so the run's data order and loss curve."""
    if before == now or before is None:
        return ""
    note = (f" The world size changed from {before} to {now} processes: the effective batch (micro-batch x "
            "gradient accumulation x world size) changes with it, and so does the loss curve.")  # fmt: skip
    if any(checkpoint.glob("global_step*/*zero_pp_rank_*_optim_states.pt")):
        note += (f" {checkpoint.name} is a DeepSpeed ZeRO checkpoint partitioned over {before} ranks; it loads on "
                 f"{now} only after DeepSpeed's ds_to_universal.py converts it and the ds_config sets "
                 '"checkpoint": {"load_universal": true}. Or resume with the earlier node count.')  # fmt: skip
    return note
