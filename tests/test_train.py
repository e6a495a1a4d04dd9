"""Real LLaMA-Factory training runs on the CPU with the tiny model (tens of seconds each)."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from conftest import DEFAULT_SECRET as SECRET
from conftest import all_text_under, logged_losses, rocmft_in
from rocmft.errors import ExitCode

pytestmark = pytest.mark.train


def test_builtin_default_trains_and_leaves_a_complete_record(default_run, cache_dir):
    """The session's built-in default run (conftest.default_run: `rocmft train` with no settings but two secrets),
    shared with test_serve.py, which exports it."""
    output, stdout = default_run.output, default_run.stdout
    losses = logged_losses(output)
    assert losses[-1] <= losses[0] / 2, f"loss did not halve: {losses[0]} -> {losses[-1]}"
    for name in ("model.safetensors", "config.json", "trainer_log.jsonl", "training_loss.png",
                 "rocmft/train.yaml", "rocmft/checks.json", "rocmft/manifest.json", "rocmft/train.log",
                 "rocmft/data/dataset_info.json"):  # fmt: skip
        assert (output / name).is_file(), name
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["exit_code"] == 0
    assert manifest["precision"]["policy"] == "fp32" and manifest["precision"]["parameter_dtypes"] == {"float32": 26}
    assert manifest["versions"]["llamafactory"] == "0.9.5" and manifest["host"]["cpus_logical"] >= 1
    assert {"settings", "render", "validate", "checks", "train"} <= set(manifest["timings_s"])
    assert manifest["environment"]["HF_TOKEN"] == "<redacted>"
    assert manifest["settings"]["secrets_given"] == ["HF_HUB_TOKEN"]
    assert "[rocmft] step " in stdout and "tok/s" in stdout
    # what a new user saw (issue 33): each step said once, rocmft's line, not also the trainer's raw {'loss': ...}
    # dict, which still reaches LLaMA-Factory's trainer_log.jsonl (the losses above) and transformers' log history;
    # no GPU here, and no DeepSpeed "Setting accelerator to CPU" warning (rocmft.worker.patches)
    step_lines = [line for line in stdout.splitlines() if line.startswith("[rocmft] step ")]
    said = {"one line per logged step": len(step_lines) == len(losses),
            "no raw step dict": "{'loss':" not in stdout,
            "no DeepSpeed CPU warning": "Setting accelerator to CPU" not in stdout,
            "the loss trend": f"over {len(losses)} logged steps; outputs in" in stdout}  # fmt: skip
    assert all(said.values()), said
    history = json.loads((output / "trainer_state.json").read_text())["log_history"]
    assert [entry["loss"] for entry in history if "loss" in entry] == losses
    assert "'train_runtime':" in stdout  # the trainer's other dicts are still printed
    # one process: the worker is the child that imported LLaMA-Factory and parsed the configuration
    assert "the worker is the process that validated the configuration" in stdout
    assert SECRET not in all_text_under(output) and SECRET not in stdout
    status = rocmft_in(default_run.folder, cache_dir, "status")  # the healthcheck finds the run this container started
    assert status.returncode == 0 and status.stdout.startswith("finished: step 240/240, loss "), status.stdout


def test_deepspeed_is_told_cpu_only_where_it_would_pick_cpu(monkeypatch):
    """DS_ACCELERATOR=cpu is set exactly where DeepSpeed's own detection would fall back to the CPU (and warn): not
    over a user's DS_ACCELERATOR, not when torch sees a GPU (its detection and messages stay DeepSpeed's)."""
    import torch

    from rocmft.worker.patches import deepspeed_accelerator_without_gpu

    assert deepspeed_accelerator_without_gpu({"DS_ACCELERATOR": "cuda"}) is None
    environ: dict[str, str] = {}
    if torch.cuda.device_count() == 0:  # this machine, as CI's: no GPU
        assert deepspeed_accelerator_without_gpu(environ) == "cpu" and environ == {"DS_ACCELERATOR": "cpu"}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu_environ: dict[str, str] = {}
    assert deepspeed_accelerator_without_gpu(gpu_environ) is None and gpu_environ == {}


_UNWRAP_A_PLAIN_MODEL = """
import json, sys
import torch
from rocmft.worker.patches import deepspeed_unimported_unless_configured
applied = deepspeed_unimported_unless_configured(json.loads(sys.argv[1]))
from accelerate.utils.other import extract_model_from_parallel
extract_model_from_parallel(torch.nn.Linear(2, 2))
print(json.dumps({"applied": applied, "deepspeed_imported": "deepspeed" in sys.modules}))
"""


@pytest.mark.parametrize(("arguments", "expected"), [
    ({}, {"applied": True, "deepspeed_imported": False}),
    ({"deepspeed": "ds_config.json"}, {"applied": False, "deepspeed_imported": True}),
], ids=["no DeepSpeed config", "a DeepSpeed config"])  # fmt: skip
def test_a_run_without_a_deepspeed_config_never_imports_deepspeed(arguments, expected):
    """accelerate's extract_model_from_parallel, which transformers' Trainer calls in its __init__, imports DeepSpeed
    whenever it is installed (4.2 CPU-s per worker here); the worker's patch keeps it out of runs that name no
    DeepSpeed config, and a run with one imports it as before. The real accelerate function, in a fresh process."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _UNWRAP_A_PLAIN_MODEL, json.dumps(arguments)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


_IMPORT_TRLS_TRAINERS = """
import json, sys
from rocmft.worker.patches import wandb_unimported_unless_reported
applied = wandb_unimported_unless_reported(json.loads(sys.argv[1]))
from trl import KTOTrainer  # what llamafactory.train.tuner imports for every stage (its KTO workflow)
print(json.dumps({"applied": applied, "wandb_imported": "wandb" in sys.modules}))
"""


@pytest.mark.parametrize(("arguments", "expected"), [
    ({"report_to": "none"}, {"applied": True, "wandb_imported": False}),
    ({"report_to": "tensorboard,wandb"}, {"applied": False, "wandb_imported": True}),
], ids=["no tracker", "wandb named"])  # fmt: skip
def test_a_run_that_reports_to_no_wandb_never_imports_wandb(arguments, expected):
    """transformers' is_wandb_available imports wandb to answer, and trl's trainer modules, which LLaMA-Factory's
    tuner imports for every stage, ask it at import (0.8 s per worker here); the worker's patch keeps wandb out of
    runs whose report_to does not name it, and a run that names it imports it as before (its records:
    tests/test_trackers.py). The real trl import, in a fresh process."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _IMPORT_TRLS_TRAINERS, json.dumps(arguments)],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


_ASK_THE_MODEL_KIND = """
import json, sys
import transformers
from rocmft.worker.patches import model_kind_asked_without_importing_every_config
applied = model_kind_asked_without_importing_every_config() if sys.argv[1] == "patched" else False
before = len(sys.modules)
kinds = [transformers.Qwen2Config in getattr(transformers, auto)._model_mapping.keys()  # llamafactory's load_model
         for auto in ("AutoModelForImageTextToText", "AutoModelForSeq2SeqLM", "AutoModelForTextToWaveform")]
print(json.dumps({"applied": applied, "kinds": kinds, "few_imports": len(sys.modules) - before < 20}))
"""


@pytest.mark.parametrize(("mode", "expected"), [
    ("patched", {"applied": True, "kinds": [False] * 3, "few_imports": True}),
    ("plain", {"applied": False, "kinds": [False] * 3, "few_imports": False}),
])  # fmt: skip
def test_asking_a_models_kind_imports_no_other_models_config(mode, expected):
    """LLaMA-Factory's load_model asks `type(config) in <mapping>.keys()` of three Auto classes, and transformers'
    keys() imports every model type's configuration module (210 modules, ~0.9 CPU-s per worker); patched, the same
    answers import almost none. The real test of load_model, in a fresh process (plain: what the patch avoids)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _ASK_THE_MODEL_KIND, mode], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected


def test_the_model_kind_patch_answers_as_the_list_for_every_config_class():
    """The patched ``in`` matches by name then identity; the list matches by identity. For every config class that
    the pinned transformers' three mappings hold (so no alias under another name) and for a config class none of
    them holds, both give the same answer."""
    import transformers

    from rocmft.worker import patches

    autos = ("AutoModelForImageTextToText", "AutoModelForSeq2SeqLM", "AutoModelForTextToWaveform")
    patches.model_kind_asked_without_importing_every_config()
    try:
        _answers_as_the_list(transformers, autos, patches._ConfigClasses)
    finally:  # this test process's transformers as it was
        for auto in autos:
            vars(getattr(transformers, auto)._model_mapping).pop("keys", None)


def _answers_as_the_list(transformers, autos, view_class) -> None:
    held = set()
    for auto in autos:
        view = getattr(transformers, auto)._model_mapping.keys()
        assert isinstance(view, view_class)
        classes = list(view)  # the list transformers builds
        assert classes and all(config_class in view for config_class in classes), auto
        assert len(view) == len(classes)
        for config_class in (transformers.Qwen2Config, transformers.LlamaConfig, transformers.Qwen2VLConfig):
            assert (config_class in view) == (config_class in classes), (auto, config_class)
        held.update(classes)
    assert transformers.Qwen2VLConfig in held and transformers.Qwen2Config not in held


def test_fp32_policy_really_trains_fp32_weights(run_rocmft, tmp_path, bf16_checkpoint, demo_data):
    """DESIGN.md: with bf16 and fp16 off, LLaMA-Factory 0.9.5 loads a bf16 checkpoint in bf16 where bf16 is
    supported (the CPU supports it); with LoRA only the adapter is then upcast, the frozen base stays bf16.
    The fp32 policy must load fp32: proven by the dtypes of all parameters of the live model (recorded by
    the worker at train start) and of the saved adapter. Without the policy this run exits 4 instead."""
    output = tmp_path / "fp32"
    result = run_rocmft("train", env={
        "MODEL_NAME_OR_PATH": str(bf16_checkpoint), "ROCMFT_PRECISION": "fp32", "FINETUNING_TYPE": "lora",
        "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data), "MAX_STEPS": "3", "CUTOFF_LEN": "64",
        "OUTPUT_DIR": str(output),
    })  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert set(manifest["precision"]["parameter_dtypes"]) == {"float32"}, manifest["precision"]
    assert manifest["precision"]["compute_dtype"] == "float32"
    with safe_open(output / "adapter_model.safetensors", "pt") as weights:
        dtypes = {str(weights.get_tensor(name).dtype) for name in weights.keys()}  # noqa: SIM118
    assert dtypes == {"torch.float32"}


def test_shared_demo_data_with_lora(run_rocmft, tmp_path, tiny_model, shared_data):
    output = tmp_path / "lora"
    result = run_rocmft("train", env={
        "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "alpaca_zh_demo,identity", "DATASET_DIR": str(shared_data),
        "TEMPLATE": "qwen", "OUTPUT_DIR": str(output), "MAX_STEPS": "4", "LOGGING_STEPS": "2",
    })  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    for name in ("adapter_model.safetensors", "adapter_config.json", "trainer_log.jsonl", "training_loss.png",
                 "rocmft/manifest.json", "rocmft/checks.json", "rocmft/train.yaml"):  # fmt: skip
        assert (output / name).is_file(), name
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["data_sets"]["identity"]["file_name"] == str(shared_data.resolve() / "identity.json")
    assert manifest["argument_sources"]["dataset"] == "DATASET"
    assert len(logged_losses(output)) == 2


def test_non_finite_loss_stops_with_exit_5(run_rocmft, tmp_path):
    output = tmp_path / "nan"
    # the fault simulates a bf16 overflow, so it fires under bf16 only (CPU bf16 needs USE_CPU in transformers 5)
    result = run_rocmft("train", env={"ROCMFT_FAULT_NAN_AT_STEP": "6", "OUTPUT_DIR": str(output),
                                      "ROCMFT_PRECISION": "bf16", "USE_CPU": "true"})  # fmt: skip
    assert result.returncode == ExitCode.NON_FINITE_LOSS, result.stdout[-3000:]
    assert "STOPPED" in result.stdout and "at step 10" in result.stdout  # the next logging step (every 5)
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["status"] == "non-finite loss" and manifest["exit_code"] == 5
    assert manifest["worker"]["non_finite"]["step"] == 10
    status = run_rocmft("status", str(output))
    assert status.returncode == 1 and status.stdout.startswith("non-finite loss: step 5/"), status.stdout


def test_neat_packing_counts_the_tokens_it_trains_on(run_rocmft, tmp_path, tiny_model, demo_data):
    """Neat packing hands the model a 4-D attention mask; transformers' non_padding count summed that mask and
    reported 0 tokens (measured on an H200, tokens/s read nan). The count is the real tokens: more than one
    sample's worth per packed row, never more than the rows' room."""
    output = tmp_path / "neat"
    steps, rows, cutoff = 3, 2, 128
    result = run_rocmft("train", env={
        "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
        "PACKING": "true", "NEAT_PACKING": "true", "CUTOFF_LEN": str(cutoff), "MAX_STEPS": str(steps),
        "PER_DEVICE_TRAIN_BATCH_SIZE": str(rows), "GRADIENT_ACCUMULATION_STEPS": "1", "OUTPUT_DIR": str(output),
    })  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    state = json.loads((output / "trainer_state.json").read_text())
    seen = max(h.get("num_input_tokens_seen", 0) for h in state["log_history"])
    assert cutoff < seen <= steps * rows * (cutoff + 1), seen
    assert "tok/s nan" not in result.stdout


def test_grad_norm_spike_from_real_gradients_stops_the_run(run_rocmft, tmp_path):
    """A real CPU run whose gradients at step 8 are multiplied by 1000 (ROCMFT_FAULT_GRAD_SPIKE_AT_STEP: no NaN, no
    lowered limit): the logged gradient norm of step 8 (~3,800 where the others are 2-3) is far above 10x the median
    of the earlier ones, and with ROCMFT_ON_GRAD_NORM_SPIKE=stop the run stops at that step (exit 5) with the median
    it was judged against. The absolute limit is turned off so that the relative rule is the one proved."""
    output = tmp_path / "spike"
    env = {"ROCMFT_FAULT_GRAD_SPIKE_AT_STEP": "8", "ROCMFT_ON_GRAD_NORM_SPIKE": "stop", "MAX_STEPS": "12",
           "ROCMFT_GRAD_NORM_LIMIT": "0", "LOGGING_STEPS": "1", "OUTPUT_DIR": str(output)}  # fmt: skip
    result = run_rocmft("train", env=env)
    assert result.returncode == ExitCode.NON_FINITE_LOSS, result.stdout[-3000:]
    assert "TEST FAULT: gradients of step 8 multiplied by 1000" in result.stdout
    assert "STOPPED (grad-norm spike)" in result.stdout and "x the median" in result.stdout
    worker = json.loads((output / "rocmft" / "manifest.json").read_text())["worker"]
    assert worker["non_finite"]["step"] == 8 and worker["non_finite"]["key"] == "grad_norm", worker["non_finite"]
    assert float(worker["non_finite"]["value"]) > 10 * float(worker["non_finite"]["median"]), worker["non_finite"]


def test_grad_norm_above_the_limit_warns_or_stops(run_rocmft, tmp_path):
    """A real CPU run whose gradient norm (~0.5 for the tiny model) is above a limit set below it: by default a
    warning with the fix and the run finishes; with ROCMFT_ON_GRAD_NORM_SPIKE=stop it stops like a NaN (exit 5)
    and the manifest names the cause."""
    base = {"ROCMFT_GRAD_NORM_LIMIT": "0.001", "MAX_STEPS": "10"}
    warned = run_rocmft("train", env={**base, "OUTPUT_DIR": str(tmp_path / "warn")})
    assert warned.returncode == ExitCode.OK, warned.stdout[-3000:]
    assert warned.stdout.count("WARNING: gradient norm") == 1  # at most once per 100 steps
    assert "above ROCMFT_GRAD_NORM_LIMIT=0.001" in warned.stdout and "rocmft check" in warned.stdout
    output = tmp_path / "stop"
    stopped = run_rocmft("train", env={**base, "OUTPUT_DIR": str(output), "ROCMFT_ON_GRAD_NORM_SPIKE": "stop"})
    assert stopped.returncode == ExitCode.NON_FINITE_LOSS, stopped.stdout[-3000:]
    assert "STOPPED (grad-norm spike)" in stopped.stdout and "Traceback" not in stopped.stdout
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["worker"]["non_finite"]["cause"] == "grad-norm spike"
    assert manifest["worker"]["non_finite"]["key"] == "grad_norm"
