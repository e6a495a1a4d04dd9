"""What rocmft prints, and its exit code, before and after a change: the README's outputs on the built-in default and
a sample of refusals (issue 29: "behaviour otherwise unchanged ... except where several findings now print together").

    .venv/bin/python bench/behaviour_diff.py --old /path/to/old/entrypoint --new entrypoint --out /tmp/behaviour-diff

Each case runs once with each entrypoint folder, in a fresh working folder at the same absolute path
(``/tmp/bd/<case>``: the old run, the folder deleted, then the new run), so that paths in messages compare equal.
Only what varies from run to run is normalised (timings, dates, pids, temporary staging folders). Writes
``OUT/old/<case>.txt``, ``OUT/new/<case>.txt`` (exit code, then stdout and stderr together) and ``OUT/summary.md``
(a table of the cases, and the unified diff of each case that differs). Needs no GPU: HF_HUB_OFFLINE=1, the built-in
tiny model and demo data made in ROCMFT_CACHE_DIR (default /tmp/bd-cache) on first use.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SHARED_DATA = HERE.parent / "shared" / "data"
SECRET = "hf_behaviourdiffsecret0123456789"


@dataclass
class Case:
    """One run: ``env`` over a minimal environment, ``args`` after ``rocmft``; ``files`` are written into the case
    folder first. ``{case}`` (the case folder), ``{model}`` (the built-in tiny model), ``{data}`` (a copy of the
    shared demo data in the case folder) are filled in; ``model_copy`` copies the tiny model to ``{case}/model``."""

    env: dict[str, str]
    args: list[str] = field(default_factory=lambda: ["render"])
    files: dict[str, str] = field(default_factory=dict)
    output_dir: bool = True  # OUTPUT_DIR={case}/out unless the case sets its own
    model_copy: bool = False
    note: str = ""


DEFAULTS: dict[str, Case] = {
    # The README's commands on the built-in default, nothing set (outputs under ./saves in the case folder).
    "default-render": Case({}, ["render"], output_dir=False),
    "default-plan": Case({}, ["plan"], output_dir=False),
    "default-check": Case({}, ["check"], output_dir=False),
}

YAMLS = {"my.yaml": "cutoff_len: 64\n", "bf16.yaml": "bf16: true\n", "other.yaml": "cutoff_len: 32\n",
         "bad.yaml": "cutoff_len: [1\n", "list.yaml": "- a\n", "typo.yaml": "learning_rte: 1\n",
         "notes.txt": "cutoff_len: 64\n", "default-qwen.yaml": "finetuning_type: lora\nlora_dropout: 5\n"}  # fmt: skip
DS_LR = json.dumps({"optimizer": {"params": {"lr": 3e-5}}})

REFUSALS: dict[str, Case] = {
    # settings: names and types (environment)
    "env-unknown-var": Case({"LEARNING_RTE": "1"}),
    "env-bad-float": Case({"LEARNING_RATE": "abc"}),
    "env-renamed": Case({"LORA_R": "8"}),
    "env-bad-precision": Case({"ROCMFT_PRECISION": "fp8"}),
    # inputs phase
    "bf16-and-fp16": Case({"BF16": "true", "FP16": "true"}),
    "yaml-bf16-env-fp16": Case({"ROCMFT_CONFIG": "{case}/bf16.yaml", "FP16": "1"}, files=YAMLS),
    "precision-contradicts": Case({"ROCMFT_PRECISION": "fp32", "BF16": "true"}),
    "ddp-zero3": Case({"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_ZERO_STAGE": "3"}),
    "zero-no-deepspeed": Case({"ROCMFT_ZERO_STAGE": "2"}),
    "fsdp-8bit": Case({"ROCMFT_DISTRIBUTED": "fsdp", "QUANTIZATION_BIT": "8"}),
    "deepspeed-two-configs": Case({"ROCMFT_DISTRIBUTED": "deepspeed", "DEEPSPEED": "{case}/ds.json"},
                                  files={"ds.json": "{}"}),
    "allocator-disagree": Case({"PYTORCH_ALLOC_CONF": "expandable_segments:True",
                                "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:False"}),
    # rendered phase
    "cutoff-999999": Case({"CUTOFF_LEN": "999999"}),
    "cutoff-negative": Case({"CUTOFF_LEN": "-3"}),
    "lora-rank-zero": Case({"LORA_RANK": "0"}),
    "template-quoted": Case({"TEMPLATE": '"qwen"'}),
    "template-unknown": Case({"TEMPLATE": "not_a_template"}),
    "template-llama3": Case({"TEMPLATE": "llama3"}),
    "lora-dropout-5": Case({"LORA_DROPOUT": "5"}),
    "warmup-both": Case({"WARMUP_STEPS": "10", "WARMUP_RATIO": "0.1"}),
    "full-with-lora-rank": Case({"FINETUNING_TYPE": "full", "LORA_RANK": "8"}),
    "epochs-zero": Case({"NUM_TRAIN_EPOCHS": "0"}),
    "lora-target-none": Case({"LORA_TARGET": "q_proj,query_key_value"}),
    "user-ds-lr": Case({"DEEPSPEED": "{case}/ds.json", "LEARNING_RATE": "1e-4"}, files={"ds.json": DS_LR}),
    "output-in-model": Case({"MODEL_NAME_OR_PATH": "{case}/model", "OUTPUT_DIR": "{case}/model/out"},
                            model_copy=True),
    "output-is-file": Case({"OUTPUT_DIR": "{data}/identity.json"}),
    "dataset-is-model": Case({"DATASET": "{model}"}),
    "dataset-dir-file": Case({"DATASET_DIR": "{data}/identity.json"}),
    "dpo-on-sft-data": Case({"STAGE": "dpo", "DATASET": "alpaca_en_demo", "DATASET_DIR": "{data}"}),
    "sft-on-pairwise": Case({"STAGE": "sft", "DATASET": "dpo_en_demo", "DATASET_DIR": "{data}"}),
    "interleave-length": Case({"DATASET": "alpaca_en_demo,identity", "DATASET_DIR": "{data}",
                               "MIX_STRATEGY": "interleave_under", "INTERLEAVE_PROBS": "0.5,0.3,0.2"}),
    "spaced-value": Case({"DATASET": "alpaca_en_demo ", "DATASET_DIR": "{data}"}),
    # launch phase
    "world-size": Case({"WORLD_SIZE": "5"}),
    "node-rank": Case({"NNODES": "2", "NODE_RANK": "3"}),
    # command line and YAML files (the refusals of tests/test_cli_config.py, with render)
    "cl-typo": Case({}, ["render", "learning_rte=5e-5"]),
    "cl-renamed": Case({}, ["render", "lora_r=8"]),
    "cl-eval-strategy": Case({}, ["render", "evaluation_strategy=steps"]),
    "cl-rocmft-setting": Case({}, ["render", "precision=fp32"]),
    "cl-bad-float": Case({}, ["render", "learning_rate=abc"]),
    "cl-list-for-float": Case({}, ["render", "num_train_epochs=[1,2]"]),
    "cl-no-equals": Case({}, ["render", "max_steps=2", "bf16"]),
    "cl-empty-key": Case({}, ["render", "=5e-5"]),
    "cl-empty-value": Case({}, ["render", "learning_rate="]),
    "cl-omegaconf": Case({}, ["render", "lora_target=[q_proj,"]),
    "cl-secret": Case({}, ["render", f"hf_token={SECRET}"]),
    "cl-missing-yaml": Case({}, ["render", "missing.yaml"]),
    "cl-not-yaml-name": Case({}, ["render", "notes.txt", "max_steps=2"], files=YAMLS),
    "cl-bad-yaml": Case({}, ["render", "bad.yaml"], files=YAMLS),
    "cl-list-yaml": Case({}, ["render", "list.yaml"], files=YAMLS),
    "cl-typo-yaml": Case({}, ["render", "typo.yaml"], files=YAMLS),
    "cl-yaml-second": Case({}, ["render", "max_steps=2", "my.yaml"], files=YAMLS),
    "cl-two-yamls": Case({"ROCMFT_CONFIG": "{case}/other.yaml"}, ["render", "my.yaml"], files=YAMLS),
    "cl-yaml-bf16-fp16": Case({}, ["render", "bf16.yaml", "fp16=true"], files=YAMLS),
    "cl-yaml-cutoff": Case({}, ["render", "my.yaml", "cutoff_len=999999"], files=YAMLS),
    "config-default-name": Case({"ROCMFT_CONFIG": "{case}/default-qwen.yaml"}, files=YAMLS),
    "cl-default-name": Case({}, ["render", "default-qwen.yaml"], files=YAMLS),
    "cl-yaml-bf16-cpu": Case({}, ["render", "bf16.yaml"], files=YAMLS),
    "env-bf16-cpu": Case({"BF16": "true"}),
    # several independent mistakes at once (the new code may print them together)
    "multi-settings": Case({"LEARNING_RTE": "1", "LORA_DROPOUT": "abc", "LORA_R": "8"}),
    "multi-inputs": Case({"BF16": "true", "FP16": "true", "ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_ZERO_STAGE": "3"}),
    "multi-rendered": Case({"LORA_DROPOUT": "5", "WARMUP_STEPS": "10", "WARMUP_RATIO": "0.1",
                            "TEMPLATE": '"qwen"'}),
    "multi-yaml-cl": Case({"CUTOFF_LEN": "999999"}, ["render", "bf16.yaml", "fp16=true", "lora_dropout=5"],
                          files=YAMLS),
}  # fmt: skip


def normalise(text: str) -> str:
    """Only what varies from run to run: timings, dates, pids, temporary folder names, free memory."""
    text = re.sub(r"\b20\d\d-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:?\d\d)?", "<DATE>", text)
    text = re.sub(r"\b\d+(\.\d+)? ?(s|ms|min)\b", r"<T>\2", text)
    text = re.sub(r"\bpid \d+", "pid <N>", text)
    text = re.sub(r"\b(tmp|\.staging|\.tmp|\.rocmft-)[A-Za-z0-9_.-]{6,}", r"\1<RND>", text)
    text = re.sub(r"\d+(\.\d+)? GiB free", "<N> GiB free", text)
    text = re.sub(r"\(settings [0-9.]+, device probe [^)]*\)", "(<timings>)", text)
    text = re.sub(r"\d+(\.\d+)?(it/s|s/it)\b", r"<N>\2", text)
    return text


def run_one(name: str, case: Case, entrypoint: Path, cache: Path, work: Path, timeout: float) -> tuple[int, str, float]:
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    data = folder / "data"
    data.mkdir()
    for f in SHARED_DATA.glob("*.json"):
        shutil.copy(f, data / f.name)
    model = cache / "tiny-qwen2-v2"
    if case.model_copy:
        shutil.copytree(model, folder / "model")

    def fill(text: str) -> str:
        return text.replace("{case}", str(folder)).replace("{model}", str(model)).replace("{data}", str(data))

    for fname, content in case.files.items():
        (folder / fname).write_text(fill(content))
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "USER") if k in os.environ}
    env.update({"HF_HUB_OFFLINE": "1", "ROCMFT_CACHE_DIR": str(cache), "PYTHONPATH": str(entrypoint),
                "PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
    if case.output_dir:
        env["OUTPUT_DIR"] = str(folder / "out")
    env.update({k: fill(v) for k, v in case.env.items()})
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "rocmft", *[fill(a) for a in case.args]], cwd=folder, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout)  # fmt: skip
        rc, out = proc.returncode, proc.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired as e:
        rc, out = -1, (e.stdout or b"").decode("utf-8", "replace") + f"\n<timed out after {timeout:.0f} s>\n"
    took = time.monotonic() - start
    shutil.rmtree(folder, ignore_errors=True)
    return rc, normalise(out), took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the old checkout's entrypoint folder")
    ap.add_argument("--new", type=Path, required=True, help="the new checkout's entrypoint folder")
    ap.add_argument("--out", type=Path, required=True, help="where old/, new/ and summary.md go")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bd"), help="the case folders' parent (same for both)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/bd-cache"), help="ROCMFT_CACHE_DIR")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (each case's two runs in turn)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--only", nargs="*", help="case ids to run (default: all)")
    ap.add_argument("--summary-only", action="store_true", help="run nothing; rewrite summary.md from OUT's captures")
    args = ap.parse_args()
    old, new = args.old.resolve(), args.new.resolve()
    for d in ("old", "new"):
        (args.out / d).mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    cases = {**DEFAULTS, **REFUSALS}
    if args.only:
        cases = {k: v for k, v in cases.items() if k in args.only}
    if args.summary_only:
        cases = {}
    results: dict[str, tuple[int, int, str, str]] = {}

    def both(name: str) -> None:
        case = cases[name]
        rc_old, out_old, t_old = run_one(name, case, old, args.cache, args.work, args.timeout)
        rc_new, out_new, t_new = run_one(name, case, new, args.cache, args.work, args.timeout)
        for d, rc, out in (("old", rc_old, out_old), ("new", rc_new, out_new)):
            (args.out / d / f"{name}.txt").write_text(f"exit {rc}\n{out}")
        results[name] = (rc_old, rc_new, out_old, out_new)
        same = "same" if (rc_old, out_old) == (rc_new, out_new) else "DIFFERS"
        print(f"{name}: old {rc_old} ({t_old:.0f} s), new {rc_new} ({t_new:.0f} s): {same}", flush=True)

    # A warm-up, not recorded: the first use of the cache makes the tiny model and the demo data (and prints so),
    # which is not a difference between the checkouts.
    if cases and not (args.cache / "tiny-qwen2-v2").is_dir():
        rc, _, _ = run_one("warm-up", DEFAULTS["default-render"], old, args.cache, args.work, args.timeout)
        print(f"warm-up (makes the cache): exit {rc}", flush=True)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(both, list(cases)))

    # The summary covers every case with both captures in OUT (a run with --only refreshes some of them).
    rows, diffs = [], []
    for name in {**DEFAULTS, **REFUSALS}:
        paths = [args.out / d / f"{name}.txt" for d in ("old", "new")]
        if not all(p.is_file() for p in paths):
            continue
        a, b = (normalise(p.read_text()) for p in paths)  # normalise() is idempotent
        for p, text in zip(paths, (a, b), strict=True):
            p.write_text(text)
        rc_old, rc_new = (t.split("\n", 1)[0].removeprefix("exit ") for t in (a, b))
        same = a == b
        rows.append(f"| {name} | {rc_old} | {rc_new} | {'yes' if same else 'no'} |")
        if not same:
            diff = "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), f"old/{name}.txt",
                                                f"new/{name}.txt"))  # fmt: skip
            diffs.append(f"### {name}\n\n```diff\n{diff}```\n")
    n_same = sum(r.endswith("| yes |") for r in rows)
    summary = [
        "# Behaviour before and after",
        "",
        f"old: `{old}`  ",
        f"new: `{new}`  ",
        f"{len(rows)} cases: {n_same} identical, {len(rows) - n_same} differ. Normalised: timings, dates, pids, "
        "temporary folder names.",
        "",
        "| case | old exit | new exit | identical |",
        "|---|---|---|---|",
        *rows,
        "",
        "## Differences",
        "",
        *(diffs or ["none"]),
    ]
    (args.out / "summary.md").write_text("\n".join(summary) + "\n")
    print(f"{len(rows)} cases, {n_same} identical; {args.out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
