"""What accelerator this process sees, through vendor-neutral torch.

ROCm builds of torch expose AMD GPUs through the ``torch.cuda`` API; ``torch.version.hip`` tells them
apart from CUDA builds. Everything here is read, nothing is changed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rocmft import testhooks
from rocmft.proc import kill_group
from rocmft.records import read_probe_line
from rocmft.values import whole_number


@dataclass(frozen=True)
class DeviceFacts:
    """The accelerators visible to this process.

    Attributes:
        backend: ``"rocm"`` (torch built for HIP), ``"cuda"``, or ``"cpu"`` (no GPU visible).
        count: number of visible GPUs (honours HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES), 0 on CPU.
        names: each GPU's marketing name, e.g. ``"AMD Instinct MI300X"``.
        archs: each GPU's gfx target on ROCm (``gcnArchName``, e.g. ``"gfx942:sramecc+:xnack-"``), or its
            compute capability on CUDA (``"sm_90"``).
        memory_gib: each GPU's memory in GiB, as :func:`memory_budget` counts it (on an APU: the shared system
            memory it may use).
        bf16: whether bf16 arithmetic is supported (``torch.cuda.is_bf16_supported``); False on CPU, where
            rocmft does not train in bf16 by default.
        torch_version: ``torch.__version__``; hip_version/cuda_version: the toolkit torch was built with.
    """

    backend: str
    count: int = 0
    names: list[str] = field(default_factory=list)
    archs: list[str] = field(default_factory=list)
    memory_gib: list[float] = field(default_factory=list)
    bf16: bool = False
    torch_version: str = ""
    hip_version: str | None = None
    cuda_version: str | None = None

    def as_dict(self) -> dict:
        """A JSON-ready copy for the manifest and ``rocmft env``."""
        return asdict(self)


PROBE_TIMEOUT_S = 90
ALLREDUCE_MIB = 256  # large enough to measure bandwidth, not latency (nccl-tests reach their plateau by then)
ALLREDUCE_TIMEOUT_S = 90
# Device nodes whose presence means a GPU may be visible: worth starting the all-reduce probe early, and without
# any of them the devices probe answers without importing torch (rocmft.facts.probe). /dev/kfd: ROCm's KFD, which
# the HIP runtime opens (ROCm's container docs pass it with --device); /dev/nvidiactl: the NVIDIA driver's control
# node; /dev/dxg: the GPU of WSL 2, through which its CUDA runs (Microsoft's "GPU acceleration in WSL" docs).
GPU_NODES = ("/dev/kfd", "/dev/nvidiactl", "/dev/dxg")


def gpu_node_present() -> bool:
    """Whether any of :data:`GPU_NODES` exists on this machine (or in this container)."""
    return any(Path(node).exists() for node in GPU_NODES)


class ProbeProcess:
    """``python -m rocmft.facts.probe ARGS`` running in the background, in its own process group, with a deadline.

    Output goes to temporary files, not pipes, so nothing needs reading while it runs (no thread: the
    validation step forks, and forking a process with live threads is unsafe). :meth:`result` waits until
    the deadline (``timeout_s`` after the start), then kills the whole group (no child is left holding a
    GPU). Probes still running when the entrypoint exits are killed (atexit).
    """

    def __init__(self, args: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> None:
        import atexit
        import tempfile

        self.args, self.timeout_s = args, timeout_s
        # open for the probe's lifetime, closed with this object (not a with-block: the probe outlives the call)
        self._out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocmft.facts.probe", *args],
            stdout=self._out, stderr=self._err, text=True, start_new_session=True,
            env=dict(env) if env is not None else None,
        )  # fmt: skip
        self._result: dict[str, Any] | None = None
        atexit.register(self.cancel)

    def cancel(self) -> None:
        """Kill the probe's process group if it is still running."""
        kill_group(self.proc)

    def result(self) -> dict[str, Any]:
        """The probe's result (rocmft.records.read_probe_line), or ``{"error": str, "timed_out": bool}`` when it
        crashed, printed no result line or missed its deadline."""
        if self._result is None:
            self._result = self._collect()
        return self._result

    def _collect(self) -> dict[str, Any]:
        remaining = self.timeout_s - (time.monotonic() - self.started)
        try:
            self.proc.wait(timeout=max(remaining, 0.01))
        except subprocess.TimeoutExpired:
            self.cancel()
            return {"error": f"no answer in {self.timeout_s:.0f} s", "timed_out": True}
        self._out.seek(0)
        self._err.seek(0)
        stdout, stderr = self._out.read(), self._err.read()
        if self.proc.returncode != 0:
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            return {"error": f"the probe exited {self.proc.returncode}: {tail}", "timed_out": False}
        try:
            return read_probe_line(stdout)
        except ValueError:
            return {"error": f"the probe printed no result: {stdout[-200:]!r}", "timed_out": False}


def run_probe(args: list[str], timeout_s: float, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m rocmft.facts.probe ARGS`` to the end with a hard timeout (see :class:`ProbeProcess`), in
    ``env`` (a whole environment: the run's with what the launch adds, e.g. HSA_OVERRIDE_GFX_VERSION) or, when
    None, this process's."""
    return ProbeProcess(args, timeout_s, env).result()


_probes: dict[str, ProbeProcess] = {}


def start_probes() -> None:
    """Start the GPU probes in the background, first thing, so they run while LLaMA-Factory is imported
    (measured on 2 x H200: the device probe and the all-reduce take ~15 s together, most of it importing
    torch and setting up NCCL in fresh processes). The device probe always starts; the all-reduce across
    every visible GPU only where a GPU device node exists. Idempotent."""
    if testhooks.injected_probes():  # a test replaced the probes (rocmft.testhooks; never in production)
        return
    _device_probe()
    if "allreduce" not in _probes and gpu_node_present():
        _probes["allreduce"] = ProbeProcess(["allreduce", "all", str(ALLREDUCE_MIB)], ALLREDUCE_TIMEOUT_S)


def probe_devices_raw() -> dict:
    """The device probe's JSON (:mod:`rocmft.facts.probe`, run once per process in a child process, hard timeout).

    On a probe failure: ``{"error": ..., "timed_out": ...}`` — the ``gpu-runtime`` check reports it.
    """
    injected = testhooks.injected_probes()
    if "devices" in injected:
        return injected["devices"]
    return _device_probe().result()


def _device_probe() -> ProbeProcess:
    """The device probe of this process: started once, by whichever asks first."""
    if "devices" not in _probes:
        _probes["devices"] = ProbeProcess(["devices"], PROBE_TIMEOUT_S)
    return _probes["devices"]


def allreduce_probe(world: int) -> dict:
    """The all-reduce probe's JSON across ``world`` local GPUs: the one :func:`start_probes` started when it
    covers every visible GPU, else a new one (hard timeout ALLREDUCE_TIMEOUT_S)."""
    injected = testhooks.injected_probes()
    if "allreduce" in injected:
        return injected["allreduce"]
    early = _probes.get("allreduce")
    if early is not None:
        result = early.result()
        if result.get("world_size") == world or "error" in result:
            return result
    return ProbeProcess(["allreduce", str(world), str(ALLREDUCE_MIB)], ALLREDUCE_TIMEOUT_S).result()


# gfx targets that are integrated GPUs sharing system memory, for probe records without ``integrated`` (written
# before it existed): the Ryzen APUs of RDNA 3.5 (ROCm's "AMD RDNA3.5 system optimization", gfx1150/1151/1152).
# MI300A shares gfx942 with the discrete MI300X and is told apart by its name ("AMD Instinct MI300A").
APU_TARGETS = ("gfx1150", "gfx1151", "gfx1152")


@dataclass(frozen=True)
class MemoryBudget:
    """The GPU memory one GPU's training process may plan with, GiB: ``total_gib`` its capacity (the planner's),
    ``free_gib`` what is free now (the memory-fit check's); ``source`` says where they come from, in words."""

    total_gib: float
    free_gib: float
    source: str


def is_unified(gpu: dict) -> bool:
    """Whether the probe's GPU record is an integrated GPU whose memory is system memory: torch's is_integrated
    where recorded, else its gfx target (:data:`APU_TARGETS`) or an MI300A name."""
    if "integrated" in gpu:
        return bool(gpu["integrated"])
    return str(gpu.get("arch", "")).split(":")[0] in APU_TARGETS or "MI300A" in str(gpu.get("name", ""))


def unified_memory(pci: str | None, root: Path = Path("/")) -> dict:
    """What an integrated GPU may use of the system memory it shares (rocmft.records.UnifiedMemory), GiB.

    ``mem_total_gib``/``mem_available_gib`` from psutil (MemTotal/MemAvailable of /proc/meminfo; read from
    ``root``/proc/meminfo when ``root`` is not /, for tests). ``gtt_total_gib``/``gtt_used_gib`` from amdgpu's
    ``mem_info_gtt_total``/``mem_info_gtt_used`` (bytes, one integer; drivers/gpu/drm/amd/amdgpu/amdgpu_gtt_mgr.c,
    "DOC: mem_info_gtt_total") under ``root``/sys/bus/pci/devices/``pci``/; left out when absent. GTT is the system
    memory the driver maps into GPU address spaces for user processes, "the memory pool used by applications such
    as PyTorch" (ROCm docs, how-to/system-optimization/strixhalo.html); it is set by amdgpu.gttsize or
    ttm.pages_limit and defaults to half the system memory (Linux commit f7ba887f606b, "drm/amdgpu: Adjust logic
    around GTT size"). Never raises: an unreadable file is left out.
    """
    out: dict[str, float] = {}
    if root == Path("/"):
        import psutil

        memory = psutil.virtual_memory()
        out["mem_total_gib"] = round(memory.total / 2**30, 2)
        out["mem_available_gib"] = round(memory.available / 2**30, 2)
    else:
        meminfo = _meminfo(root / "proc/meminfo")
        for key, name in (("MemTotal", "mem_total_gib"), ("MemAvailable", "mem_available_gib")):
            if key in meminfo:
                out[name] = round(meminfo[key] / 2**30, 2)
    if pci:
        device = root / "sys/bus/pci/devices" / pci
        for name in ("gtt_total", "gtt_used"):
            try:
                value = int((device / f"mem_info_{name}").read_text().strip())
            except (OSError, ValueError):  # no such file (an older driver, not amdgpu) or unreadable
                continue
            out[f"{name}_gib"] = round(value / 2**30, 2)
    return out


def _meminfo(path: Path) -> dict[str, int]:
    """/proc/meminfo's ``Key:   N kB`` lines as bytes (proc(5)); {} when unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and (number := whole_number(fields[0])) is not None:
            out[key.strip()] = number * (1024 if fields[1:2] == ["kB"] else 1)
    return out


def memory_budget(gpu: dict) -> MemoryBudget:
    """The memory a training process on this GPU (a probe record, rocmft.records.GpuRecord) may plan with: the one
    rule for every consumer (the planner through :func:`facts_from_probe`, the memory-fit check).

    A discrete GPU: torch.cuda.mem_get_info's total and free. An integrated GPU (:func:`is_unified`: MI300A,
    gfx1150/1151/1152) has no memory of its own: mem_get_info reports the BIOS carve-out (a few hundred MiB up to
    what the BIOS reserves) or all of the system memory, neither of which a run can fill. There the budget is the
    system memory not in use (MemAvailable: the OS, the entrypoint and the data loaders share the same memory),
    capped by the GTT pool the driver lets GPU processes map (free: GTT total - GTT used; total: GTT total)::

        total = min(MemAvailable, GTT total)    free = min(MemAvailable, GTT total - GTT used)

    (the GTT terms only where amdgpu reports them). Sources: kernel commit "drm/amdkfd: Let VRAM allocations go
    to GTT domain on small APUs" (the "MI300A approach": device allocations come from GTT); "drm/amdgpu: cap GTT
    size to physical RAM on APUs" (GTT can be set larger than the memory behind it, hence the min); LLNL's El
    Capitan memory guide (MI300A: 128 GB of HBM3 shared with the OS, ~118 GB safe per APU in SPX mode). An APU
    record without ``unified_memory`` (an older probe) keeps torch's numbers, and says so in ``source``.
    """
    total, free = float(gpu["total_gib"]), float(gpu["free_gib"])
    if not is_unified(gpu):
        return MemoryBudget(total, free, "torch.cuda.mem_get_info")
    shared = gpu.get("unified_memory") or {}
    available = shared.get("mem_available_gib")
    if available is None:
        return MemoryBudget(total, free, "torch.cuda.mem_get_info (an APU, but no system memory was recorded)")
    gtt_total = shared.get("gtt_total_gib")
    if gtt_total is None:
        return MemoryBudget(available, available, f"system memory available ({available:.1f} GiB; no GTT size)")
    gtt_free = max(gtt_total - shared.get("gtt_used_gib", 0.0), 0.0)
    return MemoryBudget(round(min(available, gtt_total), 2), round(min(available, gtt_free), 2),
                        f"unified memory: min(system memory available {available:.1f} GiB, "
                        f"GTT {gtt_free:.1f} of {gtt_total:.1f} GiB free)")  # fmt: skip


def facts_from_probe(raw: dict) -> DeviceFacts:
    """:class:`DeviceFacts` from the device probe's JSON; a failed probe reads as no usable GPU."""
    gpus = raw.get("gpus", [])
    return DeviceFacts(
        backend=raw.get("backend", "cpu") if gpus or "error" not in raw else "cpu",
        count=len(gpus),
        names=[g["name"] for g in gpus],
        archs=[g["arch"] for g in gpus],
        memory_gib=[memory_budget(g).total_gib for g in gpus],
        bf16=bool(gpus) and all(g["bf16"] for g in gpus),
        torch_version=raw.get("torch", ""),
        hip_version=raw.get("hip"),
        cuda_version=raw.get("cuda"),
    )


def probe_device() -> DeviceFacts:
    """The visible accelerators, probed in a child process: the entrypoint never opens a GPU context itself
    (it would hold memory on GPU 0 for the whole run, beside the training processes)."""
    return facts_from_probe(probe_devices_raw())
