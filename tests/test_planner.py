"""The planner: defaults chosen for the GPU from the model's shape and memory; the user's values always win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rocmft.config.provenance import Kind, Source
from rocmft.facts.device import DeviceFacts
from rocmft.render import memfit, planner

# Qwen2-7B's shape (its config.json on the Hugging Face hub, Qwen/Qwen2-7B)
QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "tie_word_embeddings": False}  # fmt: skip
H200 = DeviceFacts(backend="cuda", count=1, names=["NVIDIA H200"], archs=["sm_90"], memory_gib=[139.8], bf16=True)
MI300X = DeviceFacts(backend="rocm", count=1, names=["AMD Instinct MI300X"], archs=["gfx942:sramecc+:xnack-"],
                     memory_gib=[191.98], bf16=True)  # fmt: skip
RX7900 = DeviceFacts(backend="rocm", count=1, names=["Radeon PRO W7900"], archs=["gfx1100"], memory_gib=[48.0],
                     bf16=True)  # fmt: skip
CPU = DeviceFacts(backend="cpu")
SEED = {"stage": "sft", "finetuning_type": "lora", "lora_target": "all", "cutoff_len": 2048,
        "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}  # fmt: skip


@pytest.fixture
def qwen7b(tmp_path) -> Path:
    folder = tmp_path / "qwen2-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN2_7B))
    return folder


def run(model: Path, device: DeviceFacts, explicit=(), liger=True, flash=False, dtype="bfloat16", **arguments):
    args = {**SEED, "model_name_or_path": str(model), **arguments}
    return planner.plan_defaults(args, set(explicit), device, compute_dtype=dtype, liger_available=liger,
                                 flash_available=flash)  # fmt: skip


def chosen(plan) -> dict:
    return {c.name: c.value for c in plan.choices}


def test_h200_qwen7b_lora_gets_a_large_packed_batch_without_checkpointing(qwen7b):
    plan = run(qwen7b, H200)
    assert chosen(plan) == {
        "flash_attn": "sdpa", "neat_packing": True, "enable_liger_kernel": True,
        "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "disable_gradient_checkpointing": True,
    }  # fmt: skip
    assert all(c.planned and c.reason for c in plan.choices)
    # the effective batch (rows per GPU per optimizer step) is the seed recipe's 2 x 8
    assert chosen(plan)["per_device_train_batch_size"] * chosen(plan)["gradient_accumulation_steps"] == 16
    # the plan fits what it planned against, and micro-batch 16 (the next candidate) would not have
    assert plan.estimate_gib <= plan.usable_gib * (1 - memfit.ALLOCATOR_HEADROOM)
    bigger = memfit.spec_from_arguments({**SEED, "neat_packing": True, "enable_liger_kernel": True,
                                         "per_device_train_batch_size": 16, "disable_gradient_checkpointing": True},
                                        compute_dtype="bfloat16", zero_stage=0)  # fmt: skip
    assert not memfit.estimate(memfit.read_model_shape(qwen7b), bigger).fits(int(plan.usable_gib * memfit.GiB))


def test_without_liger_the_logits_peak_halves_the_micro_batch(qwen7b):
    plan = run(qwen7b, H200, liger=False)
    values = chosen(plan)
    assert values["enable_liger_kernel"] is False and "not installed" in plan.choices[2].reason
    assert (values["per_device_train_batch_size"], values["gradient_accumulation_steps"]) == (4, 4)
    assert values["disable_gradient_checkpointing"] is True


def test_liger_removes_the_logits_from_the_estimate(qwen7b):
    shape = memfit.read_model_shape(qwen7b)
    base = {**SEED, "neat_packing": True, "per_device_train_batch_size": 8, "disable_gradient_checkpointing": True}
    plain = memfit.estimate(shape, memfit.spec_from_arguments(base, compute_dtype="bf16", zero_stage=0))
    fused = memfit.estimate(shape, memfit.spec_from_arguments({**base, "enable_liger_kernel": True},
                                                              compute_dtype="bf16", zero_stage=0))  # fmt: skip
    tokens = 8 * 2048
    assert plain.logits == 12 * QWEN2_7B["vocab_size"] * tokens  # three fp32 T x V tensors
    assert fused.logits < 0.05 * plain.logits  # the input gradient (T x h) and one chunk of logits
    # Liger's RMSNorm keeps a bf16 input instead of an fp32 copy, its SwiGLU recomputes SiLU(gate)
    saved = dict(memfit.layer_saved_tensors(shape, memfit.spec_from_arguments(
        {**base, "enable_liger_kernel": True}, compute_dtype="bf16", zero_stage=0)))  # fmt: skip
    assert "SiLU(gate) (saved by the product)" not in saved
    assert saved["input RMSNorm: its input (Liger RMSNorm)"] == 2 * QWEN2_7B["hidden_size"]
    # the fused cross-entropy is SFT/pre-training only: DPO keeps its logits
    dpo = memfit.spec_from_arguments({**base, "stage": "dpo", "enable_liger_kernel": True}, compute_dtype="bf16",
                                     zero_stage=0)  # fmt: skip
    assert dpo.liger and not dpo.fused_cross_entropy


def test_user_values_win(qwen7b):
    plan = run(qwen7b, H200, explicit={"per_device_train_batch_size", "disable_gradient_checkpointing",
                                       "neat_packing", "enable_liger_kernel"},
               per_device_train_batch_size=2, disable_gradient_checkpointing=False, neat_packing=False,
               enable_liger_kernel=False)  # fmt: skip
    assert plan.planned_arguments() == {"flash_attn": "sdpa"}
    values = chosen(plan)
    assert values["per_device_train_batch_size"] == 2 and values["gradient_accumulation_steps"] == 8
    assert values["disable_gradient_checkpointing"] is False and values["neat_packing"] is False
    kept = {c.name: c.reason for c in plan.choices if not c.planned}
    assert kept["neat_packing"].startswith("yours (the planner would pick True")
    # an explicit plain PACKING=true is left alone (no neat_packing added behind the user's back)
    plan = run(qwen7b, H200, explicit={"packing"}, packing=True)
    assert "neat_packing" not in plan.planned_arguments()


def test_gfx1100_48gb_card_and_gfx942(qwen7b):  # the W7900 has 48 GB (AMD's product page)
    small = run(qwen7b, RX7900)
    values = chosen(small)
    assert values["flash_attn"] == "sdpa"
    assert values["per_device_train_batch_size"] * values["gradient_accumulation_steps"] == 16
    assert small.estimate_gib <= RX7900.memory_gib[0] * planner.USABLE_FRACTION
    assert values["per_device_train_batch_size"] < 8  # less memory, smaller micro-batch than on the H200
    # with flash_attn installed: FA2 on CDNA3 (CK backend), one packed row per micro-batch
    mi300 = run(qwen7b, MI300X, flash=True)
    assert chosen(mi300)["flash_attn"] == "fa2" and "ck backend for gfx942" in mi300.choices[0].reason


def test_gfx1100_gets_torchs_own_attention_even_where_flash_attn_is_importable(qwen7b):
    """Issue 31: gfx1100's profile has no flash-attn (FLASH_ATTN_BACKEND=none: its Triton backend never ran on
    triton-rocm 3.6). A flash_attn someone installed beside it is not used: SDPA, and neat-packed rows through
    torch's variable-length attention (AOTriton on ROCm), not one row per micro-batch as under FA2."""
    assert planner.flash_backend("gfx1100") == "none"
    plan = run(qwen7b, RX7900, flash=True)
    values = chosen(plan)
    assert values["flash_attn"] == "sdpa" and "no flash-attention backend for gfx1100" in plan.choices[0].reason
    assert values["neat_packing"] is True and plan.packed_attention == "varlen"
    assert values["per_device_train_batch_size"] > 1  # packed rows batch together under varlen (FA2 forced 1)
    assert values["per_device_train_batch_size"] * values["gradient_accumulation_steps"] == 16


def test_nothing_fits_without_checkpointing_turns_it_on(qwen7b):
    tiny_gpu = DeviceFacts(backend="rocm", count=1, archs=["gfx1100"], memory_gib=[24.0], bf16=True)
    plan = run(qwen7b, tiny_gpu)
    values = chosen(plan)
    assert values["disable_gradient_checkpointing"] is False
    assert values["per_device_train_batch_size"] >= 1 and plan.estimate_gib <= 24.0


def test_no_gpu_and_the_builtin_default_plan_nothing(qwen7b):
    assert run(qwen7b, CPU).active is False and run(qwen7b, CPU).choices == []
    args = {**SEED, "model_name_or_path": str(qwen7b)}
    demo = planner.plan_defaults(args, set(), H200, compute_dtype="bfloat16", demo=True)
    assert demo.active is False and demo.choices == []


def test_other_stages_do_not_pack_and_keep_logits(qwen7b):
    plan = run(qwen7b, H200, stage="dpo")
    values = chosen(plan)
    assert "neat_packing" not in values and values["enable_liger_kernel"] is False


def test_render_records_the_plan_and_the_manifest_saves_it(render_env, tmp_path):
    h200 = DeviceFacts(backend="cuda", count=1, names=["NVIDIA H200"], archs=["sm_90"], memory_gib=[139.8],
                       bf16=True)  # fmt: skip
    plan = render_env({"DATASET": "alpaca_en_demo", "PER_DEVICE_TRAIN_BATCH_SIZE": "4"}, device=h200)
    rendered = OmegaConf.to_container(OmegaConf.load(plan.files["train.yaml"]))
    assert rendered["neat_packing"] is True and rendered["per_device_train_batch_size"] == 4
    assert plan.sources["neat_packing"].kind is Kind.PLAN and str(plan.sources["neat_packing"]).startswith(
        "rocmft plan: SFT")  # fmt: skip
    assert plan.sources["per_device_train_batch_size"] == Source.environment("PER_DEVICE_TRAIN_BATCH_SIZE")
    assert rendered["disable_gradient_checkpointing"] is True  # the tiny model fits anything
    from rocmft.outputs.manifest import RunOutcome, write_manifest

    path = write_manifest(tmp_path / "manifest.json", plan, probes={}, launch=None, checks=None,
                          outcome=RunOutcome(status="running", exit_code=None, started_at="now"))  # fmt: skip
    saved = json.loads(path.read_text())["plan"]
    assert saved["active"] is True
    assert {c["name"]: c["value"] for c in saved["choices"]}["neat_packing"] is True
    # on a CPU nothing is planned: the seed recipe stays as it was
    cpu = render_env({"DATASET": "alpaca_en_demo"})
    assert cpu.perf.active is False and "neat_packing" not in OmegaConf.load(cpu.files["train.yaml"])


def test_packed_steps_keep_the_samples_per_step_of_the_recipe(qwen7b):
    """Measured on an H200 (BENCHMARKS.md): alpaca_en_demo averaged 483 tokens per sample (154,627 tokens over
    320 samples) and the plan that kept 16 *rows* per step saw ~4.2x the recipe's samples per optimizer step, its
    loss per token falling slower. With the mean sample length known, 16 samples become 16 x 483 / 2048 = 3.8
    -> 4 packed rows."""
    plan = planner.plan_defaults({**SEED, "model_name_or_path": str(qwen7b)}, set(), H200, compute_dtype="bfloat16",
                                 liger_available=True, flash_available=False, sample_tokens=483.0)  # fmt: skip
    values = chosen(plan)
    assert values["per_device_train_batch_size"] * values["gradient_accumulation_steps"] == 4
    reason = next(c.reason for c in plan.choices if c.name == "gradient_accumulation_steps")
    assert "~16 samples per optimizer step" in reason and "4 packed rows" in reason and "483 tokens" in reason
    # long samples (a row holds one): rows = samples; never below one row
    longer = planner.plan_defaults({**SEED, "model_name_or_path": str(qwen7b)}, set(), H200, compute_dtype="bfloat16",
                                   liger_available=True, flash_available=False, sample_tokens=5000.0)  # fmt: skip
    assert chosen(longer)["per_device_train_batch_size"] * chosen(longer)["gradient_accumulation_steps"] == 16
    few = planner.plan_defaults({**SEED, "model_name_or_path": str(qwen7b), "gradient_accumulation_steps": 1},
                                set(), H200, compute_dtype="bfloat16", liger_available=True, flash_available=False,
                                sample_tokens=10.0)  # fmt: skip
    assert chosen(few)["per_device_train_batch_size"] * chosen(few)["gradient_accumulation_steps"] == 1


def test_render_measures_the_sample_length_for_the_plan(render_env, tiny_model, demo_data):
    """End to end through render on an injected GPU: the mean length of the real data set's samples, measured
    with the tiny model's tokenizer, sets the packed rows (a recorded device, not a patched planner)."""
    from rocmft.render.datasets import sample_token_lengths

    plan = render_env({"DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data), "CUTOFF_LEN": "64"},
                      device=H200)  # fmt: skip
    entries = [plan.registry.entries["rocmft_demo"]]
    lengths = sample_token_lengths(entries, tiny_model)
    mean = sum(lengths) / len(lengths)
    arguments = plan.arguments
    rows = arguments["per_device_train_batch_size"] * arguments["gradient_accumulation_steps"]
    assert rows == max(1, round(16 / (64 / min(mean, 64))))
    reasons = {c["name"]: c["reason"] for c in plan.perf.as_dict()["choices"]}
    assert f"mean {mean:.0f} tokens per sample" in reasons["gradient_accumulation_steps"]


def test_sample_lengths_from_tokenizer_json_equal_transformers_counts(tiny_model, shared_data):
    """The lengths check and the planner read tokenizer.json with the tokenizers library (0.2 s instead of a 12 s
    transformers import on the H200 host); the counts must be AutoTokenizer's."""
    from transformers import AutoTokenizer

    from rocmft.render.datasets import read_records, token_counter, trainable_text

    entry = {"file_name": str(shared_data / "alpaca_en_demo.json"), "formatting": "alpaca"}
    texts = [trainable_text(r, entry) for r in read_records(Path(entry["file_name"]), 200)]
    reference = AutoTokenizer.from_pretrained(str(tiny_model))(texts, add_special_tokens=False)["input_ids"]
    assert token_counter(tiny_model)(texts) == [len(ids) for ids in reference]
    assert sum(len(t) for t in texts) > 10_000  # real records, not empty strings


def test_plan_command_on_the_builtin_default_says_why_nothing_is_planned(run_rocmft, tmp_path):
    result = run_rocmft("plan")
    assert result.returncode == 0, result.stdout[-2000:]
    assert "nothing planned" in result.stdout and "built-in default" in result.stdout, result.stdout[-2000:]
    assert not (tmp_path / "saves").exists()  # the plan writes nothing to OUTPUT_DIR


def test_neat_packing_under_sdpa_plans_varlen_attention_for_the_worker(qwen7b):
    """Neat-packed rows under SDPA take rocmft's varlen attention (no dense block mask); the memory estimate is
    the varlen path's, which drops the mask and keeps K/V at their own heads, below the masked path's (K/V repeated
    to every head and the mask). Not with FlashAttention-2 (LLaMA-Factory drops the
    mask itself), not in fp32 (no flash kernels), not without neat packing."""
    plan = planner.plan_defaults({**SEED, "model_name_or_path": str(qwen7b)}, set(), H200, compute_dtype="bfloat16",
                                 liger_available=True, flash_available=False, sample_tokens=457.0)  # fmt: skip
    assert (plan.packed_attention, plan.sample_tokens) == ("varlen", 457.0)
    assert chosen(plan)["per_device_train_batch_size"] * chosen(plan)["gradient_accumulation_steps"] == 4
    masked = memfit.spec_from_arguments({**SEED, **plan.planned_arguments()}, compute_dtype="bfloat16", zero_stage=0)
    varlen = memfit.spec_from_arguments({**SEED, **plan.planned_arguments()}, compute_dtype="bfloat16", zero_stage=0,
                                        packed_attention="varlen")  # fmt: skip
    shape = memfit.read_model_shape(qwen7b)
    assert plan.estimate_gib == round(memfit.estimate(shape, varlen).total / memfit.GiB, 2)
    assert memfit.estimate(shape, varlen).total < memfit.estimate(shape, masked).total
    assert run(qwen7b, H200, flash=True).packed_attention is None
    assert run(qwen7b, H200, dtype="float32").packed_attention is None
    assert run(qwen7b, H200, explicit={"packing"}, packing=False).packed_attention is None
    assert run(qwen7b, CPU).packed_attention is None


def test_run_json_carries_the_packed_attention_to_the_worker(render_env, tiny_model):
    """render writes the plan's packed_attention into run.json, which is what the worker reads."""
    from rocmft.render import worker_policy

    assert worker_policy(render_env({}, device=H200))["packed_attention"] == "varlen"  # flash_attn is not installed
    assert worker_policy(render_env({"PACKING": "false"}, device=H200))["packed_attention"] is None
    assert worker_policy(render_env({}))["packed_attention"] is None  # the CPU: nothing planned


def test_evaluation_is_budgeted_too(qwen7b):
    """hiyouga/LlamaFactory#7781, #6676: training fits, evaluation's full logits do not. The eval batch is planned
    only when the run evaluates; a value of yours is kept, and said when it would run out of memory."""
    small = DeviceFacts(backend="cuda", count=1, names=["GPU 32 GB"], archs=["sm_90"], memory_gib=[32.0], bf16=True)
    assert "per_device_eval_batch_size" not in chosen(run(qwen7b, small))  # no evaluation: nothing to plan
    plan = run(qwen7b, small, eval_strategy="steps")
    batch = chosen(plan)["per_device_eval_batch_size"]
    assert batch in planner.EVAL_BATCHES and batch < 8  # 8 x 2048 x 152k fp32 logits alone are ~28 GiB
    shape = memfit.read_model_shape(qwen7b)
    spec = memfit.spec_from_arguments({**SEED, **plan.planned_arguments()}, compute_dtype="bfloat16", zero_stage=0,
                                      packed_attention=plan.packed_attention)  # fmt: skip
    usable = plan.usable_gib * (1 - memfit.ALLOCATOR_HEADROOM) * memfit.GiB
    assert memfit.eval_estimate(shape, spec, batch) <= usable < memfit.eval_estimate(shape, spec, batch * 2)
    # generation adds a KV cache: never a larger batch
    generating = run(qwen7b, small, eval_strategy="steps", predict_with_generate=True)
    assert chosen(generating)["per_device_eval_batch_size"] <= batch
    mine = run(qwen7b, small, explicit={"per_device_eval_batch_size"}, eval_strategy="steps",
               per_device_eval_batch_size=8)  # fmt: skip
    (choice,) = [c for c in mine.choices if c.name == "per_device_eval_batch_size"]
    assert not choice.planned and choice.value == 8 and "run out of memory" in choice.reason
