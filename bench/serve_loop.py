"""Time each step of the loop from training to a served, hot-loaded adapter, as a user runs it (issue 19).

Run from the repository root after ``make vllm-ready`` (CPU; the numbers in BENCHMARKS.md come from it)::

    .venv/bin/python bench/serve_loop.py --out DIR

1. ``rocmft train`` on the built-in default (full fine-tune of the tiny model, 240 steps);
2. ``rocmft export`` of it (E0, merged model folder);
3. ``rocmft train`` of LoRA run A (rank 32) on E0, and 4. of run B (rank 16);
5. vLLM started by docker/vllm-serve.py on run A (.venv-vllm), until ``/health`` answers;
6. one greedy chat completion from the adapter (16 tokens);
7. ``rocmft serve --load`` of run B into that server (a child process: load the adapter, ask one prompt).

Prints one JSON object with the seconds of each step (wall clock, child processes as started here), also written
to DIR/serve_loop.json. Exit 0 when every step succeeded, 1 otherwise (the failing step's output is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, clean_environment

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def timed(label: str, command: list[str], env: dict[str, str], cwd: Path, times: dict) -> str:
    """Run ``command``; record its wall seconds under ``label``; exit 1 with its output when it fails."""
    started = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    times[label] = round(time.monotonic() - started, 1)
    if result.returncode != 0:
        print(f"{label} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        raise SystemExit(1)
    return result.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a fresh folder for the runs and the vLLM log")
    args = parser.parse_args()
    out = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    saves = out / "saves"
    env = {**clean_environment(), "ROCMFT_CACHE_DIR": str(out / "cache"), "HF_HUB_OFFLINE": "1",
           "ROCMFT_SAVES_DIR": str(saves), "PYTHONPATH": str(REPO / "entrypoint")}  # fmt: skip
    rocmft = [sys.executable, "-m", "rocmft"]
    times: dict[str, float] = {}
    timed("train_default_s", [*rocmft, "train"], env, out, times)
    timed("export_s", [*rocmft, "export"], env, out, times)
    base = saves / "rocmft-demo-merged"
    from rocmft.config.demo import ensure_demo_data

    data = ensure_demo_data(out / "cache")
    for name, rank, label in (("run-a", 32, "train_lora_a_s"), ("run-b", 16, "train_lora_b_s")):
        lora = {"MODEL_NAME_OR_PATH": str(base), "FINETUNING_TYPE": "lora", "LORA_RANK": str(rank),
                "DATASET": "rocmft_demo", "DATASET_DIR": str(data), "TEMPLATE": "qwen", "MAX_STEPS": "40",
                "OUTPUT_DIR": str(saves / name), "LEARNING_RATE": "0.02"}  # fmt: skip
        timed(label, [*rocmft, "train"], {**env, **lora}, out, times)
    from rocmft.proc import free_port

    port = free_port()
    serve_env = {"PATH": f"{VLLM_PYTHON.parent}:/usr/bin:/bin", "HOME": str(out), "HF_HUB_OFFLINE": "1",
                 "ROCMFT_SERVE_MODEL": str(saves / "run-a"), "ROCMFT_SERVE_PORT": str(port),
                 "ROCMFT_SERVE_ARGS": "--enforce-eager", "VLLM_CPU_KVCACHE_SPACE": "1"}  # fmt: skip
    import httpx

    started = time.monotonic()
    log = (out / "vllm.log").open("w")
    proc = subprocess.Popen([str(VLLM_PYTHON), str(REPO / "docker" / "vllm-serve.py")], env=serve_env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                print(f"vLLM exited with {proc.returncode}; see {out / 'vllm.log'}")
                return 1
            try:
                if httpx.get(f"{url}/health", timeout=5, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        times["vllm_start_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        body = {"model": "run-a", "messages": [{"role": "user", "content": "What is LoRA?"}], "max_tokens": 16,
                "temperature": 0}  # fmt: skip
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300, trust_env=False).json()
        times["first_completion_s"] = round(time.monotonic() - started, 2)
        timed("serve_load_b_s", [*rocmft, "serve", "--load", str(saves / "run-b"), "--url", url], env, out, times)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    report = {"seconds": times, "answer_a": answer["choices"][0]["message"]["content"], "cpus": os.cpu_count()}
    (out / "serve_loop.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
