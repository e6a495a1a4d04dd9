"""Issue 21, item 2: every refusal is complete. Each conflict rule of the registry (rocmft.validate.rules) is driven
with a configuration that breaks it, through the real path (load_settings, render_checked, and the launch rules as
prepare_launch applies them), and its message must name every setting involved, with the value as the user wrote it
and where each came from, and come with a fix.

The list of rules is the registry's, not a hand-made one: a new rule with neither a case in :data:`CONFLICTS` nor a
reason in :data:`ONE_SETTING` fails :func:`test_every_registered_rule_has_a_case`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.validate.rules import PHASES, registered

ENV = "set in the environment"
# The device of the GPU cases: one or two MI300X as rocmft's probe reports them (data, not hardware: none here).
MI300X = {"backend": "rocm", "names": ["AMD Instinct MI300X"], "archs": ["gfx942:sramecc+:xnack-"], "bf16": True}


@dataclass
class Case:
    """One conflicting configuration. ``environ`` is what load_settings reads; ``process`` what the rules that read
    torch's/ROCm's variables read (os.environ); ``yaml`` the ROCMFT_CONFIG file's text. ``involved`` lists, per
    setting, the text that names it with its value and the text that says where it came from. ``{model}``,
    ``{data}``, ``{tmp}``, ``{bf16}`` are filled in."""

    environ: dict[str, str]
    involved: list[tuple[str, str]]
    process: dict[str, str] = field(default_factory=dict)
    yaml: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # name under {tmp} -> content
    gpus: int = 0


CONFLICTS: dict[str, Case] = {
    "precision": Case({"FP16": "1"}, yaml="bf16: true\n",
                      involved=[("bf16: true", "in ROCMFT_CONFIG ({tmp}/my.yaml)"), ("FP16=1", ENV)]),
    "distributed": Case({"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_ZERO_STAGE": "3"},
                        involved=[("ROCMFT_ZERO_STAGE=3", ENV), ("ROCMFT_DISTRIBUTED=ddp", ENV)]),
    "sharded_quantization": Case({"ROCMFT_DISTRIBUTED": "fsdp", "QUANTIZATION_BIT": "8"},
                                 involved=[("QUANTIZATION_BIT=8", ENV), ("ROCMFT_DISTRIBUTED=fsdp", ENV),
                                           ("QUANTIZATION_METHOD=bnb", "not set: the default")]),
    "one_deepspeed_config": Case({"ROCMFT_DISTRIBUTED": "deepspeed", "DEEPSPEED": "{tmp}/ds.json"},
                                 files={"ds.json": "{}"},
                                 involved=[("DEEPSPEED={tmp}/ds.json", ENV), ("ROCMFT_DISTRIBUTED=deepspeed", ENV)]),
    "allocator_variables": Case({}, process={"PYTORCH_ALLOC_CONF": "expandable_segments:True",
                                             "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:False"},
                                involved=[("PYTORCH_ALLOC_CONF=expandable_segments:True", ENV),
                                          ("PYTORCH_HIP_ALLOC_CONF=expandable_segments:False", ENV)]),
    "gpu_visibility": Case({}, process={"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, gpus=2,
                           involved=[("HIP_VISIBLE_DEVICES=0", ENV), ("CUDA_VISIBLE_DEVICES=1", ENV)]),
    "user_ds_config": Case({"DEEPSPEED": "{tmp}/ds.json", "LEARNING_RATE": "1e-4"},
                           files={"ds.json": json.dumps({"optimizer": {"params": {"lr": 3e-5}}})},
                           involved=[("optimizer.params.lr=3e-05", "DEEPSPEED={tmp}/ds.json (" + ENV),
                                     ("LEARNING_RATE=1e-4", ENV)]),
    "offload_settings": Case({"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "2",
                              "ROCMFT_OFFLOAD": "optimizer", "ROCMFT_OFFLOAD_DEVICE": "nvme",
                              "ROCMFT_NVME_PATH": "{tmp}"},
                             involved=[("ROCMFT_OFFLOAD_DEVICE=nvme", ENV), ("ROCMFT_ZERO_STAGE=2", ENV)]),
    "method_settings": Case({"FINETUNING_TYPE": "full", "LORA_RANK": "64"},
                            involved=[("FINETUNING_TYPE=full", ENV), ("LORA_RANK=64", ENV)]),
    "output_not_input": Case({"MODEL_NAME_OR_PATH": "{tmp}/model", "OUTPUT_DIR": "{tmp}/model/out"},
                             involved=[("OUTPUT_DIR={tmp}/model/out", ENV), ("MODEL_NAME_OR_PATH={tmp}/model", ENV)]),
    "fp16_on_bf16_model": Case({"MODEL_NAME_OR_PATH": "{bf16}", "ROCMFT_PRECISION": "fp16", "DATASET": "identity"},
                               gpus=1, involved=[("FP16=true", "ROCMFT_PRECISION=fp16"),
                                                 ("MODEL_NAME_OR_PATH={bf16}", ENV), ("bfloat16", "config.json")]),
    "stage_data": Case({"STAGE": "dpo", "DATASET": "alpaca_en_demo", "DATASET_DIR": "{data}"},
                       involved=[("STAGE=dpo", ENV), ("DATASET=alpaca_en_demo", ENV)]),
    "ranges": Case({"CUTOFF_LEN": "100000"}, involved=[("CUTOFF_LEN=100000", ENV),
                                                       ("context length (1024", "max_position_embeddings in")]),
    "more_values": Case({"WARMUP_STEPS": "10", "WARMUP_RATIO": "0.1"},
                        involved=[("WARMUP_STEPS=10", ENV), ("WARMUP_RATIO=0.1", ENV)]),
    "more_ranges": Case({"NUM_TRAIN_EPOCHS": "0"},
                        involved=[("NUM_TRAIN_EPOCHS=0", ENV), ("MAX_STEPS", "")]),
    "folders": Case({"DATASET": "{model}"}, involved=[("DATASET={model}", ENV), ("MODEL_NAME_OR_PATH={model}", ENV)]),
    "lora_target": Case({"LORA_TARGET": "q_proj,query_key_value"},
                        involved=[("LORA_TARGET=q_proj,query_key_value", ENV), ("MODEL_NAME_OR_PATH={model}", ENV)]),
    "chat_template_fits": Case({"TEMPLATE": "llama3"},
                               involved=[("TEMPLATE=llama3", ENV), ("MODEL_NAME_OR_PATH={model}", ENV)]),
    "world_size": Case({}, process={"WORLD_SIZE": "5"},
                       involved=[("WORLD_SIZE=5", ENV), ("NNODES=1", "not set: one node"),
                                 ("1 processes per node", "one per visible GPU")]),
    "tunableop": Case({"ROCMFT_DISTRIBUTED": "ddp"}, process={"PYTORCH_TUNABLEOP_ENABLED": "1"}, gpus=2,
                      involved=[("PYTORCH_TUNABLEOP_ENABLED=1", ENV),
                                ("PYTORCH_TUNABLEOP_TUNING not set", "tuning is on by default"),
                                ("a job of 2 ranks", "")]),
}  # fmt: skip

# Rules that refuse one setting on its own (its value, or a file against itself), with nothing it conflicts with.
ONE_SETTING = {
    "text_hygiene": "a value's own characters (spaces, CR, a Windows path)",
    "quoted_values": "a value's own quotes",
    "template": "TEMPLATE against the installed LLaMA-Factory's names",
    "model_shapes": "the model folder's config.json against its own weights",
    "duplicate_keys": "the DEEPSPEED file's text against itself (a key written twice)",
    "typed_values": "the DEEPSPEED file's values against their own JSON types (a quoted false)",
}


def test_every_registered_rule_has_a_case():
    """A rule added to the registry without a conflict case (or a reason it refuses one setting) fails here."""
    names = [r.name for phase in PHASES for r in registered(phase)]
    assert len(names) == len(set(names))
    assert not set(CONFLICTS) & set(ONE_SETTING)
    assert set(names) == set(CONFLICTS) | set(ONE_SETTING), (
        f"without a case: {sorted(set(names) - set(CONFLICTS) - set(ONE_SETTING))}; "
        f"cases of no rule: {sorted(set(CONFLICTS) | set(ONE_SETTING) - set(names))}"
    )


def _raised_in(err: BaseException) -> set[str]:
    names, tb = set(), err.__traceback__
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


@pytest.mark.parametrize("rule", list(CONFLICTS))
def test_each_conflict_names_both_settings_their_values_sources_and_a_fix(
    rule, tmp_path, cache_dir, tiny_model, shared_data, bf16_checkpoint, monkeypatch
):
    from rocmft.config.settings import load_settings
    from rocmft.validate.rules import apply, render_checked

    case = CONFLICTS[rule]
    data = tmp_path / "data"
    data.mkdir()
    for name in ("alpaca_en_demo.json", "dpo_en_demo.json", "identity.json"):
        shutil.copy(shared_data / name, data / name)
    shutil.copytree(tiny_model, tmp_path / "model")
    fill = {"{tmp}": str(tmp_path), "{model}": str(tiny_model), "{data}": str(data), "{bf16}": str(bf16_checkpoint)}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    for name, content in case.files.items():
        (tmp_path / name).write_text(content)
    environ = {"ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out"),
               "MODEL_NAME_OR_PATH": str(tiny_model)}  # fmt: skip
    if case.yaml is not None:
        (tmp_path / "my.yaml").write_text(case.yaml)
        environ["ROCMFT_CONFIG"] = str(tmp_path / "my.yaml")
    environ.update({k: filled(v) for k, v in case.environ.items()})
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "ROCR_VISIBLE_DEVICES",
                 "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "NNODES", "PYTORCH_TUNABLEOP_ENABLED",
                 "PYTORCH_TUNABLEOP_TUNING", "NPROC_PER_NODE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in case.process.items():
        monkeypatch.setenv(name, value)
    device = (DeviceFacts(count=case.gpus, memory_gib=[191.98] * case.gpus, **{k: v * case.gpus if isinstance(v, list)
                          else v for k, v in MI300X.items()}) if case.gpus else DeviceFacts(backend="cpu"))  # fmt: skip

    def make_staging(output_dir: Path) -> Path:
        (tmp_path / "staging").mkdir(exist_ok=True)
        return tmp_path / "staging"

    with pytest.raises(ConfigError) as caught:
        plan = render_checked(load_settings({**environ, **case.process}), device, make_staging)
        apply("launch", plan)  # as rocmft.launch.prepare_launch does
    err = caught.value
    assert rule in _raised_in(err), (rule, str(err))
    message = err.message
    for named, source in case.involved:
        assert filled(named) in message, (filled(named), message)
        assert filled(source) in message, (filled(source), message)
    assert err.remedy.strip(), message  # a fix
