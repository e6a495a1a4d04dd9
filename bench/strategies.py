"""Train with each distributed strategy through `rocmft train` (environment variables only) and compare.

Run on a host with two GPUs, from the repository root::

    python bench/strategies.py --out DIR --data ../shared/data

1. builds a random-weight model of Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads,
   intermediate 4864, vocab 151936, tied embeddings; Qwen's published config) in bf16 with the tokenizer of
   rocmft's built-in tiny model (a child process, so this one never holds a GPU);
2. LoRA SFT for 20 optimizer steps (same seed, data, micro-batch 4, cutoff 512, learning rate 1e-4) with:
   one GPU (ROCMFT_DISTRIBUTED=none, the scaling baseline), then on two GPUs ``ddp``, ``deepspeed`` ZeRO-2,
   ZeRO-3, ZeRO-3 with optimizer offload, and ``fsdp``;
3. two "nodes" of one GPU each on this host: two ``rocmft train`` processes with NNODES=2 and NODE_RANK 0/1;
4. ``stop-resume`` (asked for by name): ddp on two GPUs for 60 steps, SIGTERM to ``rocmft train`` once
   the trainer has logged step 10, then the same command again: the stop must end both ranks with exit 143
   and a checkpoint at the same step, the second run must resume from it and finish;
5. for each: exit code, the final logged loss, tokens/s (the trainer's num_input_tokens_seen over
   train_runtime, all ranks together), whether the saved adapter loads onto the base model, and which
   rocmft folders each node wrote. Prints a table and writes DIR/strategies.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import QWEN2_SHAPES, REPO, clean_environment, random_qwen2

COMMON = {
    "FINETUNING_TYPE": "lora", "DATASET": "alpaca_en_demo", "TEMPLATE": "qwen", "CUTOFF_LEN": "512",
    "PER_DEVICE_TRAIN_BATCH_SIZE": "4", "GRADIENT_ACCUMULATION_STEPS": "1", "MAX_STEPS": "20",
    "LOGGING_STEPS": "5", "LEARNING_RATE": "1e-4", "SEED": "42", "SAVE_STRATEGY": "no", "REPORT_TO": "none",
    "ROCMFT_PRECISION": "bf16",
}  # fmt: skip
ZERO3 = {"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3"}
RUNS = {  # name -> (visible GPUs, extra environment)
    "1gpu": ("0", {}),
    "ddp": ("0,1", {"ROCMFT_DISTRIBUTED": "ddp"}),
    "zero2": ("0,1", {"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "2"}),
    "zero3": ("0,1", ZERO3),
    "zero3-offload": ("0,1", {**ZERO3, "ROCMFT_OFFLOAD": "optimizer"}),
    "fsdp": ("0,1", {"ROCMFT_DISTRIBUTED": "fsdp"}),
}  # fmt: skip


def build_model(folder: Path, cache: Path) -> None:
    """Child process: random Qwen2-0.5B-shaped bf16 weights made on the GPU, saved with the tiny tokenizer."""
    model = random_qwen2(folder, QWEN2_SHAPES["0.5b"], cache, "cuda")
    print(f"[bench] built {folder}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters", flush=True)


def start(env_extra: dict[str, str], visible: str, output: Path, model: Path, data: Path, log: Path):
    env = clean_environment()
    env.update(COMMON)
    env.update({"MODEL_NAME_OR_PATH": str(model), "DATASET_DIR": str(data), "OUTPUT_DIR": str(output),
                "CUDA_VISIBLE_DEVICES": visible, "HIP_VISIBLE_DEVICES": visible, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    env.update(env_extra)
    handle = log.open("w")
    return subprocess.Popen([sys.executable, "-m", "rocmft", "train"], env=env, stdout=handle,
                            stderr=subprocess.STDOUT, cwd=output.parent), handle  # fmt: skip


def outcome(output: Path, model: Path, code: int, wall: float, log: Path) -> dict:
    """What a run left: final loss, tokens/s, whether its adapter loads, rocmft folders."""
    result = {"exit": code, "wall_s": round(wall, 1), "log": str(log)}
    state_path = output / "trainer_state.json"
    if state_path.is_file():
        history = json.loads(state_path.read_text())["log_history"]
        losses = [h["loss"] for h in history if "loss" in h]
        final = history[-1]
        tokens = max((h.get("num_input_tokens_seen", 0) for h in history), default=0)
        runtime = final.get("train_runtime")
        result.update(final_loss=losses[-1] if losses else None, losses=losses, tokens=tokens,
                      train_runtime_s=runtime, tokens_per_s=round(tokens / runtime) if runtime else None)  # fmt: skip
    result["rocmft_folders"] = sorted(p.name for p in output.glob("rocmft*") if p.is_dir())
    result["adapter_files"] = sorted(p.name for p in output.glob("adapter_*"))
    if (output / "adapter_config.json").is_file():
        try:
            import torch
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
            loaded = PeftModel.from_pretrained(base, output)
            result["adapter_loads"] = sum(p.numel() for n, p in loaded.named_parameters() if "lora_" in n) > 0
        except Exception as err:  # report, do not stop the benchmark
            result["adapter_loads"] = f"{type(err).__name__}: {err}"
    manifest = output / "rocmft" / "manifest.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        result["world_size"] = (data.get("worker") or {}).get("world_size")
        result["numa"] = (data.get("launch") or {}).get("numa", {}).get("reason")
    return result


def _logged_step(output: Path) -> int:
    """The newest step in LLaMA-Factory's trainer_log.jsonl (written by rank 0 at each logging step), 0 before."""
    log = output / "trainer_log.jsonl"
    if not log.is_file():
        return 0
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1]).get("current_steps", 0) if lines else 0


def stop_resume(out: Path, model: Path, data: Path, timeout: float) -> dict:
    """SIGTERM a two-GPU ddp run after step 10, then run it again; what each half did (see the module doc)."""
    output = out / "runs" / "stop-resume"
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    extra = {"ROCMFT_DISTRIBUTED": "ddp", "MAX_STEPS": "60", "LOGGING_STEPS": "1", "SAVE_STRATEGY": "steps",
             "SAVE_STEPS": "1000"}  # fmt: skip
    proc, handle = start(extra, "0,1", output, model, data, out / "stop.log")
    deadline = time.monotonic() + timeout
    while _logged_step(output) < 10 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    signalled_at, step_at_signal = time.monotonic(), _logged_step(output)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = -9
    handle.close()
    result = {"step_at_signal": step_at_signal, "stop_exit": code, "stop_s": round(time.monotonic() - signalled_at, 1),
              "checkpoints": sorted(p.name for p in output.glob("checkpoint-*"))}  # fmt: skip
    worker = output / "rocmft" / "worker-result.json"
    if worker.is_file():
        result["stopped_at_step"] = json.loads(worker.read_text()).get("stopped_at_step")
    started = time.monotonic()
    proc, handle = start(extra, "0,1", output, model, data, out / "resume.log")
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = -9
    handle.close()
    text = (out / "resume.log").read_text(errors="replace")
    result.update(resume=outcome(output, model, code, time.monotonic() - started, out / "resume.log"),
                  resumed_line=next((line for line in text.splitlines() if "resuming from" in line), None))  # fmt: skip
    result["exit"] = 0 if result["stop_exit"] == 143 and code == 0 and result["resumed_line"] else 1
    result["wall_s"] = result["resume"]["wall_s"]
    result["rocmft_folders"] = result["resume"]["rocmft_folders"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--runs", default=",".join([*RUNS, "2nodes"]), help="comma-separated subset")
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    cache, model = out / "cache", out / "qwen2-0.5b-random"
    os.environ.setdefault("ROCMFT_CACHE_DIR", str(cache))
    if args.build_only:
        build_model(model, cache)
        return 0
    if not (model / "config.json").is_file():
        subprocess.run([sys.executable, __file__, "--out", str(out), "--build-only"], check=True)
    results = {}
    for name in args.runs.split(","):
        started = time.monotonic()
        if name == "stop-resume":
            results[name] = stop_resume(out, model, args.data.resolve(), args.timeout)
        elif name == "2nodes":
            output = out / "runs" / name
            shutil.rmtree(output, ignore_errors=True)
            output.mkdir(parents=True)
            nodes = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "ROCMFT_DISTRIBUTED": "ddp",
                     "ROCMFT_NPROC_PER_NODE": "1"}  # fmt: skip
            procs = [start({**nodes, "NODE_RANK": str(r)}, str(r), output, model, args.data.resolve(),
                           out / f"{name}-node{r}.log") for r in (0, 1)]  # fmt: skip
            codes = []
            for proc, handle in procs:
                try:
                    codes.append(proc.wait(timeout=args.timeout))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    codes.append(-9)
                handle.close()
            results[name] = outcome(output, model, max(codes, key=abs), time.monotonic() - started,
                                    out / f"{name}-node0.log")  # fmt: skip
            results[name]["node_exits"] = codes
        else:
            visible, extra = RUNS[name]
            output = out / "runs" / name
            shutil.rmtree(output, ignore_errors=True)
            output.mkdir(parents=True)
            proc, handle = start(extra, visible, output, model, args.data.resolve(), out / f"{name}.log")
            try:
                code = proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = -9
            handle.close()
            results[name] = outcome(output, model, code, time.monotonic() - started, out / f"{name}.log")
        r = results[name]
        print(f"[bench] {name:14s} exit {r['exit']:>3}  loss {r.get('final_loss')}  tok/s {r.get('tokens_per_s')}  "
              f"wall {r['wall_s']} s  adapter loads {r.get('adapter_loads')}  folders {r['rocmft_folders']}",
              flush=True)  # fmt: skip
        (out / "strategies.json").write_text(json.dumps(results, indent=2))
    base = (results.get("1gpu") or {}).get("tokens_per_s")
    ddp = (results.get("ddp") or {}).get("tokens_per_s")
    if base and ddp:
        print(f"[bench] scaling 1 -> 2 GPUs (ddp): {ddp / base:.2f}x", flush=True)
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
