"""Resume decisions on recorded checkpoint folders (complete vs cut short, ROCMFT_RESUME's four values, the
refusal to continue a run whose settings changed), and the loss-spike rule of the watchdog. The checkpoint files
are laid out as transformers' Trainer writes them (model, optimizer, scheduler, RNG, then trainer_state.json
last)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import yaml

from rocmft.errors import ConfigError
from rocmft.render.resume import checkpoint_problem, newest_complete


def write_safetensors(path: Path, truncate: bool = False) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    data = struct.pack("<Q", len(header)) + header + b"\0" * 8
    path.write_bytes(data[: len(data) // 2] if truncate else data)


def checkpoint(output: Path, step: int, *, state: bool = True, truncated: bool = False) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    write_safetensors(folder / "model.safetensors", truncate=truncated)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (folder / name).write_bytes(b"torch")
    if state:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return folder


def test_complete_and_cut_short_checkpoints(tmp_path):
    assert checkpoint_problem(checkpoint(tmp_path, 10)) is None
    assert "no trainer_state.json" in checkpoint_problem(checkpoint(tmp_path, 20, state=False))
    assert "truncated" in checkpoint_problem(checkpoint(tmp_path, 30, truncated=True))
    choice = newest_complete(tmp_path)
    assert choice.checkpoint == tmp_path / "checkpoint-10"
    assert [name for name, _ in choice.skipped] == ["checkpoint-30", "checkpoint-20"]
    assert newest_complete(tmp_path, at_most_step=5).checkpoint is None


def previous_run(output: Path, **arguments) -> None:
    """The earlier run's record as rocmft leaves it: OUTPUT_DIR/rocmft/train.yaml and manifest.json."""
    (output / "rocmft").mkdir(parents=True)
    (output / "rocmft" / "train.yaml").write_text(yaml.safe_dump(arguments))
    (output / "rocmft" / "manifest.json").write_text(json.dumps({"worker": {"world_size": 1}}))


def test_auto_resumes_an_unchanged_run_and_refuses_a_changed_one(render_env, tmp_path, tiny_model):
    output = tmp_path / "out"
    checkpoint(output, 5)
    same = render_env({"DATASET": "identity"})
    previous_run(output, **same.arguments)  # the earlier run rendered the same settings
    plan = render_env({"DATASET": "identity"})
    assert plan.arguments["resume_from_checkpoint"] == str(output / "checkpoint-5")
    assert str(plan.sources["resume_from_checkpoint"]) == "ROCMFT_RESUME=auto"
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "identity", "CUTOFF_LEN": "64"})
    assert "cutoff_len: 2048 -> CUTOFF_LEN=64 (set in the environment)" in str(caught.value)
    assert f"earlier values from {output / 'rocmft' / 'train.yaml'}" in str(caught.value)
    assert "ROCMFT_RESUME=force" in caught.value.remedy
    forced = render_env({"DATASET": "identity", "CUTOFF_LEN": "64", "ROCMFT_RESUME": "force"})
    assert forced.arguments["resume_from_checkpoint"] == str(output / "checkpoint-5")
    never = render_env({"DATASET": "identity", "ROCMFT_RESUME": "never"})
    assert "resume_from_checkpoint" not in never.arguments and never.arguments["overwrite_output_dir"] is True


def test_a_given_checkpoint_must_be_complete(render_env, tmp_path):
    partial = checkpoint(tmp_path / "elsewhere", 7, state=False)
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "identity", "ROCMFT_RESUME": str(partial)})
    assert "ROCMFT_RESUME" in str(caught.value) and "no trainer_state.json" in str(caught.value)
    good = checkpoint(tmp_path / "elsewhere", 8)
    assert render_env({"DATASET": "identity", "ROCMFT_RESUME": str(good)}).arguments["resume_from_checkpoint"] == str(
        good
    )


def test_loss_spike_rule():
    from rocmft.worker import loss_spike

    steady = [2.1, 2.0, 1.9, 2.0, 1.95]
    assert loss_spike(steady, 25.0, 10.0) == 2.0  # diverged: 12x the median and 23 nats above it
    assert loss_spike(steady, 3.0, 10.0) is None  # noise
    assert loss_spike(steady[:4], 25.0, 10.0) is None  # too little history
    assert loss_spike(steady, 25.0, 0) is None  # off
    assert loss_spike([0.01, 0.012, 0.011, 0.009, 0.01], 0.2, 10.0) is None  # memorizing: 20x but only 0.19 nats


def test_a_changed_world_size_is_explained_and_zero_checkpoints_say_how_to_convert(tmp_path):
    """The ZeRO file layout is DeepSpeed 0.18.4's (runtime/engine.py: ``{bf16_}zero_pp_rank_{dp_rank}`` +
    ``_mp_rank_00_optim_states.pt`` under ``global_step<N>``); the files here are empty stand-ins of that layout."""
    from rocmft.render.resume import world_size_note

    plain = tmp_path / "checkpoint-4"
    plain.mkdir()
    assert world_size_note(plain, 2, 2) == ""
    assert "effective batch" in world_size_note(plain, 2, 4) and "ds_to_universal" not in world_size_note(plain, 2, 4)
    zero = tmp_path / "checkpoint-8"
    (zero / "global_step8").mkdir(parents=True)
    (zero / "global_step8" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").touch()
    note = world_size_note(zero, 2, 4)
    assert "partitioned over 2 ranks" in note and "ds_to_universal.py" in note and "load_universal" in note


def test_grad_norm_spike_rule():
    """Above the limit with no history (hiyouga/LlamaFactory#7890: thousands from step 1), or factor x the median."""
    from rocmft.worker import grad_norm_spike

    assert grad_norm_spike([], 3000.0, 10.0, 1000.0) == (1000.0, "above ROCMFT_GRAD_NORM_LIMIT=1000")
    assert grad_norm_spike([], 3000.0, 10.0, 0) is None  # limit off, no history yet
    steady = [0.8, 0.7, 0.75, 0.9, 0.8]
    reference, why = grad_norm_spike(steady, 12.0, 10.0, 1000.0)
    assert reference == 0.8 and "15.0x the median 0.8" in why
    assert grad_norm_spike(steady, 5.0, 10.0, 1000.0) is None  # 6x: noise
    assert grad_norm_spike(steady, 12.0, 0, 0) is None  # both off


def weights_only_checkpoint(output: Path, step: int, keep: tuple[str, ...] = ()) -> Path:
    """A checkpoint as transformers 5.6 writes it with SAVE_ONLY_MODEL=true (``Trainer._save_checkpoint`` skips
    ``_save_optimizer_and_scheduler`` and the RNG state), plus any of the state files in ``keep`` (a folder copied
    in part)."""
    folder = checkpoint(output, step)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        if name not in keep:
            (folder / name).unlink()
    return folder


def test_a_checkpoint_without_optimizer_state_is_refused_with_both_fixes(render_env, tmp_path):
    """dexmal/opendm#7: with save_only_model an automatic resume "effectively becomes a weights-only restart, which
    may differ from an uninterrupted training run" (the maintainers: expected, it cannot be an exact resume);
    transformers 5.6's _load_optimizer_and_scheduler then goes on without a word. The refusal names the folder and
    what is missing, and gives both ways on; the opt-in continues from it and says so."""
    output = tmp_path / "out"
    folder = weights_only_checkpoint(output, 6)
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "identity"})
    message, fix = str(caught.value), caught.value.remedy
    assert f"{folder} has no optimizer state (no optimizer.pt and no scheduler.pt" in message
    assert "fresh" in message and "ROCMFT_RESUME=never" in fix and "ROCMFT_RESUME_WEIGHTS_ONLY=true" in fix
    plan = render_env({"DATASET": "identity", "ROCMFT_RESUME_WEIGHTS_ONLY": "true"})
    assert plan.arguments["resume_from_checkpoint"] == str(folder)
    assert (
        str(plan.sources["resume_from_checkpoint"])
        == "ROCMFT_RESUME=auto, weights only (ROCMFT_RESUME_WEIGHTS_ONLY=true)"
    )
    assert plan.resume.as_record() == {"checkpoint": str(folder), "weights_only": True,
                                       "missing": "no optimizer.pt and no scheduler.pt"}  # fmt: skip
    assert "WEIGHTS ONLY" in plan.resume.note and "learning-rate schedule start fresh" in plan.resume.note
    never = render_env({"DATASET": "identity", "ROCMFT_RESUME": "never"})
    assert "resume_from_checkpoint" not in never.arguments


def test_a_copied_checkpoint_missing_one_state_file_is_refused_too(render_env, tmp_path):
    """transformers loads the optimizer only when optimizer.pt and scheduler.pt are both there: a copy without
    scheduler.pt loses the Adam moments as well. A folder given in ROCMFT_RESUME is held to the same rule."""
    folder = weights_only_checkpoint(tmp_path / "elsewhere", 9, keep=("optimizer.pt", "rng_state.pth"))
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "identity", "ROCMFT_RESUME": str(folder)})
    assert f"ROCMFT_RESUME={folder}: {folder} has no optimizer state (no scheduler.pt;" in str(caught.value)
    plan = render_env({"DATASET": "identity", "ROCMFT_RESUME": str(folder), "ROCMFT_RESUME_WEIGHTS_ONLY": "1"})
    assert plan.resume.weights_only and plan.resume.missing == "no scheduler.pt"


def test_weights_only_is_refused_under_deepspeed(render_env, tmp_path):
    """hiyouga/LlamaFactory#5497: DeepSpeed with save_only_model leaves no global_step folder and transformers'
    deepspeed_load_checkpoint raises "Can't find a valid checkpoint" after the model loaded; the maintainer: the two
    cannot be combined. So the opt-in cannot help there: refused, with the fixes that work."""
    folder = weights_only_checkpoint(tmp_path / "out", 4)
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "identity", "ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_RESUME_WEIGHTS_ONLY": "true"})
    assert "cannot continue it under DeepSpeed" in str(caught.value)
    assert "ROCMFT_RESUME=never" in caught.value.remedy and f"ADAPTER_NAME_OR_PATH={folder}" in caught.value.remedy


def test_missing_state_reads_deepspeed_and_plain_layouts(tmp_path):
    """The layouts are DeepSpeed 0.18.4's (``global_step<N>/{bf16_}zero_pp_rank_<r>_mp_rank_00_optim_states.pt``
    with ZeRO, the optimizer inside ``mp_rank_00_model_states.pt`` without, ``latest`` naming the tag) and
    transformers 5.6's (optimizer.pt + scheduler.pt); empty files stand in for the states."""
    from rocmft.render.resume import missing_state

    zero = checkpoint(tmp_path, 8)
    for name in ("optimizer.pt", "scheduler.pt"):
        (zero / name).unlink()
    (zero / "global_step8").mkdir()
    (zero / "global_step8" / "zero_pp_rank_0_mp_rank_00_model_states.pt").touch()
    assert missing_state(zero) == "no optimizer state in global_step8/ (no *_optim_states.pt)"
    (zero / "global_step8" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").touch()
    assert "latest" in missing_state(zero)
    (zero / "latest").write_text("global_step8")
    assert missing_state(zero) is None
    assert missing_state(checkpoint(tmp_path, 9)) is None
    assert newest_complete(tmp_path, whole_state=True).checkpoint == tmp_path / "checkpoint-9"


def test_a_given_resume_from_checkpoint_is_held_to_the_same_rule(render_env, tmp_path):
    """LLaMA-Factory's own RESUME_FROM_CHECKPOINT goes to the trainer as it is: a weights-only folder there would
    continue as silently as one ROCMFT_RESUME found."""
    folder = weights_only_checkpoint(tmp_path / "elsewhere", 3)
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "identity", "RESUME_FROM_CHECKPOINT": str(folder)})
    assert f"RESUME_FROM_CHECKPOINT={folder} (set in the environment): {folder} has no optimizer state" in str(
        caught.value
    )
    plan = render_env({"DATASET": "identity", "RESUME_FROM_CHECKPOINT": str(folder), "ROCMFT_RESUME_WEIGHTS_ONLY": "1"})
    assert plan.arguments["resume_from_checkpoint"] == str(folder) and plan.resume.weights_only


@pytest.mark.train
def test_a_save_only_model_run_is_refused_then_continued_weights_only_on_request(run_rocmft, tmp_path, tiny_model,
                                                                                 demo_data):  # fmt: skip
    """The real thing on the CPU (three short runs of the tiny model): a run with SAVE_ONLY_MODEL=true leaves
    checkpoints without optimizer.pt and scheduler.pt (transformers 5.6); a longer run with the same settings is
    refused before anything starts, naming the checkpoint; with ROCMFT_RESUME_WEIGHTS_ONLY=true it continues from
    that step (the trainer's own state: its steps go on from 4), says so, and the manifest records it."""
    output = tmp_path / "weights-only"
    env = {
        "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
        "FINETUNING_TYPE": "lora", "CUTOFF_LEN": "64", "MAX_STEPS": "4", "SAVE_STEPS": "2", "LOGGING_STEPS": "1",
        "SAVE_ONLY_MODEL": "true", "OUTPUT_DIR": str(output), "PREPROCESSING_NUM_WORKERS": "1",
    }  # fmt: skip
    first = run_rocmft("train", env=env)
    assert first.returncode == 0, first.stdout[-3000:]
    folder = output / "checkpoint-4"
    assert (folder / "trainer_state.json").is_file() and not (folder / "optimizer.pt").exists()

    longer = {**env, "MAX_STEPS": "6"}
    refused = run_rocmft("train", env=longer)
    assert refused.returncode == 2, refused.stdout[-3000:]
    assert f"{folder} has no optimizer state (no optimizer.pt and no scheduler.pt" in refused.stdout
    assert "ROCMFT_RESUME_WEIGHTS_ONLY=true" in refused.stdout and "ROCMFT_RESUME=never" in refused.stdout

    again = run_rocmft("train", env={**longer, "ROCMFT_RESUME_WEIGHTS_ONLY": "true"})
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"[rocmft] WARNING: resuming from {folder} (step 4), WEIGHTS ONLY" in again.stdout
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["resume"] == {"checkpoint": str(folder), "weights_only": True,
                                  "missing": "no optimizer.pt and no scheduler.pt"}  # fmt: skip
    steps = [entry["step"] for entry in manifest["worker"]["losses"]]
    assert steps == [5, 6], steps  # this attempt trained steps 5 and 6: continued, not started over
