"""The record between rocmft and the GPU probe child (``python -m rocmft.facts.probe``): the one JSON line the
probe prints on its stdout (:func:`probe_line`) and the parent reads (:func:`read_probe_line`), with the typed
shapes of each probe's result. Re-exported by :mod:`rocmft.records` (the table of every record)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypedDict

from rocmft.records_common import VERSION, _json_object


class _GemmResult(TypedDict):
    finite: bool
    max_rel_error: float
    seconds: float


class GemmRecord(_GemmResult, total=False):
    """One dtype's matrix product on a GPU against a float64 reference: ``max_rel_error`` is
    max|gpu - reference| / max|reference|; ``seconds`` the product and its copy back. For float32, ``precision``:
    torch.backends.cuda.matmul.fp32_precision while it ran (``"ieee"``: real fp32; ``"tf32"``). A product that
    raised has ``error`` (its exception), ``finite`` False and ``max_rel_error`` inf."""

    precision: str
    error: str


class UnifiedMemory(TypedDict, total=False):
    """What an integrated GPU (MI300A, Ryzen APUs) may use of the system memory it shares, GiB
    (:func:`rocmft.facts.device.unified_memory`): ``mem_total_gib``/``mem_available_gib`` (psutil, MemTotal and
    MemAvailable of /proc/meminfo), ``gtt_total_gib``/``gtt_used_gib`` (amdgpu's mem_info_gtt_total/_used; absent
    where the driver has no such files)."""

    mem_total_gib: float
    mem_available_gib: float
    gtt_total_gib: float
    gtt_used_gib: float


class _GpuIdentity(TypedDict):
    index: int
    name: str
    arch: str
    total_gib: float
    free_gib: float
    bf16: bool
    pci: str | None
    gemm: dict[str, GemmRecord]


class GpuRecord(_GpuIdentity, total=False):
    """One visible GPU as ``devices`` reports it: memory in GiB as torch.cuda.mem_get_info reads it (misread on
    APUs: see :func:`rocmft.facts.device.memory_budget`), ``arch`` the gfx target (``gcnArchName``) or
    ``sm_<major><minor>``, ``pci`` its sysfs address (None on an old torch), ``gemm`` by dtype name;
    ``integrated`` (torch's is_integrated: an APU sharing system memory) and, when True, ``unified_memory``.
    Records written before these keys existed lack them."""

    integrated: bool
    unified_memory: UnifiedMemory


class BlasRecord(TypedDict, total=False):
    """The BLAS library torch preferred ``before`` and ``after`` the probe's GEMMs (``hipblaslt``, ``hipblas``,
    ``ck`` on ROCm; ``cublaslt``, ``cublas`` on CUDA), the ``fallback_warnings`` torch gave when a GEMM left
    hipBLASLt for hipBLAS (rocmft.facts.probe.BLAS_FALLBACK_WARNINGS), and TORCH_BLAS_PREFER_HIPBLASLT /
    TORCH_BLAS_PREFER_CUBLASLT as the probe saw them (None: unset)."""

    before: str
    after: str
    fallback_warnings: list[str]
    prefer_hipblaslt: str | None
    prefer_cublaslt: str | None


class DevicesProbe(TypedDict, total=False):
    """``devices``: the backend (rocm, cuda, cpu), torch's and its toolkit's versions, the *_VISIBLE_DEVICES
    variables it saw, the GPUs, the BLAS library of their GEMMs (``blas``) and the fp32 matmul precision after
    them (``fp32_precision``). A failed probe is ``{"error", "timed_out"}`` instead (rocmft.facts.device)."""

    backend: str
    torch: str
    hip: str | None
    cuda: str | None
    visible: dict[str, str]
    gpus: list[GpuRecord]
    blas: BlasRecord
    fp32_precision: str
    error: str
    timed_out: bool


class AllreduceProbe(TypedDict, total=False):
    """``allreduce``: ``world_size`` GPUs all-reduced ``bytes`` in ``seconds`` (mean of 10), ``correct`` whether
    the sum was right, ``busbw_gbps`` the bus bandwidth in GB/s (nccl-tests' definition); or ``{"skipped"}``
    with fewer than two GPUs, or ``{"error", "timed_out"}``."""

    world_size: int
    bytes: int
    seconds: float
    correct: bool
    busbw_gbps: float
    skipped: str
    error: str
    timed_out: bool


class LibProbe(TypedDict, total=False):
    """One library of ``libs`` (bnb, fa2): ``ok``, its ``version``, ``finite`` and ``max_rel_error`` against a
    reference; or ``{"ok": False, "error"}``."""

    ok: bool
    version: str
    finite: bool
    max_rel_error: float
    error: str


class PerfGpu(TypedDict, total=False):
    """One GPU of ``perf`` (rocmft.facts.perf.measure): ``gemm_tflops`` of a ``gemm_n``³ bf16 matmul (mean of
    ``gemm_timed`` calls), ``copy_gbps`` of a ``copy_mib`` MiB device-to-device copy counted as read plus write
    (mean of ``copy_timed``), ``seconds`` both took; or ``error`` where it raised."""

    index: int
    name: str
    arch: str
    gemm_n: int
    gemm_timed: int
    gemm_tflops: float
    copy_mib: int
    copy_timed: int
    copy_gbps: float
    seconds: float
    error: str


class PerfProbe(TypedDict, total=False):
    """``perf``: the ``backend``, torch's version and each visible GPU's figures; or ``{"skipped"}`` (a test
    injected the GPUs but not their speed), or ``{"error", "timed_out"}``."""

    backend: str
    torch: str
    gpus: list[PerfGpu]
    skipped: str
    error: str
    timed_out: bool


PROBES = ("devices", "allreduce", "libs", "perf")


def probe_line(probe: str, result: Mapping[str, Any]) -> str:
    """The probe child's stdout line (no newline): ``{"version", "probe", "result"}``, ``result`` being a
    :class:`DevicesProbe`, an :class:`AllreduceProbe`, or name -> :class:`LibProbe`."""
    return json.dumps({"version": VERSION, "probe": probe, "result": dict(result)})


def read_probe_line(stdout: str) -> dict[str, Any]:
    """The probe's result from its stdout, whose last line is :func:`probe_line`'s (libraries may print before it).

    Raises:
        ValueError: no line, not JSON, or not a probe's line.
    """
    lines = stdout.strip().splitlines()
    if not lines:
        raise ValueError("no output")
    data = _json_object(lines[-1], "the probe's line")
    if not isinstance(data.get("result"), dict):
        raise ValueError("the probe's line has no result")
    return data["result"]


__all__ = [
    "PROBES",
    "AllreduceProbe",
    "DevicesProbe",
    "GemmRecord",
    "GpuRecord",
    "LibProbe",
    "PerfGpu",
    "PerfProbe",
    "probe_line",
    "read_probe_line",
]
