"""The conflict cases of the registry's rules, one table for the tests that drive them: every refusal is complete
(tests/test_refusals_complete.py) and no verdict depends on where a value was written (tests/test_provenance.py).

:data:`CONFLICTS` holds a configuration that breaks each conflict rule of :mod:`rocmft.validate.rules`;
:data:`ONE_SETTING` the rules that refuse one setting on its own, with what they read; :data:`USER_SET` refusals of one
setting that hold only when the user set it. Devices are built here
(:func:`device`): data shaped as rocmft's probe reports one or two MI300X, not hardware (the tests' machine has none).
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field

from rocmft.facts.device import DeviceFacts

ENV = "set in the environment"
# The device of the GPU cases: one or two MI300X as rocmft's probe reports them (data, not hardware: none here).
MI300X = {"backend": "rocm", "names": ["AMD Instinct MI300X"], "archs": ["gfx942:sramecc+:xnack-"], "bf16": True}
# The process variables the rules read as they are (torch's, ROCm's, the launcher's): a test clears them all.
PROCESS_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "ROCR_VISIBLE_DEVICES",
                     "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "NNODES", "PYTORCH_TUNABLEOP_ENABLED",
                     "PYTORCH_TUNABLEOP_TUNING", "NPROC_PER_NODE")  # fmt: skip


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
    "dataset_names": Case({"DATASET": "{tmp}/qa.json", "DATASET_DIR": "{data}"},
                          files={"qa.json": json.dumps([{"instruction": "q", "output": "a"}]),
                                 "dataset_info.json": json.dumps({"qa": {"file_name": "qa.json"},
                                                                  "qa_pt": {"file_name": "qa.json",
                                                                            "columns": {"prompt": "output"}}})},
                          involved=[("DATASET={tmp}/qa.json", ENV), ("{tmp}/dataset_info.json", "")]),
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
    "checkpointing_mode": Case({"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_NPROC_PER_NODE": "2", "USE_REENTRANT_GC": "true",
                                "DDP_FIND_UNUSED_PARAMETERS": "true"},
                               involved=[("USE_REENTRANT_GC=true", ENV), ("DDP_FIND_UNUSED_PARAMETERS=true", ENV),
                                         ("FINETUNING_TYPE=lora", "the default in train.yaml.j2")]),
    "tunableop": Case({"ROCMFT_DISTRIBUTED": "ddp"}, process={"PYTORCH_TUNABLEOP_ENABLED": "1"}, gpus=2,
                      involved=[("PYTORCH_TUNABLEOP_ENABLED=1", ENV),
                                ("PYTORCH_TUNABLEOP_TUNING not set", "tuning is on by default"),
                                ("a job of 2 ranks", "")]),
    "fp8_training": Case({"FP8": "true"}, gpus=1,
                         involved=[("FP8=true", ENV), ("BF16=true", "precision policy (ROCMFT_PRECISION=auto")]),
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

# Refusals that hold only for a value the user set (rocmft.validate.rules.common.user_set reads the source's kind):
# one setting each, no conflict, so not in CONFLICTS; the provenance property drives them with those (rule, case).
USER_SET: list[tuple[str, Case]] = [
    ("more_ranges", Case({"LORA_DROPOUT": "5"}, involved=[("LORA_DROPOUT=5", ENV)])),
    ("more_values", Case({"MAX_SAMPLES": "0"}, involved=[("MAX_SAMPLES=0", ENV)])),
    ("more_values", Case({"EVAL_STEPS": "10"}, involved=[("EVAL_STEPS=10", ENV)])),
    ("folders", Case({"ADAPTER_NAME_OR_PATH": "{tmp}/no-such-adapter"},
                     involved=[("ADAPTER_NAME_OR_PATH={tmp}/no-such-adapter", ENV)])),
    ("fp8_training", Case({"FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER": "true"}, gpus=1,
                          involved=[("FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER=true", ENV)])),
]  # fmt: skip


def device(gpus: int) -> DeviceFacts:
    """``gpus`` MI300X as rocmft's probe reports them (data, labelled injected where used); 0: the CPU."""
    if not gpus:
        return DeviceFacts(backend="cpu")
    shaped = {k: v * gpus if isinstance(v, list) else v for k, v in MI300X.items()}
    return DeviceFacts(count=gpus, memory_gib=[191.98] * gpus, **shaped)


__all__ = ["CONFLICTS", "ENV", "MI300X", "ONE_SETTING", "PROCESS_VARIABLES", "USER_SET", "Case", "device"]


def raised_in(err: BaseException) -> set[str]:
    """The names of the functions ``err``'s traceback passed through (the rule that raised it among them)."""
    return {frame.f_code.co_name for frame, _ in traceback.walk_tb(err.__traceback__)}
