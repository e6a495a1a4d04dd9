"""rocmft.worker.patches.train_mode_set_once: the Trainer's per-micro-step ``model.train()`` walks the module tree only
when some module is not training (issue 32: host time while the GPU waits, bench/host_cost.py).

Each test builds a real transformers Qwen2 with peft LoRA on every Linear (the tree the Trainer walks) and watches one
submodule's ``train`` calls, which the walk makes and a skip does not.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from rocmft.worker import patches  # noqa: E402


def _model():
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = transformers.Qwen2ForCausalLM(config)
    return peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                      lora_dropout=0.1))  # fmt: skip


def _watch(module) -> list[bool]:
    """The modes of every ``train`` call ``module`` gets from its parent's walk (an instance attribute: the walk
    calls ``child.train(mode)``, its class stays ``nn.Module``)."""
    calls: list[bool] = []
    walk = module.train

    def train(mode: bool = True):
        calls.append(mode)
        return walk(mode)

    module.train = train
    return calls


def test_the_walk_runs_once_while_every_module_trains_and_again_after_any_eval():
    patches.train_mode_set_once()
    model = _model()
    layers = model.base_model.model.model.layers
    calls = _watch(layers[1].mlp)
    for _ in range(3):
        model.train()  # what transformers' training_step does on every micro-step
    assert calls == [True], "a tree already training was walked again"
    dropout = layers[0].self_attn.q_proj.lora_dropout["default"]
    dropout.eval()  # one submodule put in eval mode (a callback, an evaluation of part of the model)
    model.train()
    assert dropout.training, "the LoRA dropout stayed in eval mode: the walk was skipped"
    assert calls == [True, True]
    model.eval()  # the Trainer's evaluation loop
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())
    assert calls == [True, True, False, True]


def test_a_module_with_a_train_of_its_own_keeps_the_walk_every_time():
    patches.train_mode_set_once()

    class Stats(torch.nn.Module):
        """A module whose ``train`` has work of its own (as a norm with running statistics might)."""

        def __init__(self) -> None:
            super().__init__()
            self.seen = 0

        def train(self, mode: bool = True):
            self.seen += 1
            return super().train(mode)

    model = _model()
    stats = Stats()
    model.base_model.model.model.add_module("stats", stats)
    for _ in range(3):
        model.train()
    assert stats.seen == 3
