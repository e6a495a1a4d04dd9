"""The host's time per micro-step in what transformers' Trainer does around the GPU work (issue 32; not a test).

Builds the 7B (Qwen2) shape on the ``meta`` device (no memory, no weights) with LoRA on its seven Linears as
LLaMA-Factory's ``lora_target: all`` does, and times, on this machine's CPU, the per-micro-step calls of
transformers 5.6's ``Trainer``: ``model.train()`` (``training_step``), the same with rocmft's
``patches.train_mode_set_once``, ``num_parameters(exclude_embeddings=True)`` (``floating_point_ops``), and the
parameter walk of the clip (``model.parameters()``) and of ``model.zero_grad()`` at each optimizer step, against
rocmft's ``patches.gradients_found_without_walking`` (``rocmft.worker.params``).

    python bench/host_cost.py [--shape 7b] [--repeat 50]

Prints one line per call: milliseconds per call (the mean of ``--repeat`` after one warm-up call).
"""

from __future__ import annotations

import argparse
import time

from common import QWEN2_SHAPES as SHAPES


def per_call_ms(function, repeat: int) -> float:
    """Mean wall milliseconds of ``function()`` over ``repeat`` calls, after one."""
    function()
    started = time.perf_counter()
    for _ in range(repeat):
        function()
    return (time.perf_counter() - started) / repeat * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="7b")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = SHAPES[args.shape]
    config = Qwen2Config(**{k: v for k, v in shape.items() if k in Qwen2Config().to_dict()})
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    modules = sum(1 for _ in model.modules())
    print(f"{args.shape}: {modules} modules, {sum(1 for _ in model.parameters())} parameters")

    def show(label: str, function) -> None:
        print(f"{label:<48} {per_call_ms(function, args.repeat):7.2f} ms")

    show("model.train()", model.train)
    show("num_parameters(exclude_embeddings=True)", lambda: model.num_parameters(exclude_embeddings=True))
    show("list(model.parameters()) (the clip's walk)", lambda: list(model.parameters()))
    show("model.zero_grad()", model.zero_grad)
    from rocmft.worker import params, patches

    patches.train_mode_set_once()
    patches.gradients_found_without_walking()
    params.listed(model)  # as the run's first clip makes it
    show("model.train(), rocmft's train_mode_set_once", model.train)
    show("params.with_grad(model) (rocmft's clip)", lambda: params.with_grad(model))
    show("model.zero_grad(), rocmft's listed one", model.zero_grad)
    mlp = model.base_model.model.model.layers[3].mlp
    mlp.eval()
    started = time.perf_counter()
    model.train()
    print(
        f"model.train() after one MLP's eval()        {(time.perf_counter() - started) * 1e3:7.2f} ms "
        f"(the full walk; that MLP trains again: {mlp.training})"
    )


if __name__ == "__main__":
    main()
