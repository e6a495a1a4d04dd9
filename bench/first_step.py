"""Where the first training step's seconds go: 7B-shape LoRA with Liger's kernels, one GPU (not a test).

Run from the repository root on a GPU host, after bench/throughput.py built its model::

    python bench/first_step.py --model DIR/random-7b --out OUT [--cutoff 2048] [--batch 4] [--steps 4]

Runs the same measurement twice, each in a fresh child process sharing one new, empty ``TRITON_CACHE_DIR``: the
first child compiles every Triton kernel (Liger's RMSNorm, RoPE, SwiGLU, fused linear cross-entropy), the second
finds them cached. Each child times, with ``torch.cuda.synchronize()`` around every part: the imports; Liger's
patch (``apply_liger_kernel_to_qwen2``, LLaMA-Factory 0.9.5's defaults: RoPE, RMSNorm, SwiGLU, fused linear
cross-entropy); the model load (``from_pretrained`` onto the GPU, bf16); peft's LoRA (rank 8, all seven Linears);
the first batch on the GPU (``batch`` rows of ``cutoff`` random token ids, labels = inputs); then for each step the
forward, backward and fused AdamW step; and the Triton cache's files after each child. Attention is SDPA's causal
flash kernel on whole rows (the expert's configuration, bench/throughput.py's (c)). Writes OUT/first_step.json.
The difference between the children's first steps is the compilation a cold cache costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _timed(parts: dict, name: str, fn):
    import torch

    torch.cuda.synchronize()
    started = time.perf_counter()
    value = fn()
    torch.cuda.synchronize()
    parts[name] = round(time.perf_counter() - started, 3)
    return value


def _to_float8(model) -> None:
    """torchao's float8 training with the "rowwise" recipe on the frozen base Linears peft wraps (``base_layer``,
    both sides multiples of 16), as LLaMA-Factory 0.9.5's train/fp8_utils.py asks accelerate to do."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def wanted(module, name: str) -> bool:
        return name.endswith("base_layer") and module.in_features % 16 == 0 and module.out_features % 16 == 0

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("rowwise"), module_filter_fn=wanted)
    converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    print(f"[first_step] float8: {converted} Linears converted", flush=True)


def child(args) -> dict:
    """One measurement in this process (see the module docstring); returns the seconds of each part."""
    parts: dict = {}
    started = time.perf_counter()
    import peft
    import torch
    import transformers
    from liger_kernel.transformers import apply_liger_kernel_to_qwen2

    parts["import"] = round(time.perf_counter() - started, 3)
    torch.cuda.init()
    _timed(parts, "liger_patch", apply_liger_kernel_to_qwen2)
    model = _timed(parts, "model_load", lambda: transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.bfloat16, device_map="cuda", attn_implementation="sdpa"))  # fmt: skip
    config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    model = _timed(parts, "lora_wrap", lambda: peft.get_peft_model(model, config))
    if args.fp8:
        _timed(parts, "fp8_convert", lambda: _to_float8(model))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.cutoff), generator=generator)
    batch = _timed(parts, "first_batch_to_gpu", lambda: ids.to("cuda", non_blocking=False))
    steps = []
    for _ in range(args.steps):
        step: dict = {}
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = _timed(step, "forward", lambda: model(input_ids=batch, labels=batch))
        _timed(step, "backward", out.loss.backward)
        _timed(step, "optimizer", lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))
        step["total"] = round(sum(step.values()), 3)
        step["loss"] = round(float(out.loss.detach()), 4)
        steps.append(step)
    parts["steps"] = steps
    parts["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    parts["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 3)
    parts["segments_cudamalloc"] = torch.cuda.memory_stats().get("segment.all.allocated")
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    parts["triton_cache_files"] = sum(1 for p in cache.rglob("*") if p.is_file())
    return parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cutoff", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fp8", action="store_true", help="torchao float8 (rowwise) on the frozen base Linears")
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="one child, on the Triton cache in TRITON_CACHE_DIR (unset: a new, empty one)",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.child.write_text(json.dumps(child(args)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    cache = os.environ.get("TRITON_CACHE_DIR") if args.warm_only else None
    env = dict(os.environ, TRITON_CACHE_DIR=cache or tempfile.mkdtemp(prefix="triton-cold-"), PYTHONUNBUFFERED="1")
    report = {"triton_cache_dir": env["TRITON_CACHE_DIR"], "fp8": args.fp8}
    names = ("warm_cache",) if args.warm_only else ("cold_cache", "warm_cache")  # --warm-only: as TRITON_CACHE_DIR is
    for name in names:
        result = args.out / f"first_step_{name}.json"
        started = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--model", str(args.model), "--out", str(args.out),
                        "--cutoff", str(args.cutoff), "--batch", str(args.batch), "--steps", str(args.steps),
                        *(["--fp8"] if args.fp8 else []), "--child", str(result)], env=env, check=True)  # fmt: skip
        report[name] = {"process_wall_s": round(time.perf_counter() - started, 2), **json.loads(result.read_text())}
        print(name, json.dumps(report[name]), flush=True)
    if "cold_cache" in report:
        cold, warm = report["cold_cache"]["steps"][0], report["warm_cache"]["steps"][0]
        parts = ("forward", "backward", "optimizer", "total")
        report["compilation_s"] = {k: round(cold[k] - warm[k], 3) for k in parts}
        print("first step, cold minus warm Triton cache:", report["compilation_s"])
    later = report["warm_cache"]["steps"][1:]
    if later:
        report["steady_tokens_per_s"] = round(args.batch * args.cutoff * len(later) / sum(s["total"] for s in later))
        print("steady tokens/s (steps after the first, warm cache):", report["steady_tokens_per_s"])
    (args.out / f"first_step{'_fp8' if args.fp8 else ''}.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
