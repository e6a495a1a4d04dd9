"""Where rocmft's steady step loses to Unsloth's, in one GPU call (issue 32; not a test).

Run from the repository root on one GPU, the stack installed as docs/gpu-testing.md says and Unsloth's wheels in
their own folder (BENCHMARKS.md, "The fourth column")::

    python3 bench/steady_probe.py --out OUT --work /tmp/sp --data .devshared/data --peer-pythonpath /tmp/usite

``--parts`` (default all: ``loss,peer,addmm,compiled``; one call has 600 s, so split them over two if need be):

1. ``loss``: bench/loss_kernels.py at rocmft's step shape (the loss alone, four ways: torch, Liger,
   cut_cross_entropy, Unsloth's), with the peer's wheels on the path;
2. rocmft's plain run (bench/throughput.py ``--runs rocmft``; ``peer``: ``--runs rocmft,expert,peer``) with
   bench/stepprobe on the path, profiling rocmft's training process (and Unsloth's) over optimizer steps ``--at``
   and ``--at`` + 1; it runs whenever a variant does, as the variant's baseline in the same call;
3. each variant (:data:`VARIANTS`): ``--runs rocmft`` again on the same model with one bench/stepprobe switch:
   ``addmm`` (LoRA's product added by one ``addmm``, as Unsloth does), ``compiled`` (``torch.compile`` of each
   decoder layer, regional compilation), profiled the same way;
4. prints, and writes to OUT/steady_probe.json: each run's steady tokens/s (throughput.py's, over steps 2..20) and
   over steps 2..at-1 (before the profiled window, from the trainer's cumulative ``train_runtime``), the window's
   GPU time by kernel group and its top kernels, rocmft/peer, and each variant's largest loss difference from the
   plain run's (the same rows in the same order: step by step) and its steady ratio. OUT also gets the profile
   tables (profile-NAME.txt) and the log (steady_probe.log); the runs' own folders stay in WORK.

Exit 0 when every step ran; otherwise 1 (each step's exit code is in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "stepprobe"))
import gaps  # noqa: E402  (bench/stepprobe/gaps.py, beside this script)

# The processes bench/stepprobe probes: rocmft's parser child, which becomes the worker on one GPU
# (rocmft.validate.child), or a worker started afresh when it cannot (rocmft.launch.run); Unsloth's run (e).
PROBES = "rocmft=rocmft.validate.child,rocmft=-m rocmft.worker,peer=peer_unsloth.py"
# rocmft's run with one direction each (bench/stepprobe): each decoder layer compiled; LoRA's product by addmm
VARIANTS = {"compiled": {"BENCH_STEPPROBE_COMPILE": "layers"}, "addmm": {"BENCH_STEPPROBE_LORA": "addmm"}}


def steady_before(run_dir: Path, last_step: int) -> float | None:
    """Tokens/s over optimizer steps 2..``last_step`` from RUN_DIR/trainer_state.json (transformers logs the
    cumulative ``train_runtime`` and ``num_input_tokens_seen`` with every step when it counts input tokens)."""
    path = run_dir / "trainer_state.json"
    if not path.is_file():
        return None
    log = json.loads(path.read_text())["log_history"]
    steps = [(h["num_input_tokens_seen"], h["train_runtime"]) for h in log
             if "loss" in h and "num_input_tokens_seen" in h and "train_runtime" in h]  # fmt: skip
    if len(steps) < last_step:
        return None
    (t0, r0), (t1, r1) = steps[0], steps[last_step - 1]
    return round((t1 - t0) / (r1 - r0), 1) if r1 > r0 else None


def _run(name: str, command: list[str], env: dict, log: Path) -> int:
    print(f"[steady_probe] {name}: {' '.join(command)}", flush=True)
    with log.open("a") as handle:
        code = subprocess.run(command, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    print(f"[steady_probe] {name}: exit {code}", flush=True)
    return code


def _steps(args, out: Path, work: Path, log: Path) -> dict[str, int]:
    """Steps 1-3 of the module docstring (as ``--parts`` asks); their exit codes by name."""
    base_path = os.environ.get("PYTHONPATH", "")
    probe_env = dict(os.environ, BENCH_STEPPROBE=PROBES, BENCH_STEPPROBE_GAPS="1" if args.gaps else "0",
                     BENCH_STEPPROBE_AT=str(args.at), PYTHONPATH=os.pathsep.join(
                         p for p in (str(BENCH / "stepprobe"), base_path) if p))  # fmt: skip
    common = ["--data", str(args.data.resolve()), "--shape", args.shape, "--steps", str(args.steps),
              "--timeout", str(args.timeout)]  # fmt: skip
    throughput, parts, codes = [sys.executable, str(BENCH / "throughput.py")], args.parts.split(","), {}
    if "loss" in parts:
        peer_path = os.pathsep.join(p for p in (args.peer_pythonpath, base_path) if p)
        codes["loss_kernels"] = _run("loss", [sys.executable, str(BENCH / "loss_kernels.py"), "--out", str(out)],
                                     dict(os.environ, PYTHONPATH=peer_path), log)  # fmt: skip
    plain = work / "plain"
    if "peer" in parts or set(parts) & set(VARIANTS):  # rocmft's plain run: every variant's baseline
        peer = ["--runs", "rocmft,expert,peer", "--peer-pythonpath", args.peer_pythonpath] if "peer" in parts else []
        codes["plain"] = _run("plain", [*throughput, "--out", str(plain), *common, *(peer or ["--runs", "rocmft"])],
                              {**probe_env, "BENCH_STEPPROBE_DIR": str(work / "profiles-plain")}, log)  # fmt: skip
    for part, extra in VARIANTS.items():
        if part not in parts:
            continue
        folder, model = work / part, f"random-{args.shape}"
        folder.mkdir(parents=True, exist_ok=True)
        if (plain / model).is_dir() and not (folder / model).exists():
            (folder / model).symlink_to(plain / model)  # the same weights, not built again
        env = {**probe_env, "BENCH_STEPPROBE_DIR": str(work / f"profiles-{part}"), **extra}
        codes[part] = _run(part, [*throughput, "--out", str(folder), *common, "--runs", "rocmft"], env, log)
    return codes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the report and profile tables")
    parser.add_argument("--work", type=Path, required=True, help="the runs' folders (model, data, outputs)")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--peer-pythonpath", required=True)
    parser.add_argument("--shape", default="7b")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--at", type=int, default=16, help="the first profiled optimizer step (1-based)")
    parser.add_argument("--timeout", type=float, default=200)
    parser.add_argument("--parts", default="loss,peer,addmm,compiled", help="what to run (600 s a call: split)")
    parser.add_argument(
        "--gaps",
        action="store_true",
        help="also record Python frames and report where the GPU waited (bench/stepprobe/gaps.py)",
    )
    args = parser.parse_args(argv)
    if not 3 <= args.at < args.steps:
        parser.error(f"--at {args.at}: give a step in 3..{args.steps - 1} (two steps before it are the steady ones)")
    unknown = set(args.parts.split(",")) - {"loss", "peer", *VARIANTS}
    if unknown:
        parser.error(
            f"--parts {args.parts}: {', '.join(sorted(unknown))} is not one of loss, peer, {', '.join(VARIANTS)}"
        )
    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "steady_probe.log"
    codes = _steps(args, out, work, log)
    report = {"exit": codes, "at": args.at, "runs": {}}
    folders = [("", work / "plain", ("rocmft", "expert", "peer"))]
    for label, folder, names in folders + [(f"-{part}", work / part, ("rocmft",)) for part in VARIANTS]:
        path = folder / "throughput.json"
        throughput = json.loads(path.read_text()) if path.is_file() else {}
        report.setdefault("device", throughput.get("device"))
        for name in names:
            run = (throughput.get("runs") or {}).get(name, {})
            entry = {"steady_tokens_per_s": run.get("steady_tokens_per_s"), "points": run.get("points"),
                     "steady_before_profile": steady_before(folder / "runs" / name, args.at - 1),
                     "peak_gpu_memory_gib": run.get("peak_gpu_memory_gib")}  # fmt: skip
            profile = work / f"profiles{label or '-plain'}" / f"profile-{name}.json"
            if profile.is_file():
                entry["profile"] = json.loads(profile.read_text())
                shutil.copy2(profile.with_suffix(".txt"), out / f"profile-{name}{label}.txt")
            trace = profile.with_name(f"trace-{name}.json.gz")
            if trace.is_file():  # the trace stays in WORK (tens of MB); its summary goes in the report
                entry["gaps"] = gaps.analyze(gaps.load(str(trace)))
            report["runs"][name + label] = entry
    if (out / "loss_kernels.json").is_file():
        report["loss_kernels"] = json.loads((out / "loss_kernels.json").read_text())
    _summarize(report)
    (out / "steady_probe.json").write_text(json.dumps(report, indent=1))
    return 0 if not any(codes.values()) else 1


def _ratio(a: dict, b: dict, key: str) -> float | None:
    return round(a[key] / b[key], 3) if a.get(key) and b.get(key) else None


def _summarize(report: dict) -> None:
    """Print the table of step 4 (module docstring) and add the ratios and the variants' loss differences."""
    runs = report["runs"]
    print(f"\n{report.get('device')}: steady tokens/s (steps 2..20; before the profiled window), profiled window")
    for name, run in runs.items():
        profile = run.get("profile") or {}
        groups = ", ".join(f"{k} {v / 1e3:.0f} ms" for k, v in (profile.get("by_group_us") or {}).items())
        print(
            f"{name:<16} {run.get('steady_tokens_per_s') or 0:>9.0f} {run.get('steady_before_profile') or 0:>9.0f}"
            f"  window {profile.get('window_s')} s, GPU {(profile.get('gpu_us_total') or 0) / 1e3:.0f} ms: {groups}"
        )
        for kernel, us in (profile.get("top_kernels_us") or [])[:8]:
            print(f"{'':<18}{us / 1e3:>8.1f} ms  {kernel[:110]}")
        idle = run.get("gaps") or {}
        if idle.get("gpu_busy_us"):
            long_ms = idle["idle_in_gaps_over_1ms_us"] / 1e3
            print(
                f"{'':<18}GPU busy {idle['gpu_busy_us'] / 1e3:.1f} ms, idle {idle['gpu_idle_us'] / 1e3:.1f} ms in "
                f"{idle['gaps']} gaps ({idle['gaps_over_1ms']} over 1 ms: {long_ms:.1f} ms)"
            )
            for frame, us in idle["idle_by_frame_us"][:25]:
                print(f"{'':<20}idle {us / 1e3:>7.2f} ms under {frame[:120]}")
            for call, count, us in idle["syncs"][:12]:
                print(f"{'':<20}sync x{count} {us / 1e3:>7.2f} ms {call[:160]}")
    b, e = runs.get("rocmft", {}), runs.get("peer", {})
    for key in ("steady_tokens_per_s", "steady_before_profile"):
        if _ratio(b, e, key):
            report[f"rocmft_over_peer_{key}"] = _ratio(b, e, key)
            print(f"rocmft / peer ({key}): {report[f'rocmft_over_peer_{key}']}")
    for part in VARIANTS:
        c = runs.get(f"rocmft-{part}", {})
        if b.get("points") and c.get("points"):  # the same rows in the same order: step by step
            pairs = list(zip(b["points"], c["points"], strict=False))
            same = all(x[0] == y[0] for x, y in pairs)
            diff = round(max(abs(x[1] - y[1]) for x, y in pairs), 4)
            report[f"{part}_against_plain"] = {"same_tokens": same, "max_abs_loss_diff": diff,
                                               "steady_ratio": _ratio(c, b, "steady_before_profile")}  # fmt: skip
            print(f"rocmft {part} against plain, step by step: {report[f'{part}_against_plain']}")
    for name, row in ((report.get("loss_kernels") or {}).get("ways") or {}).items():
        print(f"loss {name:<8} {json.dumps(row)}")


if __name__ == "__main__":
    raise SystemExit(main())
