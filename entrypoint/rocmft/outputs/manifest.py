"""The run manifest (``OUTPUT_DIR/rocmft/manifest.json``): everything needed to understand and repeat a run.

Assembled here (:func:`assemble_manifest`) from the pipeline's records, none of which it changes: the plan
(rocmft.render.Plan), the probe provider's snapshot (rocmft.facts.probes), the launch spec (rocmft.launch), the
checks' summary and the :class:`RunOutcome`; the record itself, its writer and its one reader are
rocmft.records.Manifest and rocmft.records.read_manifest. Written when training starts (status ``running``) and
rewritten when it ends, atomically each time, so a crashed run still leaves a readable record. Secrets never
appear: settings hold only the names of given secrets, and environment values of secret-named variables are
replaced by ``<redacted>``.
"""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmft import __version__
from rocmft.config.lfargs import is_secret_name, stack_versions
from rocmft.config.provenance import kinds, texts
from rocmft.facts.host import host_facts
from rocmft.facts.image import build_record
from rocmft.launch import LaunchSpec
from rocmft.records import SCHEMA_VERSION, Manifest, Restart, WorkerResult
from rocmft.render import Plan

# Variables that change what a run does without being training arguments, recorded in the manifest.
RECORDED_ENV_PREFIXES = ("ROCMFT_", "NCCL_", "RCCL_", "HSA_", "HIP_", "ROCR_", "GPU_", "CUDA_", "TORCH_",
                         "PYTORCH_", "HF_", "OMP_", "FORCE_TORCHRUN", "NNODES", "NODE_RANK", "NPROC_PER_NODE",
                         "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_", "PET_",
                         "JOB_COMPLETION_INDEX", "KUBERNETES_SERVICE_HOST", "APPTAINER_", "SINGULARITY_")  # fmt: skip


def now() -> str:
    """The current UTC time, ISO 8601, seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def redact_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The recorded subset of ``environ``, values of secret-named variables replaced by ``<redacted>``."""
    return {
        k: ("<redacted>" if is_secret_name(k) else v)
        for k, v in sorted(environ.items())
        if k.startswith(RECORDED_ENV_PREFIXES)
    }


@dataclass(frozen=True)
class RunOutcome:
    """Where a `rocmft train` attempt stands, for its manifest.

    Attributes:
        status: a :class:`rocmft.records.RunStatus` word.
        exit_code: the worker's exit code (rocmft.errors.ExitCode), None while it runs.
        started_at: when the attempt started (:func:`now`).
        timings: stage -> seconds (unrounded; the manifest rounds to 0.01 s).
        worker: this node's worker record (rocmft.records.read_worker_result), None before it wrote one.
        restarts: the automatic restarts of this `rocmft train` so far, oldest first.
    """

    status: str
    exit_code: int | None
    started_at: str
    timings: Mapping[str, float] = field(default_factory=dict)
    worker: WorkerResult | None = None
    restarts: Sequence[Restart] = ()


def _outputs(output_dir: Path) -> dict[str, int | str]:
    """OUTPUT_DIR's visible entries: name -> size in bytes, or ``"folder"``."""
    outputs: dict[str, int | str] = {}
    if output_dir.is_dir():
        for item in sorted(output_dir.iterdir()):
            if not item.name.startswith("."):
                outputs[item.name] = item.stat().st_size if item.is_file() else "folder"
    return outputs


def assemble_manifest(plan: Plan, *, probes: Mapping[str, Any], launch: LaunchSpec | None,
                      checks: Mapping[str, Any] | None, outcome: RunOutcome) -> Manifest:  # fmt: skip
    """The manifest of ``plan`` (see the module docstring); reads the host's facts, the image's build record, the
    stack's versions and OUTPUT_DIR's entries now.

    Args:
        plan: the rendered run.
        probes: the probe provider's snapshot (rocmft.facts.probes.Probes.snapshot); all but ``image`` are recorded.
        launch: how the worker starts (rocmft.launch.prepare_launch); None: not decided (``launch`` {}, ``job``
            None).
        checks: the checks' summary ``{status, seconds, report}``, or None.
        outcome: the attempt's status, exit code, timings, worker record and restarts.
    """
    worker = outcome.worker
    record = launch.as_record() if launch is not None else None
    return Manifest(
        schema_version=SCHEMA_VERSION,
        rocmft_version=__version__,
        status=str(outcome.status),
        exit_code=outcome.exit_code,
        started_at=outcome.started_at,
        updated_at=now(),
        command=tuple(sys.argv),
        timings_s={k: round(v, 2) for k, v in outcome.timings.items()},
        precision={
            **plan.precision.as_dict(),
            "parameter_dtypes": worker.parameter_dtypes if worker else None,
            "trainable_dtypes": worker.trainable_dtypes if worker else None,
            "quantization": worker.quantization if worker else None,
        },
        versions=stack_versions(),
        image=build_record(),
        host=host_facts(),
        device=plan.device.as_dict(),
        gpu_probes={k: v for k, v in probes.items() if k != "image"},
        launcher=plan.launcher,
        job=record["job"] if record is not None else None,
        launch=record if record is not None else {},
        demo=plan.demo,
        settings=plan.settings.redacted(),
        arguments=plan.arguments,
        argument_sources=texts(plan.sources),
        argument_source_kinds=kinds(plan.sources),
        plan=plan.perf.as_dict() if plan.perf is not None else None,
        data_sets=plan.registry.entries,
        ds_config=plan.ds_config,
        checks=dict(checks) if checks is not None else None,
        worker=worker.to_json() if worker else None,
        restarts=tuple(outcome.restarts),
        resume=plan.resume.as_record() if plan.resume.checkpoint is not None else None,
        environment=redact_env(plan.settings.environ),
        outputs=_outputs(plan.output_dir),
    )


def write_manifest(path: Path, plan: Plan, *, probes: Mapping[str, Any], launch: LaunchSpec | None,
                   checks: Mapping[str, Any] | None, outcome: RunOutcome) -> Path:  # fmt: skip
    """:func:`assemble_manifest`, written atomically to ``path`` (rocmft.records.Manifest.write); returns ``path``."""
    return assemble_manifest(plan, probes=probes, launch=launch, checks=checks, outcome=outcome).write(path)


__all__ = ["RECORDED_ENV_PREFIXES", "Restart", "RunOutcome", "assemble_manifest", "now", "redact_env",
           "write_manifest"]  # fmt: skip
