"""rocmft.worker.params and patches.gradients_found_without_walking: transformers' Trainer clips and zeroes the
gradients of a parameter list made once, not of a walk of the module tree at every optimizer step (issue 32), and
finds exactly the gradients torch's own ``clip_grad_norm_(model.parameters())`` and ``zero_grad`` find.

A real transformers Trainer (CPU, one process) with a Qwen2 of two layers and peft LoRA on every Linear.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from rocmft.worker import params, patches  # noqa: E402


def _model():
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    return peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                      init_lora_weights=False))  # fmt: skip


def _backward(model) -> None:
    ids = torch.randint(1, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()


@pytest.fixture()
def trainer(tmp_path):
    patches.gradients_found_without_walking()
    arguments = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                               max_grad_norm=0.01)  # fmt: skip
    return transformers.Trainer(model=_model(), args=arguments)


def _count_walks(model) -> list[int]:
    """Calls of ``model.parameters()`` (an instance attribute over the class's method)."""
    calls = [0]
    walk = model.parameters

    def parameters(recurse: bool = True):
        calls[0] += 1
        return walk(recurse)

    model.parameters = parameters
    return calls


def test_the_clip_finds_torchs_gradients_and_walks_the_tree_once(trainer):
    model = trainer.model
    reference = copy.deepcopy(model)
    for m in (model, reference):
        _backward(m)
        frozen = m.base_model.model.model.layers[0].mlp.down_proj.base_layer.weight
        frozen.grad = torch.ones_like(frozen)  # a frozen parameter holding a gradient counts, as torch counts it
    walks = _count_walks(model)
    norm = trainer._clip_grad_norm(model)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    assert torch.equal(norm, expected)
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        assert p.grad is None or torch.equal(p.grad, q.grad), f"{name}: clipped differently"
    for _ in range(3):
        _backward(model)
        trainer._clip_grad_norm(model)
        model.zero_grad()
    assert walks == [1], "the module tree was walked again for a clip or a zero_grad"
    assert all(p.grad is None for p in model.parameters())


def test_a_parameter_registered_later_is_clipped_and_a_forward_keeps_the_list(trainer):
    model = trainer.model
    _backward(model)
    before = params.listed(model)
    _backward(model)  # Qwen2's forward slices its layers (a new ModuleList): not a change of this tree
    assert params.listed(model) is before
    extra = torch.nn.Parameter(torch.zeros(3))
    extra.grad = torch.full((3,), 100.0)
    model.base_model.model.model.layers[1].register_parameter("extra", extra)
    assert params.listed(model) is not before and any(p is extra for p in params.with_grad(model))
    trainer._clip_grad_norm(model)
    assert float(extra.grad.norm()) < 0.01 + 1e-6, "the parameter registered after the list was not clipped"


def test_zero_grad_keeps_torchs_way_for_what_was_never_clipped():
    patches.gradients_found_without_walking()
    model = _model()
    _backward(model)
    model.zero_grad(set_to_none=False)
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert not params.is_listed(model)
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
