"""One small wrong input per kind of mistake that rocmft refuses before anything runs (docs/rules.md): the exit
code, the variables and keys named in the message, and nothing left in OUTPUT_DIR. Kinds caught by the health
checks (exit 3) are tested with their checks: tests/test_cli.py (data sets, columns, output folder),
tests/test_gpu_checks.py (shm, device nodes, gfx target, collectives, libraries, memory fit). The command runs in the
pytest process (conftest's rocmft_here), one case in a real child process; ``PARSES`` marks a test that reaches
LLaMA-Factory's parser, a child process of rocmft's (rocmft.validate), so it stays out of the fast layer."""

from __future__ import annotations

import json

import pytest

from rocmft.errors import ConfigError, ExitCode
from rocmft.facts.device import DeviceFacts

PARSES = pytest.mark.slow  # starts rocmft's parser child (python -m rocmft.validate.child)
IN_A_CHILD = "4 fp16 and bf16"  # through a real `rocmft` process: the exit code at the process boundary, no traceback

DS_BATCH = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "zero_optimization": {"stage": 2}}  # fmt: skip
DS_CONTRADICTS = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-5}}, "fp16": {"enabled": "true"},
                  "gradient_clipping": 0.5, "zero_optimization": {"stage": 2}}  # fmt: skip
DS_AUTO = {"zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}, "train_batch_size": "auto"}

CASES = {
    # kind: (environment, ds_config or None, words the message must contain)
    "1 ds train_batch_size": ({"PER_DEVICE_TRAIN_BATCH_SIZE": "2", "GRADIENT_ACCUMULATION_STEPS": "4"}, DS_BATCH,
                              ["train_batch_size=64 vs 8 = micro-batch 2 (PER_DEVICE_TRAIN_BATCH_SIZE=2 (set in "
                               "the environment)) x accumulation 4 (GRADIENT_ACCUMULATION_STEPS=4 (set in the "
                               "environment)) x world size 1"]),
    "2 ds literals contradict": ({"LEARNING_RATE": "1e-4"}, DS_CONTRADICTS,
                                 ["optimizer.params.lr=3e-05 vs LEARNING_RATE=1e-4 (set in the environment)",
                                  "fp16.enabled=True vs FP16=false (precision policy",
                                  "gradient_clipping=0.5 vs MAX_GRAD_NORM="]),
    "3 ds auto unfilled": ({}, DS_AUTO, ["zero_optimization.allgather_bucket_size"]),
    "4 fp16 and bf16": ({"BF16": "true", "FP16": "true"}, None, ["BF16", "FP16"]),
    "9 lora target": ({"FINETUNING_TYPE": "lora", "LORA_TARGET": "q_proj,query_key_value"}, None,
                      ["LORA_TARGET", "query_key_value", "q_proj, up_proj, v_proj"]),
    "17 renamed argument": ({"EVALUATION_STRATEGY": "steps"}, None, ["EVALUATION_STRATEGY", "use EVAL_STRATEGY"]),
    "17 tutorial argument": ({"LOAD_IN_4BIT": "true"}, None, ["LOAD_IN_4BIT", "use QUANTIZATION_BIT=4"]),
    "18 negative cutoff": ({"CUTOFF_LEN": "-5"}, None, ["CUTOFF_LEN=-5", "must be positive"]),
    "18 cutoff beyond context": ({"CUTOFF_LEN": "100000"}, None, ["CUTOFF_LEN=100000", "context length (1024"]),
    "18 lora rank": ({"FINETUNING_TYPE": "lora", "LORA_RANK": "0"}, None, ["LORA_RANK=0"]),
    # found by trying wrong .env files as a new user would (the closing note of issue 7 lists them)
    "chat template": ({"TEMPLATE": "qwen2"}, None, ["TEMPLATE=qwen2", "Did you mean qwen"]),
    "quotes kept": ({"TEMPLATE": '"qwen"'}, None, ['TEMPLATE="qwen"', "Remove the quotes"]),
    "other method's settings": ({"FINETUNING_TYPE": "full", "LORA_RANK": "64"}, None,
                                ["FINETUNING_TYPE=full (set in the environment) ignores "
                                 "LORA_RANK=64 (set in the environment), a setting of lora", "FINETUNING_TYPE=lora"]),
    "percent as fraction": ({"FINETUNING_TYPE": "lora", "LORA_DROPOUT": "5"}, None,
                            ["LORA_DROPOUT=5 (set in the environment)", "LORA_DROPOUT=0.05"]),
    "nothing to train": ({"NUM_TRAIN_EPOCHS": "0"}, None, ["NUM_TRAIN_EPOCHS=0 (set in the environment)", "MAX_STEPS"]),
    # a newcomer's trial (2026-12-05): MAX_STEPS=0 trained one step and exited 0
    "zero steps": ({"MAX_STEPS": "0"}, None, ["MAX_STEPS=0 (set in the environment)", "or to -1 (the default)"]),
}  # fmt: skip


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == IN_A_CHILD else k for k in CASES])
def test_each_kind_is_refused_with_exit_2_naming_it_and_writing_nothing(request, rocmft_here, tmp_path, kind):
    rocmft = request.getfixturevalue("run_rocmft") if kind == IN_A_CHILD else rocmft_here
    environ, ds_config, words = CASES[kind]
    output = tmp_path / "out"
    env = {"OUTPUT_DIR": str(output), **environ}
    if ds_config is not None:
        (tmp_path / "ds.json").write_text(json.dumps(ds_config))
        env["DEEPSPEED"] = str(tmp_path / "ds.json")
    result = rocmft("check", env=env)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-2000:]
    assert "Traceback" not in result.stdout
    for word in words:
        assert word in result.stdout, (word, result.stdout[-2000:])
    assert not output.exists() or not any(output.iterdir())


def test_tutorial_keys_in_a_config_file_get_the_exact_edit(rocmft_here, tmp_path):
    (tmp_path / "tutorial.yaml").write_text("load_in_4bit: true\nmax_seq_length: 512\nlearning_rte: 1.0e-4\n")
    result = rocmft_here("render", env={"ROCMFT_CONFIG": str(tmp_path / "tutorial.yaml"),
                                        "OUTPUT_DIR": str(tmp_path / "out")})  # fmt: skip
    assert result.returncode == ExitCode.CONFIG_ERROR
    for line in ("load_in_4bit: use quantization_bit: 4 instead", "max_seq_length: use cutoff_len instead",
                 "learning_rte: Did you mean learning_rate?"):  # fmt: skip
        assert line in result.stdout, result.stdout[-2000:]


def test_fp16_for_a_bf16_model_on_a_bf16_gpu_is_refused(render_env, bf16_checkpoint):
    """Kind 5. The GPU is data (an MI300X as the device probe reports it), the checkpoint a real bf16 one."""
    mi300x = DeviceFacts(backend="rocm", count=1, names=["AMD Instinct MI300X"], archs=["gfx942:sramecc+:xnack-"],
                         memory_gib=[191.98], bf16=True)  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        render_env({"MODEL_NAME_OR_PATH": str(bf16_checkpoint), "ROCMFT_PRECISION": "fp16", "DATASET": "identity"},
                   device=mi300x)  # fmt: skip
    assert "weights are bfloat16" in str(caught.value) and "ROCMFT_PRECISION=bf16" in caught.value.remedy
    plan = render_env({"MODEL_NAME_OR_PATH": str(bf16_checkpoint), "DATASET": "identity"}, device=mi300x)
    assert plan.arguments["bf16"] is True  # auto picks bf16 there


@PARSES
def test_an_odd_learning_rate_is_a_warning_not_an_error(rocmft_here, tmp_path):
    result = rocmft_here("render", env={"LEARNING_RATE": "1e4", "OUTPUT_DIR": str(tmp_path / "out")})
    assert result.returncode == ExitCode.OK
    assert "WARNING: LEARNING_RATE=1e4 (set in the environment) is outside 1e-07..0.01" in result.stdout


def test_output_into_the_model_folder_is_refused_and_writes_nothing_there(rocmft_here, tmp_path, tiny_model):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    before = sorted(p.name for p in model.iterdir())
    result = rocmft_here("check", env={"MODEL_NAME_OR_PATH": str(model), "OUTPUT_DIR": str(model)})
    assert result.returncode == ExitCode.CONFIG_ERROR and "overwrite the base model" in result.stdout
    assert sorted(p.name for p in model.iterdir()) == before


def test_a_config_json_that_is_not_an_object_reads_as_unreadable(tmp_path):
    """config.json holding a JSON list made the context-length rule raise AttributeError (a traceback from
    `rocmft render`); every reader now treats it as an unreadable config, which the model check reports."""
    from rocmft.facts.modeldir import ModelDir

    (tmp_path / "config.json").write_text("[1, 2]")
    model = ModelDir(tmp_path)
    with pytest.raises(ValueError, match="not an object"):
        model.config_json()
    assert model.config() is None and model.max_position_embeddings() is None and model.quantization_method() is None
