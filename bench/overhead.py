"""rocmft's own overhead before the model loads, against the import any LLaMA-Factory run pays (not a test).

Run from the repository root (CPU is enough)::

    python bench/overhead.py --out DIR --data ../shared/data [--repeat 3]

Each repetition runs ``rocmft train`` in a fresh process for one optimizer step of LoRA SFT of rocmft's tiny
model on alpaca_en_demo (cutoff 512) and reads the manifest's ``timings_s``: ``settings``, ``render`` (with the
planner) and ``checks`` are rocmft's own work; ``device probe`` and ``validate`` are waits for imports that run in
child processes from the start (torch in the device probe; LLaMA-Factory in the parser's process, which then
becomes the worker of a one-process run); ``train`` is model load, the step and the save. The baseline is
``python -c "import llamafactory.hparams; from llamafactory.train.tuner import run_exp"`` in a fresh process.
The first repetition builds the tiny model and the vocabulary cache if they are missing. Writes
DIR/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, clean_environment

OWN = ("settings", "render", "checks")
WAITS = ("device probe", "validate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("ROCMFT_CACHE_DIR") or out / "cache")
    sys.path.insert(0, str(REPO / "entrypoint"))
    from rocmft.config.demo import ensure_tiny_model

    model = ensure_tiny_model(cache)
    rows = []
    for index in range(args.repeat):
        env = clean_environment()
        env.update({"MODEL_NAME_OR_PATH": str(model), "DATASET_DIR": str(args.data.resolve()),
                    "DATASET": "alpaca_en_demo", "CUTOFF_LEN": "512", "FINETUNING_TYPE": "lora", "MAX_STEPS": "1",
                    "OUTPUT_DIR": str(out / f"run{index}"), "ROCMFT_CACHE_DIR": str(cache),
                    "HF_HUB_OFFLINE": "1"})  # fmt: skip
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "rocmft", "train"], env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        (out / f"run{index}.log").write_text(proc.stdout + proc.stderr)
        manifest = json.loads((out / f"run{index}" / "rocmft" / "manifest.json").read_text())
        timings = manifest["timings_s"]
        row = {"exit": proc.returncode, "wall_s": round(wall, 2), **timings,
               "own_s": round(sum(timings.get(k, 0) for k in OWN), 2),
               "to_worker_s": round(sum(timings.get(k, 0) for k in OWN + WAITS), 2),
               "worker_reused": "the worker is the process that validated" in proc.stdout}  # fmt: skip
        rows.append(row)
        print(f"[bench] run {index}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    baseline = []
    for _ in range(args.repeat):
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", "import llamafactory.hparams; from llamafactory.train.tuner import "
                        "run_exp"], check=True, capture_output=True)  # fmt: skip
        baseline.append(round(time.monotonic() - started, 2))
    print(f"[bench] importing LLaMA-Factory alone (fresh process): {baseline} s", flush=True)
    (out / "overhead.json").write_text(json.dumps({"runs": rows, "llamafactory_import_s": baseline}, indent=2))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
