"""The run manifest (``OUTPUT_DIR/rocmft/manifest.json``): everything needed to understand and repeat a run.

Written when training starts (status ``running``) and rewritten when it ends, atomically each time, so a
crashed run still leaves a readable record. Secrets never appear: settings hold only the names of given
secrets, and environment values of secret-named variables are replaced by ``<redacted>``.
"""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmft import __version__
from rocmft.config.lfargs import is_secret_name, stack_versions
from rocmft.config.provenance import kinds, texts
from rocmft.facts.host import host_facts
from rocmft.facts.image import build_record
from rocmft.fsutil import atomic_write_json
from rocmft.launch import LaunchSpec
from rocmft.records import WorkerResult

# Variables that change what a run does without being training arguments, recorded in the manifest.
RECORDED_ENV_PREFIXES = ("ROCMFT_", "NCCL_", "RCCL_", "HSA_", "HIP_", "ROCR_", "GPU_", "CUDA_", "TORCH_",
                         "PYTORCH_", "HF_", "OMP_", "FORCE_TORCHRUN", "NNODES", "NODE_RANK", "NPROC_PER_NODE",
                         "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_", "PET_",
                         "JOB_COMPLETION_INDEX", "KUBERNETES_SERVICE_HOST", "APPTAINER_", "SINGULARITY_")  # fmt: skip


def now() -> str:
    """The current UTC time, ISO 8601, seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def redact_env(environ: dict[str, str]) -> dict[str, str]:
    """The recorded subset of ``environ``, values of secret-named variables replaced by ``<redacted>``."""
    return {
        k: ("<redacted>" if is_secret_name(k) else v)
        for k, v in sorted(environ.items())
        if k.startswith(RECORDED_ENV_PREFIXES)
    }


@dataclass(frozen=True)
class Restart:
    """One automatic restart of a `rocmft train` (ROCMFT_ON_NAN=fp32): its ``cause`` (a RunStatus word), the
    optimizer step the divergence was seen at, the checkpoint it resumes from (None: step 0), and the precision
    policy before and after."""

    cause: str
    at_step: int | None
    from_checkpoint: str | None
    precision_from: str
    precision_to: str = "fp32"

    def as_dict(self) -> dict[str, Any]:
        """The manifest's ``restarts`` entry: ``{cause, at_step, from_checkpoint, precision: {from, to}}``."""
        return {"cause": self.cause, "at_step": self.at_step, "from_checkpoint": self.from_checkpoint,
                "precision": {"from": self.precision_from, "to": self.precision_to}}  # fmt: skip


def write_manifest(path: Path, plan, *, status: str, exit_code: int | None, timings: dict[str, float],
                   checks: dict[str, Any] | None, worker: WorkerResult | None, started_at: str,
                   restarts: Sequence[Restart] = (), probes: Mapping[str, Any] | None = None,
                   launch: LaunchSpec | None = None) -> Path:  # fmt: skip
    """Write the manifest for ``plan`` atomically to ``path`` (see the module docstring).

    ``probes``: the probe provider's snapshot (rocmft.facts.probes.Probes.snapshot); ``launch``: how the worker
    starts (rocmft.launch.prepare_launch); ``status``: a :class:`rocmft.records.RunStatus` word; ``worker``: this
    node's worker record (rocmft.records.read_worker_result), embedded as its JSON object; ``restarts``: the
    automatic restarts of this `rocmft train` so far, oldest first.
    """
    outputs = {}
    if plan.output_dir.is_dir():
        for item in sorted(plan.output_dir.iterdir()):
            if not item.name.startswith("."):
                outputs[item.name] = item.stat().st_size if item.is_file() else "folder"
    data = {
        "rocmft_version": __version__,
        "status": status,
        "exit_code": exit_code,
        "started_at": started_at,
        "updated_at": now(),
        "command": sys.argv,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "precision": {
            **plan.precision.as_dict(),
            "parameter_dtypes": worker.parameter_dtypes if worker else None,
            "trainable_dtypes": worker.trainable_dtypes if worker else None,
            "quantization": worker.quantization if worker else None,
        },
        "versions": stack_versions(),
        "image": build_record(),
        "host": host_facts(),
        "device": plan.device.as_dict(),
        "gpu_probes": {k: v for k, v in (probes or {}).items() if k != "image"},
        "launcher": plan.launcher,
        "job": launch.as_record()["job"] if launch is not None else None,
        "launch": launch.as_record() if launch is not None else {},
        "demo": plan.demo,
        "settings": plan.settings.redacted(),
        "arguments": plan.arguments,
        "argument_sources": texts(plan.sources),
        "argument_source_kinds": kinds(plan.sources),
        "plan": plan.perf.as_dict() if getattr(plan, "perf", None) is not None else None,
        "data_sets": plan.registry.entries,
        "ds_config": plan.ds_config,
        "checks": checks,
        "worker": worker.to_json() if worker else None,
        "restarts": [restart.as_dict() for restart in restarts],
        "environment": redact_env(dict(plan.settings.environ)),
        "outputs": outputs,
    }
    return atomic_write_json(path, data)
