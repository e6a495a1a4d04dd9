"""Time `rocmft export` of a LoRA run on a model of real shape, then reload the export and run a forward pass.

Run from the repository root (the lead runs ``--shape 7b`` on one H200; ``--shape tiny`` is the CPU check)::

    python bench/export_time.py --shape 7b --out DIR

1. the base: ``7b`` builds random bf16 weights of Qwen2-7B's shape (bench/common.py's QWEN2_SHAPES["7b"]: hidden 3584,
   28 layers, vocab 152064, untied; 7.6B parameters) on the GPU when there is one, and saves them to
   DIR/base with the tiny model's tokenizer; ``tiny`` uses rocmft's built-in tiny Qwen2 model (fp32) as it is;
2. the adapter: peft LoRA (rank 16, alpha 32, all linear layers of the decoder) on that base, with A and B drawn
   from N(0, 0.02²) (a fresh adapter has B = 0, which would merge to nothing), saved to DIR/run;
3. the run folder as ``rocmft train`` leaves it, minimally: the adapter, the tokenizer, rocmft/train.yaml and a
   finished rocmft/manifest.json (marked as made by this script: no training happened);
4. ``python -m rocmft export DIR/run`` in a child process, timed (wall clock, and LLaMA-Factory's part as the
   export manifest records it), into DIR/run-merged;
5. reloads the export with transformers, runs a forward pass on a short sequence and compares its logits with
   base + adapter loaded through peft (max absolute difference; bf16 differs by rounding, fp32 by ~1e-7).

Prints one JSON object (also written to DIR/export_time.json). Exit 0 when the export succeeded and the forward
pass gave finite logits, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import QWEN2_SHAPES, REPO, TOKENIZER_FILES, clean_environment, random_qwen2

LORA_RANK = 16


def build_base(out: Path, shape: str, cache: Path, device: str) -> tuple[Path, int]:
    """The base model folder and its parameter count (see the module docstring, step 1)."""
    from rocmft.config.demo import ensure_tiny_model

    tiny = ensure_tiny_model(cache)
    if shape == "tiny":
        return tiny, _params(tiny)
    folder = out / "base"
    if (folder / "config.json").is_file():
        return folder, _params(folder)
    random_qwen2(folder, QWEN2_SHAPES["7b"], cache, device)  # saved; the model is freed on return
    return folder, _params(folder)


def _params(folder: Path) -> int:
    """Parameters stored in a model folder's safetensors files (read from their headers)."""
    from safetensors import safe_open

    total = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    return total


def make_run(out: Path, base: Path, device: str) -> Path:
    """A finished LoRA run folder with a random adapter on ``base`` (steps 2 and 3)."""
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rocmft import __version__
    from rocmft.config.lfargs import stack_versions
    from rocmft.outputs.manifest import now

    run = out / "run"
    shutil.rmtree(run, ignore_errors=True)
    (run / "rocmft").mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype="auto", device_map=device)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(
        model, LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=targets, init_lora_weights=False)
    )
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.normal_(0.0, 0.02)
    peft_model.save_pretrained(run)
    config = json.loads((run / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(base)
    (run / "adapter_config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, run / name)
    arguments = {
        "model_name_or_path": str(base),
        "stage": "sft",
        "finetuning_type": "lora",
        "lora_rank": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_target": "all",
        "template": "qwen",
        "output_dir": str(run),
        "trust_remote_code": True,
    }
    (run / "rocmft" / "train.yaml").write_text(yaml.safe_dump(arguments, sort_keys=False))
    manifest = {
        "rocmft_version": __version__,
        "status": "finished",
        "exit_code": 0,
        "started_at": now(),
        "arguments": arguments,
        "versions": stack_versions(),
        "note": "made by bench/export_time.py: a random LoRA adapter, no training",
    }
    (run / "rocmft" / "manifest.json").write_text(json.dumps(manifest, indent=2))
    del peft_model, model
    return run


def reload_and_compare(export_dir: Path, base: Path, run: Path, device: str) -> dict:
    """Step 5: load the export, a forward pass, and the same through peft; their logits' difference."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.arange(1, 33).unsqueeze(0).to(device)
    started = time.monotonic()
    merged = AutoModelForCausalLM.from_pretrained(export_dir, dtype="auto", device_map=device).eval()
    reload_s = time.monotonic() - started
    with torch.no_grad():
        logits = merged(input_ids=ids).logits.float()
    dtype = str(next(merged.parameters()).dtype).replace("torch.", "")
    del merged
    if device == "cuda":
        torch.cuda.empty_cache()
    base_model = AutoModelForCausalLM.from_pretrained(base, dtype="auto", device_map=device).eval()
    with torch.no_grad():
        base_logits = base_model(input_ids=ids).logits.float()
        reference = PeftModel.from_pretrained(base_model, str(run)).eval()(input_ids=ids).logits.float()
    del base_model
    return {
        "reload_s": round(reload_s, 1),
        "export_dtype": dtype,
        "forward_finite": bool(torch.isfinite(logits).all()),
        "max_abs_logit_diff_vs_peft": float((logits - reference).abs().max()),
        "max_abs_logit": float(reference.abs().max()),
        "max_abs_logit_change_by_adapter": float((reference - base_logits).abs().max()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=("tiny", "7b"), default="7b")
    parser.add_argument(
        "--out", type=Path, required=True, help="work folder (the 7b base needs ~15 GB, the export ~15 GB)"
    )
    parser.add_argument(
        "--export-device", choices=("cpu", "auto"), help="EXPORT_DEVICE (default: rocmft's: auto on a GPU)"
    )
    args = parser.parse_args()

    import torch

    out = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.monotonic()
    base, params = build_base(out, args.shape, cache, device)
    run = make_run(out, base, device)
    prepare_s = time.monotonic() - started
    if device == "cuda":
        torch.cuda.empty_cache()

    export_dir = out / "run-merged"
    env = {
        **clean_environment(),
        "ROCMFT_CACHE_DIR": str(cache),
        "ROCMFT_SAVES_DIR": str(out),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "entrypoint"), os.environ.get("PYTHONPATH")])),
    }
    if args.export_device:
        env["EXPORT_DEVICE"] = args.export_device
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "rocmft", "export", str(run)],
        cwd=out,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=3600,
    )
    export_s = time.monotonic() - started
    (out / "export.log").write_text(result.stdout)
    report = {
        "shape": args.shape,
        "params": params,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "prepare_s": round(prepare_s, 1),
        "export_exit_code": result.returncode,
        "export_wall_s": round(export_s, 1),
    }
    if result.returncode == 0:
        record = json.loads((export_dir / "rocmft-export.json").read_text())
        report.update(
            export_in_llamafactory_s=record["seconds"],
            export_device=record["device"],
            export_bytes=sum(record["files"].values()),
            files=sorted(record["files"]),
        )
        report.update(reload_and_compare(export_dir, base, run, device))
    else:
        report["export_log_tail"] = result.stdout[-3000:]
    report["versions"] = _versions()
    text = json.dumps(report, indent=2)
    (out / "export_time.json").write_text(text + "\n")
    print(text)
    return 0 if result.returncode == 0 and report.get("forward_finite") else 1


def _versions() -> dict:
    from rocmft.config.lfargs import stack_versions

    return {k: stack_versions()[k] for k in ("llamafactory", "transformers", "peft", "torch")}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
