"""Neat-packed rows through rocmft's variable-length attention: each sample attends only to itself.

The proof the performance issue asks for: the logits of samples packed into rows (several per row, several rows
per micro-batch, LLaMA-Factory's index mask as the input) equal each sample's logits computed alone, through a
real transformers Qwen2 model with GQA. Runs on the CPU (one SDPA call per sample); with a GPU
visible the same comparison runs through torch's varlen kernel (tests/test_gpu.py covers a training run).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rocmft.records import read_worker_result  # noqa: E402
from rocmft.worker import attention  # noqa: E402


def tiny_qwen2(attn: str, device: str = "cpu", dtype=None):
    config = transformers.Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      attn_implementation=attn)  # fmt: skip
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).to(device=device, dtype=dtype or torch.float32).eval()


def pack(samples: list[list[int]], row_length: int) -> dict:
    """Rows as LLaMA-Factory 0.9.5's packed dataset and collator give them: ids, sample indices, pad 0."""
    rows, masks, row, mask = [], [], [], []
    for index, sample in enumerate(samples, start=1):
        if len(row) + len(sample) > row_length:
            rows.append(row + [0] * (row_length - len(row)))
            masks.append(mask + [0] * (row_length - len(mask)))
            row, mask = [], []
        row, mask = row + sample, mask + [index] * len(sample)
    rows.append(row + [0] * (row_length - len(row)))
    masks.append(mask + [0] * (row_length - len(mask)))
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": torch.tensor(masks), "labels": ids.clone()}


def test_segments_split_samples_rows_and_padding():
    mask = torch.tensor([[1, 1, 2, 2, 2, 0], [3, 4, 4, 5, 5, 5]])
    cu, longest = attention.segments(mask)
    assert cu.tolist() == [0, 2, 5, 6, 7, 9, 12] and cu.dtype == torch.int32 and longest == 3
    # a sample index that continues across a row boundary is still cut there
    cu, _ = attention.segments(torch.tensor([[1, 1], [1, 1]]))
    assert cu.tolist() == [0, 2, 4]


def test_pack_kwargs_keeps_rows_and_restarts_positions():
    batch = attention.pack_kwargs(pack([[5, 6, 7], [8, 9], [10, 11, 12, 13]], 6))
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [10, 11, 12, 13, 0, 0]]
    assert batch["labels"].tolist() == batch["input_ids"].tolist()
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 10, 12] and batch["max_length_q"] == 4


def test_only_right_padded_packed_rows_are_packed_batches():
    assert attention.is_packed_batch(pack([[5, 6, 7], [8, 9]], 6))
    left = {"input_ids": torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]]),
            "attention_mask": torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])}  # fmt: skip
    assert not attention.is_packed_batch(left)  # generation prompts: transformers' own mask
    mrope = {**pack([[5, 6, 7]], 4), "position_ids": torch.zeros(3, 1, 4, dtype=torch.long)}
    assert not attention.is_packed_batch(mrope)  # vision-language 3-D positions: left to LLaMA-Factory


def _packed_against_alone(device: str, dtype=None, contaminate: bool = False) -> float:
    """Largest |packed logit - the sample's own logit| over all samples, relative to the largest logit."""
    attention.register()
    torch.manual_seed(1)
    lengths = [7, 3, 11, 5, 9, 2, 13]
    samples = [torch.randint(1, 97, (n,)).tolist() for n in lengths]
    reference = tiny_qwen2("sdpa", device, dtype)
    packed_model = tiny_qwen2("sdpa", device, dtype)
    attention.use_on(packed_model)
    assert packed_model.config._attn_implementation == attention.NAME
    batch = attention.pack_kwargs(pack(samples, 16))
    inputs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items() if k != "labels"}
    if contaminate:  # what plain packing does: causal rows, samples see the ones before them
        ids = inputs["input_ids"]
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": inputs["position_ids"]}
    assert inputs["input_ids"].shape[0] > 1  # several rows in the micro-batch
    with torch.no_grad():
        logits = packed_model(**inputs).logits.reshape(-1, 97)
        worst, scale, offsets = 0.0, 0.0, batch["cu_seq_lens_q"].tolist()
        starts = [a for a in offsets[:-1] if batch["attention_mask"].reshape(-1)[a]]
        assert len(starts) == len(samples)
        for start, sample in zip(starts, samples, strict=True):
            alone = reference(input_ids=torch.tensor([sample], device=device)).logits[0]
            worst = max(worst, (logits[start : start + len(sample)] - alone).abs().max().item())
            scale = max(scale, alone.abs().max().item())
    return worst / scale


def test_packed_logits_equal_each_sample_alone_on_cpu():
    assert _packed_against_alone("cpu") < 1e-5
    # the comparison can fail: the same rows with samples attending to the ones before them differ
    assert _packed_against_alone("cpu", contaminate=True) > 1e-2


def test_lf_block_mask_agrees_with_varlen_on_cpu():
    """The path rocmft replaces (LLaMA-Factory's dense block-diagonal mask under SDPA) gives the same logits."""
    collator = pytest.importorskip("llamafactory.data.collator")
    attention.register()
    torch.manual_seed(2)
    samples = [torch.randint(1, 97, (n,)).tolist() for n in (4, 6, 5)]
    batch = pack(samples, 16)
    mask4 = collator.prepare_4d_attention_mask(batch["attention_mask"], torch.float32)
    position_ids = attention.pack_kwargs(dict(batch))["position_ids"]
    model = tiny_qwen2("sdpa")
    with torch.no_grad():
        dense = model(input_ids=batch["input_ids"], attention_mask=mask4, position_ids=position_ids).logits
        attention.use_on(model)
        packed = attention.pack_kwargs(pack(samples, 16))
        varlen = model(**{k: v for k, v in packed.items() if k != "labels"}).logits
    real = batch["attention_mask"].reshape(-1) != 0
    assert (dense.reshape(-1, 97)[real] - varlen.reshape(-1, 97)[real]).abs().max().item() < 1e-4


def test_generation_with_left_padding_is_transformers_sdpa():
    """Generation (a KV cache, queries shorter than keys, left padding) is not packed: transformers' own SDPA path."""
    attention.register()
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    reference, model = tiny_qwen2("sdpa"), tiny_qwen2("sdpa")
    attention.use_on(model)
    settings = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        want = reference.generate(input_ids=ids, attention_mask=mask, **settings)
        got = model.generate(input_ids=ids, attention_mask=mask, **settings)
    assert torch.equal(want, got)


def test_unpacked_calls_take_sdpa_with_the_padding_mask():
    """Evaluation or generation batches (no cu_seq_lens): same logits as transformers' SDPA, padding included."""
    attention.register()
    torch.manual_seed(3)
    ids = torch.randint(1, 97, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    reference, model = tiny_qwen2("sdpa"), tiny_qwen2("sdpa")
    attention.use_on(model)
    with torch.no_grad():
        want = reference(input_ids=ids, attention_mask=mask).logits
        got = model(input_ids=ids, attention_mask=mask).logits
    assert (want[mask.bool()] - got[mask.bool()]).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: torch's varlen kernel")
def test_packed_logits_equal_each_sample_alone_on_gpu():
    # bf16 (the flash kernels take no fp32): the kernels' different summation order costs ~bf16 precision
    assert _packed_against_alone("cuda", torch.bfloat16) < 2e-2
    assert _packed_against_alone("cuda", torch.bfloat16, contaminate=True) > 5e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: torch's varlen kernel")
def test_fp32_inputs_take_autocasts_dtype_or_the_per_segment_path_on_gpu():
    """torch's varlen kernel takes fp16/bf16 only. Under the trainer's bf16 autocast (DDP on the H200 handed
    attention fp32 q/k/v: 'FlashAttention only support fp16 and bf16 data type', exit 4) the inputs are cast to
    autocast's dtype, as SDPA would run them; in real fp32 (no autocast) each segment goes through SDPA in fp32."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(40, 4, 16, device="cuda") for _ in range(3))
    cu = torch.tensor([0, 7, 25, 40], dtype=torch.int32, device="cuda")
    reference = attention.varlen(q.double().cpu(), k.double().cpu(), v.double().cpu(), cu.cpu(), 18, None)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        mixed = attention.varlen(q, k, v, cu, 18, None)
    assert mixed.dtype == torch.bfloat16 and (mixed.double().cpu() - reference).abs().max().item() < 2e-2
    real = attention.varlen(q, k, v, cu, 18, None)
    assert real.dtype == torch.float32 and (real.double().cpu() - reference).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: torch's varlen kernel")
def test_gqa_goes_to_the_kernel_unrepeated_with_exact_gradients_on_gpu():
    """K and V reach torch's varlen kernel with their own Hkv heads (no repeat to the Hq query heads, whose copies
    the kernel's autograd context would keep for backward: 2.62 GiB on the 7B shape), and the output and the
    gradients of Q, K and V equal a float64 per-segment SDPA reference (GQA through ``enable_gqa``)."""
    torch.manual_seed(0)
    tokens, heads, kv_heads, dim = 120, 8, 2, 64
    cu = torch.tensor([0, 17, 70, 71, 120], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(tokens, h, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for h in (heads, kv_heads, kv_heads))  # fmt: skip
    grad = torch.randn(tokens, heads, dim, device="cuda", dtype=torch.bfloat16)
    saved = []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = attention.varlen(q, k, v, cu, 53, None)
    out.backward(grad)
    assert (tokens, kv_heads, dim) in saved and (tokens, heads, dim) in saved
    assert saved.count((tokens, heads, dim)) == 2, saved  # the query and the output; K and V kept at Hkv heads
    reference = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    want = attention.varlen(*reference, cu.cpu(), 53, None)
    want.backward(grad.double().cpu())
    for got, ref in zip((out, q.grad, k.grad, v.grad), (want, *(t.grad for t in reference)), strict=True):
        assert got.shape == ref.shape
        error = (got.double().cpu() - ref.detach()).abs().max().item() / ref.abs().max().item()
        assert error < 2e-2, (got.shape, error)


def _worker_losses(folder, cache_dir, run_dir, packed_attention):
    """Train the rendered run in ``run_dir`` with run.json's packed_attention set as given (the planner plans only
    on a GPU: here the value is injected); the losses and the worker's attention record."""
    import json
    import shutil
    import subprocess
    import sys

    from conftest import _rocmft_environment

    policy = json.loads((run_dir / "run.json").read_text())
    policy.update(packed_attention=packed_attention, sample_tokens=60.0)
    (run_dir / "run.json").write_text(json.dumps(policy))
    for item in run_dir.parent.iterdir():  # a fresh output_dir beside the rendered run
        if item != run_dir:
            shutil.rmtree(item) if item.is_dir() else item.unlink()
    done = subprocess.run([sys.executable, "-m", "rocmft.worker", str(run_dir)], cwd=folder, text=True,
                          env=_rocmft_environment(folder, cache_dir, None), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    result = read_worker_result(run_dir)  # the losses are in losses.jsonl beside worker-result.json
    return [entry.loss for entry in result.losses], result.attention, result.tokens_seen


@pytest.mark.slow  # starts rocmft, LLaMA-Factory's parser or a trainer as a process (not the fast layer)
def test_training_through_the_worker_matches_lf_block_mask(tmp_path, cache_dir, tiny_model, demo_data):
    """The whole worker path (collator wrapper, padding-free keyword arguments, attention set on the loaded model)
    trains exactly as LLaMA-Factory's own neat packing with its dense mask: same losses step by step, same token
    count. With TRAIN_ON_PROMPT every row's first token is a label too (a review found that flattening the rows
    into one made the row before it predict that label)."""
    from conftest import rocmft_in

    output = tmp_path / "out"
    env = {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
           "TEMPLATE": "qwen", "OUTPUT_DIR": str(output), "MAX_STEPS": "4", "PER_DEVICE_TRAIN_BATCH_SIZE": "2",
           "GRADIENT_ACCUMULATION_STEPS": "1", "CUTOFF_LEN": "256", "NEAT_PACKING": "true", "LOGGING_STEPS": "1",
           "SAVE_STRATEGY": "no", "TRAIN_ON_PROMPT": "true"}  # fmt: skip
    rendered = rocmft_in(tmp_path, cache_dir, "render", env=env)
    assert rendered.returncode == 0, rendered.stdout[-3000:]
    run_dir = output / "rocmft"
    varlen, record, tokens = _worker_losses(tmp_path, cache_dir, run_dir, "varlen")
    assert record["chosen"] == attention.NAME  # on the CPU there is nothing to measure (the record says so)
    # the packed batches took the varlen path, in every layer of every training forward
    assert record["calls"]["varlen"] >= 4 * 2 and record["calls"]["varlen"] > record["calls"]["sdpa"]
    masked, none, mask_tokens = _worker_losses(tmp_path, cache_dir, run_dir, None)
    assert none is None and len(varlen) == len(masked) == 4
    assert tokens == mask_tokens > 0
    # fp32 on the CPU: equal to rounding; bf16 on a GPU: the kernels' summation order differs
    import torch as _torch

    assert max(abs(a - b) for a, b in zip(varlen, masked, strict=True)) < (2e-2 if _torch.cuda.is_available() else 1e-4)


def test_lora_without_peft_casts_is_bit_identical_and_saves_less():
    """rocmft.worker.patches.lora_inputs_uncast_under_autocast: under bf16 autocast the loss and every gradient are
    bit for bit those of peft's own path, and autograd keeps fewer bytes (the census of saved tensors)."""
    peft = pytest.importorskip("peft")
    from peft.tuners.lora import layer

    from rocmft.worker import patches

    def run(patched: bool):
        model = tiny_qwen2("sdpa", dtype=torch.bfloat16).train()
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules="all-linear", lora_dropout=0.0,
                                                           init_lora_weights=False))  # fmt: skip
        for param in model.parameters():  # LLaMA-Factory keeps the adapters in fp32
            if param.requires_grad:
                param.data = param.data.float()
        ids = torch.randint(1, 97, (2, 24), generator=torch.Generator().manual_seed(4))
        saved: dict[int, int] = {}

        def keep(tensor):
            saved.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
            return tensor

        original = layer.Linear._cast_input_dtype
        if patched:
            patches.lora_inputs_uncast_under_autocast()
        try:
            with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), torch.autocast("cpu", torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        finally:
            layer.Linear._cast_input_dtype = original
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        return loss.item(), grads, sum(saved.values())

    plain_loss, plain_grads, plain_bytes = run(False)
    loss, grads, saved_bytes = run(True)
    assert loss == plain_loss
    assert grads.keys() == plain_grads.keys() and len(grads) > 0
    assert all(torch.equal(grads[name], plain_grads[name]) for name in grads)
    assert saved_bytes < plain_bytes
