"""GPU probes, run in a child process so that a hard HIP/CUDA error cannot kill the entrypoint.

``python -m rocmft.probe devices``: every visible GPU's name, gfx target (``gcnArchName`` on ROCm), memory,
bf16 support, and a matrix product in each training dtype the GPU supports (bf16, fp16, fp32) checked against a
float64 reference; JSON on stdout. This is the only place rocmft touches a GPU before training: the entrypoint
itself never opens a GPU context (which would hold memory on GPU 0 for the whole run).

``python -m rocmft.probe allreduce NPROC MIB``: an all-reduce of MIB MiB across NPROC local GPUs through
torch.distributed (RCCL on ROCm, NCCL on CUDA), one process per GPU; JSON with the bus bandwidth, computed as
NCCL's tests define it: ``busbw = 2·S·(n−1)/n / t`` (nccl-tests' doc/PERFORMANCE.md).

:func:`run_probe` runs either with a hard timeout and returns the parsed JSON or an error description.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

GEMM_SIZE = 1024
# Largest allowed |gpu - reference| / max|reference| per dtype. The reference is computed in float64 from the
# same rounded inputs, so what remains is accumulation and output rounding: output rounding alone is 2^-8 for
# bf16 and 2^-11 for fp16 relative to each element; these bounds leave 2-3x headroom. A broken kernel or a
# wrong-architecture code object gives NaN, zeros or O(1) errors.
GEMM_TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-4}


def _devices() -> dict[str, Any]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in the reference comparison
    out: dict[str, Any] = {
        "backend": "rocm" if torch.version.hip else ("cuda" if torch.cuda.is_available() else "cpu"),
        "torch": torch.__version__,
        "hip": torch.version.hip,
        "cuda": torch.version.cuda,
        "visible": {
            k: os.environ[k]
            for k in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
            if k in os.environ
        },
        "gpus": [],
    }
    if not torch.cuda.is_available():
        return out
    bf16 = bool(torch.cuda.is_bf16_supported())
    generator = torch.Generator().manual_seed(0)
    a32 = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
    b32 = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        gemm = {}
        for name in ("bfloat16", "float16", "float32") if bf16 else ("float16", "float32"):
            dtype = getattr(torch, name)
            a, b = a32.to(dtype), b32.to(dtype)
            reference = a.double() @ b.double()
            started = time.monotonic()
            result = (a.to(f"cuda:{index}") @ b.to(f"cuda:{index}")).double().cpu()
            torch.cuda.synchronize(index)
            error = float((result - reference).abs().max() / reference.abs().max())
            gemm[name] = {"finite": bool(torch.isfinite(result).all()), "max_rel_error": error,
                          "seconds": round(time.monotonic() - started, 3)}  # fmt: skip
        out["gpus"].append({
            "index": index,
            "name": props.name,
            "arch": props.gcnArchName if torch.version.hip else f"sm_{props.major}{props.minor}",
            "total_gib": round(total / 2**30, 2),
            "free_gib": round(free / 2**30, 2),
            "bf16": bf16,
            "gemm": gemm,
        })  # fmt: skip
    return out


def _allreduce_rank(rank: int, world: int, port: int, mib: int, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tensor = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=f"cuda:{rank}")
    for _ in range(3):  # warm-up: connection setup, channel allocation
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    repeats = 10
    started = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / repeats
    tensor.fill_(1.0)
    dist.all_reduce(tensor)
    correct = bool(torch.all(tensor == world))
    if rank == 0:
        size = tensor.numel() * 4
        with open(result_path, "w") as handle:
            json.dump({"world_size": world, "bytes": size, "seconds": seconds, "correct": correct,
                       "busbw_gbps": 2 * size * (world - 1) / world / seconds / 1e9}, handle)  # fmt: skip
    dist.destroy_process_group()


def _allreduce(world: int, mib: int) -> dict[str, Any]:
    import tempfile

    import torch.multiprocessing as mp

    from .validate import free_port

    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        mp.spawn(_allreduce_rank, args=(world, free_port(), mib, result.name), nprocs=world, join=True)
        with open(result.name) as handle:
            return json.load(handle)


def run_probe(args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``python -m rocmft.probe ARGS`` with a hard timeout.

    Returns:
        The probe's JSON, or ``{"error": str, "timed_out": bool}`` when it crashed or hung (the whole process
        group is killed on timeout, so no child is left holding a GPU).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmft.probe", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"no answer in {timeout_s:.0f} s", "timed_out": True}
    if proc.returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        return {"error": f"the probe exited {proc.returncode}: {tail}", "timed_out": False}
    return json.loads(stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    """Entry of the child process; prints one JSON line."""
    if argv[0] == "devices":
        print(json.dumps(_devices()))
    elif argv[0] == "allreduce":
        print(json.dumps(_allreduce(int(argv[1]), int(argv[2]))))
    else:
        print(f"unknown probe {argv[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
