"""Render: templates and layers produce one consistent train.yaml (and ds_config.json), secrets never written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rocmft.config.provenance import Kind, Source
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts

CPU = DeviceFacts(backend="cpu")


def staged_yaml(plan) -> dict:
    # OmegaConf is how LLaMA-Factory reads it: this also proves there are no duplicate keys
    return OmegaConf.to_container(OmegaConf.load(plan.files["train.yaml"]))


def test_seed_recipe_defaults(render_env):
    args = staged_yaml(render_env({"DATASET": "alpaca_en_demo"}))
    expected = {
        "stage": "sft", "finetuning_type": "lora", "lora_target": "all", "cutoff_len": 2048,
        "learning_rate": 1e-4, "num_train_epochs": 3.0, "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8, "lr_scheduler_type": "cosine", "warmup_steps": 0.1, "plot_loss": True,
        "logging_nan_inf_filter": False, "bf16": False, "fp16": False,
    }  # fmt: skip
    assert {k: args[k] for k in expected} == expected


def test_layers_environment_over_user_yaml_over_defaults(render_env, tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("learning_rate: 2.0e-5\ncutoff_len: 512\nneftune_noise_alpha: 5\ndataset: identity\n")
    plan = render_env({"ROCMFT_CONFIG": str(config), "CUTOFF_LEN": "256", "SEED": "7"})
    args = staged_yaml(plan)
    assert args["learning_rate"] == 2e-5 and args["cutoff_len"] == 256 and args["lora_rank"] == 8
    # arguments the template does not name are rendered once, in the "other arguments" block
    assert args["neftune_noise_alpha"] == 5 and args["seed"] == 7
    text = plan.files["train.yaml"].read_text()
    assert text.count("seed:") == 1 and "### other arguments given" in text
    assert plan.sources["cutoff_len"] == Source.environment("CUTOFF_LEN")
    assert plan.sources["learning_rate"].kind is Kind.CONFIG_FILE
    assert (
        plan.sources["lora_rank"].kind is Kind.TEMPLATE
        and str(plan.sources["lora_rank"]) == "the default in train.yaml.j2"
    )


@pytest.mark.parametrize(("stage", "offload", "has_opt", "has_param"), [
    (2, "none", False, False), (3, "none", False, False), (3, "optimizer", True, False),
    (3, "optimizer+params", True, True),
])  # fmt: skip
def test_deepspeed_configs(render_env, stage, offload, has_opt, has_param):
    plan = render_env({"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": str(stage), "ROCMFT_OFFLOAD": offload,
                       "DATASET": "identity"})  # fmt: skip
    ds = json.loads(plan.files["ds_config.json"].read_text())
    zero = ds["zero_optimization"]
    assert zero["stage"] == stage and zero["overlap_comm"] is True and zero["contiguous_gradients"] is True
    assert ("offload_optimizer" in zero) == has_opt and ("offload_param" in zero) == has_param
    if has_opt:
        assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    # one source of truth: the trainer fills these from train.yaml
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
    ):
        assert ds[key] == "auto"
    assert ds["bf16"]["enabled"] == "auto" and ds["fp16"]["enabled"] == "auto"
    assert staged_yaml(plan)["deepspeed"] == str(plan.run_dir / "ds_config.json")
    assert plan.launcher == "torchrun"


@pytest.mark.parametrize(("environ", "names"), [
    ({"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_OFFLOAD": "optimizer+params"},
     ["ROCMFT_OFFLOAD", "ROCMFT_ZERO_STAGE"]),
    ({"ROCMFT_ZERO_STAGE": "3"}, ["ROCMFT_ZERO_STAGE", "ROCMFT_DISTRIBUTED"]),
    ({"ROCMFT_DISTRIBUTED": "fsdp", "DEEPSPEED": "/x/ds.json"}, ["DEEPSPEED", "ROCMFT_DISTRIBUTED"]),
])  # fmt: skip
def test_distributed_contradictions(render_env, environ, names):
    with pytest.raises(ConfigError) as caught:
        render_env(environ)
    for name in names:
        assert name in str(caught.value)


def test_fsdp_is_rendered_into_the_training_yaml(render_env):
    args = staged_yaml(render_env({"ROCMFT_DISTRIBUTED": "fsdp", "DATASET": "identity"}))
    assert args["fsdp"] == "full_shard auto_wrap" and args["fsdp_config"]["use_orig_params"] is True


def test_secrets_are_never_rendered(render_env):
    plan = render_env({"HF_HUB_TOKEN": "hf_supersecretvalue", "DATASET": "identity"})
    for path in plan.files.values():
        assert "hf_supersecretvalue" not in path.read_text()


def test_a_template_that_drops_arguments_is_refused(render_env, tmp_path):
    own = tmp_path / "templates"
    own.mkdir()
    (own / "train.yaml.j2").write_text('model_name_or_path: {{ arg("model_name_or_path") | y }}\n')
    with pytest.raises(ConfigError, match="dropped given arguments"):
        render_env({"ROCMFT_TEMPLATES": str(own), "DATASET": "identity"})


def test_a_broken_template_names_the_file(render_env, tmp_path):
    own = tmp_path / "templates"
    own.mkdir()
    (own / "train.yaml.j2").write_text("model: {{ not_defined_anywhere }}\n")
    with pytest.raises(ConfigError, match=r"train\.yaml\.j2"):
        render_env({"ROCMFT_TEMPLATES": str(own)})


def test_data_sets_are_registered_without_touching_the_data_folder(render_env, shared_data):
    plan = render_env({"DATASET": "alpaca_zh_demo,identity,glaive_toolcall_en_demo", "DATASET_DIR": str(shared_data)})
    entries = json.loads(plan.files["dataset_info.json"].read_text())
    assert entries["alpaca_zh_demo"]["file_name"] == str(shared_data.resolve() / "alpaca_zh_demo.json")
    assert entries["identity"]["columns"] == {"prompt": "instruction", "query": "input", "response": "output"}
    glaive = entries["glaive_toolcall_en_demo"]
    assert glaive["formatting"] == "sharegpt" and glaive["columns"] == {"messages": "conversations", "tools": "tools"}
    assert not (shared_data / "dataset_info.json").exists()
    assert staged_yaml(plan)["dataset_dir"] == str(plan.run_dir / "data")


def test_ranking_data_is_detected(render_env, shared_data):
    plan = render_env({"DATASET": "dpo_en_demo", "DATASET_DIR": str(shared_data), "STAGE": "dpo"})
    entry = json.loads(plan.files["dataset_info.json"].read_text())["dpo_en_demo"]
    assert entry["ranking"] is True and entry["formatting"] == "sharegpt"


def test_builtin_default_without_a_model(render_env):
    plan = render_env({}, model=False)
    args = staged_yaml(plan)
    assert plan.demo and args["finetuning_type"] == "full" and args["dataset"] == "rocmft_demo"
    assert Path(args["model_name_or_path"], "config.json").is_file()
    assert plan.output_dir.name == "out"


def test_several_visible_gpus_launch_through_torchrun(render_env):
    # LLaMA-Factory refuses one process driving several GPUs (seen on a 2-GPU machine), so like its launcher
    two_gpus = DeviceFacts(backend="rocm", count=2, names=["AMD Instinct MI300X"] * 2, bf16=True)
    assert render_env({"DATASET": "identity"}, device=two_gpus).launcher == "torchrun"
    assert render_env({"DATASET": "identity"}).launcher == "python"


def test_more_than_one_process_per_node_launches_through_torchrun(render_env):
    """ROCMFT_NPROC_PER_NODE=2 with one GPU is a torchrun launch, so the gpu-runtime check can refuse it (exit 3)
    instead of silently training one process (seen on 2 x H200 with CUDA_VISIBLE_DEVICES=0)."""
    assert render_env({"DATASET": "identity", "ROCMFT_NPROC_PER_NODE": "2"}).launcher == "torchrun"
    assert render_env({"DATASET": "identity"}).launcher == "python"
