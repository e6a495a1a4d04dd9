"""Measure the peak GPU memory of real LoRA runs and compare it with rocmft.render.memfit's estimate.

Run on one GPU (the acceptance target is an NVIDIA H200, ~139.8 GiB usable), from the repository root::

    python bench/memfit.py --out DIR --data ../shared/data

1. builds a random-weight model of Qwen2-7B's shape (hidden 3584, intermediate 18944, 28 layers, 28 heads,
   4 KV heads, vocab 152064, untied embeddings) directly on the GPU in bf16, in a child process (so this
   process never holds a CUDA context), and saves it to DIR/qwen2-7b-random with the tokenizer of rocmft's
   built-in tiny model (its vocabulary is smaller than 152064; the logits follow the model's vocab_size);
2. writes DIR/data/memfit_alpaca.json: LLaMA-Factory's alpaca_en_demo from ``--data``, repeated until it
   holds enough tokens for the largest run (micro-batch × 2048 × steps, with room for packing losses);
3. for each configuration (micro-batch 2 and 8 × gradient checkpointing on and off; LoRA SFT, packing,
   cutoff_len 2048, bf16) runs ``python -m rocmft train`` in a child process configured by environment
   variables only, with a timeout, and reads the worker's ``peak_gpu_memory_gib``
   (``torch.cuda.max_memory_allocated()``) from OUTPUT_DIR/rocmft/worker-result.json; a run that exits
   non-zero with "out of memory" in its log counts as a measured OOM;
4. estimates each run with rocmft.render.memfit from the run's own rendered train.yaml, prints a table and writes
   DIR/memfit.json.

GRADIENT_ACCUMULATION_STEPS=1 keeps the runs short (the gradients are then freed between steps, which memfit
models from the rendered gradient_accumulation_steps). The ``memory-fit`` health check, when present, is
skipped (``--skip-checks`` adds others): the point is to see what really happens. Results on 2026-11-30 are
in rocmft/memfit.py's docstring.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import QWEN2_SHAPES, REPO, clean_environment, random_qwen2

QWEN2_7B = QWEN2_SHAPES["7b"]

MODEL_FOLDER = "qwen2-7b-random"
CUTOFF_LEN = 2048
STEPS = 3
CONFIGS = {  # name -> (micro-batch, gradient checkpointing)
    "mb2-gc": (2, True),
    "mb2-nogc": (2, False),
    "mb8-gc": (8, True),
    "mb8-nogc": (8, False),
}
DEFAULT_USABLE_GIB = 139.8  # one H200, what a process can allocate


def build_model(out: Path, cache: Path) -> None:
    """Child process: random Qwen2-7B-shaped bf16 weights made on the GPU, saved with the tiny tokenizer."""
    import torch

    free, total = torch.cuda.mem_get_info()
    folder = out / MODEL_FOLDER
    started = time.monotonic()
    model = random_qwen2(folder, QWEN2_7B, cache, "cuda")
    params = sum(p.numel() for p in model.parameters())
    record = {"params": params, "device": torch.cuda.get_device_name(), "free_bytes": free, "total_bytes": total,
              "torch": torch.__version__, "build_seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    (out / "device.json").write_text(json.dumps(record, indent=2))
    print(f"[bench] built {folder} ({params / 1e9:.2f}B parameters) in {record['build_seconds']} s", flush=True)


def write_data(out: Path, source: Path, tokenizer_dir: Path, tokens_needed: int) -> tuple[str, int]:
    """Write DIR/data/memfit_alpaca.json (alpaca_en_demo repeated as needed); return (name, its token count)."""
    from transformers import AutoTokenizer

    records = json.loads((source / "alpaca_en_demo.json").read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = ["\n".join(str(r.get(k) or "") for k in ("instruction", "input", "output")) for r in records]
    tokens = sum(len(ids) for ids in tokenizer(text)["input_ids"])
    # packing leaves gaps and drops samples longer than cutoff_len: ask for twice what the runs consume
    repeats = max(1, math.ceil(2 * tokens_needed / max(tokens, 1)))
    folder = out / "data"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memfit_alpaca.json").write_text(json.dumps(records * repeats, ensure_ascii=False))
    print(f"[bench] data: alpaca_en_demo, {len(records)} records, ~{tokens:,} tokens, repeated {repeats}x "
          f"(need ~{tokens_needed:,})", flush=True)  # fmt: skip
    return "memfit_alpaca", tokens * repeats


def run_config(name: str, micro_batch: int, checkpointing: bool, out: Path, data: Path, dataset: str,
               timeout: float, skip: list[str]) -> dict:  # fmt: skip
    """Train one configuration in a child process; return its outcome and measured peak."""
    output = out / "runs" / name
    shutil.rmtree(output, ignore_errors=True)
    env = clean_environment()
    env.update({
        "MODEL_NAME_OR_PATH": str(out / MODEL_FOLDER), "DATASET": dataset, "DATASET_DIR": str(data),
        "TEMPLATE": "qwen", "CUTOFF_LEN": str(CUTOFF_LEN), "PACKING": "true",
        "PER_DEVICE_TRAIN_BATCH_SIZE": str(micro_batch), "GRADIENT_ACCUMULATION_STEPS": "1",
        "DISABLE_GRADIENT_CHECKPOINTING": "false" if checkpointing else "true",
        "MAX_STEPS": str(STEPS), "LOGGING_STEPS": "1", "SAVE_STRATEGY": "no", "PLOT_LOSS": "false",
        "OUTPUT_DIR": str(output), "ROCMFT_PRECISION": "bf16", "ROCMFT_CACHE_DIR": str(out / "cache"),
        "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
    })  # fmt: skip
    if skip:
        env["ROCMFT_SKIP_CHECKS"] = ",".join(skip)
    log_path = out / "runs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("w") as log:
        try:
            code = subprocess.run([sys.executable, "-m", "rocmft", "train"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout, cwd=out).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            code = None
    seconds = round(time.monotonic() - started, 1)
    text = log_path.read_text(errors="replace")
    result_path = output / "rocmft" / "worker-result.json"
    worker = json.loads(result_path.read_text()) if result_path.is_file() else {}
    if code == 0:
        outcome = "ok"
    elif code is None:
        outcome = f"timeout ({timeout:.0f} s)"
    elif "out of memory" in text.lower():
        outcome = "OOM"
    else:
        outcome = f"failed (exit {code})"
    return {"name": name, "micro_batch": micro_batch, "gradient_checkpointing": checkpointing, "outcome": outcome,
            "exit_code": code, "seconds": seconds, "measured_gib": worker.get("peak_gpu_memory_gib"),
            "log": str(log_path), "train_yaml": str(output / "rocmft" / "train.yaml")}  # fmt: skip


def estimate_config(run: dict, model_dir: Path, usable_gib: float) -> dict:
    """memfit's estimate for a run, from its rendered train.yaml (or the same arguments when none was left)."""
    import yaml

    from rocmft.render import memfit

    path = Path(run["train_yaml"])
    if path.is_file():
        arguments = yaml.safe_load(path.read_text())
    else:
        arguments = {"finetuning_type": "lora", "cutoff_len": CUTOFF_LEN, "packing": True,
                     "per_device_train_batch_size": run["micro_batch"],
                     "disable_gradient_checkpointing": not run["gradient_checkpointing"]}  # fmt: skip
    spec = memfit.spec_from_arguments(arguments, compute_dtype="bfloat16", zero_stage=0, offload="none", world_size=1)
    est = memfit.estimate(memfit.read_model_shape(model_dir), spec)
    return {"estimate_gib": round(est.total / memfit.GiB, 2), "fits_predicted": est.fits(int(usable_gib * memfit.GiB)),
            "breakdown_gib": est.breakdown(), "phase": est.phase, "phases_gib": est.details["phases_gib"],
            "summary": est.summary()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="work folder: model, data, runs, memfit.json")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                        help="folder with LLaMA-Factory's alpaca_en_demo.json (default ../shared/data)")  # fmt: skip
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per training run (default 900)")
    usable = "memory a process can allocate (default: free memory seen by the build, else 139.8)"
    parser.add_argument("--usable-gib", type=float, default=None, help=usable)
    parser.add_argument("--rebuild", action="store_true", help="build the model even if DIR already has one")
    parser.add_argument("--skip-checks", default="", help="more ROCMFT_SKIP_CHECKS ids (memory-fit is always skipped)")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    if args.build_only:
        build_model(out, cache)
        return 0

    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    model_dir = out / MODEL_FOLDER
    if args.rebuild or not (model_dir / "config.json").is_file():
        subprocess.run([sys.executable, __file__, "--out", str(out), "--build-only"], check=True)
    device = json.loads((out / "device.json").read_text()) if (out / "device.json").is_file() else {}
    usable_gib = args.usable_gib or round(device.get("free_bytes", DEFAULT_USABLE_GIB * 2**30) / 2**30, 2)

    largest = max(CONFIGS[n][0] for n in names)
    dataset, _ = write_data(out, args.data, model_dir, largest * CUTOFF_LEN * STEPS)
    from rocmft.checks import check_ids

    skip = [c for c in ("memory-fit",) if c in check_ids()] + [c for c in args.skip_checks.split(",") if c]
    results = []
    for name in names:
        micro_batch, checkpointing = CONFIGS[name]
        print(f"[bench] {name}: micro-batch {micro_batch}, checkpointing {'on' if checkpointing else 'off'} ...",
              flush=True)  # fmt: skip
        run = run_config(name, micro_batch, checkpointing, out, out / "data", dataset, args.timeout, skip)
        run.update(estimate_config(run, model_dir, usable_gib))
        measured = run["measured_gib"]
        run["error_pct"] = round(100 * (run["estimate_gib"] - measured) / measured, 1) if measured else None
        results.append(run)
        print(f"[bench] {name}: {run['outcome']} in {run['seconds']} s, measured {measured} GiB, "
              f"estimate {run['estimate_gib']} GiB ({run['summary']})", flush=True)  # fmt: skip

    header = f"{'config':<10} {'estimate GiB':>12} {'measured GiB':>12} {'error %':>8} {'fits predicted':>14}  outcome"
    print(f"\nusable memory {usable_gib} GiB on {device.get('device', 'the GPU')}\n{header}\n{'-' * len(header)}")
    for r in results:
        measured = f"{r['measured_gib']:.2f}" if r["measured_gib"] is not None else "-"
        error = f"{r['error_pct']:+.1f}" if r["error_pct"] is not None else "-"
        fits = "yes" if r["fits_predicted"] else "no"
        print(f"{r['name']:<10} {r['estimate_gib']:>12.2f} {measured:>12} {error:>8} {fits:>14}  {r['outcome']}")
    report = {"device": device, "usable_gib": usable_gib, "model": QWEN2_7B, "cutoff_len": CUTOFF_LEN,
              "steps": STEPS, "runs": results}  # fmt: skip
    (out / "memfit.json").write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out / 'memfit.json'}")
    consistent = all(r["fits_predicted"] == (r["outcome"] == "ok") for r in results if r["outcome"] in ("ok", "OOM"))
    within = all(abs(r["error_pct"]) <= 15 for r in results if r["error_pct"] is not None)
    print(f"estimates within ±15%: {'yes' if within else 'NO'}; fit predictions match outcomes: "
          f"{'yes' if consistent else 'NO'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
