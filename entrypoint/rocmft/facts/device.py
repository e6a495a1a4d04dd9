"""What accelerator this process sees, through vendor-neutral torch.

ROCm builds of torch expose AMD GPUs through the ``torch.cuda`` API; ``torch.version.hip`` tells them
apart from CUDA builds. Everything here is read, nothing is changed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rocmft.proc import kill_group
from rocmft.records import read_probe_line


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
ALLREDUCE_MIB = 256  # large enough to measure bandwidth, not latency (nccl-tests reach their plateau by then)
ALLREDUCE_TIMEOUT_S = 90
# Device nodes whose presence means a GPU may be visible: worth starting the all-reduce probe early.
GPU_NODES = ("/dev/kfd", "/dev/nvidiactl")


class ProbeProcess:
    """``python -m rocmft.facts.probe ARGS`` running in the background, in its own process group, with a deadline.

    Output goes to temporary files, not pipes, so nothing needs reading while it runs (no thread: the
    validation step forks, and forking a process with live threads is unsafe). :meth:`result` waits until
    the deadline (``timeout_s`` after the start), then kills the whole group (no child is left holding a
    GPU). Probes still running when the entrypoint exits are killed (atexit).
    """

    def __init__(self, args: list[str], timeout_s: float) -> None:
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


def run_probe(args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``python -m rocmft.facts.probe ARGS`` to the end with a hard timeout (see :class:`ProbeProcess`)."""
    return ProbeProcess(args, timeout_s).result()


_probes: dict[str, ProbeProcess] = {}
# TEST ONLY (RocmftSettings.test_probes): a JSON file of recorded probe results that replace the probes, read
# here because the probes start before the settings are read.
TEST_PROBES_VARIABLE = "ROCMFT_TEST_PROBES"


def injected_probes() -> dict:
    """The probe results of ROCMFT_TEST_PROBES (a test hook; ``{}`` unless the variable is set).

    Raises:
        ConfigError: the file cannot be read or is not a JSON object.
    """
    import json
    import os
    from pathlib import Path

    from rocmft.errors import ConfigError

    path = os.environ.get(TEST_PROBES_VARIABLE)
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{TEST_PROBES_VARIABLE}={path} cannot be read as JSON: {err}.",
            f"Unset {TEST_PROBES_VARIABLE} (a test hook), or point it at a JSON object.",
        ) from err
    if not isinstance(data, dict):
        raise ConfigError(f"{TEST_PROBES_VARIABLE}={path} is not a JSON object.", "Give probe id: result pairs.")
    return data


def start_probes() -> None:
    """Start the GPU probes in the background, first thing, so they run while LLaMA-Factory is imported
    (measured on 2 x H200: the device probe and the all-reduce take ~15 s together, most of it importing
    torch and setting up NCCL in fresh processes). The device probe always starts; the all-reduce across
    every visible GPU only where a GPU device node exists. Idempotent."""
    from pathlib import Path

    if injected_probes():
        return
    _device_probe()
    if "allreduce" not in _probes and any(Path(node).exists() for node in GPU_NODES):
        _probes["allreduce"] = ProbeProcess(["allreduce", "all", str(ALLREDUCE_MIB)], ALLREDUCE_TIMEOUT_S)


def probe_devices_raw() -> dict:
    """The device probe's JSON (:mod:`rocmft.facts.probe`, run once per process in a child process, hard timeout).

    On a probe failure: ``{"error": ..., "timed_out": ...}`` — the ``gpu-runtime`` check reports it.
    """
    injected = injected_probes()
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
    injected = injected_probes()
    if "allreduce" in injected:
        return injected["allreduce"]
    early = _probes.get("allreduce")
    if early is not None:
        result = early.result()
        if result.get("world_size") == world or "error" in result:
            return result
    return ProbeProcess(["allreduce", str(world), str(ALLREDUCE_MIB)], ALLREDUCE_TIMEOUT_S).result()


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
