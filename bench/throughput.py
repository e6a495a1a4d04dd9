"""Throughput of rocmft's planned defaults against the stock recipe, on the same data and step count.

Run on one GPU, from the repository root (not a test)::

    python bench/throughput.py --out DIR --data ../shared/data [--shape 7b|1.5b|0.5b|llama3-8b|tiny] [--steps 20]

1. builds a random-weight model of a real shape (Qwen2-7B by default; Qwen2-1.5B, Qwen2-0.5B, Llama-3-8B; ``tiny`` uses
   rocmft's built-in tiny model, for a CPU check of this script) in bf16 with the tokenizer of rocmft's tiny
   model, in a child process;
2. writes LLaMA-Factory's alpaca_en_demo repeated until it holds enough tokens (bench/memfit.py's write_data);
3. (a) **stock**: the recipe users copy from blogs — LoRA all-linear, micro-batch 2 × accumulation 8, no
   packing, gradient checkpointing on (LLaMA-Factory's default), bf16 — through LLaMA-Factory's own
   ``run_exp`` (what ``llamafactory-cli train`` calls) in a child process that records
   ``torch.cuda.max_memory_allocated()``;
   (b) **rocmft**: ``rocmft train`` with the same model, data, cutoff, learning rate, seed and step count and
   nothing else: micro-batch, accumulation, packing, checkpointing, attention and kernels are planned;
   (c) **expert**: what a user who knows LLaMA-Factory sets by hand (:data:`EXPERT`: the planner's 4 × 1
   rows, plain ``packing`` — no block mask, so samples attend to the ones packed before them —, no
   checkpointing, Liger), through ``run_exp`` like (a);
   (e) **peer** (``--runs ...,expert,peer``): Unsloth on the rows (c) packed, in its own PYTHONPATH
   (bench/peer_unsloth.py; ``--peer-pythonpath``); its losses compare with (c)'s step by step;
4. prints, for each run asked for (``--runs``, default all three, in that order): tokens/s (non-padding input tokens
   over the trainer's train_runtime, and the steady rate after the first optimizer step, see :func:`history`), MFU
   of the steady rate, peak memory (measured, and rocmft.render.memfit's prediction), the ratios b/a and b/c;
   compares the loss curves over the same tokens; writes DIR/throughput.json.

FLOPs per token (stated in the output): **model FLOPs** 6·N (PaLM, Chowdhery et al. 2022, appendix B; N =
the weights of every matrix product: the layers' Linears and lm_head, embeddings excluded; the attention term
12·L·d·s is left out: with alpaca's few-hundred-token samples it is under 1% of 6N for these shapes) — the
usual MFU convention, which counts weight gradients LoRA does not compute. **LoRA's own FLOPs**: 4·N (forward
2N + input gradient 2N) + 6·N_lora. With gradient checkpointing the hardware also recomputes the forward:
+2·N (+2·N_lora), reported as HFU. MFU = tokens/s × FLOPs per token / peak; ``--peak-tflops`` defaults to
989 (NVIDIA H200 bf16 dense, NVIDIA's datasheet); use 1307 for an MI300X (AMD's datasheet).

Loss curves: (b) packs many samples per row, so its steps hold more tokens; each of (b)'s logged losses is
compared with (a)'s loss interpolated at the same number of tokens seen, over the tokens both covered. The
tolerance is 3σ of (a)'s own step-to-step noise (σ = std of successive differences / √2: each logged loss is
one batch's mean), at least 1% of the loss: different batches of the same data differ by that much.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, SHAPES, clean_environment, random_qwen2

STOCK = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}  # the blog recipe; GC on, no packing
# What an expert sets by hand in LLaMA-Factory: the planner's 4 x 1 rows, plain packing (no block mask: samples
# attend to the samples packed before them), no checkpointing, Liger (issue 20's configuration (c))
EXPERT = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "packing": True, "neat_packing": False,
          "disable_gradient_checkpointing": True, "enable_liger_kernel": True, "flash_attn": "sdpa"}  # fmt: skip
# (d) fp8: the expert's configuration with LLaMA-Factory 0.9.5's ``fp8: true`` and its torchao backend
# (train/fp8_utils.py: accelerate's AORecipeKwargs, torchao's "rowwise" Float8LinearConfig; embeddings, lm_head and
# Linears whose sides are not multiples of 16 stay bf16, so peft's rank-8 lora_A/lora_B do too)
FP8 = {**EXPERT, "fp8": True, "fp8_backend": "torchao"}
LF_RUNS = {"stock": STOCK, "expert": EXPERT, "fp8": FP8}
H200_BF16_TFLOPS = 989.0
PLANNED_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps", "packing", "neat_packing",
                "disable_gradient_checkpointing", "flash_attn", "enable_liger_kernel")  # fmt: skip


def build_model(folder: Path, shape: str, cache: Path) -> None:
    """Child process: random-weight bf16 model of ``shape`` (on the GPU when there is one), tiny tokenizer."""
    import torch

    model = random_qwen2(folder, SHAPES[shape], cache,
                         "cuda" if torch.cuda.is_available() else "cpu")  # fmt: skip
    print(f"[bench] built {folder}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters", flush=True)


def lf_child(config_path: Path, result_path: Path) -> int:
    """Child process: LLaMA-Factory's run_exp on a YAML (as ``llamafactory-cli train`` does); records the peak."""
    import torch
    import yaml
    from llamafactory.train.tuner import run_exp

    run_exp(yaml.safe_load(config_path.read_text()))
    result = {"peak_gpu_memory_gib": None}
    if torch.cuda.is_available():
        stats = torch.cuda.memory_stats()
        result = {"peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                  "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
                  "alloc_retries": stats.get("num_alloc_retries")}  # fmt: skip
    result_path.write_text(json.dumps(result))
    return 0


def flops_per_token(model_dir: Path, lora_rank: int = 8) -> dict[str, float]:
    """Matrix-product weights N and LoRA weights N_lora (all seven Linears, rank ``lora_rank``) of the model."""
    from rocmft.render import memfit

    shape = memfit.read_model_shape(model_dir)
    n = shape.num_layers * shape.layer_linear_weights + shape.vocab_size * shape.hidden_size
    n_lora = shape.num_layers * sum(lora_rank * (i + o) for i, o, _ in shape.linears().values())
    return {"N": n, "N_lora": n_lora, "model_6N": 6 * n, "lora_4N": 4 * n + 6 * n_lora,
            "recompute_2N": 2 * n + 2 * n_lora}  # fmt: skip


def history(output: Path, warmup_steps: int = 1) -> dict:
    """Losses against tokens seen, total tokens, runtime and tokens/s from the trainer's trainer_state.json.

    ``tokens_per_s`` is over the whole train_runtime; ``steady_tokens_per_s`` leaves out the first
    ``warmup_steps`` optimizer steps (kernel autotuning, Triton compilation of Liger's kernels, the allocator's
    first growth: 6.3 s of rocmft's first step against 0.64 s for each later one, 7B shape, 2026-11-30), from
    the cumulative ``train_runtime`` transformers 5 logs with every step when it counts input tokens. A run of
    hours is at the steady rate; 20 steps of a benchmark are not.
    """
    path = output / "trainer_state.json"
    if not path.is_file():
        return {}
    log = json.loads(path.read_text())["log_history"]
    points = [(h["num_input_tokens_seen"], h["loss"]) for h in log if "loss" in h and "num_input_tokens_seen" in h]
    final = log[-1]
    tokens = max((h.get("num_input_tokens_seen", 0) for h in log), default=0)
    runtime = final.get("train_runtime")
    steps = [(h["num_input_tokens_seen"], float(h["train_runtime"])) for h in log
             if "loss" in h and "num_input_tokens_seen" in h and "train_runtime" in h]  # fmt: skip
    steady = None
    if len(steps) > warmup_steps + 1:
        (t0, r0), (t1, r1) = steps[warmup_steps - 1] if warmup_steps else (0, 0.0), steps[-1]
        steady = (t1 - t0) / (r1 - r0) if r1 > r0 else None
    return {"points": points, "tokens": tokens, "train_runtime_s": runtime,
            "tokens_per_s": tokens / runtime if runtime else None, "steady_tokens_per_s": steady,
            "first_step_s": steps[0][1] if steps else None}  # fmt: skip


def run_lf(name: str, out: Path, model: Path, data: Path, dataset: str, args, gpu: bool) -> dict:
    """Run (a) stock or (c) expert: LLaMA-Factory's own run_exp with :data:`LF_RUNS` ``[name]``."""
    output = out / "runs" / name
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    config = {
        "model_name_or_path": str(model), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_target": "all", "lora_rank": 8, "dataset": dataset, "dataset_dir": str(data), "template": "qwen",
        "cutoff_len": args.cutoff, "max_steps": args.steps, "learning_rate": 1e-4, "lr_scheduler_type": "cosine",
        "warmup_steps": 0.1, "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 42,
        "bf16": gpu, "output_dir": str(output), "overwrite_output_dir": True, "plot_loss": False,
        "preprocessing_num_workers": 4, "dataloader_num_workers": 2, "overwrite_cache": True,
        "include_num_input_tokens_seen": "non_padding", "disable_tqdm": True, **LF_RUNS[name],
    }  # fmt: skip
    if name == "expert" and "peer" in args.runs.split(","):  # (e) trains on these very rows: LF saves them here
        shutil.rmtree(out / "rows-expert", ignore_errors=True)
        config["tokenized_path"] = str(out / "rows-expert")
    config_path = out / f"{name}.yaml"
    import yaml

    config_path.write_text(yaml.safe_dump(config))
    env = clean_environment()
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": args.gpu,
                "HIP_VISIBLE_DEVICES": args.gpu, "TRITON_CACHE_DIR": _fresh_triton_cache(out, name)})  # fmt: skip
    result_path = out / f"{name}-result.json"
    result_path.unlink(missing_ok=True)
    started = time.monotonic()
    code = _run([sys.executable, __file__, "--lf-child", str(config_path), "--result", str(result_path)], env,
                out / f"{name}.log", args.timeout, out)  # fmt: skip
    result = {"exit": code, "wall_s": round(time.monotonic() - started, 1), **history(output), "config": config}
    if result_path.is_file():
        result.update(json.loads(result_path.read_text()))
    result["predicted_gib"] = _predict(model, config, "bfloat16" if gpu else "float32", plain_lf=True)
    return result


def _fresh_triton_cache(out: Path, name: str) -> str:
    """An empty Triton cache for one run: every run compiles its kernels (Liger's) as on a fresh machine, whatever
    ran before it. With one shared cache (~/.triton) the first run paid for the others: rocmft, run first, took
    4.91 s for its first step against 1.55 s on a warm cache (one H200, 2026-12-05, BENCHMARKS.md)."""
    folder = out / "triton-cache" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return str(folder)


def run_rocmft(out: Path, model: Path, data: Path, dataset: str, args) -> dict:
    output = out / "runs" / "rocmft"
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    env = clean_environment()
    env.update({
        "MODEL_NAME_OR_PATH": str(model), "DATASET": dataset, "DATASET_DIR": str(data), "TEMPLATE": "qwen",
        "CUTOFF_LEN": str(args.cutoff), "MAX_STEPS": str(args.steps), "LEARNING_RATE": "1e-4", "SEED": "42",
        "LOGGING_STEPS": "1", "SAVE_STRATEGY": "no", "PLOT_LOSS": "false", "OUTPUT_DIR": str(output),
        "ROCMFT_CACHE_DIR": str(out / "cache"), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": args.gpu, "HIP_VISIBLE_DEVICES": args.gpu,
        "TRITON_CACHE_DIR": _fresh_triton_cache(out, "rocmft"),
    })  # fmt: skip
    user = dict(args.rocmft_env)
    env.update(user)
    started = time.monotonic()
    code = _run([sys.executable, "-m", "rocmft", "train"], env, out / "rocmft.log", args.timeout, out)
    result = {"exit": code, "wall_s": round(time.monotonic() - started, 1), **history(output), "user_values": user}
    run_dir = output / "rocmft"
    if (run_dir / "worker-result.json").is_file():
        worker = json.loads((run_dir / "worker-result.json").read_text())
        result["peak_gpu_memory_gib"] = worker.get("peak_gpu_memory_gib")
        result["attention"] = worker.get("attention")
        result["quantization"] = worker.get("quantization")
    if (run_dir / "manifest.json").is_file():
        manifest = json.loads((run_dir / "manifest.json").read_text())
        plan = manifest.get("plan") or {}
        result["plan"] = {c["name"]: c["value"] for c in plan.get("choices", [])}
        result["plan_note"] = plan.get("note")
        result["timings_s"] = manifest.get("timings_s")
        arguments = manifest.get("arguments") or {}
        result["config"] = {k: arguments[k] for k in PLANNED_KEYS if k in arguments}
        dtype = (manifest.get("precision") or {}).get("compute_dtype", "bfloat16")
        result["predicted_gib"] = plan.get("estimate_gib") or _predict(model, arguments, dtype)
    return result


def run_peer(out: Path, model: Path, args) -> dict:
    """Run (e): Unsloth (bench/peer_unsloth.py) on run (c)'s packed rows, with ``--peer-pythonpath`` (Unsloth's
    wheels) ahead of this process's PYTHONPATH; the same step count, learning rate, seed and a fresh Triton cache."""
    output = out / "runs" / "peer"
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    env = clean_environment()
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": args.gpu,
                "HIP_VISIBLE_DEVICES": args.gpu, "TRITON_CACHE_DIR": _fresh_triton_cache(out, "peer"),
                "UNSLOTH_DISABLE_STATISTICS": "1", "UNSLOTH_ENABLE_LOGGING": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (args.peer_pythonpath, env.get("PYTHONPATH")) if p),
                })  # fmt: skip
    result_path = out / "peer-result.json"
    result_path.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).with_name("peer_unsloth.py")), "--model", str(model), "--rows",
               str(out / "rows-expert"), "--output", str(output), "--result", str(result_path), "--steps",
               str(args.steps), "--cutoff", str(args.cutoff)]  # fmt: skip
    started = time.monotonic()
    code = _run(command, env, out / "peer.log", args.timeout, out)
    result = {"exit": code, "wall_s": round(time.monotonic() - started, 1), **history(output),
              "config": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "packing": True,
                         "disable_gradient_checkpointing": True, "kernels": "unsloth"}}  # fmt: skip
    if result_path.is_file():
        result.update(json.loads(result_path.read_text()))
    return result


def _predict(model: Path, arguments: dict, dtype: str, plain_lf: bool = False) -> float | None:
    """memfit's peak for a run; ``plain_lf``: LLaMA-Factory's own run_exp (peft's input casts in effect)."""
    from rocmft.render import memfit

    spec = memfit.spec_from_arguments(arguments, compute_dtype=dtype, zero_stage=0, peft_casts_inputs=plain_lf)
    return round(memfit.estimate(memfit.read_model_shape(model), spec).total / memfit.GiB, 2)


def _run(command: list[str], env: dict[str, str], log: Path, timeout: float, cwd: Path) -> int | None:
    with log.open("w") as handle:
        try:
            return subprocess.run(command, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout,
                                  cwd=cwd).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return None


def _ratios(report: dict, b: dict, other: dict, letter: str, name: str, digits: int, lead: str = "") -> None:
    """rocmft's tokens/s over ``other``'s (whole runs and steady) into ``report`` (``ratio_b_over_<letter>``,
    ``steady_ratio_b_over_<letter>``), printed on one line."""
    if not (other.get("tokens_per_s") and b.get("tokens_per_s")):
        return
    report[f"ratio_b_over_{letter}"] = round(b["tokens_per_s"] / other["tokens_per_s"], digits)
    line = f"{lead}ratio rocmft / {name} tokens/s: {report[f'ratio_b_over_{letter}']}x over the whole runs"
    if other.get("steady_tokens_per_s") and b.get("steady_tokens_per_s"):
        report[f"steady_ratio_b_over_{letter}"] = round(b["steady_tokens_per_s"] / other["steady_tokens_per_s"], digits)
        line += f", {report[f'steady_ratio_b_over_{letter}']}x steady"
    print(line)


def compare_losses(stock: list, planned: list) -> dict:
    """(b)'s losses against (a)'s interpolated at the same tokens seen (see the module docstring)."""
    if len(stock) < 3 or not planned:
        return {"compared": 0, "note": "too few logged losses"}
    diffs = [b[1] - a[1] for a, b in itertools.pairwise(stock)]
    sigma = statistics.pstdev(diffs) / math.sqrt(2)
    pairs = []
    for tokens, loss in planned:
        if stock[0][0] <= tokens <= stock[-1][0]:
            for (t0, l0), (t1, l1) in itertools.pairwise(stock):
                if t0 <= tokens <= t1:
                    ref = l0 + (l1 - l0) * ((tokens - t0) / (t1 - t0) if t1 > t0 else 0)
                    pairs.append((tokens, loss, ref))
                    break
    if not pairs:
        return {"compared": 0, "sigma": sigma, "note": "no logged loss of (b) inside (a)'s token range"}
    worst = max(abs(loss - ref) for _, loss, ref in pairs)
    tolerance = max(3 * sigma, 0.01 * statistics.mean(ref for *_, ref in pairs))
    return {"compared": len(pairs), "max_abs_diff": round(worst, 4), "sigma": round(sigma, 4),
            "tolerance": round(tolerance, 4), "agree": worst <= tolerance,
            "pairs": [(t, round(x, 4), round(r, 4)) for t, x, r in pairs]}  # fmt: skip


def _same_batches(report: dict, name: str, expert: dict, other: dict) -> None:
    """Run ``name`` ((d) fp8 or (e) peer) against (c) expert: the same packed rows in the same order, so the losses
    compare step by step (each step's loss is the mean over that step's label tokens in both)."""
    diffs = [abs(f[1] - e[1]) for e, f in zip(expert["points"], other["points"], strict=False)]
    tokens_equal = [e[0] == f[0] for e, f in zip(expert["points"], other["points"], strict=False)]
    report[f"{name}_against_expert"] = {
        "steps": len(diffs), "max_abs_loss_diff": round(max(diffs), 4) if diffs else None,
        "same_tokens_each_step": all(tokens_equal),
        "last_loss": {"expert": expert["points"][-1][1], name: other["points"][-1][1]},
        "steady_ratio": round(other["steady_tokens_per_s"] / expert["steady_tokens_per_s"], 3)
        if other.get("steady_tokens_per_s") and expert.get("steady_tokens_per_s") else None,
    }  # fmt: skip
    print(f"{name} / expert: {report[f'{name}_against_expert']}")


def _print_losses(results: dict) -> None:
    """Each run's logged loss per optimizer step (the mean over that step's label tokens) and tokens seen."""
    runs = [n for n, r in results.items() if r.get("points")]
    if not runs:
        return
    print("\nloss per step (tokens seen):")
    print("step " + " ".join(f"{n:>22}" for n in runs))
    for step in range(max(len(results[n]["points"]) for n in runs)):
        cells = []
        for n in runs:
            points = results[n]["points"]
            cells.append(f"{points[step][1]:>10.4f} ({points[step][0]:>9})" if step < len(points) else " " * 22)
        print(f"{step + 1:>4} " + " ".join(cells))


# What both runs must share for the comparison to mean anything; --rocmft-env may not change them.
FIXED = ("MODEL_NAME_OR_PATH", "DATASET", "DATASET_DIR", "TEMPLATE", "CUTOFF_LEN", "MAX_STEPS", "LEARNING_RATE",
         "SEED", "LOGGING_STEPS", "OUTPUT_DIR", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")  # fmt: skip


def user_value(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` for --rocmft-env, checked when the arguments are parsed, before any run."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    if name in FIXED:
        raise argparse.ArgumentTypeError(f"{name} is fixed by the benchmark (both runs share it); use its own option")
    return name, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="work folder: model, data, runs, throughput.json")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--shape", choices=[*SHAPES, "tiny"], default="7b")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps of each run (default 20)")
    parser.add_argument("--cutoff", type=int, default=None, help="cutoff_len (default 2048; tiny: 128)")
    parser.add_argument(
        "--runs",
        default="stock,rocmft,expert",
        help="comma-separated: stock, rocmft, expert, fp8, peer (peer after expert: its rows)",
    )
    parser.add_argument(
        "--peer-pythonpath",
        default="",
        help="folder with Unsloth's wheels installed (--target), put first on the peer's PYTHONPATH",
    )
    parser.add_argument("--gpu", default="0", help="the one GPU both runs use (CUDA/HIP_VISIBLE_DEVICES; default 0)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_TFLOPS)
    parser.add_argument(
        "--rocmft-env",
        action="append",
        default=[],
        type=user_value,
        metavar="NAME=VALUE",
        help="a user value for run (b), e.g. FLASH_ATTN=sdpa (the planner keeps it); repeatable",
    )
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lf-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.lf_child:
        return lf_child(args.lf_child, args.result)
    if args.out is None:
        parser.error("--out is required")
    args.cutoff = args.cutoff or (128 if args.shape == "tiny" else 2048)
    names = args.runs.split(",")
    if "peer" in names and ("expert" not in names or names.index("expert") > names.index("peer")):
        parser.error("--runs: peer trains on the rows run expert packs; name expert before peer")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    os.environ["ROCMFT_CACHE_DIR"] = str(cache)
    model = out / f"random-{args.shape}"
    if args.build_only:
        build_model(model, args.shape, cache)
        return 0
    if args.shape == "tiny":
        from rocmft.config.demo import ensure_tiny_model

        model = ensure_tiny_model(cache)
    elif not (model / "config.json").is_file():
        subprocess.run([sys.executable, __file__, "--out", str(out), "--shape", args.shape, "--build-only"],
                       check=True)  # fmt: skip
    from memfit import write_data

    dataset, _ = write_data(out, args.data.resolve(), model, args.steps * 16 * args.cutoff)
    data = out / "data"
    (data / "dataset_info.json").write_text(json.dumps({dataset: {"file_name": f"{dataset}.json"}}))
    import torch

    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else "cpu"
    results = {}
    for name in args.runs.split(","):
        if name in LF_RUNS:
            print(f"[bench] {name}: LLaMA-Factory with {LF_RUNS[name]}, {args.steps} steps ...", flush=True)
            results[name] = run_lf(name, out, model, data, dataset, args, gpu)
        elif name == "peer":
            print(f"[bench] peer: Unsloth on the expert's packed rows, {args.steps} steps ...", flush=True)
            results[name] = run_peer(out, model, args)
        elif name == "rocmft":
            print(f"[bench] rocmft train with planned defaults, {args.steps} steps ...", flush=True)
            results[name] = run_rocmft(out, model, data, dataset, args)
        else:
            parser.error(f"--runs: {name!r} is not one of stock, rocmft, expert, fp8, peer")

    flops = flops_per_token(model)
    print(f"\n{device}; model {args.shape} (N = {flops['N'] / 1e9:.2f}B matmul weights); cutoff {args.cutoff}; "
          f"{args.steps} steps; peak {args.peak_tflops} TFLOPS")  # fmt: skip
    print("FLOPs/token: model 6N; LoRA's own 4N + 6N_lora; recomputation (checkpointing) adds 2N + 2N_lora (HFU)")
    print("tokens/s: whole train_runtime; steady: after the first optimizer step (MFU/HFU are of the steady rate)")
    header = (f"{'run':<7} {'exit':>4} {'tokens/s':>9} {'steady':>7} {'MFU 6N':>7} {'MFU LoRA':>8} {'HFU':>6} "
              f"{'peak GiB':>8} {'predicted':>9} {'error':>7}  configuration")  # fmt: skip
    print(header + "\n" + "-" * len(header))
    for name, r in results.items():
        tps, steady = r.get("tokens_per_s"), r.get("steady_tokens_per_s")
        rate = steady or tps
        cfg = r.get("config") or {}
        gc = not cfg.get("disable_gradient_checkpointing", False)
        row = {}
        if rate and gpu:
            peak = args.peak_tflops * 1e12
            row["mfu_6N"] = rate * flops["model_6N"] / peak
            row["mfu_lora"] = rate * flops["lora_4N"] / peak
            row["hfu"] = rate * (flops["lora_4N"] + (flops["recompute_2N"] if gc else 0)) / peak
        measured, predicted = r.get("peak_gpu_memory_gib"), r.get("predicted_gib")
        if measured and predicted:
            row["memory_error_pct"] = round(100 * (predicted - measured) / measured, 1)
        r.update(row)
        summary = ", ".join(f"{k}={v}" for k, v in cfg.items() if k in PLANNED_KEYS)
        if r.get("user_values"):
            summary += f" (user values {r['user_values']})"
        mfu, mfu_lora, hfu = (f"{100 * row[k]:.1f}%" if k in row else "-" for k in ("mfu_6N", "mfu_lora", "hfu"))
        error = f"{row['memory_error_pct']:+.1f}%" if "memory_error_pct" in row else "-"
        print(f"{name:<7} {r['exit']!s:>4} {tps or 0:>9.0f} {steady or 0:>7.0f} {mfu:>7} {mfu_lora:>8} {hfu:>6} "
              f"{measured or '-'!s:>8} {predicted or '-'!s:>9} {error:>7}  {summary}")  # fmt: skip
    a, b, x = results.get("stock", {}), results.get("rocmft", {}), results.get("expert", {})
    report = {"device": device, "shape": args.shape, "steps": args.steps, "cutoff_len": args.cutoff,
              "peak_tflops": args.peak_tflops, "flops_per_token": flops, "runs": results}  # fmt: skip
    _ratios(report, b, a, "a", "stock", 2, lead="\n")
    _ratios(report, b, x, "c", "expert", 3)
    _ratios(report, b, results.get("peer", {}), "e", "peer (Unsloth)", 3)
    if b.get("attention"):
        print(f"rocmft's attention on packed rows: {b['attention']}")
    if b.get("quantization"):
        print(f"rocmft's quantized base (worker record): {b['quantization']}")
    if a.get("points") and b.get("points"):
        report["loss_comparison"] = compare_losses(a["points"], b["points"])
        c = report["loss_comparison"]
        print(f"loss curves over the same tokens: {c.get('compared')} points, max |diff| {c.get('max_abs_diff')}, "
              f"tolerance {c.get('tolerance')} (3σ of the stock run's step noise, σ={c.get('sigma')}): "
              f"{'agree' if c.get('agree') else 'DISAGREE' if c.get('compared') else c.get('note')}")  # fmt: skip
    _print_losses(results)
    for name in ("fp8", "peer"):
        if x.get("points") and results.get(name, {}).get("points"):
            _same_batches(report, name, x, results[name])
    if b.get("timings_s"):
        print(f"rocmft's own steps (manifest timings_s): {b['timings_s']}")
    (out / "throughput.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out / 'throughput.json'}")
    return 0 if all(r.get("exit") == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
