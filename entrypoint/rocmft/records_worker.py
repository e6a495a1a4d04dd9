"""The records between the entrypoint and the worker process: ``run.json``, which render writes and the worker
reads (:class:`RunPolicy`), and ``worker-result.json``, which the worker writes and the command line, the launcher
and the report read (:class:`WorkerResult`). Re-exported by :mod:`rocmft.records` (the table of every record)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from rocmft.fsutil import atomic_write_json
from rocmft.records_common import VERSION, RunStatus, _json_object

RESULT_FILE = "worker-result.json"  # OUTPUT_DIR/rocmft/: written by the worker, read by the entrypoint
RUN_POLICY_FILE = "run.json"  # OUTPUT_DIR/rocmft/: written by render, read by the worker


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


def load_worker_result(run_dir: Path) -> WorkerResult:
    """The worker's record in RUN_DIR, for a reader that says why there is none (``rocmft status``).

    Raises:
        OSError: no file (FileNotFoundError: the worker did not start training) or one that cannot be read.
        ValueError: not JSON (cut short, say), not a JSON object, or not a worker record (the reason in its text).
    """
    return WorkerResult.from_json(_json_object(worker_result_path(run_dir).read_text(), RESULT_FILE))


def read_worker_result(run_dir: Path) -> WorkerResult | None:
    """The worker's record in RUN_DIR; None when there is none: no file (the worker did not start training),
    one that cannot be read, or one that is not a worker record."""
    try:
        return load_worker_result(run_dir)
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
        fault_grad_spike_at_step, fault_hang_at_step: the test-only fault injections (rocmft.testhooks, installed
            by the tests' launcher only; steps, seconds), None when off, as always in production.
        loss_spike_factor: ROCMFT_LOSS_SPIKE_FACTOR (0 or None: no spike watchdog).
        grad_norm_spike_factor, grad_norm_limit, on_grad_norm_spike: the gradient-norm watchdog's
            ROCMFT_GRAD_NORM_SPIKE_FACTOR, ROCMFT_GRAD_NORM_LIMIT (0 or None: off) and ROCMFT_ON_GRAD_NORM_SPIKE.
        peer_timeout_s: ROCMFT_PEER_TIMEOUT_S, the lost-node watch of multi-node runs (rocmft.worker.peers).
        collectives: ROCMFT_COLLECTIVES (``safe``: the launch added RCCL's fallbacks; the hang fault spares it).
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
    fault_hang_at_step: int | None = None
    loss_spike_factor: float | None = None
    grad_norm_spike_factor: float | None = None
    grad_norm_limit: float | None = None
    on_grad_norm_spike: str = "warn"
    peer_timeout_s: float | None = None
    collectives: str = "default"
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
                "fault_hang_at_step": self.fault_hang_at_step,
                "loss_spike_factor": self.loss_spike_factor, "grad_norm_spike_factor": self.grad_norm_spike_factor,
                "grad_norm_limit": self.grad_norm_limit, "on_grad_norm_spike": self.on_grad_norm_spike,
                "peer_timeout_s": self.peer_timeout_s, "collectives": self.collectives,
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


__all__ = [
    "RESULT_FILE",
    "RUN_POLICY_FILE",
    "LossRecord",
    "NonFinite",
    "PrecisionRecord",
    "RunPolicy",
    "WorkerResult",
    "read_run_policy",
    "read_worker_result",
    "worker_result_path",
    "write_worker_result",
]
