"""What was alive at a process's peak of allocated GPU memory, from a snapshot of bench/memsnap (not a test).

Usage: ``python bench/peak_breakdown.py SNAPSHOT.pickle [--top 40] [--json OUT.json]``

Replays the allocator's trace (``device_traces``: ``alloc`` adds a block, ``free_requested`` — the moment
``torch.cuda.memory_allocated()`` drops — removes it; PyTorch's "Understanding CUDA Memory Usage" page describes
the format), finds the moment the allocated bytes peaked, and groups the blocks alive then by the innermost
stack frame outside torch's own modules (the library line that asked for the memory: transformers, peft,
liger_kernel, ...). Prints each group's GiB and block count, the peak and the frames at the peak's allocation.
"""

from __future__ import annotations

import argparse
import collections
import json
import pickle
from pathlib import Path

GiB = 2**30
_TORCH_INTERNAL = ("/torch/", "<frozen", "/contextlib.py", "/functools.py", "/accelerate/utils/operations.py")


def frame_label(frames: list[dict]) -> str:
    """``file:line:function`` of the innermost frame outside torch's own modules (the first frame otherwise)."""
    for frame in frames or []:
        name = frame.get("filename", "")
        if not any(part in name for part in _TORCH_INTERNAL):
            short = "/".join(name.split("/")[-4:])
            return f"{short}:{frame.get('line')}:{frame.get('name')}"
    if frames:
        return f"{frames[0].get('filename', '').split('/')[-1]}:{frames[0].get('line')}:{frames[0].get('name')}"
    return "<no stack>"


def replay(trace: list[dict]) -> tuple[int, int, dict[int, dict]]:
    """(peak bytes, index of the peak's entry, blocks alive at the peak: addr -> trace entry)."""
    live: dict[int, dict] = {}
    current = peak = peak_at = 0
    peak_live: dict[int, dict] = {}
    for index, entry in enumerate(trace):
        action = entry.get("action")
        if action == "alloc":
            live[entry["addr"]] = entry
            current += entry["size"]
            if current > peak:
                peak, peak_at, peak_live = current, index, dict(live)
        elif action in ("free_requested", "free_completed") and entry["addr"] in live:
            current -= live.pop(entry["addr"])["size"]
    return peak, peak_at, peak_live


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    snapshot = pickle.loads(args.snapshot.read_bytes())
    traces = [t for t in snapshot.get("device_traces", []) if t]
    if not traces:
        raise SystemExit(f"{args.snapshot}: no allocator trace in it (was the history recorded?)")
    trace = max(traces, key=len)
    peak, peak_at, alive = replay(trace)
    groups: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for entry in alive.values():
        group = groups[frame_label(entry.get("frames"))]
        group[0] += entry["size"]
        group[1] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    print(f"{args.snapshot.name}: {len(trace)} trace entries; peak {peak / GiB:.3f} GiB at entry {peak_at}, "
          f"{len(alive)} blocks alive")  # fmt: skip
    for label, (size, count) in rows[: args.top]:
        print(f"{size / GiB:9.3f} GiB {count:6d}  {label}")
    last = trace[peak_at]
    print("peak's own allocation:", round(last["size"] / GiB, 3), "GiB from")
    for frame in (last.get("frames") or [])[:25]:
        print(f"    {frame.get('filename')}:{frame.get('line')} {frame.get('name')}")
    if args.json:
        report = {"peak_gib": peak / GiB, "entries": len(trace), "blocks": len(alive),
                  "groups": [{"label": k, "gib": v[0] / GiB, "blocks": v[1]} for k, v in rows],
                  "peak_frames": last.get("frames", [])[:40]}  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
