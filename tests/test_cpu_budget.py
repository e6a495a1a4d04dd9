"""The ``cpus`` check: a task's processes, threads and loader workers against the CPUs it may use (issue 31,
finding 5). deploy/slurm/train.sbatch no longer asks for 64 CPUs per task (Frontier allocates 56 of its 64 cores;
docs/clusters.md, "CPUs per task") and takes what the allocation gives, so the check says when that is too little.
The GPUs and the CPU count are injected: the device as rocmft.facts.device.DeviceFacts, the allowed CPUs as the
probe provider's ``cpus_allowed``, the shapes the check measures."""

from __future__ import annotations

import os

import pytest

from rocmft.checks import PASS, WARN, CheckSubject
from rocmft.checks import host as checks
from rocmft.facts.device import DeviceFacts
from rocmft.facts.probes import Probes

EIGHT_GPUS = DeviceFacts(backend="rocm", count=8, names=["AMD Instinct MI300X"] * 8,
                         archs=["gfx942:sramecc+:xnack-"] * 8, memory_gib=[191.98] * 8, bf16=True)  # fmt: skip


def outcome(plan, cpus: int):
    """The real ``cpus`` check on ``plan`` with ``cpus`` allowed CPUs injected."""
    return checks.cpus(CheckSubject(plan=plan, probes=Probes(injected={"cpus_allowed": (cpus, "injected")})))


@pytest.mark.parametrize(("cpus", "status"), [(56, PASS), (8, WARN)])
def test_a_node_of_eight_ranks_warns_when_their_threads_and_workers_outnumber_its_cpus(render_env, cpus, status):
    """torchrun's 8 ranks x (OMP_NUM_THREADS=4 + 2 loader workers) = 48 CPUs: a Frontier node's 56 allocatable
    cores hold them, the one CPU per task Slurm gives by default on a shared partition (here 8) does not."""
    plan = render_env({"DATASET": "identity", "ROCMFT_DISTRIBUTED": "ddp", "OMP_NUM_THREADS": "4",
                       "DATALOADER_NUM_WORKERS": "2"}, device=EIGHT_GPUS)  # fmt: skip
    found = outcome(plan, cpus)
    assert found.status == status and found.value == f"{cpus} CPU(s), need 48", found
    if status == WARN:
        assert "8 process(es) x (4 thread(s)" in found.message and "--cpus-per-task" in found.remedy


def test_slurms_cpus_per_task_bounds_the_affinity_of_a_cluster_without_task_binding():
    """Under task/none (this project's local cluster) the affinity is the whole host; srun's --cpus-per-task,
    SLURM_CPUS_PER_TASK in the task's environment, is what the task was given."""
    host = len(os.sched_getaffinity(0))
    assert checks.allowed_cpus({}) == (host, "this process's CPU affinity")
    assert checks.allowed_cpus({"SLURM_CPUS_PER_TASK": str(host + 8)})[0] == host
    if host > 1:
        assert checks.allowed_cpus({"SLURM_CPUS_PER_TASK": "1"}) == (1, "SLURM_CPUS_PER_TASK, Slurm's CPUs per task")
