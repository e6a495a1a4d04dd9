"""The run manifest, ``OUTPUT_DIR/rocmft/manifest.json``: a typed, versioned record, with its one writer
(:meth:`Manifest.write`, atomic) and its one reader (:func:`read_manifest`). rocmft.outputs.manifest assembles it
from the run's records (the plan, the probes' snapshot, the launch spec, the checks' summary, the outcome);
``rocmft train`` writes it, and render (the resume decision's world size), the staging workspace (the history
folder's name), ``rocmft status``, ``report``, ``export``, ``chat`` and ``serve --load`` read it.

The JSON keys are the ones rocmft 0.1.0 wrote, plus ``schema_version`` (:data:`SCHEMA_VERSION`). A manifest
without ``schema_version`` was written before the field existed and has the layout of version 1; a reader reads
any version by the keys it knows, and a key that is missing reads as its default (a manifest of only
``{"status": "finished"}`` reads). Nested records stay JSON objects, as written (the worker's is
rocmft.records.WorkerResult's); the restarts are typed (:class:`Restart`). Ground floor: nothing of rocmft is
imported here but the ground floor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmft.errors import ConfigError
from rocmft.fsutil import atomic_write_json
from rocmft.nesting import loads_json

MANIFEST_FILE = "manifest.json"  # in OUTPUT_DIR/rocmft (or rocmft-node<k>)
SCHEMA_VERSION = 1  # the manifest's layout; a manifest without the key is version 1


@dataclass(frozen=True)
class Restart:
    """One automatic restart of a `rocmft train` (ROCMFT_ON_NAN=fp32, ROCMFT_ON_HANG=retry): its ``cause`` (a
    RunStatus word), the optimizer step the divergence or the hang was seen at, the checkpoint it resumes from
    (None: step 0), the precision policy before and after, and for a hang ROCMFT_COLLECTIVES before and after
    (``collectives_to`` None: unchanged)."""

    cause: str
    at_step: int | None
    from_checkpoint: str | None
    precision_from: str
    precision_to: str = "fp32"
    collectives_from: str = "default"
    collectives_to: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The manifest's ``restarts`` entry: ``{cause, at_step, from_checkpoint, precision: {from, to}}``, and
        ``collectives: {from, to}`` when the restart changed ROCMFT_COLLECTIVES."""
        entry = {"cause": self.cause, "at_step": self.at_step, "from_checkpoint": self.from_checkpoint,
                 "precision": {"from": self.precision_from, "to": self.precision_to}}  # fmt: skip
        if self.collectives_to is not None:
            entry["collectives"] = {"from": self.collectives_from, "to": self.collectives_to}
        return entry

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Restart:
        """The restart of an :meth:`as_dict` object. Raises KeyError, TypeError or AttributeError on another shape."""
        precision, collectives = data["precision"], data.get("collectives") or {}
        return cls(data["cause"], data.get("at_step"), data.get("from_checkpoint"), precision["from"],
                   precision.get("to", "fp32"), collectives.get("from", "default"), collectives.get("to"))  # fmt: skip


# The JSON types each key may hold (bool is not a number here). Every object may be null: for the keys of
# _EMPTY_WHEN_NULL that reads as an empty object (as readers always took it); for the others null is their "none".
_OBJECT, _TEXT = (dict, type(None)), (str, type(None))
_TYPES = {
    "schema_version": (int,), "rocmft_version": _TEXT, "status": _TEXT, "exit_code": (int, type(None)),
    "started_at": _TEXT, "updated_at": _TEXT, "command": (list,), "timings_s": _OBJECT, "precision": _OBJECT,
    "versions": _OBJECT, "image": _OBJECT, "host": _OBJECT, "device": _OBJECT, "gpu_probes": _OBJECT,
    "launcher": _TEXT, "job": _OBJECT, "launch": _OBJECT, "demo": (bool,), "settings": _OBJECT,
    "arguments": _OBJECT, "argument_sources": _OBJECT, "argument_source_kinds": _OBJECT, "plan": _OBJECT,
    "data_sets": _OBJECT, "ds_config": _OBJECT, "checks": _OBJECT, "worker": _OBJECT, "restarts": (list,),
    "resume": _OBJECT, "environment": _OBJECT, "outputs": _OBJECT,
}  # fmt: skip
_EMPTY_WHEN_NULL = {"timings_s", "precision", "versions", "host", "device", "gpu_probes", "launch", "settings",
                    "arguments", "argument_sources", "argument_source_kinds", "data_sets", "environment",
                    "outputs"}  # fmt: skip


@dataclass(frozen=True)
class Manifest:
    """``OUTPUT_DIR/rocmft/manifest.json``: everything needed to understand and repeat a run.

    Attributes (the JSON keys, in the order written):
        schema_version: the layout's number (:data:`SCHEMA_VERSION`; 1 when the file has none).
        rocmft_version: the rocmft that wrote it.
        status: a rocmft.records.RunStatus word: ``running`` while training, then ``finished``, ``non-finite
            loss``, ``interrupted`` or ``failed``.
        exit_code: the worker's exit code (rocmft.errors.ExitCode), None while running.
        started_at, updated_at: ISO 8601 times, UTC, seconds.
        command: the command line (sys.argv).
        timings_s: stage -> seconds (settings, device probe, render, validate, checks, train).
        precision: the precision policy (rocmft.render.precision.Precision.as_dict) and the worker's
            ``parameter_dtypes``, ``trainable_dtypes``, ``quantization``.
        versions: the stack's package versions. image: the image's build record (None outside an image).
        host: host facts. device: the probed device (rocmft.facts.device.DeviceFacts.as_dict).
        gpu_probes: what the probe provider measured or a test injected (rocmft.facts.probes), less the image.
        launcher: ``python``, ``torchrun`` or ``task``. job: the job layout's record (None before a launch spec).
        launch: the launch spec's record (rocmft.launch.LaunchSpec.as_record; ``{}`` before one).
        demo: whether the run is the built-in default.
        settings: the settings, secrets as names only. arguments: the training arguments as rendered.
        argument_sources, argument_source_kinds: argument -> its source's text / kind word (rocmft.config.provenance).
        plan: the planner's record (rocmft.render.planner.PerfPlan.as_dict) or None.
        data_sets: the data set registry's entries. ds_config: the rendered DeepSpeed config or None.
        checks: the checks' summary ``{status, seconds, report}`` or None.
        worker: this node's worker record (rocmft.records.WorkerResult's JSON object) or None.
        restarts: the automatic restarts of this `rocmft train`, oldest first.
        resume: the checkpoint this run continued (rocmft.render.resume.ResumeChoice.as_record: ``checkpoint``,
            ``weights_only`` (ROCMFT_RESUME_WEIGHTS_ONLY: optimizer and schedule started fresh), ``missing``), None
            when it started at step 0 (and in manifests written before the field).
        environment: the recorded variables, secret values ``<redacted>``.
        outputs: OUTPUT_DIR's entries: name -> bytes, or ``"folder"``.
    """

    schema_version: int = SCHEMA_VERSION
    rocmft_version: str | None = None
    status: str | None = None
    exit_code: int | None = None
    started_at: str | None = None
    updated_at: str | None = None
    command: tuple[str, ...] = ()
    timings_s: Mapping[str, float] = field(default_factory=dict)
    precision: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, Any] = field(default_factory=dict)
    image: Mapping[str, Any] | None = None
    host: Mapping[str, Any] = field(default_factory=dict)
    device: Mapping[str, Any] = field(default_factory=dict)
    gpu_probes: Mapping[str, Any] = field(default_factory=dict)
    launcher: str | None = None
    job: Mapping[str, Any] | None = None
    launch: Mapping[str, Any] = field(default_factory=dict)
    demo: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)
    arguments: Mapping[str, Any] = field(default_factory=dict)
    argument_sources: Mapping[str, str] = field(default_factory=dict)
    argument_source_kinds: Mapping[str, str] = field(default_factory=dict)
    plan: Mapping[str, Any] | None = None
    data_sets: Mapping[str, Any] = field(default_factory=dict)
    ds_config: Mapping[str, Any] | None = None
    checks: Mapping[str, Any] | None = None
    worker: Mapping[str, Any] | None = None
    restarts: tuple[Restart, ...] = ()
    resume: Mapping[str, Any] | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, int | str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON object written: every key, in the order of the attributes."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["command"] = list(self.command)
        data["restarts"] = [restart.as_dict() for restart in self.restarts]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """The manifest of a JSON value; keys it does not know are left out, missing ones take their defaults.

        Raises:
            ValueError: ``data`` is not an object, a key holds a value of another JSON type, or a restart is
                malformed (the message names the key).
        """
        if not isinstance(data, dict):
            raise ValueError("it is not a JSON object")
        values: dict[str, Any] = {}
        for name, kinds in _TYPES.items():
            if name not in data:
                continue
            value = data[name]
            number = name in ("schema_version", "exit_code")
            if not isinstance(value, kinds) or (number and isinstance(value, bool)):
                raise ValueError(f"its {name!r} is {type(value).__name__} {str(value)[:40]!r}")
            if value is not None or name not in _EMPTY_WHEN_NULL:
                values[name] = value
        if values.get("schema_version", 1) < 1:
            raise ValueError(f"its 'schema_version' is {values['schema_version']}, not a version")
        values["command"] = tuple(str(part) for part in values.get("command", ()))
        try:
            values["restarts"] = tuple(Restart.from_json(entry) for entry in values.get("restarts", ()))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(
                f"its 'restarts' holds an entry that is not a restart ({type(err).__name__}: {err})"
            ) from err
        return cls(**values)

    def write(self, path: Path) -> Path:
        """Write the manifest atomically to ``path`` (rocmft.fsutil.atomic_write_json); returns ``path``."""
        return atomic_write_json(path, self.to_json())


READ_FIX = "It is written by `rocmft train`: point at a run folder `rocmft train` wrote, or train again."


def read_manifest(path: Path, *, how: str = "", fix: str = READ_FIX) -> Manifest:
    """The manifest at ``path`` (a ``manifest.json``), of any schema version.

    Args:
        path: the file.
        how: how the caller found it, for the message (``"given as saves/run"``); empty: not said.
        fix: the refusal's remedy (default :data:`READ_FIX`).

    Raises:
        ConfigError: the file cannot be read, is not JSON, or is not a manifest (:meth:`Manifest.from_json`): "The
            run record PATH (HOW) cannot be read: PROBLEM.", with ``fix``.
    """
    try:
        return Manifest.from_json(loads_json(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError) as err:  # UnicodeDecodeError, JSONDecodeError and TooDeep are ValueErrors
        raise ConfigError(f"The run record {path}{f' ({how})' if how else ''} cannot be read: {err}.", fix) from err


__all__ = ["MANIFEST_FILE", "READ_FIX", "SCHEMA_VERSION", "Manifest", "Restart", "read_manifest"]
