"""How fast each GPU is: a bf16 GEMM's TFLOPS and a device-memory copy's bandwidth, against the model's figures.

Three parts, each read-only:

* **The measurement** (:func:`measure`, run in the GPU probe child ``python -m rocmft.facts.probe perf``, so the
  entrypoint never opens a GPU context): per visible GPU, a square bf16 matmul of :data:`GEMM_N` (warm-up, then
  timed with CUDA/HIP events: ``2·n³ / t``) and a device-to-device copy of :data:`COPY_MIB` MiB (``copy_``; read
  plus write, ``2·bytes / t``, as AMD Primus' node smoke test counts it: primus/tools/preflight/node_smoke/
  per_gpu.py, ``_measure_hbm_gbs``), each bounded in time (:data:`GPU_BUDGET_S`, 1 s, per GPU in all). The parent
  runs it with a hard timeout (:func:`perf_probe`).
* **The expected figures** (:data:`MODELS`): per GPU model, the datasheet's peak dense bf16 TFLOPS and memory
  bandwidth with the page they come from, and the share of each that a healthy GPU reaches in these two kernels
  (stated per row). The AMD rows are published figures with assumed shares that rocmft has not measured; the H200
  row's shares were measured with ``bench/preflight.py`` on an H200 (``measured`` says where and when).
* **The node's versions** (:func:`node_versions`): rocmft, torch, ROCm (or CUDA), the kernel driver and the image's
  build record, which node 0 compares across the nodes of a job.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GEMM_N = 8192  # the size AMD Primus' preflight and node smoke test use (square_gemm.py, per_gpu.py: 8192³ bf16)
COPY_MIB = 512  # Primus' node smoke test copies 512 MiB (per_gpu.py, size_bytes=512 MiB): past every cache
# Per GPU, GEMM and copy together (issue 30: "≤ 2 s per GPU"; every start of rocmft pays it for each GPU, so 1 s: at
# the H200 row's expected figures that times ~200 GEMMs and ~900 copies, an estimate; bench/preflight.py --budget-s
# shows whether a longer one changes the figures). The first call's setup comes on top.
GPU_BUDGET_S = 1.0
GEMM_SHARE = 0.6  # of GPU_BUDGET_S: the GEMM's warm-up and timed part; the copy has the rest
WARM_UP_SHARE = 0.4  # of each kernel's time: warm-up (clocks ramp up, the BLAS library picks its kernel)
PERF_TIMEOUT_BASE_S = 40.0  # the probe child's hard timeout: starting it (9 s on the 2-core build machine) ...
PERF_TIMEOUT_PER_GPU_S = 5.0  # ... plus this per GPU (its budget, the first GEMM's kernel selection, memory)


@dataclass(frozen=True)
class Model:
    """The expected figures of one GPU model, per GPU as torch sees it (one GCD of an MI250).

    Attributes:
        label: the model, as the messages name it.
        pattern: a regular expression matched (case-insensitive) against torch's device name.
        peak_tflops: peak dense bf16 matrix TFLOPS from the datasheet (without sparsity).
        peak_gbps: peak memory bandwidth, GB/s (10⁹ bytes/s), from the datasheet.
        source: the datasheet's address.
        gemm_share: the share of ``peak_tflops`` a healthy GPU reaches in an 8192³ bf16 matmul through torch
            (an assumption until ``measured``; ``why`` says what it rests on).
        copy_share: the same for the copy's bandwidth against ``peak_gbps``.
        why: where the two shares come from.
        measured: where rocmft measured this model (None: the figures are published ones, not run here).
    """

    label: str
    pattern: str
    peak_tflops: float
    peak_gbps: float
    source: str
    gemm_share: float
    copy_share: float
    why: str
    measured: str | None = None

    @property
    def expected_tflops(self) -> float:
        """What a healthy GPU of this model reaches in the GEMM, TFLOPS: ``peak_tflops · gemm_share``."""
        return self.peak_tflops * self.gemm_share

    @property
    def expected_gbps(self) -> float:
        """What a healthy GPU of this model reaches in the copy, GB/s: ``peak_gbps · copy_share``."""
        return self.peak_gbps * self.copy_share


# What a healthy GPU reaches of its datasheet peak, by family (assumptions until measured):
# * CDNA (Instinct): Primus' node smoke test floors an MI300X at 600 TFLOPS in this very GEMM (46% of 1307.4) and says
#   "a healthy MI300X is ≈ 4500–5000" GB/s in this very copy (85-94% of 5300: primus/tools/preflight/node_smoke/
#   README, Tier 2); rocmft expects half the bf16 peak and 80% of the bandwidth.
# * RDNA 3 (Radeon): the datasheet's FP16 figure is the WMMA matrix rate; RDNA 3 has the same WMMA for bf16
#   (V_WMMA_F32_16X16X16_BF16 beside _F16, RDNA 3 ISA guide), assumed at the same rate; half of it and 80% of the
#   bandwidth, as for CDNA.
# * Hopper (H200): measured by rocmft on one H200 SXM (2026-12-03, `bench/preflight.py --repeat 3`, then
#   `--repeat 2 --budget-s 5`; torch 2.11.0+cu130, 700 W): 653-673 TFLOPS (66-68% of the dense peak, the 5 s budget
#   the lower) and 4183-4188 GB/s (87%); the row takes the lowest of each. The NVL row keeps the assumption.
_CDNA = "Primus' node smoke test floors an MI300X at 600 TFLOPS (46% of peak) and finds ≈ 4500–5000 GB/s healthy"
_RDNA = "the FP16 figure is the WMMA rate, assumed for bf16's WMMA too; shares as for CDNA (not measured on RDNA 3)"
_HOPPER = "assumed: 70% of the dense peak for large bf16 GEMMs, 80% for copies; calibrate with bench/preflight.py"
_AMD = "https://www.amd.com/en/products/"
MODELS: tuple[Model, ...] = (
    Model("AMD Instinct MI210", r"MI210", 181.0, 1638.4, _AMD + "accelerators/instinct/mi200/mi210.html",
          0.5, 0.8, _CDNA),
    # one MI250/MI250X is two GCDs, each its own torch device with half the OAM's figures (MI250: 362.1 TFLOPS,
    # 3.2 TB/s in all; MI250X: 383); the name ("AMD Instinct MI250X/MI250") does not tell them apart: the MI250's
    Model("AMD Instinct MI250X/MI250 (one GCD)", r"MI250", 181.05, 1638.4, _AMD + "accelerators/instinct/mi200/"
          "mi250.html", 0.5, 0.8, _CDNA),
    Model("AMD Instinct MI325X", r"MI325X", 1307.4, 6000.0, _AMD + "accelerators/instinct/mi300/mi325x.html",
          0.5, 0.8, _CDNA),
    Model("AMD Instinct MI300X", r"MI300X", 1307.4, 5300.0, _AMD + "accelerators/instinct/mi300/mi300x.html",
          0.5, 0.8, _CDNA),
    Model("AMD Instinct MI355X", r"MI355X", 2516.6, 8000.0, _AMD + "accelerators/instinct/mi350/mi355x.html",
          0.5, 0.8, _CDNA),
    Model("AMD Instinct MI350X", r"MI350X", 2306.9, 8000.0, _AMD + "accelerators/instinct/mi350/mi350x.html",
          0.5, 0.8, _CDNA),
    Model("AMD Radeon PRO W7900", r"W7900", 122.6, 864.0, _AMD + "graphics/workstations/radeon-pro/w7900.html",
          0.5, 0.8, _RDNA),
    Model("AMD Radeon RX 7900 XTX", r"7900 XTX", 122.8, 960.0, _AMD + "graphics/desktops/radeon/7000-series/"
          "amd-radeon-rx-7900xtx.html", 0.5, 0.8, _RDNA),
    # the datasheet gives 1,979 (SXM) and 1,671 (NVL) bf16 TFLOPS "with sparsity": dense is half. The word H200:
    # not GH200 (an H100 with other memory)
    Model("NVIDIA H200 NVL", r"\bH200 NVL", 835.5, 4800.0, "https://www.nvidia.com/en-us/data-center/h200/",
          0.7, 0.8, _HOPPER),
    Model("NVIDIA H200", r"\bH200\b", 989.5, 4800.0, "https://www.nvidia.com/en-us/data-center/h200/", 0.66, 0.87,
          "measured on one H200 SXM: 653-673 TFLOPS, 4183-4188 GB/s (the lowest of 5 runs kept)",
          measured="H200 SXM, 2026-12-03, bench/preflight.py (BENCHMARKS.md: the performance preflight)"),
)  # fmt: skip
# MI350X and MI355X report an empty device name on some ROCm releases (ROCm/mori#464: "torch.cuda.
# get_device_properties(0).name is empty on MI350X"); their gfx target then stands in, as the slower of the two.
BY_TARGET = {"gfx950": "AMD Instinct MI350X"}


def model_of(name: str, arch: str = "") -> Model | None:
    """The row of :data:`MODELS` for torch's device ``name`` (first match, in the table's order: MI325X before
    MI300X, H200 NVL before H200); an empty name falls back to the gfx target (:data:`BY_TARGET`). None: no row."""
    for model in MODELS:
        if name and re.search(model.pattern, name, re.IGNORECASE):
            return model
    label = BY_TARGET.get(arch.split(":")[0]) if not name.strip() else None
    return next((model for model in MODELS if model.label == label), None)


# ---- the measurement, in the probe child ------------------------------------------------------------------------
def _mean_seconds(torch, run, budget_s: float) -> tuple[float, int]:
    """Mean seconds of one ``run()`` on the current device, and how many were timed: one call (setup), warm-up
    calls for ``WARM_UP_SHARE`` of ``budget_s``, then as many as fill the rest (at least 3), timed between two
    CUDA/HIP events."""
    run()
    torch.cuda.synchronize()
    started, warm = time.perf_counter(), 0
    while time.perf_counter() - started < budget_s * WARM_UP_SHARE:
        run()
        torch.cuda.synchronize()
        warm += 1
    each = (time.perf_counter() - started) / max(warm, 1)
    count = max(3, min(10_000, int(budget_s * (1 - WARM_UP_SHARE) / max(each, 1e-6))))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / count, count


def _gemm_tflops(torch, device: str, budget_s: float) -> tuple[float, int]:
    """An n×n bf16 matmul's TFLOPS on ``device`` (``2·n³ / t``, n = GEMM_N) and how many calls were timed."""
    a = torch.randn(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
    c = torch.empty(GEMM_N, GEMM_N, device=device, dtype=torch.bfloat16)
    seconds, count = _mean_seconds(torch, lambda: torch.matmul(a, b, out=c), budget_s)
    return round(2 * GEMM_N**3 / seconds / 1e12, 1), count


def _copy_gbps(torch, device: str, budget_s: float) -> tuple[float, int]:
    """A COPY_MIB MiB device-to-device copy's bandwidth on ``device``, GB/s, counting the read and the write
    (``2·bytes / t``), and how many copies were timed."""
    size = COPY_MIB * 2**20
    source = torch.ones(size // 2, device=device, dtype=torch.bfloat16)
    target = torch.empty_like(source)
    seconds, count = _mean_seconds(torch, lambda: target.copy_(source), budget_s)
    return round(2 * size / seconds / 1e9, 1), count


def _one_gpu(torch, index: int, budget_s: float) -> dict[str, Any]:
    """GPU ``index``'s figures: ``gemm_tflops`` and ``copy_gbps``, the sizes, the timed counts and the seconds both
    took (the tensors are freed before the next GPU)."""
    started = time.monotonic()
    props = torch.cuda.get_device_properties(index)
    arch = props.gcnArchName if torch.version.hip else f"sm_{props.major}{props.minor}"  # as the device probe
    record: dict[str, Any] = {"index": index, "name": props.name, "arch": arch}
    with torch.cuda.device(index):
        tflops, gemms = _gemm_tflops(torch, f"cuda:{index}", budget_s * GEMM_SHARE)
        gbps, copies = _copy_gbps(torch, f"cuda:{index}", budget_s * (1 - GEMM_SHARE))
        torch.cuda.empty_cache()
    record.update(gemm_n=GEMM_N, gemm_timed=gemms, gemm_tflops=tflops, copy_mib=COPY_MIB, copy_timed=copies,
                  copy_gbps=gbps, seconds=round(time.monotonic() - started, 2))  # fmt: skip
    return record


def measure(budget_s: float = GPU_BUDGET_S) -> dict[str, Any]:
    """Every visible GPU's figures, one GPU at a time (so none shares the host's power or PCIe with another).

    Returns ``{"backend", "torch", "gpus": [...]}``, each GPU as :func:`_one_gpu` measured it, or ``{"index",
    "name", "error"}`` where it raised (out of memory, a HIP error). Without a GPU, ``gpus`` is empty."""
    import torch

    backend = "rocm" if torch.version.hip else ("cuda" if torch.cuda.is_available() else "cpu")
    out: dict[str, Any] = {"backend": backend, "torch": torch.__version__, "gpus": []}
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        try:
            out["gpus"].append(_one_gpu(torch, index, budget_s))
        except Exception as err:  # torch.OutOfMemoryError, RuntimeError from the BLAS library
            name = torch.cuda.get_device_name(index)
            out["gpus"].append({"index": index, "name": name, "error": f"{type(err).__name__}: {err}"[:300]})
            torch.cuda.empty_cache()
    return out


def perf_probe(gpus: int, injected: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The perf probe's result in the parent: ``python -m rocmft.facts.probe perf`` run to the end, killed after
    ``PERF_TIMEOUT_BASE_S + PERF_TIMEOUT_PER_GPU_S · gpus`` seconds (then ``{"error", "timed_out": True}``).

    ``injected`` (default: rocmft.testhooks.injected_probes, empty in production): a test's ``perf`` is returned as
    it is; a test that injected ``devices`` but no ``perf`` gets ``{"skipped": ...}``, since this machine's GPUs are
    not the injected ones."""
    from rocmft import testhooks

    injected = testhooks.injected_probes() if injected is None else injected
    if "perf" in injected:
        return injected["perf"]
    if "devices" in injected:
        return {"skipped": "the GPUs were injected (a test), their speed was not"}
    from rocmft.facts.device import run_probe

    return run_probe(["perf"], PERF_TIMEOUT_BASE_S + PERF_TIMEOUT_PER_GPU_S * gpus)


# ---- the node's versions ----------------------------------------------------------------------------------------
VERSION_KEYS = ("rocmft", "torch", "rocm", "driver", "image")


def driver_version(root: Path = Path("/")) -> str | None:
    """The GPU kernel driver's version: ``/sys/module/amdgpu/version`` (the amdgpu DKMS package's; the kernel's own
    inbox amdgpu has no such file, then ``inbox, kernel <release>`` from /proc/sys/kernel/osrelease) or
    ``/sys/module/nvidia/version``; None without either driver loaded. amdgpu's is read by
    rocmft.facts.amdgpu.driver_version, the reader the ``driver`` check uses."""
    from rocmft.facts import amdgpu

    amd = amdgpu.driver_version(root)
    if amd["version"]:
        return f"amdgpu {amd['version']}"
    if amd["loaded"]:
        return f"amdgpu inbox, kernel {amd['kernel'] or '?'}"
    nvidia = root / "sys/module/nvidia"
    version = _read(nvidia / "version")
    if version:
        return f"nvidia {version}"
    if nvidia.is_dir():
        return f"nvidia inbox, kernel {_read(root / 'proc/sys/kernel/osrelease') or '?'}"
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip() or None
    except OSError:
        return None


def image_identity(record_path: Path) -> str | None:
    """The image, as far as a container can tell: the sha256 of its build record (/etc/rocmft/build.json, written
    once per image build, with the commit and build date), shortened to 16 hex digits; None outside a rocmft
    image. The registry's digest of the image is not visible from inside a container."""
    try:
        return "build.json sha256:" + hashlib.sha256(record_path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def node_versions(devices: Mapping[str, Any] | None, image: Mapping[str, Any] | None, driver: str | None,
                  image_id: str | None) -> dict[str, str | None]:  # fmt: skip
    """This node's versions by :data:`VERSION_KEYS`: rocmft's, torch's (the device probe's), ROCm (the image's
    ROCM_VERSION, else the HIP torch was built with) or ``cuda <version>``, the driver (:func:`driver_version`) and
    the image (:func:`image_identity`). A version not known is None (never compared)."""
    from rocmft import __version__

    devices, image = devices or {}, image or {}
    rocm = image.get("rocm_version") or devices.get("hip") or (f"cuda {devices['cuda']}" if devices.get("cuda")
                                                                else None)  # fmt: skip
    return {"rocmft": __version__, "torch": devices.get("torch"), "rocm": rocm, "driver": driver, "image": image_id}


__all__ = ["BY_TARGET", "COPY_MIB", "GEMM_N", "MODELS", "VERSION_KEYS", "Model", "driver_version", "image_identity",
           "measure", "model_of", "node_versions", "perf_probe"]  # fmt: skip
