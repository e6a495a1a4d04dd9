"""Launch: start the worker (one process, or torchrun per rank), stream and save its output, pass signals.

The worker's output goes both to the console and to ``OUTPUT_DIR/rocmft/train.log``, with the values of
any secrets replaced by ``<redacted>``; under torchrun each local rank's output also goes to its own files
(``rocmft/logs/``, torchrun's ``--log-dir`` with ``--tee``). A first SIGTERM/SIGINT to rocmft is passed to the
worker, or to torchrun's ranks (:func:`graceful_stop_targets`), which stop at the next optimizer step with a
checkpoint; a second one goes to the whole process group (stop now). rocmft then exits 143 (rocmft.errors).

Multi-node: every node runs ``rocmft train`` with the same settings and NNODES, NODE_RANK, MASTER_ADDR,
MASTER_PORT (LLaMA-Factory's launcher names, passed to torchrun as they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rocmft.facts.probes import Probes
from rocmft.launch.run import LOG_FILE, graceful_stop_recorded, graceful_stop_targets, run_spec
from rocmft.launch.spec import (
    COMMUNICATION_PREFIXES,
    LOG_DIR,
    LaunchSpec,
    build_launch_spec,
    communication_environment,
    full_node_environment,
    worker_command,
)
from rocmft.render import Plan


def prepare_launch(plan: Plan, probes: Probes | None = None, root: Path = Path("/"), numactl: bool | None = None,
                   allowed_cpus: set[int] | None = None) -> LaunchSpec:  # fmt: skip
    """Apply the ``launch`` rules and decide how the worker starts (:func:`~rocmft.launch.spec.build_launch_spec`).

    Returns the frozen :class:`LaunchSpec` (command, environment additions, NUMA binding, network notes, the
    communication variables with their sources, the job layout); the checks read its ``environment``, the manifest
    records its :meth:`~LaunchSpec.as_record`, :func:`run_worker` starts it. Changes nothing.

    Args:
        plan: the rendered run.
        probes: the run's probe provider (rocmft.facts.probes.Probes): its ``devices`` (the device probe, seeded
            where the command started; never measured here) give the GPUs' PCI addresses for the NUMA binding, its
            ``image`` (the build record, read once) the gfx targets ROCMFT_GFX_OVERRIDE=auto compares with.
            None: no device probe, no binding by address.
        root: where /sys and /proc are (tests pass a recorded host layout).
        numactl: whether numactl is installed (torch binds through it); None looks on PATH.
        allowed_cpus: the CPUs this process may use; None reads os.sched_getaffinity (the container's cpuset).

    Raises:
        ConfigError: a bad NNODES/NODE_RANK/WORLD_SIZE, or ROCMFT_NUMA_BIND=on where binding cannot work.
    """
    from rocmft.validate.rules import apply

    apply("launch", plan)  # NNODES, NODE_RANK and WORLD_SIZE agree (rocmft.validate.rules.distributed.world_size)
    from rocmft.facts.image import build_record

    devices = probes.known("devices") if probes is not None else None
    image = probes.get("image", build_record) if probes is not None else build_record()  # the checks' record too
    return build_launch_spec(plan, plan.settings.environ, root, numactl, allowed_cpus, devices=devices, image=image)


def run_worker(plan: Plan, launch: LaunchSpec, secrets: Mapping[str, str]) -> int:
    """Run the worker as ``launch`` (:func:`prepare_launch`'s spec) says and return its exit code (an ExitCode
    value). ``secrets``: name -> value, redacted from the saved output."""
    return run_spec(launch, plan.run_dir, plan.launcher, secrets)


__all__ = ["COMMUNICATION_PREFIXES", "LOG_DIR", "LOG_FILE", "LaunchSpec", "build_launch_spec",
           "communication_environment", "full_node_environment", "graceful_stop_recorded", "graceful_stop_targets",
           "prepare_launch", "run_worker", "worker_command"]  # fmt: skip
