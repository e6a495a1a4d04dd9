"""Where a profiled window's GPU waited, and what the host was doing meanwhile (issue 32; bench code, not rocmft).

Reads a Chrome trace that ``torch.profiler`` wrote with ``with_stack=True`` (bench/stepprobe with
``BENCH_STEPPROBE_GAPS=1``) and returns:

* ``gpu_busy_us`` / ``gpu_idle_us``: the union of the GPU's kernels, copies and memsets over the window (first to
  last GPU event), and the time none ran; ``gaps``: how many idle stretches of at least ``min_gap_us``;
* ``idle_by_frame_us``: idle time charged to each Python frame on the host's main thread while the GPU was idle
  (sampled every ``sample_us``; a frame is charged for every sample where it is on the stack, so a caller's total
  includes its callees'), the largest first; ``idle_by_leaf_us``: the same charged to the innermost frame only;
* ``syncs``: the CUDA runtime calls that wait for the GPU (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, device-to-host ``cudaMemcpy``) by the Python stack that made them (its three innermost
  frames), with count and time.

Only Python frames whose file is not torch's own ``nn/modules`` are kept in a stack (they would fill it with
``Module._call_impl``). Usage: ``python3 bench/stepprobe/gaps.py TRACE.json[.gz]`` prints the JSON.
"""

from __future__ import annotations

import gzip
import heapq
import itertools
import json
import sys
from collections import defaultdict

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpyAsync")  # fmt: skip
NOISE = ("torch/nn/modules/module.py", "<built-in", "threading.py")


def load(path: str) -> list[dict]:
    """The ``traceEvents`` of a Chrome trace file (gzip when its name ends in .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """The merged (start, end) µs intervals during which any GPU event ran, in order."""
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in GPU_CATS)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _frames(events: list[dict]) -> dict:
    """Python-function events by (pid, tid), sorted by start, as (start, end, name)."""
    by_thread: dict = defaultdict(list)
    for e in events:
        if e.get("cat") == "python_function" and not any(n in e.get("name", "") for n in NOISE):
            by_thread[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    for frames in by_thread.values():
        frames.sort(key=lambda f: (f[0], -f[1]))
    return by_thread


def stacks_at(frames: list[tuple[float, float, str]], times: list[float]) -> list[list[str]]:
    """The stack (outermost first) of nested ``frames`` (sorted by start) at each of ``times`` (ascending)."""
    out, stack, i = [], [], 0
    for t in times:
        while i < len(frames) and frames[i][0] <= t:
            while stack and stack[-1][1] < frames[i][0]:
                stack.pop()
            stack.append(frames[i])
            i += 1
        while stack and stack[-1][1] < t:
            stack.pop()
        out.append([f[2] for f in stack if f[1] >= t])
    return out


def analyze(events: list[dict], min_gap_us: float = 5.0, sample_us: float = 10.0, top: int = 40) -> dict:
    """The summary in the module docstring, from a trace's events."""
    busy = busy_intervals(events)
    if not busy:
        return {"error": "no GPU events in the trace"}
    gaps = [(a[1], b[0]) for a, b in itertools.pairwise(busy) if b[0] - a[1] >= min_gap_us]
    by_thread = _frames(events)
    main = max(by_thread, key=lambda k: len(by_thread[k])) if by_thread else None
    samples = [g0 + k * sample_us for g0, g1 in gaps for k in range(int((g1 - g0) // sample_us))]
    inclusive: dict[str, float] = defaultdict(float)
    leaf: dict[str, float] = defaultdict(float)
    if main is not None:
        for stack in stacks_at(by_thread[main], samples):
            for name in set(stack):
                inclusive[name] += sample_us
            leaf[stack[-1] if stack else "(no Python frame)"] += sample_us
    syncs: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    calls = sorted((e["ts"], e.get("dur", 0), e["name"]) for e in events
                   if e.get("cat") == "cuda_runtime" and e.get("name") in SYNC_NAMES
                   and (e["name"] != "cudaMemcpyAsync" or e.get("dur", 0) > 20))  # fmt: skip
    if main is not None and calls:
        stacks = stacks_at(by_thread[main], [c[0] for c in calls])
        for (_ts, dur, name), stack in zip(calls, stacks, strict=True):
            key = f"{name} <- " + " <- ".join(reversed(stack[-3:]))
            syncs[key][0] += 1
            syncs[key][1] += dur
    span = busy[-1][1] - busy[0][0]
    busy_us = sum(b - a for a, b in busy)

    def ranked(table: dict) -> list:
        return [[k, round(v)] for k, v in heapq.nlargest(top, table.items(), key=lambda kv: kv[1])]

    return {"window_us": round(span), "gpu_busy_us": round(busy_us), "gpu_idle_us": round(span - busy_us),
            "gaps": len(gaps), "gaps_over_1ms": sum(1 for a, b in gaps if b - a >= 1000),
            "idle_in_gaps_over_1ms_us": round(sum(b - a for a, b in gaps if b - a >= 1000)),
            "idle_by_frame_us": ranked(inclusive), "idle_by_leaf_us": ranked(leaf),
            "syncs": sorted(([k, v[0], round(v[1])] for k, v in syncs.items()), key=lambda r: -r[2])[:top]}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(analyze(load(sys.argv[1])), indent=1))
