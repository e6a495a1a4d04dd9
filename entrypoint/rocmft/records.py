"""Records that cross a process boundary: the files and lines one rocmft process writes and another reads.

==========================  ==========================================  =========================================
record                      writer                                      reader
==========================  ==========================================  =========================================
RUN_DIR/worker-result.json  the worker (:func:`write_worker_result`)    :func:`read_worker_result` (cli, launch,
                                                                        report; the manifest embeds it)
RUN_DIR/run.json            render (:meth:`RunPolicy.to_json`)          the worker (:func:`read_run_policy`)
parser child's stdin lines  :class:`rocmft.validate.Validator`          the child (:meth:`ParseRequest.from_line`,
                            (:meth:`ParseRequest.to_line`,              :meth:`TrainOrder.from_line`)
                            :meth:`TrainOrder.to_line`)
parser child's result.json  the child (:meth:`ParseResult.write`)       the parent (:func:`read_parse_result`)
probe child's stdout line   the probe (:func:`probe_line`)              the parent (:func:`read_probe_line`)
==========================  ==========================================  =========================================

Each carries ``version`` (:data:`VERSION`, the layout's number; a record without one has the layout of version 1,
written before the field existed; readers read any version by the keys they know). JSON keys are the ones
rocmft 0.1.0 wrote. Statuses and causes are one vocabulary, :class:`RunStatus`. Nothing of rocmft is imported
here but the ground floor.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from rocmft.errors import ExitCode
from rocmft.fsutil import atomic_write_json

VERSION = 1  # of every record's layout below
RESULT_FILE = "worker-result.json"  # OUTPUT_DIR/rocmft/: written by the worker, read by the entrypoint
RUN_POLICY_FILE = "run.json"  # OUTPUT_DIR/rocmft/: written by render, read by the worker


class RunStatus(str, enum.Enum):
    """How a run (the manifest's ``status``) or its worker (worker-result.json's ``status``) stands, and what
    stopped a diverging one (``non_finite.cause``, the restart's ``cause``). The value is the word written.

    The manifest says one of RUNNING, FINISHED, NON_FINITE_LOSS (exit 5, a loss spike included), INTERRUPTED,
    FAILED (:func:`run_status`). The worker also says LOSS_SPIKE, and ``"stopping (<why>)"`` /
    ``"interrupted (<why>)"`` (:func:`with_reason`).
    """

    RUNNING = "running"
    FINISHED = "finished"
    NON_FINITE_LOSS = "non-finite loss"  # the loss or the gradient norm is NaN/Inf
    LOSS_SPIKE = "loss spike"  # the loss jumped above ROCMFT_LOSS_SPIKE_FACTOR x its recent median
    GRAD_NORM_SPIKE = "grad-norm spike"  # ROCMFT_GRAD_NORM_SPIKE_FACTOR / ROCMFT_GRAD_NORM_LIMIT, with ..._SPIKE=stop
    STOPPING = "stopping"
    INTERRUPTED = "interrupted"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__  # f"{RunStatus.FINISHED}" is "finished" on every Python


def with_reason(status: RunStatus, why: str) -> str:
    """``"<status> (<why>)"``: the worker's ``stopping (SIGTERM)``, ``interrupted (SIGINT)``."""
    return f"{status.value} ({why})"


def run_status(code: int) -> RunStatus:
    """The manifest's status for the worker's exit ``code`` (an :class:`~rocmft.errors.ExitCode` value)."""
    return {ExitCode.OK: RunStatus.FINISHED, ExitCode.NON_FINITE_LOSS: RunStatus.NON_FINITE_LOSS,
            ExitCode.INTERRUPTED: RunStatus.INTERRUPTED}.get(code, RunStatus.FAILED)  # fmt: skip


def _json_object(text: str, what: str) -> dict[str, Any]:
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{what} is not a JSON object")
    return data


# ---------------------------------------------------------------------------------------------- worker-result.json


@dataclass(frozen=True)
class LossRecord:
    """One logged training step: ``step`` (optimizer steps), ``loss`` (the trainer's logged loss, nats);
    on a GPU ``gpu_memory_gib`` (``torch.cuda.memory_allocated``) and ``peak_gpu_memory_gib``
    (``max_memory_allocated``), GiB, of rank 0."""

    step: int
    loss: float
    gpu_memory_gib: float | None = None
    peak_gpu_memory_gib: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"step", "loss"}``, plus the memory keys when measured."""
        data: dict[str, Any] = {"step": self.step, "loss": self.loss}
        for key in ("gpu_memory_gib", "peak_gpu_memory_gib"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LossRecord:
        """Raises KeyError without ``step`` or ``loss``."""
        return cls(data["step"], data["loss"], data.get("gpu_memory_gib"), data.get("peak_gpu_memory_gib"))


@dataclass(frozen=True)
class NonFinite:
    """What stopped a diverging run: at optimizer ``step`` the logged ``key`` (``loss`` or ``grad_norm``) was
    ``value`` (its ``str()``: ``"nan"``, ``"inf"``, or the spiking loss); for a spike, ``median`` of the recent
    logged values (for a norm above ROCMFT_GRAD_NORM_LIMIT, the limit). ``cause``: :attr:`RunStatus.NON_FINITE_LOSS`,
    :attr:`RunStatus.LOSS_SPIKE` or :attr:`RunStatus.GRAD_NORM_SPIKE`."""

    step: int
    key: str
    value: str
    median: float | None = None
    cause: str = RunStatus.NON_FINITE_LOSS.value

    def to_json(self) -> dict[str, Any]:
        """``{"step", "key", "value"}``, plus ``median`` and ``cause`` for a spike (a record without ``cause``
        is a non-finite loss)."""
        data: dict[str, Any] = {"step": self.step, "key": self.key, "value": self.value}
        if self.median is not None:
            data["median"] = self.median
        if self.cause != RunStatus.NON_FINITE_LOSS:
            data["cause"] = self.cause
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NonFinite:
        """Raises KeyError without ``step``, ``key`` or ``value``."""
        cause = data.get("cause", RunStatus.NON_FINITE_LOSS.value)
        return cls(data["step"], data["key"], data["value"], data.get("median"), cause)


@dataclass(frozen=True)
class WorkerResult:
    """``RUN_DIR/worker-result.json``: what one node's worker did, rewritten (atomically) at train start, at each
    logging step and at the end by each node's local rank 0.

    Attributes:
        status: a :class:`RunStatus` word, or ``stopping (<why>)`` / ``interrupted (<why>)``; None in a record
            that has none.
        losses: the logged steps, oldest first.
        parameter_dtypes, trainable_dtypes: dtype name -> number of parameter tensors (all / trainable), at train
            start.
        max_steps: optimizer steps the trainer plans; world_size: ranks of the job.
        stopped_at_step: the step a graceful stop (SIGTERM/SIGINT here or on another rank) saved a checkpoint at.
        non_finite: what stopped a diverging run.
        peak_gpu_memory_gib: ``torch.cuda.max_memory_allocated()`` of this rank, GiB (GPU runs only).
        last_step: the last optimizer step reached; tokens_seen: the trainer's ``num_input_tokens_seen``.
        elapsed_s: seconds since the callback was made (wall clock).
        error: ``"<exception type>: <message>"`` when training raised.
        attention: for neat-packed rows, the attention measured and chosen (rocmft.worker.attention.choose).
        quantization: for a quantized base (QLoRA), what the loaded model holds (rocmft.worker.callbacks).
        extra: keys of a record this layout does not name, kept as they were.

    The JSON object holds the keys in the order they were first set (:meth:`updated`): the record reads back
    byte for byte as it was written.
    """

    version: int = VERSION
    status: str | None = None
    losses: tuple[LossRecord, ...] = ()
    parameter_dtypes: dict[str, int] | None = None
    trainable_dtypes: dict[str, int] | None = None
    max_steps: int | None = None
    world_size: int | None = None
    stopped_at_step: int | None = None
    non_finite: NonFinite | None = None
    peak_gpu_memory_gib: float | None = None
    last_step: int | None = None
    tokens_seen: int | None = None
    elapsed_s: float | None = None
    error: str | None = None
    attention: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    keys: tuple[str, ...] = field(default=("version",), repr=False, compare=False)  # the JSON keys, in order

    @classmethod
    def start(cls) -> WorkerResult:
        """The record of a worker that has not trained yet: status ``running``, no losses."""
        return cls(status=RunStatus.RUNNING.value, keys=("version", "status", "losses"))

    def updated(self, **changes: Any) -> WorkerResult:
        """A copy with ``changes`` (field names); a key set for the first time goes last in the JSON object."""
        changes = {k: (v.value if isinstance(v, RunStatus) else v) for k, v in changes.items()}
        added = tuple(k for k in changes if k not in self.keys)
        return dataclasses.replace(self, **changes, keys=self.keys + added)

    def with_loss(self, entry: LossRecord) -> WorkerResult:
        """A copy with ``entry`` logged after the others."""
        return self.updated(losses=(*self.losses, entry))

    def loss_dicts(self) -> list[dict[str, Any]]:
        """The logged steps as JSON objects (rocmft.render.resume.last_good_checkpoint reads ``step``)."""
        return [entry.to_json() for entry in self.losses]

    def to_json(self) -> dict[str, Any]:
        """The JSON object (keys in first-set order; see the class docstring)."""
        data: dict[str, Any] = {}
        for key in self.keys:
            if key in self.extra:
                data[key] = self.extra[key]
                continue
            value = getattr(self, key)
            if key == "losses":
                value = [entry.to_json() for entry in value]
            elif key == "non_finite" and value is not None:
                value = value.to_json()
            data[key] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerResult:
        """The record of a JSON object.

        Raises:
            ValueError: ``losses`` or ``non_finite`` is not of the shape above.
        """
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "keys"}
        values: dict[str, Any] = {"version": 1}
        extra = {}
        try:
            for key, value in data.items():
                if key == "losses":
                    value = tuple(LossRecord.from_json(entry) for entry in value or [])
                elif key == "non_finite" and value is not None:
                    value = NonFinite.from_json(value)
                if key in names:
                    values[key] = value
                else:
                    extra[key] = value
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a worker record: {type(err).__name__}: {err}") from err
        return cls(**values, extra=extra, keys=tuple(data))


def worker_result_path(run_dir: Path) -> Path:
    """``RUN_DIR/worker-result.json``."""
    return Path(run_dir) / RESULT_FILE


def write_worker_result(run_dir: Path, result: WorkerResult) -> Path:
    """Write ``result`` to ``RUN_DIR/worker-result.json`` atomically (a reader never sees half a record); returns
    the path. Raises OSError when RUN_DIR cannot be written."""
    return atomic_write_json(worker_result_path(run_dir), result.to_json())


def read_worker_result(run_dir: Path) -> WorkerResult | None:
    """The worker's record in RUN_DIR; None when there is none: no file (the worker did not start training),
    one that cannot be read, or one that is not a worker record."""
    try:
        return WorkerResult.from_json(_json_object(worker_result_path(run_dir).read_text(), RESULT_FILE))
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------------------- run.json


class PrecisionRecord(TypedDict):
    """rocmft.render.precision.Precision as JSON: ``policy`` (bf16, fp16, fp32), ``compute_dtype`` (the torch
    dtype name the weights load in), ``bf16``/``fp16`` (the trainer's flags), ``reason``."""

    policy: str
    compute_dtype: str
    bf16: bool
    fp16: bool
    reason: str


@dataclass(frozen=True)
class RunPolicy:
    """``RUN_DIR/run.json``: what the worker needs beyond train.yaml.

    Attributes:
        rocmft_version: the rocmft that rendered the run.
        precision: the resolved precision; ``precision["policy"] == "fp32"`` makes the worker force float32 weights.
        distributed: ROCMFT_DISTRIBUTED; launcher: ``python`` or ``torchrun``.
        fault_nan_at_step, fault_kill_in_save_at_step, fault_slow_final_save_s,
        fault_grad_spike_at_step: the test-only fault injections (rocmft.testhooks, installed by the tests'
            launcher only; steps, seconds), None when off, as always in production.
        loss_spike_factor: ROCMFT_LOSS_SPIKE_FACTOR (0 or None: no spike watchdog).
        grad_norm_spike_factor, grad_norm_limit, on_grad_norm_spike: the gradient-norm watchdog's
            ROCMFT_GRAD_NORM_SPIKE_FACTOR, ROCMFT_GRAD_NORM_LIMIT (0 or None: off) and ROCMFT_ON_GRAD_NORM_SPIKE.
        peer_timeout_s: ROCMFT_PEER_TIMEOUT_S, the lost-node watch of multi-node runs (rocmft.worker.peers).
        demo: whether this is the built-in demo run.
        packed_attention, sample_tokens: the planner's ``varlen`` for neat-packed rows (rocmft.worker.attention)
            and the mean sample length it planned with (tokens); None when not planned.
    """

    precision: PrecisionRecord
    rocmft_version: str = ""
    distributed: str | None = None
    launcher: str | None = None
    fault_nan_at_step: int | None = None
    fault_kill_in_save_at_step: int | None = None
    fault_slow_final_save_s: float | None = None
    fault_grad_spike_at_step: int | None = None
    loss_spike_factor: float | None = None
    grad_norm_spike_factor: float | None = None
    grad_norm_limit: float | None = None
    on_grad_norm_spike: str = "warn"
    peer_timeout_s: float | None = None
    demo: bool = False
    packed_attention: str | None = None
    sample_tokens: float | None = None
    version: int = VERSION

    @property
    def precision_policy(self) -> str:
        """``bf16``, ``fp16`` or ``fp32``."""
        return self.precision["policy"]

    def to_json(self) -> dict[str, Any]:
        """The JSON object of run.json (the writer: rocmft.render.worker_policy)."""
        return {"version": self.version, "rocmft_version": self.rocmft_version, "precision": dict(self.precision),
                "distributed": self.distributed, "launcher": self.launcher,
                "fault_nan_at_step": self.fault_nan_at_step,
                "fault_kill_in_save_at_step": self.fault_kill_in_save_at_step,
                "fault_slow_final_save_s": self.fault_slow_final_save_s,
                "fault_grad_spike_at_step": self.fault_grad_spike_at_step,
                "loss_spike_factor": self.loss_spike_factor, "grad_norm_spike_factor": self.grad_norm_spike_factor,
                "grad_norm_limit": self.grad_norm_limit, "on_grad_norm_spike": self.on_grad_norm_spike,
                "peer_timeout_s": self.peer_timeout_s,
                "demo": self.demo,
                "packed_attention": self.packed_attention, "sample_tokens": self.sample_tokens}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunPolicy:
        """Raises ValueError without a ``precision`` object holding ``policy``."""
        precision = data.get("precision")
        if not isinstance(precision, dict) or "policy" not in precision:
            raise ValueError(f"{RUN_POLICY_FILE} has no precision policy")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def read_run_policy(run_dir: Path) -> RunPolicy:
    """The run policy of RUN_DIR (``run.json``).

    Raises:
        OSError: the file cannot be read (the run was not rendered there).
        ValueError: it is not JSON, or has no precision policy.
    """
    return RunPolicy.from_json(_json_object((Path(run_dir) / RUN_POLICY_FILE).read_text(), RUN_POLICY_FILE))


# ------------------------------------------------------------------------------------ the parser child's protocol


@dataclass(frozen=True)
class ParseRequest:
    """The parser child's first stdin line: parse ``arguments`` (train.yaml's mapping) with ``environ`` (added to
    the child's environment first: torchrun's rank-0 variables for a torchrun launch)."""

    arguments: Mapping[str, Any]
    environ: Mapping[str, str] = field(default_factory=dict)
    version: int = VERSION

    def to_line(self) -> str:
        """One JSON line ``{version, arguments, environ}`` (newline included)."""
        data = {"version": self.version, "arguments": dict(self.arguments), "environ": dict(self.environ)}
        return json.dumps(data) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ParseRequest:
        """Raises ValueError: not JSON, or without ``arguments``."""
        data = _json_object(line, "the parse request")
        if "arguments" not in data:
            raise ValueError("the parse request has no arguments")
        return cls(data["arguments"], data.get("environ") or {}, data.get("version", 1))


@dataclass(frozen=True)
class TrainOrder:
    """The parser child's second stdin line: become the worker of ``run_dir`` (RUN_DIR), with ``environ`` added
    to its environment (secrets included: this line is the only place they travel, never a file)."""

    run_dir: str
    environ: Mapping[str, str] = field(default_factory=dict)
    version: int = VERSION

    def to_line(self) -> str:
        """One JSON line ``{version, train: RUN_DIR, environ}`` (newline included)."""
        return json.dumps({"version": self.version, "train": self.run_dir, "environ": dict(self.environ)}) + "\n"

    @classmethod
    def from_line(cls, line: str) -> TrainOrder:
        """Raises ValueError: not JSON, or without ``train``."""
        data = _json_object(line, "the train order")
        if "train" not in data:
            raise ValueError("the train order names no run folder")
        return cls(data["train"], data.get("environ") or {}, data.get("version", 1))


@dataclass(frozen=True)
class ParseResult:
    """The parser child's ``result.json``: LLaMA-Factory's verdict on one configuration.

    Attributes:
        ok: whether ``get_train_args`` accepted it.
        world_size, parallel_mode, compute_dtype: what the parser derived (``ok`` only; the dtype before rocmft's
            precision policy, e.g. ``torch.bfloat16`` or ``None``).
        type, error: the exception's type name and message (not ``ok``).
        llamafactory: the installed LLaMA-Factory's version, when known.
        seconds: the parse, s; import_s: the child's LLaMA-Factory import, s.

    Also readable as a mapping (``result["ok"]``), the JSON object's keys.
    """

    ok: bool
    world_size: int | None = None
    parallel_mode: str | None = None
    compute_dtype: str | None = None
    type: str | None = None
    error: str | None = None
    llamafactory: str | None = None
    seconds: float = 0.0
    import_s: float = 0.0
    version: int = VERSION

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (keys that are None left out)."""
        data = {"version": self.version, **dataclasses.asdict(self)}
        return {k: v for k, v in data.items() if v is not None}

    def write(self, path: Path) -> Path:
        """Write it to ``path`` atomically (the parent polls for the file: never a half-written one)."""
        return atomic_write_json(Path(path), self.to_json())


def read_parse_result(path: Path) -> ParseResult | None:
    """The parser child's result at ``path``; None when it has not written one (it died first).

    Raises:
        ValueError: the file is not a parse result.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    data = _json_object(text, "the parse result")
    known = {f.name for f in dataclasses.fields(ParseResult)}
    try:
        return ParseResult(**{k: v for k, v in data.items() if k in known})
    except TypeError as err:  # no "ok"
        raise ValueError(f"not a parse result: {err}") from err


# ----------------------------------------------------------------------------------------- the probe child's line


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


PROBES = ("devices", "allreduce", "libs")


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
    "RESULT_FILE",
    "RUN_POLICY_FILE",
    "VERSION",
    "AllreduceProbe",
    "DevicesProbe",
    "GemmRecord",
    "GpuRecord",
    "LibProbe",
    "LossRecord",
    "NonFinite",
    "ParseRequest",
    "ParseResult",
    "PrecisionRecord",
    "RunPolicy",
    "RunStatus",
    "TrainOrder",
    "WorkerResult",
    "probe_line",
    "read_parse_result",
    "read_probe_line",
    "read_run_policy",
    "read_worker_result",
    "run_status",
    "with_reason",
    "worker_result_path",
    "write_worker_result",
]
