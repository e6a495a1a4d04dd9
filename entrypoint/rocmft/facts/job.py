"""The job's shape: nodes, this node's rank, processes per node, the world size (from the job layout and settings).

The layout (which scheduler started this process, and where it sits) is :func:`rocmft.facts.scheduler.job_layout`;
NPROC_PER_NODE is LLaMA-Factory's launcher variable (torchrun's --nproc_per_node), ROCMFT_NPROC_PER_NODE rocmft's
own. Read-only: nothing here changes the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class JobShape:
    """The job's shape, computed once by :func:`job_shape` when render has chosen the launcher; every later step
    (the rules, the checks, the launch spec) reads these numbers and none derives them again from the settings.

    Attributes:
        launcher: ``python``, ``torchrun`` or ``task`` (:data:`LAUNCHERS`; rocmft.render decides it).
        nnodes: nodes in the job (the layout's: the scheduler's, NNODES, else 1).
        asked: processes per node the user or scheduler asked for (:func:`asked_processes`), 0 when none.
        local_processes: processes rocmft starts on this node: 1 without torchrun (one process, or one scheduler
            task); with it ``asked``, else one per visible GPU (at least one).
        world_size: processes in the whole job: the scheduler's task count in task mode (at least 1), else
            ``local_processes`` x ``nnodes``.
        communicating: this node's processes that talk to each other through /dev/shm (rocmft.render.loader): torchrun's
            ``local_processes``, the scheduler's tasks on this node (the layout's ``local_world_size``, at least 1),
            or 0 for one process started alone.
    """

    launcher: str
    nnodes: int
    asked: int
    local_processes: int
    world_size: int
    communicating: int


def job_shape(settings: Settings, device: DeviceFacts, launcher: str, layout: JobLayout) -> JobShape:
    """The job's :class:`JobShape` from the settings (ROCMFT_NPROC_PER_NODE, NPROC_PER_NODE), the probed
    ``device`` (its GPU count), the chosen ``launcher`` (:data:`LAUNCHERS`) and the run's job ``layout``
    (rocmft.facts.scheduler.job_layout, read once by render). Raises nothing."""
    asked = asked_processes(settings, layout)
    local = (asked or max(device.count, 1)) if launcher == "torchrun" else 1
    if launcher == "task":
        world, communicating = layout.world_size or 1, layout.local_world_size or 1
    else:
        world, communicating = local * layout.nnodes, local if launcher == "torchrun" else 0
    return JobShape(launcher=launcher, nnodes=layout.nnodes, asked=asked, local_processes=local, world_size=world,
                    communicating=communicating)  # fmt: skip


__all__ = ["LAUNCHERS", "JobShape", "asked_processes", "job_shape"]
