"""rocmft's own overhead: the time its steps take before LLaMA-Factory loads the model (not a test).

Run from the repository root (CPU is enough)::

    python bench/overhead.py --out DIR --data ../shared/data [--repeat 3]

Runs the steps of ``rocmft check`` in this process, the way rocmft.cli._prepare and _run_checks do, each
timed with time.perf_counter, for a LoRA SFT of rocmft's tiny model on alpaca_en_demo:

* ``import``: importing LLaMA-Factory and transformers (the first settings load pays it; the training
  process pays the same import again, so it is reported apart from rocmft's own work);
* ``settings``: reading and typing the environment (pydantic-settings over LLaMA-Factory's dataclasses);
* ``render``: templates, data set registry, precision, the planner;
* ``planner (7B shape, H200)``: rocmft.planner alone for a Qwen2-7B config against an injected 139.8 GiB GPU
  (on a CPU the planner is inactive, so its memory search is timed separately: every memfit estimate it tries);
* ``validate``: LLaMA-Factory's parser in a child process (started first, as the CLI does);
* ``checks``: the health checks that run on a CPU (the GPU checks skip; the GPU probes are excluded).

The first round includes one-time costs (imports, the tiny model's build, the validator's start); the next
rounds are what a restart costs. Writes DIR/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from common import REPO

QWEN2_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "tie_word_embeddings": False}  # fmt: skip


def one_round(out: Path, data: Path, index: int) -> dict[str, float]:
    """One pass over rocmft's steps; returns seconds per step."""
    from rocmft.validate import start_validator

    timings: dict[str, float] = {}
    start_validator()  # as the CLI: the parser's child imports LLaMA-Factory while the settings load
    started = time.perf_counter()
    import llamafactory.hparams  # noqa: F401  (what the settings step imports to discover the arguments)

    timings["import"] = time.perf_counter() - started

    from rocmft import planner
    from rocmft.checks import run_checks
    from rocmft.demo import ensure_tiny_model
    from rocmft.device import DeviceFacts
    from rocmft.render import render
    from rocmft.settings import load_settings
    from rocmft.validate import validate

    cache = out / "cache"
    model = ensure_tiny_model(cache)
    environ = {"MODEL_NAME_OR_PATH": str(model), "DATASET": "alpaca_en_demo", "DATASET_DIR": str(data),
               "TEMPLATE": "qwen", "OUTPUT_DIR": str(out / f"run-{index}"), "ROCMFT_CACHE_DIR": str(cache)}  # fmt: skip
    started = time.perf_counter()
    settings = load_settings(environ)
    timings["settings"] = time.perf_counter() - started

    staging = Path(tempfile.mkdtemp(prefix="overhead-", dir=out))
    started = time.perf_counter()
    plan = render(settings, DeviceFacts(backend="cpu"), lambda _output_dir: staging)
    timings["render"] = time.perf_counter() - started

    big = out / "qwen2-7b-config"
    big.mkdir(exist_ok=True)
    (big / "config.json").write_text(json.dumps(QWEN2_7B))
    h200 = DeviceFacts(backend="cuda", count=1, archs=["sm_90"], memory_gib=[139.8], bf16=True)
    arguments = {**plan.arguments, "model_name_or_path": str(big)}
    started = time.perf_counter()
    planner.plan_defaults(arguments, set(), h200, compute_dtype="bfloat16", liger_available=False)
    timings["planner (7B shape, H200)"] = time.perf_counter() - started

    started = time.perf_counter()
    validate(plan)
    timings["validate"] = time.perf_counter() - started

    started = time.perf_counter()
    run_checks(plan, [])
    timings["checks"] = time.perf_counter() - started
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in [k for k in os.environ if k.upper().startswith("ROCMFT_")]:
        os.environ.pop(name)
    rounds = [one_round(out, args.data.resolve(), i) for i in range(args.repeat)]
    steps = list(rounds[0])
    own = [s for s in steps if s not in ("import", "planner (7B shape, H200)")]
    print(f"{'step':<26} " + " ".join(f"{'round ' + str(i + 1):>9}" for i in range(len(rounds))))
    for step in steps:
        print(f"{step:<26} " + " ".join(f"{r[step]:>8.2f}s" for r in rounds))
    totals = [sum(r[s] for s in own) for r in rounds]
    print(f"{'rocmft own (no import)':<26} " + " ".join(f"{t:>8.2f}s" for t in totals))
    later = totals[1:] or totals
    print(f"\nrocmft's own steps (settings, render, validate, checks; imports, model load and GPU probes excluded): "
          f"first {totals[0]:.2f} s, then median {statistics.median(later):.2f} s")  # fmt: skip
    (out / "overhead.json").write_text(json.dumps({"rounds": rounds, "own_totals_s": totals}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
