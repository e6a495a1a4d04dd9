"""The records between the entrypoint and the worker process: ``run.json``, which render writes and the worker
reads (:class:`RunPolicy`), and ``worker-result.json`` with its ``losses.jsonl``, which the worker writes
(:class:`WorkerResultWriter`) and the command line, the launcher and the report read (:class:`WorkerResult`).
Re-exported by :mod:`rocmft.records` (the table of every record)."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from rocmft.fsutil import atomic_write_json, atomic_write_text
from rocmft.records_common import VERSION, RunStatus, _json_object
from rocmft.values import is_count

RESULT_FILE = "worker-result.json"  # OUTPUT_DIR/rocmft/: written by the worker, read by the entrypoint
LOSSES_FILE = "losses.jsonl"  # OUTPUT_DIR/rocmft/, beside RESULT_FILE: the worker's logged steps, one line each
RESULT_VERSION = 2  # worker-result.json's layout: 2 keeps the losses in LOSSES_FILE; 1 (or none) holds them inline
LOGGED_KEY = "losses_logged"  # worker-result.json's key (layout 2): how many lines of LOSSES_FILE the record counts
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
    """``RUN_DIR/worker-result.json`` and ``RUN_DIR/losses.jsonl``: what one node's worker did, written at train
    start, at each logging step and at the end by each node's local rank 0 (:class:`WorkerResultWriter`).

    Layout (``version`` :data:`RESULT_VERSION`, 2): worker-result.json, rewritten atomically at each write, holds
    every key below but the losses; in their place ``losses_logged``, the number of logged steps the record
    accounts for. The steps are the first ``losses_logged`` whole lines of losses.jsonl, one compact JSON object
    (:meth:`LossRecord.to_json`) per line, appended at each logging step (O(1) per step: version 1 rewrote every
    loss at every step, O(n²) over a run); a line that is not a whole record (the last one, torn by a worker
    killed mid-append) is skipped. Version 1 (earlier rocmft; a record without ``version`` is one) holds the
    losses inline, ``"losses": [{...}, ...]``, and still reads. :meth:`to_json` is the whole record with the
    losses inline (the manifest embeds it); :meth:`record_json` is worker-result.json's object.

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

    version: int = RESULT_VERSION
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
        """The JSON object with the losses inline (keys in first-set order; see the class docstring): what the
        manifest embeds. O(number of losses)."""
        return self._json(inline=True)

    def record_json(self) -> dict[str, Any]:
        """worker-result.json's JSON object: :meth:`to_json` with ``losses_logged`` (their number) in the place
        of the losses, which losses.jsonl holds (:class:`WorkerResultWriter`). O(1) in the number of losses."""
        return self._json(inline=False)

    def _json(self, inline: bool) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for key in self.keys:
            if key in self.extra:
                data[key] = self.extra[key]
                continue
            value = getattr(self, key)
            if key == "version" and not inline:
                value = RESULT_VERSION  # the file's layout, whatever the record read was written in
            elif key == "losses" and not inline:
                key, value = LOGGED_KEY, len(value)
            elif key == "losses":
                value = [entry.to_json() for entry in value]
            elif key == "non_finite" and value is not None:
                value = value.to_json()
            data[key] = value
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], losses: Sequence[LossRecord] = ()) -> WorkerResult:
        """The record of a JSON object: the whole one (``losses`` inline, version 1 and :meth:`to_json`), or
        worker-result.json's (:meth:`record_json`), whose steps are the first ``losses_logged`` of ``losses``
        (:func:`read_losses`; fewer when ``losses`` has fewer).

        Raises:
            ValueError: ``losses``, ``losses_logged`` or ``non_finite`` is not of the shape above.
        """
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "keys"}
        values: dict[str, Any] = {"version": 1}
        extra = {}
        keys = []
        try:
            for key, value in data.items():
                if key == LOGGED_KEY and "losses" not in data:
                    key, value = "losses", tuple(losses[: _logged_count(value)])
                elif key == "losses":
                    value = tuple(LossRecord.from_json(entry) for entry in value or [])
                elif key == "non_finite" and value is not None:
                    value = NonFinite.from_json(value)
                if key in names:
                    values[key] = value
                else:
                    extra[key] = value
                keys.append(key)
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a worker record: {type(err).__name__}: {err}") from err
        return cls(**values, extra=extra, keys=tuple(keys))


def _logged_count(value: Any) -> int:
    if not is_count(value):
        raise TypeError(f"{LOGGED_KEY} is {value!r}, not a number of logged steps")
    return value


def _loss_line(entry: LossRecord) -> str:
    return json.dumps(entry.to_json(), ensure_ascii=False, default=str) + "\n"


def worker_result_path(run_dir: Path) -> Path:
    """``RUN_DIR/worker-result.json``."""
    return Path(run_dir) / RESULT_FILE


def losses_path(run_dir: Path) -> Path:
    """``RUN_DIR/losses.jsonl``: the logged steps of the record beside it (:class:`WorkerResult`)."""
    return Path(run_dir) / LOSSES_FILE


class WorkerResultWriter:
    """Writes one worker's record in RUN_DIR as it grows (the layout: :class:`WorkerResult`), in O(1) per logged
    step.

    The first :meth:`write` starts losses.jsonl afresh with the record's losses (a new run, or a resumed one in the
    same OUTPUT_DIR, starts an empty file, as its record starts with no losses: :meth:`WorkerResult.start`). Each
    later one first appends the lines of the steps logged since (flushed), then rewrites worker-result.json
    atomically: a reader never sees the record count a step whose line is missing. The lines are not fsynced: a
    second fsync per logged step cost 4-5 ms on a slow disk (bench/worker_record.py), and after a power loss a
    record that counts lines the file lost reads as fewer losses, which only makes
    rocmft.render.resume.last_good_checkpoint choose an earlier checkpoint. A
    record whose losses are not the ones written plus new ones (fewer, or others) rewrites the file whole.
    Thread-safe (the lost-node watch writes from its own thread: rocmft.worker.peers).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._lock = threading.Lock()
        self._count: int | None = None  # losses in losses.jsonl; None: not written yet
        self._last: LossRecord | None = None  # the last of them
        self._size = 0  # bytes of losses.jsonl: the end of its last whole line

    def write(self, result: WorkerResult) -> Path:
        """Write ``result``: the new loss lines, then the record; returns the record's path.

        Raises:
            OSError: RUN_DIR cannot be written (the line or the record; a torn line is cut off at the next write).
        """
        with self._lock:
            self._write_losses(result.losses)
            return atomic_write_json(worker_result_path(self.run_dir), result.record_json())

    def _write_losses(self, losses: tuple[LossRecord, ...]) -> None:
        count, path = self._count, losses_path(self.run_dir)
        grown = count is not None and len(losses) >= count and (count == 0 or losses[count - 1] == self._last)
        if not grown or not self._append(path, losses[count:]):
            text = "".join(_loss_line(entry) for entry in losses)
            atomic_write_text(path, text)
            self._size = len(text.encode())
        self._count, self._last = len(losses), losses[-1] if losses else None

    def _append(self, path: Path, entries: tuple[LossRecord, ...]) -> bool:
        """Append ``entries`` (none: nothing to do); False when the file is not the one written (shorter, gone):
        rewrite it whole. A longer one holds a torn line of a failed append, which is cut off first."""
        if not entries:
            return True
        data = "".join(_loss_line(entry) for entry in entries).encode()
        with open(path, "ab") as handle:
            size = handle.tell()
            if size < self._size:
                return False
            if size > self._size:
                handle.truncate(self._size)
            handle.write(data)
            handle.flush()  # in the page cache before the record counts it; not fsynced (the class docstring)
        self._size += len(data)
        return True


def write_worker_result(run_dir: Path, result: WorkerResult) -> Path:
    """Write ``result`` whole to RUN_DIR (its losses to a fresh losses.jsonl, then worker-result.json, each
    atomically); returns the record's path. A worker that writes as it trains keeps one
    :class:`WorkerResultWriter`, which appends the new losses only. Raises OSError when RUN_DIR cannot be written."""
    return WorkerResultWriter(run_dir).write(result)


def read_losses(run_dir: Path, limit: int | None = None) -> tuple[LossRecord, ...]:
    """The logged steps in ``RUN_DIR/losses.jsonl``, oldest first, at most ``limit`` of them. A line that is not a
    whole loss record (the last one torn by a worker killed mid-append, or a damaged one) is skipped; no file, or
    one that cannot be read, holds none."""
    try:
        lines = [line for line in losses_path(run_dir).read_bytes().split(b"\n") if line.strip()]
    except OSError:
        return ()
    try:  # every line whole (the common case): one parse, twice as fast as one per line
        whole = tuple(LossRecord.from_json(entry) for entry in json.loads(b"[" + b",".join(lines[:limit]) + b"]"))
        if len(whole) == len(lines[:limit]):  # not redundant: a line holding two records, or two torn lines
            return whole  # whose join is one object, parse as an array of another length (test_worker_record.py)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    entries: list[LossRecord] = []
    for line in lines:
        if limit is not None and len(entries) >= limit:
            break
        try:
            entries.append(LossRecord.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError):  # UnicodeDecodeError is a ValueError
            continue
    return tuple(entries)


def load_worker_result(run_dir: Path) -> WorkerResult:
    """The worker's record in RUN_DIR, its losses included (from losses.jsonl, or inline in a version 1 record),
    for a reader that says why there is none (``rocmft status``).

    Raises:
        OSError: no file (FileNotFoundError: the worker did not start training) or one that cannot be read.
        ValueError: not JSON (cut short, say), not a JSON object, or not a worker record (the reason in its text).
    """
    data = _json_object(worker_result_path(run_dir).read_text(), RESULT_FILE)
    logged = data.get(LOGGED_KEY) if "losses" not in data else None
    limit = logged if is_count(logged) else 0
    return WorkerResult.from_json(data, read_losses(run_dir, limit) if limit else ())


def read_worker_result(run_dir: Path) -> WorkerResult | None:
    """The worker's record in RUN_DIR, its losses included (from losses.jsonl, or inline in a version 1 record);
    None when there is none: no file (the worker did not start training), one that cannot be read, or one that is
    not a worker record."""
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
    "LOSSES_FILE",
    "RESULT_FILE",
    "RESULT_VERSION",
    "RUN_POLICY_FILE",
    "LossRecord",
    "NonFinite",
    "PrecisionRecord",
    "RunPolicy",
    "WorkerResult",
    "WorkerResultWriter",
    "losses_path",
    "read_losses",
    "read_run_policy",
    "read_worker_result",
    "worker_result_path",
    "write_worker_result",
]
