"""Issue 32, FP8: `fp8: true` with the pinned LLaMA-Factory 0.9.5 and transformers 5.6.0 trains in bf16 without a
word (BENCHMARKS.md, "Issue 32 on one H200"), so rocmft refuses it (rule ``precision.fp8_training``), wherever it was
written; ``fp8_enable_fsdp_float8_all_gather`` without fp8 is refused too (LLaMA-Factory says it turns fp8 on; it
does not), and ``fp8_backend`` alone is a warning. The last test checks the fault itself in the installed packages:
when an upgrade makes LLaMA-Factory's FP8 real it fails, and the rule must go.

Everything runs in-process through the real path (load_settings, layer, the inputs rules, render, the rendered
rules); the GPU is an injected MI300X (data, not hardware: this machine has none).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rocmft.config.cmdline import parse_command_line
from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError
from rocmft.findings import ERROR, WARNING
from support.conflicts import device

PLACES = ["environment", "ROCMFT_CONFIG", "the command line's YAML", "key=value"]
KINDS = {"environment": "environment", "ROCMFT_CONFIG": "rocmft_config", "the command line's YAML": "command_line_yaml",
         "key=value": "command_line"}  # fmt: skip
CODE = "precision.fp8_training"


def _rendered_findings(tmp_path: Path, cache_dir: Path, tiny_model: Path, name: str, value: str, place: str):
    """Render with training argument ``name`` = ``value`` written in ``place`` on one injected MI300X, as
    render_checked does: the rendered phase's findings and its refusal (None when it passed). Nothing is written
    before the rendered rules pass (rocmft.render.write comes after them)."""
    from rocmft.config.layers import layer
    from rocmft.render import render
    from rocmft.validate.rules import Inputs, apply

    environ = {"ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out"),
               "MODEL_NAME_OR_PATH": str(tiny_model)}  # fmt: skip
    arguments: list[str] = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "my config.yaml"
    config.write_text(f"{name}: {value}\n")
    if place == "environment":
        environ[name.upper()] = value
    elif place == "ROCMFT_CONFIG":
        environ["ROCMFT_CONFIG"] = str(config)
    elif place == "the command line's YAML":
        arguments = [str(config)]
    else:
        arguments = [f"{name}={value}"]
    settings = load_settings(environ, parse_command_line(arguments))
    layers = layer(settings)
    gpu = device(1)
    apply("inputs", Inputs(settings=settings, arguments=layers.arguments, device=gpu, sources=layers.sources))

    def make_staging(output_dir: Path) -> Path:
        (tmp_path / "staging").mkdir(exist_ok=True)
        return tmp_path / "staging"

    rendered = render(settings, gpu, layers, make_staging, None)
    try:
        return apply("rendered", rendered), None
    except ConfigError as refused:
        return refused.findings, refused


@pytest.mark.parametrize("place", PLACES)
def test_fp8_is_refused_wherever_it_was_written_naming_the_precision_it_would_train_in(
    place, tmp_path, cache_dir, tiny_model
):
    found, refused = _rendered_findings(tmp_path, cache_dir, tiny_model, "fp8", "true", place)
    assert refused is not None and refused.code == 2  # exit 2
    assert not (tmp_path / "out").exists()  # nothing written
    ours = [f for f in found if f.code == CODE]
    assert [f.severity for f in ours] == [ERROR], found
    (finding,) = ours
    settings = {s.name: s for s in finding.settings}
    assert list(settings) == ["fp8", "bf16"], finding.settings
    assert (settings["fp8"].value, settings["fp8"].kind) == ("true", KINDS[place])
    assert settings["bf16"].value == "true" and settings["bf16"].source.startswith("precision policy")
    assert "trains in bf16 instead" in finding.message and "training_args.py" in finding.message
    assert "0.42x" in finding.fix and "docs/planner.md" in finding.fix
    assert ("unset FP8" if place == "environment" else "fp8") in finding.fix


@pytest.mark.parametrize("place", PLACES)
def test_fp8_backend_without_fp8_is_a_warning_wherever_it_was_written(place, tmp_path, cache_dir, tiny_model):
    found, refused = _rendered_findings(tmp_path, cache_dir, tiny_model, "fp8_backend", "torchao", place)
    assert refused is None
    ours = [f for f in found if f.code == CODE]
    assert [f.severity for f in ours] == [WARNING], found
    assert [(s.name, s.value, s.kind) for s in ours[0].settings] == [("fp8_backend", "torchao", KINDS[place])]
    assert "does nothing without FP8=true" in ours[0].message


def test_all_gather_without_fp8_is_refused_and_plain_settings_pass(tmp_path, cache_dir, tiny_model):
    name = "fp8_enable_fsdp_float8_all_gather"
    found, refused = _rendered_findings(tmp_path / "a", cache_dir, tiny_model, name, "true", "environment")
    (finding,) = [f for f in found if f.code == CODE]
    assert finding.severity == ERROR and refused is not None and refused.code == 2
    assert [s.name for s in finding.settings] == ["fp8_enable_fsdp_float8_all_gather", "bf16"]
    assert "does not turn FP8 on" in finding.message
    quiet, refused = _rendered_findings(tmp_path / "b", cache_dir, tiny_model, "fp8", "false", "environment")
    assert refused is None and not [f for f in quiet if f.code == CODE]


def test_the_installed_llamafactory_and_transformers_still_ignore_fp8(tmp_path, tiny_model, shared_data, monkeypatch):
    """The fault the rule rests on, in the installed packages: LLaMA-Factory's sft trainer with fp8 true (its own
    TrainingArguments, bf16 as rocmft renders it on a GPU) builds an Accelerator in bf16 with FP8 off, although it
    set ACCELERATE_MIXED_PRECISION=fp8; fp8_backend te fails on the missing Transformer Engine; and
    fp8_enable_fsdp_float8_all_gather leaves training's fp8 false. If this fails, FP8 may work now: measure it
    (BENCHMARKS.md) and drop or narrow rocmft.validate.rules.precision.fp8_training."""
    from accelerate.state import AcceleratorState
    from llamafactory.hparams import FinetuningArguments, TrainingArguments, get_train_args
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("ACCELERATE_MIXED_PRECISION", "FP8_BACKEND", "FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER"):
        monkeypatch.setenv(name, "unset by the test")  # restored afterwards: the trainer writes them
        monkeypatch.delenv(name)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)

    def trainer(backend: str):
        arguments = TrainingArguments(output_dir=str(tmp_path / "o"), fp8=True, fp8_backend=backend, bf16=True,
                                      use_cpu=True, report_to=[])  # fmt: skip
        return CustomSeq2SeqTrainer(model=model, args=arguments, finetuning_args=FinetuningArguments(),
                                    processor=None, tokenizer=tokenizer)  # fmt: skip

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = trainer("torchao").accelerator
        assert (accelerator.mixed_precision, accelerator.fp8_enabled) == ("bf16", False)
        assert os.environ["ACCELERATE_MIXED_PRECISION"] == "fp8"  # LLaMA-Factory set it, too late
        with pytest.raises(ModuleNotFoundError, match="transformer_engine"):
            trainer("te")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(shared_data / "alpaca_en_demo.json", data / "a.json")
    (data / "dataset_info.json").write_text('{"a": {"file_name": "a.json"}}')
    _, _, training, _, _ = get_train_args({
        "model_name_or_path": str(tiny_model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "dataset": "a", "dataset_dir": str(data), "template": "qwen", "output_dir": str(tmp_path / "o2"),
        "report_to": "none", "fp8_enable_fsdp_float8_all_gather": True,
    })  # fmt: skip
    assert training.fp8 is False
