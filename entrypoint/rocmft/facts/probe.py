"""GPU probes, run in a child process so that a hard HIP/CUDA error cannot kill the entrypoint.

``python -m rocmft.facts.probe devices``: every visible GPU's name, gfx target (``gcnArchName`` on ROCm), memory,
bf16 support, whether it is an integrated GPU sharing system memory (MI300A, Ryzen APUs: then the memory the
driver lets it map, rocmft.facts.device.unified_memory), a matrix product in each training dtype the GPU supports
(bf16, fp16, and fp32 in IEEE precision, TF32 off) checked against a float64 reference, and the BLAS library torch
used for them with any warning that it fell back from hipBLASLt to hipBLAS. Each probe prints one JSON line on
stdout, :func:`rocmft.records.probe_line` (the shapes:
rocmft.records.DevicesProbe, AllreduceProbe, LibProbe). This is the only place rocmft touches a GPU before
training: the entrypoint itself never opens a GPU context (which would hold memory on GPU 0 for the whole run).

``python -m rocmft.facts.probe allreduce NPROC|all MIB``: an all-reduce of MIB MiB across NPROC local GPUs (``all``:
every visible GPU; fewer than two gives ``{"skipped": ...}``) through torch.distributed (RCCL on ROCm, NCCL on
CUDA), one process per GPU; JSON with the bus bandwidth, computed as NCCL's tests define it:
``busbw = 2·S·(n−1)/n / t`` (nccl-tests' doc/PERFORMANCE.md).

``python -m rocmft.facts.probe libs bnb fa2``: what the configuration needs from the libraries, for real on GPU 0:
a bitsandbytes 4-bit (NF4) matmul against its dequantized reference, a flash-attention 2 forward against
PyTorch's SDPA.

``python -m rocmft.facts.probe perf``: each visible GPU's bf16 GEMM TFLOPS and device-memory copy bandwidth, about
1 s per GPU (rocmft.facts.perf.measure).

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
    from rocmft.records import AllreduceProbe, DevicesProbe, GemmRecord, GpuRecord, LibProbe

GEMM_SIZE = 1024
# Largest allowed |gpu - reference| / max|reference| per dtype. The reference is computed in float64 from the
# same rounded inputs, so what remains is accumulation and output rounding: output rounding alone is 2^-8 for
# bf16 and 2^-11 for fp16 relative to each element; these bounds leave 2-3x headroom. A broken kernel or a
# wrong-architecture code object gives NaN, zeros or O(1) errors. fp32's 1e-4 is also what tells real fp32 from
# TF32 (10-bit mantissa, ~1e-3 here): measured on an H200 (tests/test_gpu_probe.py prints both).
GEMM_TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-4}
# Warnings by which torch says a GEMM did not run on the BLAS library it was meant to (both are TORCH_WARN*, which
# torch's Python binding turns into a Python UserWarning: the "(Triggered internally at ...)" suffix in the reports
# below is that translation):
# * at::Context::blasPreferredBackend() (aten/src/ATen/Context.cpp, torch 2.5-2.11): hipBLASLt was asked for (by
#   TORCH_BLAS_PREFER_HIPBLASLT=1 or preferred_blas_library("hipblaslt")) on a GPU outside its list of supported
#   gfx targets; TORCH_WARN_ONCE("Attempting to use hipBLASLt on an unsupported architecture! Overriding blas
#   backend to hipblas") and the preferred backend becomes hipBLAS for the whole process.
# * at::cuda::blas's per-call recovery (CUDABlas.cpp, hipified to aten/src/ATen/hip/HIPBlas.cpp): a hipBLASLt call
#   failed and torch retries it on hipBLAS: "bgemm_internal_cublaslt error: HIPBLAS_STATUS_INTERNAL_ERROR when
#   calling hipblasLtMatmul ... Will attempt to recover by calling cublas instead." -- AMDResearch/hpcfund#86 (a
#   1024x1024 fp32 matmul on MI300X, torch 2.11.0+rocm7.2), where the retry then died with "CUDA error: file not
#   found".
BLAS_FALLBACK_WARNINGS = ("Overriding blas backend to hipblas", "Will attempt to recover by calling")


def _blas_library(torch) -> str:
    """The BLAS library torch prefers now, by its vendor's name: ``hipblaslt``/``hipblas``/``ck`` on ROCm,
    ``cublaslt``/``cublas`` on CUDA (torch names both vendors' libraries by the CUDA ones: _BlasBackend.Cublas is
    hipBLAS on ROCm). On ROCm the first query itself resolves "default" and may trigger the override above."""
    name = torch.backends.cuda.preferred_blas_library().name.lower()  # Cublas, Cublaslt, Ck, Default
    if torch.version.hip:
        name = {"cublas": "hipblas", "cublaslt": "hipblaslt"}.get(name, name)
    return name


def _gemm(torch, a32, b32, dtype_name: str, device: str) -> GemmRecord:
    """One GEMM_SIZE² product in ``dtype_name`` on ``device`` against a float64 reference of the same rounded
    inputs; a product that raised (a missing kernel, a HIP error) is ``{"finite": False, "error": ...}``."""
    dtype = getattr(torch, dtype_name)
    a, b = a32.to(dtype), b32.to(dtype)
    reference = a.double() @ b.double()
    started = time.monotonic()
    record: GemmRecord
    try:
        result = (a.to(device) @ b.to(device)).double().cpu()
        torch.cuda.synchronize(device)
    except Exception as err:  # torch.AcceleratorError / RuntimeError from the BLAS library
        return {"finite": False, "max_rel_error": float("inf"), "seconds": round(time.monotonic() - started, 3),
                "error": f"{type(err).__name__}: {err}"[:300]}  # fmt: skip
    error = float((result - reference).abs().max() / reference.abs().max())
    record = {"finite": bool(torch.isfinite(result).all()), "max_rel_error": error,
              "seconds": round(time.monotonic() - started, 3)}  # fmt: skip
    if dtype_name == "float32":
        # what governs an fp32 GEMM's TF32 use in torch >= 2.9: at::Context::float32Precision(CUDA, MATMUL), read and
        # set from Python as torch.backends.cuda.matmul.fp32_precision ("ieee" | "tf32" | "none" = inherit); the
        # legacy allow_tf32 flag is a view of it (ATen/Context.h of the 2.11.0 wheel, git 70d99e99)
        record["precision"] = torch.backends.cuda.matmul.fp32_precision
    return record


VISIBLE_VARIABLES = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _without_gpu_nodes() -> DevicesProbe | None:
    """The devices probe's answer without importing torch (2.7 CPU-s on our CPU machines, ``python -c "import
    torch"``), when no GPU device node (:data:`rocmft.facts.device.GPU_NODES`) exists: ROCm's runtime opens /dev/kfd,
    CUDA's /dev/nvidiactl (/dev/dxg under WSL), so torch then finds no GPU whatever else is installed; None when a
    node exists (:func:`_devices` asks torch). torch's build facts come from its ``torch/version.py``, read without
    importing the package; None if that file is not there."""
    import importlib.util
    import runpy
    from pathlib import Path

    from rocmft.facts.device import gpu_node_present

    spec = importlib.util.find_spec("torch")
    if gpu_node_present() or spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    if not version_file.is_file():
        return None
    version = runpy.run_path(str(version_file))
    return {
        "backend": "rocm" if version.get("hip") else "cpu",
        "torch": version["__version__"],
        "hip": version.get("hip"),
        "cuda": version.get("cuda"),
        "visible": {k: os.environ[k] for k in VISIBLE_VARIABLES if k in os.environ},
        "gpus": [],
    }


def _devices(ask_torch: bool = False) -> DevicesProbe:
    """Every visible GPU's facts (the module docstring); without a GPU device node, :func:`_without_gpu_nodes`'
    answer unless ``ask_torch``."""
    import warnings

    answer = None if ask_torch else _without_gpu_nodes()
    if answer is not None:
        return answer
    import torch

    # fp32 means IEEE fp32 in the reference comparison, set through the API that governs it (see _gemm); mixing it
    # with the legacy allow_tf32 setter makes torch refuse to read the flag ("mix of the legacy and new APIs")
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    out: DevicesProbe = {
        "backend": "rocm" if torch.version.hip else ("cuda" if torch.cuda.is_available() else "cpu"),
        "torch": torch.__version__,
        "hip": torch.version.hip,
        "cuda": torch.version.cuda,
        "visible": {k: os.environ[k] for k in VISIBLE_VARIABLES if k in os.environ},
        "gpus": [],
    }
    if not torch.cuda.is_available():
        return out
    from rocmft.facts.device import unified_memory

    bf16 = bool(torch.cuda.is_bf16_supported())
    generator = torch.Generator().manual_seed(0)
    a32 = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
    b32 = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # TORCH_WARN_ONCE fires once per process: this fresh child sees it
        blas_before = _blas_library(torch)
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            free, total = torch.cuda.mem_get_info(index)
            names = ("bfloat16", "float16", "float32") if bf16 else ("float16", "float32")
            gemm = {name: _gemm(torch, a32, b32, name, f"cuda:{index}") for name in names}
            pci = _pci_address(props)
            # is_integrated: hipDeviceProp_t.integrated on ROCm (torch/csrc/cuda/Module.cpp binds
            # cudaDeviceProp::integrated, hipified); 1 on MI300A and the Ryzen APUs, 0 on discrete GPUs
            integrated = bool(getattr(props, "is_integrated", False))
            record: GpuRecord = {
                "index": index,
                "name": props.name,
                "arch": props.gcnArchName if torch.version.hip else f"sm_{props.major}{props.minor}",
                "total_gib": round(total / 2**30, 2),
                "free_gib": round(free / 2**30, 2),
                "bf16": bf16,
                "pci": pci,
                "integrated": integrated,
                "gemm": gemm,
            }
            if integrated:
                record["unified_memory"] = unified_memory(pci)
            out["gpus"].append(record)
        blas_after = _blas_library(torch)
    messages = {str(warning.message)[:400] for warning in caught}
    fallbacks = sorted(m for m in messages if any(key in m for key in BLAS_FALLBACK_WARNINGS))
    out["blas"] = {"before": blas_before, "after": blas_after, "fallback_warnings": fallbacks,
                   "prefer_hipblaslt": os.environ.get("TORCH_BLAS_PREFER_HIPBLASLT"),
                   "prefer_cublaslt": os.environ.get("TORCH_BLAS_PREFER_CUBLASLT")}  # fmt: skip
    out["fp32_precision"] = torch.backends.cuda.matmul.fp32_precision
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
    elif argv[0] == "perf":
        from rocmft.facts.perf import measure

        print(probe_line(argv[0], measure()))
    else:
        print(f"unknown probe {argv[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
