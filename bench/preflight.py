"""The performance preflight on this machine's GPUs: the perf probe's figures as JSON, then the gpu-perf verdict.

    PYTHONPATH=entrypoint python bench/preflight.py [--repeat N] [--budget-s S]

Runs ``python -m rocmft.facts.probe perf`` (the child process ``rocmft check`` runs: each visible GPU's bf16 GEMM
TFLOPS and device-memory copy bandwidth, about 1 s per GPU) N times (default 3, to see the spread between runs),
prints each result as one JSON line, then the gpu-perf check's verdict on the last one, and for each GPU model found
its table row (rocmft.facts.perf.MODELS) with the measured share of peak: the figures to write into the row's
``gemm_share``/``copy_share`` and ``measured`` after a calibration run. ``--budget-s`` measures in-process instead,
with another per-GPU budget (to see whether 1 s is long enough for a steady figure). Exit 0 when gpu-perf passes,
1 otherwise (warn, fail, skip).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of the probe (default 3)")
    parser.add_argument("--budget-s", type=float, default=None, help="measure in this process with this per-GPU budget")
    args = parser.parse_args()

    from rocmft.checks import CheckSubject
    from rocmft.checks.perf import gpu_perf
    from rocmft.facts import perf
    from rocmft.facts.device import run_probe
    from rocmft.facts.probes import Probes

    results = []
    for run in range(max(args.repeat, 1)):
        started = time.monotonic()
        if args.budget_s is not None:
            result = perf.measure(args.budget_s)
        else:
            result = run_probe(["perf"], perf.PERF_TIMEOUT_BASE_S + perf.PERF_TIMEOUT_PER_GPU_S * 16)
        print(json.dumps({"run": run, "wall_s": round(time.monotonic() - started, 1), "perf": result}), flush=True)
        results.append(result)
    last = results[-1]
    devices = {"gpus": [{"index": g.get("index"), "name": g.get("name")} for g in last.get("gpus") or []]}
    settings = SimpleNamespace(rocmft=SimpleNamespace(on_slow_node="warn"), environ=dict(os.environ))
    subject = CheckSubject(plan=SimpleNamespace(settings=settings), probes=Probes(injected={"devices": devices,
                                                                                          "perf": last}))  # fmt: skip
    outcome = gpu_perf(subject)
    verdict = {"status": outcome.status, "value": outcome.value, "message": outcome.message, "remedy": outcome.remedy}
    print(json.dumps({"gpu-perf": verdict}))
    for name in sorted({g["name"] for r in results for g in r.get("gpus") or [] if "error" not in g}):
        model = perf.model_of(name)
        runs = [g for r in results for g in r.get("gpus") or [] if g.get("name") == name and "error" not in g]
        tflops, gbps = [g["gemm_tflops"] for g in runs], [g["copy_gbps"] for g in runs]
        row = {"name": name, "row": model.label if model else None, "tflops": [min(tflops), max(tflops)],
               "gbps": [min(gbps), max(gbps)]}  # fmt: skip
        if model:
            row.update(share_of_peak_tflops=round(min(tflops) / model.peak_tflops, 3),
                       share_of_peak_gbps=round(min(gbps) / model.peak_gbps, 3),
                       table_shares=[model.gemm_share, model.copy_share])  # fmt: skip
        print(json.dumps({"model": row}))
    return 0 if outcome.status == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
