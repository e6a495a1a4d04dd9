"""The job's shape: nodes, this node's rank, processes per node, the world size (from the job layout and settings).

The layout (which scheduler started this process, and where it sits) is :func:`rocmft.facts.scheduler.job_layout`;
NPROC_PER_NODE is LLaMA-Factory's launcher variable (torchrun's --nproc_per_node), ROCMFT_NPROC_PER_NODE rocmft's
own. Read-only: nothing here changes the environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocmft.facts.scheduler import JobLayout
from rocmft.values import whole_number

if TYPE_CHECKING:
    from rocmft.config.settings import Settings
    from rocmft.facts.device import DeviceFacts

# The launchers: ``python`` (one process), ``torchrun`` (rocmft starts the node's processes), ``task`` (the
# scheduler started this process as one rank of many: Slurm's one task per GPU; no torchrun)
LAUNCHERS = ("python", "torchrun", "task")


def asked_processes(settings: Settings, layout: JobLayout) -> int:
    """Processes per node the user or scheduler asked for: ROCMFT_NPROC_PER_NODE, else NPROC_PER_NODE, else the
    scheduler's (Kubeflow's PET_NPROC_PER_NODE); 0 when none. Variables are read from ``settings.environ``;
    ``layout``: the run's job layout, read once by render (rocmft.facts.scheduler.job_layout)."""
    given = whole_number(settings.environ.get("NPROC_PER_NODE") or "")
    return settings.rocmft.nproc_per_node or given or layout.nproc_per_node or 0


def local_processes(settings: Settings, device: DeviceFacts, launcher: str, layout: JobLayout) -> int:
    """Processes rocmft starts on this node: 1 without torchrun (one process, or one scheduler task); with it
    ROCMFT_NPROC_PER_NODE, else NPROC_PER_NODE, else the scheduler's, else one per visible GPU (at least one).
    ``layout``: the run's job layout."""
    if launcher != "torchrun":
        return 1
    return asked_processes(settings, layout) or max(device.count, 1)


def world_size(settings: Settings, device: DeviceFacts, launcher: str, layout: JobLayout) -> int:
    """Processes in the whole job: the scheduler's task count in task mode, else processes per node × nodes.
    ``layout``: the run's job layout."""
    if launcher == "task":
        return layout.world_size or 1
    return local_processes(settings, device, launcher, layout) * layout.nnodes


__all__ = ["LAUNCHERS", "asked_processes", "local_processes", "world_size"]
