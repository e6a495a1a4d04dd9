"""Resume: find the newest complete checkpoint in OUTPUT_DIR and decide whether this run continues from it.

transformers writes a checkpoint in place (``checkpoint-<step>/``: the model or adapter, then the optimizer,
scheduler and RNG states, and ``trainer_state.json`` last; transformers' Trainer._save_checkpoint), and
deletes older ones beyond SAVE_TOTAL_LIMIT only after that. So a checkpoint is complete when its
trainer_state.json parses and says the same step as its name and its weights are there with readable headers. A
process killed mid-save leaves a checkpoint without trainer_state.json: skipped with a warning, never loaded.

A complete checkpoint without its optimizer state (``SAVE_ONLY_MODEL=true`` skips ``_save_optimizer_and_scheduler``,
or a folder copied without optimizer.pt / scheduler.pt / DeepSpeed's ``global_step<N>/``) is not resumed: transformers
5.6's ``Trainer._load_optimizer_and_scheduler`` loads the states only when optimizer.pt *and* scheduler.pt are there
and otherwise goes on without a word, so the run would continue at step N with fresh Adam moments and a learning-rate
schedule started over (warmup again; built for MAX_STEPS and stepped from 0, it does not reach its end): another run
than the one it continues (dexmal/opendm#7: with save_only_model "automatic resume ... effectively becomes a
weights-only restart"); under DeepSpeed transformers raises "Can't find a valid checkpoint" after the model loaded
(hiyouga/LlamaFactory#5497). It is refused (:func:`choose`), unless ``ROCMFT_RESUME_WEIGHTS_ONLY=true`` asks for
exactly that continuation, which is then said and recorded.

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
    return None


def missing_state(folder: Path) -> str | None:
    """What a complete checkpoint lacks to continue its run exactly, or None when nothing is missing.

    transformers 5.6 (``Trainer._load_optimizer_and_scheduler``) restores the optimizer only when ``optimizer.pt``
    (or ``optimizer.bin``, or an FSDP ``optimizer*`` folder) and ``scheduler.pt`` are both there; under DeepSpeed
    the optimizer state is in ``global_step<N>/``: ``*_optim_states.pt`` per rank with ZeRO (DeepSpeed 0.18.4's
    engine ``_get_zero_ckpt_name``), inside ``mp_rank_00_model_states.pt`` without it, found through the ``latest``
    file (``DeepSpeedEngine.load_checkpoint`` returns nothing without it and transformers raises)."""
    steps = [p for p in folder.glob("global_step*") if p.is_dir()]
    if steps:
        states = [p for step in steps for p in step.glob("*_optim_states.pt")]
        zero_files = [p for step in steps for p in step.glob("*zero_pp_rank_*")]
        if not states and (zero_files or not any(step.glob("mp_rank_*_model_states.pt") for step in steps)):
            return f"no optimizer state in {steps[0].name}/ (no *_optim_states.pt)"
        if not (folder / "latest").is_file():
            return "no DeepSpeed `latest` file naming its global_step folder"
        return None
    optimizer = (
        (folder / "optimizer.pt").is_file()
        or (folder / "optimizer.bin").is_file()
        or any(p.is_dir() and p.name.startswith("optimizer") for p in folder.iterdir())
    )
    scheduler = (folder / "scheduler.pt").is_file()
    missing = [name for name, there in (("optimizer.pt", optimizer), ("scheduler.pt", scheduler)) if not there]
    return f"no {' and no '.join(missing)}" if missing else None


# transformers builds the scheduler for the whole run and steps it from 0; without scheduler.pt nothing moves it on
WEIGHTS_ONLY_EFFECT = ("the optimizer (Adam moments) and the learning-rate schedule start fresh at that step: warmup "
                       "runs again and the decay starts from the top")  # fmt: skip


@dataclass
class ResumeChoice:
    """What ROCMFT_RESUME decided. ``checkpoint``: the folder to resume from (None: start over); ``skipped``:
    incomplete checkpoints with the reason; ``note``: one line for the log; ``missing``: what ``checkpoint`` lacks
    (:func:`missing_state`), None when it holds the whole training state; ``weights_only``: the run continues
    from it anyway (ROCMFT_RESUME_WEIGHTS_ONLY)."""

    checkpoint: Path | None
    note: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    missing: str | None = None
    weights_only: bool = False

    def as_record(self) -> dict[str, Any]:
        """The manifest's ``resume`` object: ``{checkpoint, weights_only, missing}`` (checkpoint None: step 0)."""
        checkpoint = str(self.checkpoint) if self.checkpoint is not None else None
        return {"checkpoint": checkpoint, "weights_only": self.weights_only, "missing": self.missing}


def checkpoints(output_dir: Path) -> list[Path]:
    """``checkpoint-<step>`` folders in ``output_dir``, newest (highest step) first."""
    if not output_dir.is_dir():
        return []
    found = [p for p in output_dir.iterdir() if p.is_dir() and CHECKPOINT.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT.match(p.name).group(1)), reverse=True)


def newest_complete(output_dir: Path, at_most_step: int | None = None, whole_state: bool = False) -> ResumeChoice:
    """The newest complete checkpoint (at or below ``at_most_step`` when given), with the skipped ones; with
    ``whole_state`` only one that holds its optimizer state too (:func:`missing_state`)."""
    skipped = []
    for folder in checkpoints(output_dir):
        step = int(CHECKPOINT.match(folder.name).group(1))
        if at_most_step is not None and step > at_most_step:
            continue
        problem = checkpoint_problem(folder)
        missing = missing_state(folder) if problem is None else None
        if whole_state and missing is not None:
            problem = missing
        if problem is None:
            return ResumeChoice(folder, f"resuming from {folder} (step {step})", skipped, missing)
        skipped.append((folder.name, problem))
    return ResumeChoice(None, "no complete checkpoint: starting from step 0", skipped)


def last_good_checkpoint(output_dir: Path, losses: list[dict[str, Any]]) -> Path | None:
    """After a divergence: the newest complete checkpoint at or before the last finite logged loss (``losses``:
    the worker's ``{"step", "loss"}`` records). A checkpoint saved between that log and the detection may
    already hold NaN weights, so it is never chosen."""
    good_step = max((entry["step"] for entry in losses), default=0)
    return newest_complete(output_dir, at_most_step=good_step, whole_state=True).checkpoint


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


def weights_only(choice: ResumeChoice, label: str, allowed: bool, deepspeed: bool) -> ResumeChoice:
    """``choice`` when its checkpoint holds the whole training state; the weights-only continuation when
    ``allowed`` (ROCMFT_RESUME_WEIGHTS_ONLY=true), with a note that says what it changes. ``label`` names the
    setting that chose the checkpoint (``ROCMFT_RESUME=auto``, ``RESUME_FROM_CHECKPOINT=... (set in ...)``).

    Raises:
        ConfigError: the checkpoint lacks its optimizer state (:func:`missing_state`) and ``allowed`` is False,
            naming the folder, what is missing and the two fixes; or ``allowed`` under DeepSpeed (``deepspeed``),
            whose checkpoint loader needs the global_step folder (hiyouga/LlamaFactory#5497).
    """
    folder, missing = choice.checkpoint, choice.missing
    if folder is None or missing is None:
        return choice
    what = (f"{label}: {folder} has no optimizer state ({missing}; SAVE_ONLY_MODEL=true saves none, "
            "or the folder was copied without it)")  # fmt: skip
    if allowed and deepspeed:
        raise ConfigError(f"{what}, and ROCMFT_RESUME_WEIGHTS_ONLY=true cannot continue it under DeepSpeed: "
                          "transformers' DeepSpeed loader needs the global_step folder and fails after the model "
                          "loads.",
                          "Start fresh: ROCMFT_RESUME=never (or a new OUTPUT_DIR); for LoRA, ADAPTER_NAME_OR_PATH="
                          f"{folder} with a new OUTPUT_DIR starts a new run from its adapter.")  # fmt: skip
    if not allowed:
        raise ConfigError(f"{what}: resuming would load its weights and step count but {WEIGHTS_ONLY_EFFECT}, so the "
                          "run would not be the one it continues.",
                          "Start fresh: ROCMFT_RESUME=never (or a new OUTPUT_DIR); or continue from its weights with a "
                          "fresh optimizer: ROCMFT_RESUME_WEIGHTS_ONLY=true (said on the console, recorded in the "
                          "manifest). To resume exactly next time, leave SAVE_ONLY_MODEL unset.")  # fmt: skip
    note = (f"{choice.note}, WEIGHTS ONLY (ROCMFT_RESUME_WEIGHTS_ONLY=true): {folder.name} has {missing}; "
            f"{WEIGHTS_ONLY_EFFECT}")  # fmt: skip
    return ResumeChoice(folder, note, choice.skipped, missing, weights_only=True)


def given_checkpoint(given: str, label: str, *, weights_only_ok: bool, deepspeed: bool) -> ResumeChoice | None:
    """A RESUME_FROM_CHECKPOINT the user gave (``given``; ``label`` names it): LLaMA-Factory hands it to the trainer
    as it is, so it is held to the same rule. None when it holds the whole training state, is not a complete checkpoint
    (the ``paths`` rule and the parser say what is wrong) or is no folder here; the weights-only choice when
    ``weights_only_ok``.

    Raises:
        ConfigError: it lacks its optimizer state (:func:`weights_only`).
    """
    try:  # a path that is no folder here, or not even a path ("~nobody/x", a NUL): the paths rule names it
        folder = Path(given).expanduser()
        if not folder.is_dir() or checkpoint_problem(folder) is not None or missing_state(folder) is None:
            return None
    except (OSError, ValueError, RuntimeError):
        return None
    choice = ResumeChoice(folder, f"resuming from {folder} ({label})", missing=missing_state(folder))
    return weights_only(choice, label, weights_only_ok, deepspeed)


def choose(setting: str, output_dir: Path, previous: dict[str, Any] | None, current: dict[str, Any],
           named=None, record: Path | None = None, *, weights_only_ok: bool = False,
           deepspeed: bool = False) -> ResumeChoice:  # fmt: skip
    """Apply ROCMFT_RESUME.

    Args:
        setting: ``auto``, ``never``, ``force`` or a checkpoint folder.
        output_dir: where the checkpoints are.
        previous: the earlier run's settings (its rocmft/train.yaml plus ``world_size``), None if unknown.
        current: this run's arguments plus ``world_size``.
        named: ``name -> text`` naming a current setting and its source for the message (see :func:`differences`).
        record: the earlier run's train.yaml, named in the message as where the earlier values came from.
        weights_only_ok: ROCMFT_RESUME_WEIGHTS_ONLY: a checkpoint without optimizer state may be continued.
        deepspeed: the run trains under DeepSpeed.

    Raises:
        ConfigError: a given folder that is not a complete checkpoint; a checkpoint without its optimizer state
            (:func:`weights_only`); under ``auto``, settings that changed since the checkpoint was written (listed).
    """
    if setting == "never":
        return ResumeChoice(None, "ROCMFT_RESUME=never: starting from step 0")
    if setting not in ("auto", "force"):
        folder = Path(setting).expanduser()
        problem = checkpoint_problem(folder) if folder.is_dir() else "no such folder"
        if problem:
            raise ConfigError(f"ROCMFT_RESUME={setting} is not a complete checkpoint: {problem}.",
                              "Point it at a checkpoint-<step> folder, or use auto, never or force.")  # fmt: skip
        choice = ResumeChoice(folder, f"resuming from {folder} (ROCMFT_RESUME)", missing=missing_state(folder))
        return weights_only(choice, f"ROCMFT_RESUME={setting}", weights_only_ok, deepspeed)
    choice = weights_only(newest_complete(output_dir), f"ROCMFT_RESUME={setting}", weights_only_ok, deepspeed)
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
