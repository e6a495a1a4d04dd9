"""What accelerator this process sees, through vendor-neutral torch.

ROCm builds of torch expose AMD GPUs through the ``torch.cuda`` API; ``torch.version.hip`` tells them
apart from CUDA builds. Everything here is read, nothing is changed.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class DeviceFacts:
    """The accelerators visible to this process.

    Attributes:
        backend: ``"rocm"`` (torch built for HIP), ``"cuda"``, or ``"cpu"`` (no GPU visible).
        count: number of visible GPUs (honours HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES), 0 on CPU.
        names: each GPU's marketing name, e.g. ``"AMD Instinct MI300X"``.
        archs: each GPU's gfx target on ROCm (``gcnArchName``, e.g. ``"gfx942:sramecc+:xnack-"``), or its
            compute capability on CUDA (``"sm_90"``).
        memory_gib: each GPU's total memory in GiB.
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


@functools.lru_cache(maxsize=1)
def probe_devices_raw() -> dict:
    """The device probe's JSON (:mod:`rocmft.probe`, run once per process in a child process, hard timeout).

    On a probe failure: ``{"error": ..., "timed_out": ...}`` — the ``gpu-runtime`` check reports it.
    """
    from .probe import run_probe

    return run_probe(["devices"], PROBE_TIMEOUT_S)


def facts_from_probe(raw: dict) -> DeviceFacts:
    """:class:`DeviceFacts` from the device probe's JSON; a failed probe reads as no usable GPU."""
    gpus = raw.get("gpus", [])
    return DeviceFacts(
        backend=raw.get("backend", "cpu") if gpus or "error" not in raw else "cpu",
        count=len(gpus),
        names=[g["name"] for g in gpus],
        archs=[g["arch"] for g in gpus],
        memory_gib=[g["total_gib"] for g in gpus],
        bf16=bool(gpus) and all(g["bf16"] for g in gpus),
        torch_version=raw.get("torch", ""),
        hip_version=raw.get("hip"),
        cuda_version=raw.get("cuda"),
    )


def probe_device() -> DeviceFacts:
    """The visible accelerators, probed in a child process: the entrypoint never opens a GPU context itself
    (it would hold memory on GPU 0 for the whole run, beside the training processes)."""
    return facts_from_probe(probe_devices_raw())
