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


@functools.lru_cache(maxsize=1)
def probe_device() -> DeviceFacts:
    """Probe the visible accelerators once per process (importing torch takes ~2 s)."""
    import torch

    hip = getattr(torch.version, "hip", None)
    common = {"torch_version": torch.__version__, "hip_version": hip, "cuda_version": torch.version.cuda}
    if not torch.cuda.is_available():
        return DeviceFacts(backend="cpu", **common)
    count = torch.cuda.device_count()
    names, archs, memory = [], [], []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        names.append(props.name)
        # gcnArchName is the gfx target on ROCm; CUDA builds of torch fill it with the marketing name
        archs.append(props.gcnArchName if hip else f"sm_{props.major}{props.minor}")
        memory.append(round(props.total_memory / 2**30, 1))
    return DeviceFacts(
        backend="rocm" if hip else "cuda",
        count=count,
        names=names,
        archs=archs,
        memory_gib=memory,
        bf16=bool(torch.cuda.is_bf16_supported()),
        **common,
    )
