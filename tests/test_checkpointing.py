"""Gradient checkpointing with adapters (LoRA, OFT: frozen base weights): rocmft renders the mode that works with
them (non-reentrant) and refuses a mode the user wrote that fails (rocmft.validate.rules.method.checkpointing_mode).

The failure is reproduced here, not restated: two gloo ranks on the CPU run LLaMA-Factory 0.9.5's own checkpointing
(``prepare_model_for_training``) on the tiny model with a LoRA adapter under DDP looking for unused parameters, as
huggingface/peft#313 (LLaMA-Factory's author's report), huggingface/trl#921 and huggingface/accelerate#3536 show it
("Expected to mark a variable ready only once ... Reused parameters in multiple reentrant backward passes"); the
maintainer's fix there (modelscope/ms-swift#2746) is ``use_reentrant: false``. Then a real two-rank `rocmft train`
in the same set-up, with rocmft's rendered mode, trains the adapter.
"""

from __future__ import annotations

import json
import socket

import pytest
import yaml

from rocmft.errors import ConfigError

DDP = {"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_NPROC_PER_NODE": "2", "DATASET": "identity"}


def test_adapters_render_non_reentrant_checkpointing(render_env):
    """LoRA with LLaMA-Factory's checkpointing (on by default) renders ``use_reentrant_gc: false``; with transformers'
    GRADIENT_CHECKPOINTING=true also the Trainer's kwargs, which would otherwise turn it reentrant again
    (huggingface/transformers#26221: "the Trainer was resetting it"). Full fine-tuning, checkpointing off and sharded
    weights (ZeRO-3: see the next test but one) keep LLaMA-Factory's defaults; a user's own value stays."""
    lora = render_env({"DATASET": "identity"})
    assert lora.arguments["use_reentrant_gc"] is False
    assert str(lora.sources["use_reentrant_gc"]) == (
        "rocmft's default (non-reentrant gradient checkpointing for adapters on frozen weights)"
    )
    assert "gradient_checkpointing_kwargs" not in lora.arguments
    assert "use_reentrant_gc: false" in lora.text
    from rocmft.render.checkpointing import said

    assert said(lora.arguments, lora.sources).startswith("gradient checkpointing: use_reentrant_gc=false (rocmft's")
    trainer = render_env({"DATASET": "identity", "GRADIENT_CHECKPOINTING": "true"})
    assert trainer.arguments["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    oft = render_env({"DATASET": "identity", "FINETUNING_TYPE": "oft"})
    assert oft.arguments["use_reentrant_gc"] is False
    zero3 = {"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3"}
    for unchanged in ({"FINETUNING_TYPE": "full"}, {"DISABLE_GRADIENT_CHECKPOINTING": "true"}, zero3):
        assert "use_reentrant_gc" not in render_env({"DATASET": "identity", **unchanged}).arguments, unchanged
    mine = render_env({"DATASET": "identity", "USE_REENTRANT_GC": "true"})
    assert mine.arguments["use_reentrant_gc"] is True and str(mine.sources["use_reentrant_gc"]) == "USE_REENTRANT_GC"


def test_reentrant_checkpointing_under_ddp_looking_for_unused_parameters_is_refused(render_env):
    """The combination reproduced by the slow test below (reentrant + DDP_FIND_UNUSED_PARAMETERS=true + LoRA on
    two DDP ranks) is refused before anything runs, naming the three settings and the fix; rocmft's own mode with
    the same DDP setting renders. OFT needs no DDP_FIND_UNUSED_PARAMETERS: LLaMA-Factory sets it False for LoRA only,
    and transformers' Trainer turns it on for a model that is no PreTrainedModel (a PeftModel)."""
    with pytest.raises(ConfigError) as caught:
        render_env({**DDP, "USE_REENTRANT_GC": "true", "DDP_FIND_UNUSED_PARAMETERS": "true"})
    message, fix = str(caught.value), caught.value.remedy
    expected = (
        "USE_REENTRANT_GC=true (set in the environment)",
        "FINETUNING_TYPE=lora",
        "on 2 DDP processes",
        "DDP_FIND_UNUSED_PARAMETERS=true (set in the environment)",
        "Expected to mark a variable ready",
    )
    for named in expected:
        assert named in message, named
    assert "USE_REENTRANT_GC=false" in fix
    plan = render_env({**DDP, "DDP_FIND_UNUSED_PARAMETERS": "true"})
    assert plan.arguments["use_reentrant_gc"] is False and plan.world_size == 2
    with pytest.raises(ConfigError) as oft:
        render_env({**DDP, "FINETUNING_TYPE": "oft", "USE_REENTRANT_GC": "true"})
    assert "DDP_FIND_UNUSED_PARAMETERS not set (transformers: true for an OFT model)" in str(oft.value)
    render_env({**DDP, "USE_REENTRANT_GC": "true"})  # LoRA: LLaMA-Factory sets find_unused False itself
    render_env({"DATASET": "identity", "USE_REENTRANT_GC": "true", "DDP_FIND_UNUSED_PARAMETERS": "true"})  # 1 process


def test_non_reentrant_checkpointing_under_zero3_is_refused_for_this_deepspeed(render_env):
    """huggingface/transformers#47254 (and hiyouga/LlamaFactory#6438, huggingface/trl#2514): PEFT LoRA with
    non-reentrant checkpointing under ZeRO-3 on two or more processes fails the first backward with "Recomputed
    values for the following tensors have different metadata" (a frozen weight's shape [1024] vs [0]), until
    DeepSpeed 0.19.3 (PR #8148); the installed DeepSpeed is LLaMA-Factory 0.9.5's pin, 0.18.4. Reentrant, what
    rocmft leaves there, is LLaMA-Factory's default."""
    import importlib.metadata

    assert importlib.metadata.version("deepspeed").startswith("0.18."), "the refusal is for DeepSpeed < 0.19.3"
    zero3 = {**DDP, "ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3"}
    assert "use_reentrant_gc" not in render_env(zero3).arguments
    with pytest.raises(ConfigError) as caught:
        render_env({**zero3, "USE_REENTRANT_GC": "false"})
    message = str(caught.value)
    assert "USE_REENTRANT_GC=false (set in the environment) (non-reentrant gradient checkpointing)" in message
    assert "ROCMFT_ZERO_STAGE=3" in message and "on 2 processes" in message and "0.19.3" in message
    assert "USE_REENTRANT_GC=true" in caught.value.remedy
    render_env({**zero3, "ROCMFT_NPROC_PER_NODE": "1", "USE_REENTRANT_GC": "false"})  # one process: no partition


def test_the_trainers_kwargs_undoing_use_reentrant_gc_is_refused(render_env):
    """huggingface/transformers#26221: the user's non-reentrant choice is silently replaced by the Trainer's
    gradient_checkpointing with reentrant kwargs."""
    with pytest.raises(ConfigError) as caught:
        render_env({"DATASET": "identity", "USE_REENTRANT_GC": "false", "GRADIENT_CHECKPOINTING": "true",
                    "GRADIENT_CHECKPOINTING_KWARGS": '{"use_reentrant": true}'})  # fmt: skip
    assert "USE_REENTRANT_GC=false (set in the environment) is undone by GRADIENT_CHECKPOINTING=true" in str(
        caught.value
    )
    assert 'GRADIENT_CHECKPOINTING_KWARGS={"use_reentrant": false}' in caught.value.remedy


def test_both_problems_are_findings_of_the_rule(render_env):
    """Each refusal is a finding of its own with the rule's code (rocmft.findings), reported together."""
    with pytest.raises(ConfigError) as caught:
        render_env({**DDP, "DDP_FIND_UNUSED_PARAMETERS": "true", "GRADIENT_CHECKPOINTING": "true",
                    "USE_REENTRANT_GC": "false",
                    "GRADIENT_CHECKPOINTING_KWARGS": '{"use_reentrant": true}'})  # fmt: skip
    codes = [f.code for f in caught.value.findings if f.severity == "error"]
    assert codes == ["method.checkpointing_mode", "method.checkpointing_mode"], codes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, port: int, model_dir: str, results) -> None:
    """One gloo rank: LLaMA-Factory's checkpointing on the tiny model, a LoRA adapter, DDP looking for unused
    parameters (what DDP_FIND_UNUSED_PARAMETERS=true makes transformers' Trainer build), one forward and backward
    in each mode; puts ``(mode, rank, outcome, lora_B matrices with a gradient, lora_B matrices)``."""
    import os
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    from llamafactory.model.model_utils.checkpointing import prepare_model_for_training
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for mode, reentrant in (("reentrant", True), ("non-reentrant", False)):
        torch.manual_seed(rank)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        model.requires_grad_(False)
        prepare_model_for_training(model, SimpleNamespace(upcast_layernorm=False, disable_gradient_checkpointing=False,
                                                          use_reentrant_gc=reentrant, use_unsloth_gc=False,
                                                          upcast_lmhead_output=False))  # fmt: skip
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        model.train()
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        ids = torch.randint(0, 100, (2, 16))
        try:
            ddp(input_ids=ids, labels=ids).loss.backward()
            # lora_B starts at zero, so lora_A's first gradient is zero too: B's shows the adapter trains
            grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
            results.put((mode, rank, "ok", sum(g is not None and bool(g.abs().sum() > 0) for g in grads), len(grads)))
        except RuntimeError as err:
            results.put((mode, rank, str(err).splitlines()[0], 0, 0))
    dist.destroy_process_group()


@pytest.mark.slow
def test_the_refused_mode_really_fails_and_the_rendered_one_trains(tiny_model):
    """The premise of the refusal and of the rendered default, on two real gloo ranks (under a minute): reentrant
    fails on the first backward; non-reentrant, in the same ranks, gives every adapter B matrix a gradient."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, str(tiny_model), results)) for rank in (0, 1)]
    for proc in ranks:
        proc.start()
    outcome = sorted(results.get(timeout=400) for _ in range(4))
    for proc in ranks:
        proc.join(timeout=60)
    failed = [entry for entry in outcome if entry[0] == "reentrant"]
    trained = [entry for entry in outcome if entry[0] == "non-reentrant"]
    assert len(failed) == 2 and all("Expected to mark a variable ready only once" in e[2] for e in failed), outcome
    assert len(trained) == 2 and all(e[2] == "ok" and e[3] == e[4] > 0 for e in trained), outcome


@pytest.mark.train
def test_two_ddp_ranks_train_the_adapter_with_the_rendered_mode(run_rocmft, tmp_path, tiny_model, demo_data):
    """The set-up that fails with LLaMA-Factory's reentrant default (two DDP ranks on the CPU, LoRA,
    DDP_FIND_UNUSED_PARAMETERS=true, and transformers' GRADIENT_CHECKPOINTING=true, whose kwargs rocmft renders
    too) trains with rocmft's rendered mode: a few real steps, and the adapter's B matrices, which PEFT starts at
    zero, are no longer zero."""
    from safetensors import safe_open

    output = tmp_path / "ddp-lora"
    env = {
        "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
        "FINETUNING_TYPE": "lora", "MAX_STEPS": "3", "LOGGING_STEPS": "1", "CUTOFF_LEN": "64",
        "OUTPUT_DIR": str(output), "ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_NPROC_PER_NODE": "2",
        "ROCMFT_SKIP_CHECKS": "gpu-runtime", "PREPROCESSING_NUM_WORKERS": "1", "DATALOADER_NUM_WORKERS": "0",
        "DDP_FIND_UNUSED_PARAMETERS": "true", "GRADIENT_CHECKPOINTING": "true", "LEARNING_RATE": "0.01",
    }  # fmt: skip
    result = run_rocmft("train", env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    said = 'gradient checkpointing: use_reentrant_gc=false, gradient_checkpointing_kwargs={"use_reentrant": false}'
    assert f"[rocmft] {said} (rocmft's default" in result.stdout, result.stdout[-3000:]
    rendered = yaml.safe_load((output / "rocmft" / "train.yaml").read_text())
    assert rendered["use_reentrant_gc"] is False and rendered["gradient_checkpointing_kwargs"] == {
        "use_reentrant": False
    }
    with safe_open(output / "adapter_model.safetensors", "pt") as weights:
        b_norms = {name: float(weights.get_tensor(name).abs().sum()) for name in weights.keys() if "lora_B" in name}  # noqa: SIM118
    assert b_norms and all(norm > 0 for norm in b_norms.values()), b_norms
    assert json.loads((output / "rocmft" / "manifest.json").read_text())["status"] == "finished"


def _peak_live_bytes(reentrant: bool | None) -> int:
    """The peak of live tensor storage (bytes) made by one forward and backward of a LoRA step on a small
    Qwen2-shaped model with LLaMA-Factory's checkpointing in the given mode (None: off), counted op by op with a
    dispatch mode (a process's RSS is the CPU allocator's, not the tensors')."""
    import weakref
    from types import SimpleNamespace

    import torch
    from llamafactory.model.model_utils.checkpointing import prepare_model_for_training
    from peft import LoraConfig, get_peft_model
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from transformers import Qwen2Config, Qwen2ForCausalLM

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self.seen: set[int] = set()

        def _gone(self, key: int, size: int) -> None:
            self.seen.discard(key)
            self.live -= size

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in tree_flatten(out)[0]:
                if isinstance(tensor, torch.Tensor):
                    storage = tensor.untyped_storage()
                    key = storage.data_ptr()
                    if key and key not in self.seen:
                        self.seen.add(key)
                        self.live += storage.nbytes()
                        weakref.finalize(storage, self._gone, key, storage.nbytes())
                        self.peak = max(self.peak, self.live)
            return out

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=2048, max_position_embeddings=1024)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.requires_grad_(False)
    arguments = SimpleNamespace(
        upcast_layernorm=False,
        use_unsloth_gc=False,
        upcast_lmhead_output=False,
        disable_gradient_checkpointing=reentrant is None,
        use_reentrant_gc=bool(reentrant),
    )
    prepare_model_for_training(model, arguments)
    model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    model.train()
    ids = torch.randint(0, 2048, (2, 512))
    with Live() as live:
        model(input_ids=ids, labels=ids).loss.backward()
    return live.peak


@pytest.mark.slow
def test_the_rendered_mode_keeps_what_reentrant_checkpointing_keeps():
    """rocmft.render.memfit estimates checkpointed layers by their inputs alone (written for LLaMA-Factory's
    reentrant default); the non-reentrant mode rocmft renders for adapters must keep no more, or the planner's
    fits would be wrong. Measured here: the peak of live tensors of one LoRA step in each mode, and without
    checkpointing for scale (2026-12-03 on the CPU, this test's model: 105, 103 and 213 MiB; at width 1024 and
    1024 tokens x 2: 441, 433 and 869 MiB)."""
    reentrant, non_reentrant, off = _peak_live_bytes(True), _peak_live_bytes(False), _peak_live_bytes(None)
    assert non_reentrant <= reentrant * 1.05, (reentrant, non_reentrant, off)
    assert reentrant < off * 0.75, (reentrant, non_reentrant, off)  # checkpointing saves what it should
