"""rocmft.worker.lora_kernel: the LoRA product added by the GEMMs' epilogues (issue 32).

Its gradients are checked against autograd's numerical ones in float64; a peft model (a real transformers Qwen2 with
every Linear adapted, fp32 adapters as LLaMA-Factory keeps them, bf16 autocast) gives a loss and adapter gradients
at least as close to a float64 reference as peft's own path; every case the kernel does not cover is peft's path
bit for bit. With a GPU the model comparison runs on it too (flash/cuBLAS bf16 GEMMs instead of the CPU's).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft.tuners.lora import layer  # noqa: E402

from rocmft.worker import lora_kernel, patches  # noqa: E402


def test_the_kernels_gradients_are_autograds_numerical_ones():
    generator = torch.Generator().manual_seed(0)

    def rand(*shape, grad=True):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_(grad)

    x, a, b = rand(2, 3, 6), rand(4, 6), rand(5, 4)
    weight, bias = rand(5, 6, grad=False), rand(5, grad=False)
    assert torch.autograd.gradcheck(lora_kernel.LoraLinear.apply, (x, weight, bias, a, b, 0.5))
    assert torch.autograd.gradcheck(lora_kernel.LoraLinear.apply, (x, weight, None, a, b, 2.0))
    y = lora_kernel.LoraLinear.apply(x, weight, bias, a, b, 0.5)
    assert torch.allclose(y, x @ weight.T + bias + 0.5 * (x @ a.T) @ b.T)


def _model(device: str, **lora):
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16).train()
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                       init_lora_weights=False, **lora))  # fmt: skip
    for param in model.parameters():  # LLaMA-Factory keeps the adapters in fp32
        if param.requires_grad:
            param.data = param.data.float()
    return model


def _step(model, autocast: bool = True):
    """The loss and the adapters' gradients of one forward/backward, and how many Linears ran as LoraLinear."""
    device = next(model.parameters()).device
    ids = torch.randint(1, 97, (2, 24), generator=torch.Generator().manual_seed(4)).to(device)
    model.zero_grad()
    with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    fused = sum(1 for n in _graph(loss.grad_fn) if type(n).__name__ == "LoraLinearBackward")
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, fused


def _graph(node, seen=None):
    seen = set() if seen is None else seen
    if node is None or node in seen:
        return seen
    seen.add(node)
    for child, _ in node.next_functions:
        _graph(child, seen)
    return seen


@pytest.fixture
def patched(monkeypatch):
    """The patch applied for one test (monkeypatch undoes it)."""
    monkeypatch.setattr(layer.Linear, "forward", layer.Linear.forward)
    patches.lora_product_in_the_gemm()
    return layer.Linear.forward


def _against_float64(device: str, patched_forward, monkeypatch):
    model = _model(device)
    reference = copy.deepcopy(model).double()
    with monkeypatch.context() as plain:
        plain.setattr(layer.Linear, "forward", patched_forward.__wrapped__)  # peft's own forward
        peft_loss, peft_grads, peft_fused = _step(model)
        want_loss, want_grads, _ = _step(reference, autocast=False)
    loss, grads, fused = _step(model)
    assert peft_fused == 0 and fused == 14  # 7 Linears a layer x 2 layers took the kernel
    assert grads.keys() == peft_grads.keys() == want_grads.keys() and len(grads) == 28

    def error(got, want):
        return (got.double() - want).abs().max().item()

    # rounds once where peft rounds three times: as close to float64 as peft, with a margin for the summation order
    assert error(loss, want_loss) <= 1.5 * error(peft_loss, want_loss) + 1e-3
    worse = [n for n in grads if error(grads[n], want_grads[n]) > 1.5 * error(peft_grads[n], want_grads[n]) + 1e-6]
    assert not worse


def test_a_peft_model_under_bf16_autocast_is_as_close_to_float64_as_peft(patched, monkeypatch):
    _against_float64("cpu", patched, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_peft_model_under_bf16_autocast_is_as_close_to_float64_as_peft_on_gpu(patched, monkeypatch):
    _against_float64("cuda", patched, monkeypatch)


@pytest.mark.parametrize(
    "case",
    ["dropout", "dora", "no autocast", "zero3 partitioned"],
)
def test_what_the_kernel_does_not_cover_is_peft_bit_for_bit(case, patched, monkeypatch):
    lora = {"dropout": {"lora_dropout": 0.1}, "dora": {"use_dora": True}}.get(case, {})
    model = _model("cpu", **lora)
    if case == "zero3 partitioned":
        for param in model.parameters():
            param.ds_id = 0  # what DeepSpeed ZeRO-3 marks its partitioned parameters with
    autocast = case != "no autocast"
    torch.manual_seed(1)  # dropout's mask
    loss, grads, fused = _step(model, autocast)
    with monkeypatch.context() as plain:
        plain.setattr(layer.Linear, "forward", patched.__wrapped__)
        torch.manual_seed(1)
        peft_loss, peft_grads, _ = _step(model, autocast)
    assert fused == 0
    assert torch.equal(loss, peft_loss)
    assert all(torch.equal(grads[n], peft_grads[n]) for n in grads)
