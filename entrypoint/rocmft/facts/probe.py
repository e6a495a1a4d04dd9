"""GPU probes, run in a child process so that a hard HIP/CUDA error cannot kill the entrypoint.

``python -m rocmft.facts.probe devices``: every visible GPU's name, gfx target (``gcnArchName`` on ROCm), memory,
bf16 support, and a matrix product in each training dtype the GPU supports (bf16, fp16, fp32) checked against a
float64 reference. Each probe prints one JSON line on stdout, :func:`rocmft.records.probe_line` (the shapes:
rocmft.records.DevicesProbe, AllreduceProbe, LibProbe). This is the only place rocmft touches a GPU before
training: the entrypoint itself never opens a GPU context (which would hold memory on GPU 0 for the whole run).

``python -m rocmft.facts.probe allreduce NPROC|all MIB``: an all-reduce of MIB MiB across NPROC local GPUs (``all``:
every visible GPU; fewer than two gives ``{"skipped": ...}``) through torch.distributed (RCCL on ROCm, NCCL on
CUDA), one process per GPU; JSON with the bus bandwidth, computed as NCCL's tests define it:
``busbw = 2·S·(n−1)/n / t`` (nccl-tests' doc/PERFORMANCE.md).

``python -m rocmft.facts.probe libs bnb fa2``: what the configuration needs from the libraries, for real on GPU 0:
a bitsandbytes 4-bit (NF4) matmul against its dequantized reference, a flash-attention 2 forward against
PyTorch's SDPA.

:class:`rocmft.facts.device.ProbeProcess` starts one in the background (the entrypoint starts the GPU probes
first thing, so they run while LLaMA-Factory is imported) and :func:`rocmft.facts.device.run_probe` runs one to
the end; both with a hard timeout. This module is the child's side only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rocmft.records import AllreduceProbe, DevicesProbe, LibProbe

GEMM_SIZE = 1024
# Largest allowed |gpu - reference| / max|reference| per dtype. The reference is computed in float64 from the
# same rounded inputs, so what remains is accumulation and output rounding: output rounding alone is 2^-8 for
# bf16 and 2^-11 for fp16 relative to each element; these bounds leave 2-3x headroom. A broken kernel or a
# wrong-architecture code object gives NaN, zeros or O(1) errors.
GEMM_TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-4}


def _devices() -> DevicesProbe:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in the reference comparison
    out: DevicesProbe = {
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
            "pci": _pci_address(props),
            "gemm": gemm,
        })  # fmt: skip
    return out


def _pci_address(props) -> str | None:
    """The GPU's PCI address as sysfs names it (``0000:05:00.0``), the key to its NUMA node."""
    try:
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:  # older torch
        return None


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


def _allreduce(world: int | str, mib: int) -> AllreduceProbe:
    import tempfile

    import torch
    import torch.multiprocessing as mp

    if world == "all":
        world = torch.cuda.device_count()
        if world < 2:
            return {"skipped": f"{world} GPU visible"}
    world = int(world)

    from rocmft.proc import free_port

    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        mp.spawn(_allreduce_rank, args=(world, free_port(), mib, result.name), nprocs=world, join=True)
        with open(result.name) as handle:
            return json.load(handle)


# Largest allowed max|x - reference| / max|reference| of the library probes (bf16 outputs: 2^-8 rounding each,
# plus the kernels' own summation order; a missing or wrong-architecture kernel gives NaN, zeros or O(1)).
LIB_TOLERANCE = 2e-2


def _relative_error(result, reference) -> float:
    return float((result.float() - reference.float()).abs().max() / reference.float().abs().max())


def _bnb_probe() -> LibProbe:
    """A 4-bit NF4 linear layer on GPU 0 against its own dequantized weight: proves the GPU backend runs."""
    import bitsandbytes as bnb
    import torch

    generator = torch.Generator().manual_seed(0)
    layer = bnb.nn.Linear4bit(256, 256, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(torch.randn(256, 256, generator=generator), requires_grad=False,
                                     quant_type="nf4")  # fmt: skip
    layer = layer.to("cuda:0")  # quantizes on the GPU
    x = torch.randn(8, 256, generator=generator).to("cuda:0", torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
        weight = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).to(torch.bfloat16)
        reference = x @ weight.t()
    torch.cuda.synchronize()
    error = _relative_error(y, reference)
    return {"version": bnb.__version__, "finite": bool(torch.isfinite(y).all()), "max_rel_error": error,
            "ok": bool(torch.isfinite(y).all()) and error <= LIB_TOLERANCE}  # fmt: skip


def _fa2_probe() -> LibProbe:
    """A causal flash-attention 2 forward on GPU 0 against PyTorch's scaled_dot_product_attention."""
    import flash_attn
    import torch
    from flash_attn import flash_attn_func

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 128, 4, 64, generator=generator).to("cuda:0", torch.bfloat16) for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)  # (batch, seq, heads, head_dim)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    torch.cuda.synchronize()
    error = _relative_error(out, reference)
    return {"version": flash_attn.__version__, "finite": bool(torch.isfinite(out).all()), "max_rel_error": error,
            "ok": bool(torch.isfinite(out).all()) and error <= LIB_TOLERANCE}  # fmt: skip


def _libs(names: list[str]) -> dict[str, LibProbe]:
    """Run the named library probes (``bnb``, ``fa2``); each result is ``{ok, version, ...}`` or ``{ok: False,
    error}`` (an import error, no GPU, a kernel that raised)."""
    import torch

    probes = {"bnb": _bnb_probe, "fa2": _fa2_probe}
    out: dict[str, LibProbe] = {}
    for name in names:
        if not torch.cuda.is_available():
            out[name] = {"ok": False, "error": "no GPU visible"}
            continue
        try:
            out[name] = probes[name]()
        except Exception as err:  # ImportError, a missing kernel (RuntimeError), ...
            out[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
    return out


def main(argv: list[str]) -> int:
    """Entry of the child process; prints one JSON line (rocmft.records.probe_line: the probe's name and its
    result). Exits 2 on an unknown probe."""
    from rocmft.records import probe_line

    if argv[0] == "devices":
        print(probe_line(argv[0], _devices()))
    elif argv[0] == "allreduce":
        print(probe_line(argv[0], _allreduce(argv[1], int(argv[2]))))
    elif argv[0] == "libs":
        print(probe_line(argv[0], _libs(argv[1:])))
    else:
        print(f"unknown probe {argv[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
