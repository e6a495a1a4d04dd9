"""Issue 7's remaining kinds, one small wrong input each, run through rocmft's own command line (rocmft.cli.main, in
the pytest process: conftest's rocmft_here; one case in a real child process): the exit code, the variables and files
named in the message, and what is left in OUTPUT_DIR (nothing on exit 2, only rocmft/checks.json on exit 3). The
"Tried as a new user" list in docs/rules.md maps each case here to its row."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from rocmft.errors import ExitCode


def only_the_report(output: Path) -> bool:
    """OUTPUT_DIR holds nothing but rocmft/checks.json."""
    files = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
    return files == ["rocmft/checks.json"]


def empty(output: Path) -> bool:
    return not output.exists() or not any(output.iterdir())


@pytest.fixture
def data_dir(tmp_path, shared_data) -> Path:
    """A data folder with LLaMA-Factory's demo files (alpaca_en_demo, dpo_en_demo, identity)."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("alpaca_en_demo.json", "dpo_en_demo.json", "identity.json"):
        shutil.copy(shared_data / name, folder / name)
    return folder


# kind: (environment, words the message must contain); {data} is the data folder, {model} the tiny model,
# {tmp} the test's folder
EXIT_2 = {
    "dpo on sft data (gap 4)": ({"STAGE": "dpo", "DATASET": "alpaca_en_demo"},
                                ["STAGE=dpo", "'alpaca_en_demo' is not pairwise", '"ranking": true']),
    "sft on pairwise data": ({"STAGE": "sft", "DATASET": "dpo_en_demo"},
                             ["STAGE=sft", "'dpo_en_demo', which is pairwise", "STAGE=dpo"]),
    "kto without kto_tag": ({"STAGE": "kto", "DATASET": "alpaca_en_demo"}, ["STAGE=kto", "kto_tag"]),
    "llama3 template, qwen tokenizer (gap 6)": ({"TEMPLATE": "llama3"},
                                                ["TEMPLATE=llama3", "<|start_header_id|>", "TEMPLATE=qwen"]),
    "dataset dir is a file (gap 7)": ({"DATASET_DIR": "{data}/identity.json"},
                                      ["DATASET_DIR={data}/identity.json", "is a file, not a folder"]),
    "model is a file (gap 7)": ({"MODEL_NAME_OR_PATH": "{model}/model.safetensors"},
                                ["MODEL_NAME_OR_PATH={model}/model.safetensors", "is a file", "its folder {model}"]),
    "output is a file (gap 7)": ({"OUTPUT_DIR": "{data}/identity.json"}, ["OUTPUT_DIR={data}/identity.json",
                                                                          "is a file, not a folder"]),
    "interleave wrong length (gap 7)": ({"DATASET": "alpaca_en_demo,identity", "MIX_STRATEGY": "interleave_under",
                                         "INTERLEAVE_PROBS": "0.5,0.3,0.2"},
                                        ["INTERLEAVE_PROBS=0.5,0.3,0.2", "3 probabilities for the 2 data sets",
                                         "DATASET=alpaca_en_demo,identity"]),
    "interleave not summing to 1 (gap 7)": ({"DATASET": "alpaca_en_demo,identity", "INTERLEAVE_PROBS": "0.7,0.7",
                                             "MIX_STRATEGY": "interleave_under"},
                                            ["INTERLEAVE_PROBS=0.7,0.7", "sums to 1.4", "INTERLEAVE_PROBS=0.5,0.5"]),
    "interleave with concat": ({"DATASET": "alpaca_en_demo,identity", "INTERLEAVE_PROBS": "0.5,0.5"},
                               ["MIX_STRATEGY=concat", "interleave_under"]),
    "lora alpha 0": ({"LORA_ALPHA": "0"}, ["LORA_ALPHA=0", "alpha / rank"]),
    "lora rank above the hidden size": ({"LORA_RANK": "100000"},
                                        ["LORA_RANK=100000", "above the model's hidden size (64", "at most 64"]),
    "learning rate nan": ({"LEARNING_RATE": "nan"}, ["LEARNING_RATE=nan", "must be a positive number"]),
    "learning rate inf": ({"LEARNING_RATE": "inf"}, ["LEARNING_RATE=inf", "must be a positive number"]),
    "nan and inf elsewhere": ({"MAX_GRAD_NORM": "nan", "NUM_TRAIN_EPOCHS": "inf"},
                              ["MAX_GRAD_NORM=nan", "NUM_TRAIN_EPOCHS=inf", "not a finite number"]),
    "negative warmup": ({"WARMUP_STEPS": "-10"}, ["WARMUP_STEPS=-10", "negative"]),
    "negative max grad norm": ({"MAX_GRAD_NORM": "-1"}, ["MAX_GRAD_NORM=-1", "0 for no clipping"]),
    "negative logging steps": ({"LOGGING_STEPS": "-3"}, ["LOGGING_STEPS=-3", "negative", "LOGGING_STEPS=10"]),
    "negative save steps": ({"SAVE_STEPS": "-5"}, ["SAVE_STEPS=-5", "negative", "SAVE_STEPS=500", "SAVE_STRATEGY=no"]),
    "negative eval steps": ({"VAL_SIZE": "0.1", "EVAL_STRATEGY": "steps", "EVAL_STEPS": "-1"},
                            ["EVAL_STEPS=-1", "negative", "EVAL_STEPS=100"]),
    "negative dataloader workers": ({"DATALOADER_NUM_WORKERS": "-1"},
                                    ["DATALOADER_NUM_WORKERS=-1", "negative", "DATALOADER_NUM_WORKERS to 0"]),
    "max samples 0": ({"MAX_SAMPLES": "0"}, ["MAX_SAMPLES=0", "no records"]),
    "3-bit bitsandbytes": ({"QUANTIZATION_BIT": "3"}, ["QUANTIZATION_BIT=3", "4 or 8"]),
    "warmup ratio and steps": ({"WARMUP_RATIO": "0.1", "WARMUP_STEPS": "100"}, ["WARMUP_STEPS=100", "WARMUP_RATIO"]),
    "val size with streaming": ({"STREAMING": "true", "VAL_SIZE": "0.1", "MAX_STEPS": "10"},
                                ["STREAMING=true", "VAL_SIZE=0.1", "VAL_SIZE=500"]),
    "eval steps, no eval strategy": ({"VAL_SIZE": "0.1", "EVAL_STEPS": "20"}, ["EVAL_STEPS=20", "EVAL_STRATEGY=no"]),
    "negative dropout": ({"FINETUNING_TYPE": "lora", "LORA_DROPOUT": "-0.1"},
                         ["LORA_DROPOUT=-0.1", "between 0 and 1"]),
    "windows path": ({"MODEL_NAME_OR_PATH": "C:\\Users\\me\\models\\Qwen2-0.5B"},
                     ["Windows paths", "MODEL_NAME_OR_PATH=C:\\Users\\me\\models\\Qwen2-0.5B", "/models/"]),
    "trailing space": ({"DATASET": "alpaca_en_demo "}, ["DATASET='alpaca_en_demo '", "Remove the spaces"]),
    "empty value": ({"TEMPLATE": ""}, ["Empty values: TEMPLATE=", "remove the line"]),
    "CRLF line endings": ({"TEMPLATE": "qwen\r"}, ["TEMPLATE='qwen\\r'", "CRLF", "dos2unix"]),
    "model and dataset swapped": ({"MODEL_NAME_OR_PATH": "alpaca_en_demo", "DATASET": "{model}"},
                                  ["DATASET={model}", "is a model folder", "look swapped"]),
    "model names a data set": ({"MODEL_NAME_OR_PATH": "alpaca_en_demo"},
                               ["MODEL_NAME_OR_PATH=alpaca_en_demo", "data set", "swapped"]),
    "lora target with spaces": ({"FINETUNING_TYPE": "lora", "LORA_TARGET": "q_proj v_proj"},
                                ["LORA_TARGET=q_proj v_proj", "LORA_TARGET=q_proj,v_proj"]),
    "adapter path missing": ({"ADAPTER_NAME_OR_PATH": "/nonexistent/adapter"},
                             ["ADAPTER_NAME_OR_PATH=/nonexistent/adapter", "does not exist"]),
    "resume path missing": ({"RESUME_FROM_CHECKPOINT": "/nonexistent/checkpoint-100"},
                            ["RESUME_FROM_CHECKPOINT=/nonexistent/checkpoint-100", "ROCMFT_RESUME=auto"]),
    "output inside the data folder": ({"OUTPUT_DIR": "{data}/out"},
                                      ["OUTPUT_DIR={data}/out (set in the environment)",
                                       "is the data folder (DATASET_DIR={data}, set in the environment)"]),
    "qlora as a method": ({"FINETUNING_TYPE": "qlora"}, ["FINETUNING_TYPE='qlora'", "QUANTIZATION_BIT=4"]),
    # a break-it trial (2026-12-05): each rendered before (exit 0, or LLaMA-Factory's message naming no variable)
    "data set list with a trailing comma": ({"DATASET": "alpaca_en_demo,"},
                                            ["DATASET=alpaca_en_demo, (set in the environment)", "empty item",
                                             "Remove the extra comma: DATASET=alpaca_en_demo."]),
    "interleave probabilities with a trailing comma": ({"DATASET": "alpaca_en_demo,identity",
                                                        "MIX_STRATEGY": "interleave_under",
                                                        "INTERLEAVE_PROBS": "0.5,0.5,"},
                                                       ["INTERLEAVE_PROBS=0.5,0.5, (set in the environment)",
                                                        "INTERLEAVE_PROBS=0.5,0.5."]),
    "packing with dpo": ({"STAGE": "dpo", "DATASET": "dpo_en_demo", "PACKING": "true"},
                         ["PACKING=true (set in the environment) has no effect with STAGE=dpo", "Remove PACKING"]),
    "quantization with full fine-tuning": ({"FINETUNING_TYPE": "full", "QUANTIZATION_BIT": "4"},
                                           ["FINETUNING_TYPE=full (set in the environment) cannot be combined with "
                                            "QUANTIZATION_BIT=4 (set in the environment), which needs "
                                            "FINETUNING_TYPE=lora or oft", "remove QUANTIZATION_BIT"]),
    "adapter with freeze": ({"FINETUNING_TYPE": "freeze", "ADAPTER_NAME_OR_PATH": "{tmp}"},
                            ["ADAPTER_NAME_OR_PATH={tmp} (set in the environment), which needs FINETUNING_TYPE=lora"]),
    # gap 5: a user's DeepSpeed config ({tmp}/ds.json is written from DS_CONFIGS)
    "ds offload_param at ZeRO-2 (gap 5)": ({"DEEPSPEED": "{tmp}/ds-param.json"},
                                           ["DEEPSPEED={tmp}/ds-param.json", "offload_param", "stage 3",
                                            "the file has stage 2"]),
    "ds nvme offload without path (gap 5)": ({"DEEPSPEED": "{tmp}/ds-nvme.json"},
                                             ["offload_optimizer.device is nvme but there is no nvme_path"]),
    "ds nvme path missing (gap 5)": ({"DEEPSPEED": "{tmp}/ds-nvme-missing.json"},
                                     ["nvme_path=/nonexistent/nvme is not a folder"]),
}  # fmt: skip

DS_CONFIGS = {
    "ds-param.json": {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
    "ds-nvme.json": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
    "ds-nvme-missing.json": {
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nonexistent/nvme"}}
    },
}


# one kind through a real `rocmft` process (the exit code at the process boundary, no traceback); the others in the
# pytest process (conftest's rocmft_here: the same command, environment and folder, without the child's imports)
IN_A_CHILD = "lora alpha 0"


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == IN_A_CHILD else k for k in EXIT_2])
def test_each_new_kind_is_refused_with_exit_2_naming_it_and_writing_nothing(
    request, rocmft_here, tmp_path, data_dir, tiny_model, kind
):
    rocmft = request.getfixturevalue("run_rocmft") if kind == IN_A_CHILD else rocmft_here
    environ, words = EXIT_2[kind]
    for name, config in DS_CONFIGS.items():
        (tmp_path / name).write_text(json.dumps(config))
    places = {"data": str(data_dir), "model": str(tiny_model), "tmp": str(tmp_path)}
    output = tmp_path / "out"
    env = {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "alpaca_en_demo", "DATASET_DIR": str(data_dir),
           "TEMPLATE": "qwen", "OUTPUT_DIR": str(output)}  # fmt: skip
    env.update({key: value.format(**places) for key, value in environ.items()})
    result = rocmft("render", env=env)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-2000:]
    assert "Traceback" not in result.stdout
    for word in words:
        assert word.format(**places) in result.stdout, (word, result.stdout[-2000:])
    assert empty(output) and not (data_dir / "out").exists()
    assert (data_dir / "identity.json").is_file()  # OUTPUT_DIR pointing at it left it alone


@pytest.mark.slow  # reaches the parse: rocmft starts LLaMA-Factory's parser child (rocmft.validate)
def test_new_warnings_are_printed_and_the_run_renders(rocmft_here, tmp_path, data_dir, tiny_model):
    env = {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "alpaca_en_demo", "DATASET_DIR": str(data_dir),
           "EVAL_DATASET": "alpaca_en_demo", "SAVE_TOTAL_LIMIT": "0", "MAX_STEPS": "100", "SAVE_STEPS": "500",
           "EVAL_STRATEGY": "steps", "EVAL_STEPS": "50", "NUM_TRAIN_EPOCHS": "3",
           "OUTPUT_DIR": str(tmp_path / "out")}  # fmt: skip
    result = rocmft_here("render", env=env)
    assert result.returncode == ExitCode.OK, result.stdout[-2000:]
    for words in ("WARNING: SAVE_TOTAL_LIMIT=0 keeps every checkpoint",
                  "WARNING: SAVE_STEPS=500 is beyond MAX_STEPS=100",
                  "WARNING: EVAL_DATASET and DATASET share alpaca_en_demo",
                  "WARNING: NUM_TRAIN_EPOCHS=3 is ignored: MAX_STEPS=100"):  # fmt: skip
        assert words in result.stdout, (words, result.stdout[-2000:])
    result = rocmft_here("render", env={**env, "SAVE_STEPS": "0", "OUTPUT_DIR": str(tmp_path / "out2")})
    assert result.returncode == ExitCode.OK and "WARNING: SAVE_STEPS=0 with SAVE_STRATEGY=steps" in result.stdout


def test_step_fractions_below_1_stay_allowed(render_env, data_dir):
    """transformers reads a SAVE_STEPS, EVAL_STEPS or LOGGING_STEPS in (0, 1) as a fraction of the run's steps
    (TrainerState.compute_steps): the refusal of a negative value lets these through (in-process, no parse)."""
    plan = render_env({"TEMPLATE": "qwen", "DATASET": "alpaca_en_demo", "DATASET_DIR": str(data_dir),
                       "VAL_SIZE": "0.1", "EVAL_STRATEGY": "steps", "SAVE_STEPS": "0.25", "EVAL_STEPS": "0.5",
                       "LOGGING_STEPS": "0.1"})  # fmt: skip
    steps = [plan.arguments[name] for name in ("save_steps", "eval_steps", "logging_steps")]
    assert steps == [0.25, 0.5, 0.1]


# --- data records (exit 3, check `dataset`) ----------------------------------------------------------------
def write_data(folder: Path, name: str, records: list[dict], entry: dict) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(records))
    (folder / "dataset_info.json").write_text(json.dumps({name: {"file_name": f"{name}.json", **entry}}))


def check_data(rocmft_here, tmp_path, tiny_model, folder: Path, name: str):
    output = tmp_path / "out"
    env = {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": name, "DATASET_DIR": str(folder), "CUTOFF_LEN": "512",
           "TEMPLATE": "qwen", "OUTPUT_DIR": str(output)}  # fmt: skip
    result = rocmft_here("check", env=env)
    report = json.loads((output / "rocmft" / "checks.json").read_text()) if only_the_report(output) else None
    return result, output, report


@pytest.mark.slow  # reaches the parse: rocmft starts LLaMA-Factory's parser child (rocmft.validate)
def test_sharegpt_tags_that_do_not_match_the_records_list_what_the_file_has(rocmft_here, tmp_path, tiny_model):
    """Gap 1: OpenAI-style role/content messages registered as sharegpt with the default tags (from/value)."""
    records = [{"conversations": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
               for i in range(20)]  # fmt: skip
    write_data(tmp_path / "data", "chats", records, {"formatting": "sharegpt"})
    result, output, report = check_data(rocmft_here, tmp_path, tiny_model, tmp_path / "data", "chats")
    assert result.returncode == ExitCode.CHECK_FAILED, result.stdout[-3000:]
    assert report is not None, sorted(output.rglob("*"))
    failed = {c["id"]: c for c in report["checks"] if c["status"] == "fail"}
    assert set(failed) == {"dataset"}
    message = failed["dataset"]["message"]
    assert "record 0 of chats.json" in message and "has no from / value key" in message
    assert '"role_tag": "from"' in message and "keys content, role" in message
    assert "role values assistant, user" in message
    fit = {"role_tag": "role", "user_tag": "user", "assistant_tag": "assistant", "content_tag": "content"}
    assert f'"tags": {json.dumps(fit)}' in message


@pytest.mark.slow  # reaches the parse: rocmft starts LLaMA-Factory's parser child (rocmft.validate)
def test_sharegpt_roles_out_of_order_are_found_with_the_record_number(rocmft_here, tmp_path, tiny_model):
    records = [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]} for _ in range(50)]
    records[30]["conversations"].reverse()
    write_data(tmp_path / "data", "chats", records, {"formatting": "sharegpt"})
    result, _, report = check_data(rocmft_here, tmp_path, tiny_model, tmp_path / "data", "chats")
    assert result.returncode == ExitCode.CHECK_FAILED and report is not None, result.stdout[-3000:]
    message = next(c["message"] for c in report["checks"] if c["id"] == "dataset")
    assert "record 30 of chats.json: turn 0 has from='gpt'" in message


@pytest.mark.slow  # reaches the parse: rocmft starts LLaMA-Factory's parser child (rocmft.validate)
@pytest.mark.parametrize("bad", [777, 1999])
def test_a_bad_record_deep_in_the_file_is_found_and_numbered(rocmft_here, tmp_path, tiny_model, bad):
    """Gap 2: the sample covers the whole file (first, last, a stride), not the first 200 records. Record 777 is
    reached only when the stride hits it, so the file is laid out to make it one: 2000 records, 200 first, 200
    last and 200 spaced 8 apart from record 200 (200 + 8 x 72 = 776, 777 is missed); the test therefore breaks
    every record from 777 to 784, as a converter that failed half-way would."""
    records = [{"instruction": f"q{i}", "input": "", "output": f"a{i}"} for i in range(2000)]
    for index in range(bad, min(bad + 8, 2000)):
        del records[index]["output"]
    write_data(tmp_path / "data", "big", records, {})
    result, _, report = check_data(rocmft_here, tmp_path, tiny_model, tmp_path / "data", "big")
    assert result.returncode == ExitCode.CHECK_FAILED and report is not None, result.stdout[-3000:]
    message = next(c["message"] for c in report["checks"] if c["id"] == "dataset")
    assert f"record {bad if bad == 1999 else 784} of big.json lacks output" in message, message


def test_jsonl_sampling_reports_line_numbers_and_stays_bounded(tmp_path):
    from rocmft.render.datasets import sample_records

    path = tmp_path / "big.jsonl"
    lines = [json.dumps({"instruction": str(i), "output": "a"}) for i in range(5000)]
    lines[4321] = "{not json"
    path.write_text("\n".join(lines[:100]) + "\n\n" + "\n".join(lines[100:]) + "\n")
    with pytest.raises(ValueError, match=r"record 4321 \(line 4323\) is not JSON"):
        sample_records(path, part=5000)
    lines[4321] = lines[4320]
    path.write_text("\n".join(lines) + "\n")
    sample = sample_records(path)
    numbers = [n for n, _ in sample.records]
    assert sample.total == 5000 and len(numbers) == 600 and numbers[:200] == list(range(200))
    assert numbers[-200:] == list(range(4800, 5000)) and max(b - a for a, b in itertools.pairwise(numbers)) < 25


# --- model metadata (exit 2) -----------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "value", "words"), [
    ("hidden_size", 128, "hidden_size=128 but model.embed_tokens.weight is {vocab_size} x {hidden_size}"),
    ("vocab_size", 32000, "vocab_size=32000 but model.embed_tokens.weight is {vocab_size} x {hidden_size}"),
    ("num_hidden_layers", 24, "num_hidden_layers=24 but the weights have {num_hidden_layers} layers"),
])  # fmt: skip
def test_a_config_json_that_contradicts_the_weights_is_refused(rocmft_here, tmp_path, tiny_model, key, value, words):
    """Gap 3: config.json from another size of the family beside the weights (only the safetensors headers
    are read)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    words = words.format(**config)  # the real shape, as the tiny model's own config.json and weights have it
    config[key] = value
    (model / "config.json").write_text(json.dumps(config))
    output = tmp_path / "out"
    result = rocmft_here("render", env={"MODEL_NAME_OR_PATH": str(model), "DATASET": "rocmft_demo",
                                       "OUTPUT_DIR": str(output), "CUTOFF_LEN": "512"})  # fmt: skip
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-2000:]
    assert words in result.stdout and f"{model}/config.json does not describe the weights" in result.stdout
    assert empty(output)


# --- a break-it trial (2026-12-05): the same verdict whichever way the value was written ----------------------
WRITTEN = {
    "quantization with full fine-tuning": ({"finetuning_type": "full", "quantization_bit": 4},
                                           "cannot be combined with", "which needs FINETUNING_TYPE=lora or oft"),
    "packing with dpo": ({"stage": "dpo", "dataset": "dpo_en_demo", "packing": True},
                         "has no effect with", "packs samples only for STAGE=sft and STAGE=pt"),
    "data set list with a trailing comma": ({"dataset": "alpaca_en_demo,"}, "Lists with an empty item",
                                            "alpaca_en_demo,"),
    "empty output folder": ({"output_dir": ""}, "Empty values: ", "output_dir"),  # any case: OUTPUT_DIR=
}  # fmt: skip


def _written(values: dict, how: str, folder: Path) -> tuple[dict[str, str], list[str]]:
    """``values`` (argument -> value) as the environment, ROCMFT_CONFIG, the command line's YAML (a name without
    the usual suffix is refused by LLaMA-Factory's own rule, so .yml) or ``key=value`` tokens give them."""
    import yaml

    if how == "environment":
        return {k.upper(): str(v).lower() if isinstance(v, bool) else str(v) for k, v in values.items()}, []
    if how == "key=value":
        return {}, [f"{k}={str(v).lower() if isinstance(v, bool) else v if v != '' else repr(v)}"
                    for k, v in values.items()]  # fmt: skip
    path = folder / "my settings.yml"
    path.write_text(yaml.safe_dump(values))
    return ({"ROCMFT_CONFIG": str(path)}, []) if how == "ROCMFT_CONFIG" else ({}, [str(path)])


@pytest.mark.parametrize("how", ["environment", "ROCMFT_CONFIG", "the command line's YAML", "key=value"])
@pytest.mark.parametrize("kind", list(WRITTEN))
def test_the_new_refusals_do_not_depend_on_how_the_value_was_written(rocmft_here, tmp_path, data_dir, tiny_model,
                                                                     kind, how):  # fmt: skip
    """Each refusal of the trial is exit 2, names the setting where it was written and leaves nothing, whether
    it came from the environment, a YAML (either way) or the command line. An empty OUTPUT_DIR in the
    environment used to run in saves/<model>-sft-lora without a word (the command line's ``output_dir=`` was
    refused, ``output_dir=''`` and ``output_dir: ""`` were not)."""
    values, *words = WRITTEN[kind]
    env, args = _written(values, how, tmp_path)
    base = {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "alpaca_en_demo", "DATASET_DIR": str(data_dir),
            "TEMPLATE": "qwen", "OUTPUT_DIR": str(tmp_path / "out"), "CUTOFF_LEN": "512"}  # fmt: skip
    base = {k: v for k, v in base.items() if k.lower() not in values}
    result = rocmft_here("render", *args, env={**base, **env})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-2000:]
    assert "Traceback" not in result.stdout
    for word in words:  # the environment's names are upper case, the YAML's and the command line's lower
        assert word.lower() in result.stdout.lower(), (word, result.stdout[-2000:])
    where = {
        "environment": "(set in the environment)",
        "ROCMFT_CONFIG": "(in ROCMFT_CONFIG (",
        "the command line's YAML": "(in the command line's CONFIG (",
        "key=value": "(command line (",
    }[how]
    assert where in result.stdout, result.stdout[-2000:]
    assert empty(tmp_path / "out") and not (tmp_path / "saves").exists()
    if kind == "data set list with a trailing comma":  # the fix as it is written where the value was set
        fix = {"environment": "DATASET=alpaca_en_demo.", "key=value": "dataset=alpaca_en_demo."}
        assert f"Remove the extra comma: {fix.get(how, 'dataset: alpaca_en_demo.')}" in result.stdout
