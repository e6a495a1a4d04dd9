"""The job's shape (rocmft.facts.job.JobShape) is computed once per render, and every later step reads that record:
its numbers are those the launcher, the world size, the processes per node and the /dev/shm plan were derived
from the settings with before, in each place that needed them."""

from __future__ import annotations

import pytest

from rocmft.facts.device import DeviceFacts
from rocmft.facts.job import JobShape, asked_processes


def slurm_step(nodes: int, tasks: int) -> dict[str, str]:
    """srun's variables for rank 0 of a step of ``tasks`` tasks over ``nodes`` nodes (tests/test_scheduler.py)."""
    per_node = tasks // nodes
    return {"SLURM_JOB_ID": "31337", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": str(nodes),
            "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0",
            "SLURM_STEP_NODELIST": f"n[1-{nodes}]", "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})"}  # fmt: skip


def shape_before(settings, device, launcher: str, layout) -> tuple[int, int, int]:
    """(local processes, world size, communicating processes) as the old rocmft.facts.job.local_processes and
    world_size and rocmft.render.loader.communicating_processes computed them, each from the settings again."""
    local = 1 if launcher != "torchrun" else asked_processes(settings, layout) or max(device.count, 1)
    world = (layout.world_size or 1) if launcher == "task" else local * layout.nnodes
    talking = local if launcher == "torchrun" else (layout.local_world_size or 1) if launcher == "task" else 0
    return local, world, talking


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, JobShape(launcher="python", nnodes=1, asked=0, local_processes=1, world_size=1, communicating=0)),
        (
            {"NPROC_PER_NODE": "4", "NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "head", "MASTER_PORT": "29500"},
            JobShape(launcher="torchrun", nnodes=2, asked=4, local_processes=4, world_size=8, communicating=4),
        ),
        (
            slurm_step(nodes=2, tasks=4),
            JobShape(launcher="task", nnodes=2, asked=0, local_processes=1, world_size=4, communicating=2),
        ),
    ],
    ids=["python", "torchrun-4-per-node-2-nodes", "slurm-task-mode"],
)
def test_the_job_shape_is_computed_once_and_agrees_with_the_old_arithmetic(render_env, monkeypatch, environ, expected):
    import rocmft.render as render_module

    original, made = render_module.job_shape, []
    monkeypatch.setattr(render_module, "job_shape", lambda *args: made.append(original(*args)) or made[-1])
    plan = render_env({"DATASET": "identity", **environ}, device=DeviceFacts(backend="cpu"))
    assert made == [expected] and plan.job is made[0]  # once per render; the plan carries that very record
    assert (plan.launcher, plan.world_size) == (expected.launcher, expected.world_size)
    assert (plan.layout.mode == "task") == (expected.launcher == "task")
    before = shape_before(plan.settings, plan.device, plan.launcher, plan.layout)
    assert before == (plan.job.local_processes, plan.job.world_size, plan.job.communicating)
