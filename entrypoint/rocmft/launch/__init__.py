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

from pathlib import Path
from typing import Any

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


def prepare_launch(plan: Plan, root: Path = Path("/"), numactl: bool | None = None,
                   allowed_cpus: set[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Decide how the worker starts (:func:`~rocmft.launch.spec.build_launch_spec`) and record it in
    ``plan.launch`` (for the manifest).

    Returns ``{"command", "environment" (additions), "numa", "network_notes", "communication"}``
    (:meth:`LaunchSpec.as_record`).

    Args:
        plan: the rendered run (its device probe gives the GPUs' PCI addresses).
        root: where /sys and /proc are (tests pass a recorded host layout).
        numactl: whether numactl is installed (torch binds through it); None looks on PATH.
        allowed_cpus: the CPUs this process may use; None reads os.sched_getaffinity (the container's cpuset).

    Raises:
        ConfigError: a bad NNODES/NODE_RANK/WORLD_SIZE, or ROCMFT_NUMA_BIND=on where binding cannot work.
    """
    from rocmft.validate.rules import apply

    apply("launch", plan)  # NNODES, NODE_RANK and WORLD_SIZE agree (rocmft.validate.rules.distributed.world_size)
    plan.launch = build_launch_spec(plan, plan.settings.environ, root, numactl, allowed_cpus).as_record()
    return plan.launch


def run_worker(plan: Plan, secrets: dict[str, str]) -> int:
    """Run the worker as :func:`prepare_launch` decided and return its exit code (an ExitCode value)."""
    launch = plan.launch or prepare_launch(plan)
    return run_spec(LaunchSpec.from_record(launch), plan.run_dir, plan.launcher, secrets)


__all__ = ["COMMUNICATION_PREFIXES", "LOG_DIR", "LOG_FILE", "LaunchSpec", "build_launch_spec",
           "communication_environment", "full_node_environment", "graceful_stop_recorded", "graceful_stop_targets",
           "prepare_launch", "run_worker", "worker_command"]  # fmt: skip
