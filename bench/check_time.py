"""Wall time of the whole `rocmft check` and the all-reduce bus bandwidth it measures.

Run from the repository root on the GPU host (every visible GPU takes part)::

    python bench/check_time.py --out DIR [--repeat 3]

Each repetition runs ``python -m rocmft check`` on the built-in default in a fresh process (imports, GPU
probes, LLaMA-Factory's parser, every check) and reads the breakdown it prints and the collectives check's bus
bandwidth from checks.json. The bandwidth is also given as a fraction of the GPU link's published peak per
direction: NVIDIA H200 NVLink 4, 900 GB/s bidirectional per GPU (H200 product brief) -> 450 GB/s; AMD MI300X,
7 Infinity Fabric links x 64 GB/s per direction (AMD CDNA 3 white paper) -> 448 GB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

PEAK_GBPS = {"H200": 450.0, "H100": 450.0, "MI300X": 448.0, "MI325X": 448.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(args.repeat):
        output = args.out / f"check-{i}"
        env = {**os.environ, "OUTPUT_DIR": str(output), "ROCMFT_CACHE_DIR": str(args.out / "cache")}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "rocmft", "check"], env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        (args.out / f"check-{i}.log").write_text(proc.stdout + proc.stderr)
        breakdown = re.search(r"checks passed in [\d.]+ s \((.*)\)", proc.stdout)
        row = {
            "exit": proc.returncode,
            "wall_s": round(wall, 2),
            "breakdown": breakdown.group(1) if breakdown else None,
        }
        parser_import = re.search(r"accepted the configuration \(its import ([\d.]+) s", proc.stdout)
        row["parser_lf_import_s"] = float(parser_import.group(1)) if parser_import else None
        report = output / "rocmft" / "checks.json"
        if report.is_file():
            checks = {c["id"]: c for c in json.loads(report.read_text())["checks"]}
            row["collectives"] = checks.get("collectives", {}).get("value")
            row["slowest_checks"] = sorted(((c["seconds"], k) for k, c in checks.items()), reverse=True)[:3]
        rows.append(row)
        print(f"[bench] run {i}: exit {row['exit']}, wall {row['wall_s']} s; {row['breakdown']}; the parser's "
              f"LLaMA-Factory import {row['parser_lf_import_s']} s; {row.get('collectives')}", flush=True)  # fmt: skip
    probe = json.loads((args.out / "check-0" / "rocmft" / "checks.json").read_text()) if rows else {}
    name = next((c["message"] for c in probe.get("checks", []) if c["id"] == "gpu-runtime"), "")
    peak = next((v for k, v in PEAK_GBPS.items() if k in name), None)
    busbw = [float(m.group(1)) for r in rows if (m := re.match(r"([\d.]+) GB/s", r.get("collectives") or ""))]
    summary = {"runs": rows, "gpu": name, "peak_gbps_per_direction": peak}
    if busbw and peak:
        summary["busbw_fraction_of_peak"] = round(max(busbw) / peak, 3)
        print(f"[bench] bus bandwidth {max(busbw):.1f} GB/s = {max(busbw) / peak:.0%} of {peak:.0f} GB/s", flush=True)
    (args.out / "check_time.json").write_text(json.dumps(summary, indent=2))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
