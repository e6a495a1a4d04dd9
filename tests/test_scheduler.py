"""The job layout read from a scheduler's variables (rocmft.facts.scheduler), for Slurm and by hand; Kubeflow's
are in tests/test_kubernetes.py. The variables are what Slurm sets in a step (``man srun``, OUTPUT ENVIRONMENT
VARIABLES); tests/test_slurm.py runs the same under a real Slurm cluster."""

from __future__ import annotations

import pytest

from rocmft.console import is_first_rank
from rocmft.errors import ConfigError
from rocmft.facts.scheduler import PORT_BASE, PORT_SPAN, job_layout
from rocmft.launch.spec import task_environment


def slurm_step(nodes: int, tasks: int, proc: int, **extra: str) -> dict[str, str]:
    """The variables of task ``proc`` of a block-distributed srun step over ``nodes`` nodes n[1-nodes]."""
    per_node = tasks // nodes
    return {
        "SLURM_JOB_ID": "31337", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_PROCID": str(proc), "SLURM_NODEID": str(proc // per_node),
        "SLURM_LOCALID": str(proc % per_node), "SLURM_STEP_NODELIST": f"n[1-{nodes}]",
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{nodes})", **extra,
    }  # fmt: skip


def test_one_task_per_node_is_torchrun_per_node_with_the_first_host_as_rendezvous():
    layout = job_layout(slurm_step(nodes=2, tasks=2, proc=1))
    assert (layout.engine, layout.mode, layout.nnodes, layout.node_rank) == ("slurm", "node", 2, 1)
    assert layout.master_addr == "n1" and layout.master_port == PORT_BASE + 31337 % PORT_SPAN
    assert layout.rank is None and layout.worker_environment() == {}
    assert not layout.is_first_node and "SLURM_NODEID=1" in layout.describe()


def test_more_tasks_than_nodes_is_one_process_per_task_with_the_schedulers_ranks():
    layout = job_layout(slurm_step(nodes=2, tasks=16, proc=9))
    assert (layout.mode, layout.rank, layout.local_rank, layout.world_size) == ("task", 9, 1, 16)
    assert (layout.node_rank, layout.local_world_size) == (1, 8)
    env = layout.worker_environment()
    assert env["RANK"] == "9" and env["WORLD_SIZE"] == "16" and env["LOCAL_WORLD_SIZE"] == "8"
    assert env["MASTER_ADDR"] == "n1" and env["GROUP_RANK"] == "1"
    assert job_layout(slurm_step(nodes=2, tasks=16, proc=0)).is_first_node


def test_a_task_bound_to_one_gpu_uses_that_gpu_whatever_its_local_id():
    """--gpus-per-task=1 leaves each task one visible GPU: LOCAL_RANK must be 0 there, not SLURM_LOCALID."""
    layout = job_layout(slurm_step(nodes=1, tasks=8, proc=5))
    assert task_environment(layout, visible_gpus=1)["LOCAL_RANK"] == "0"
    assert task_environment(layout, visible_gpus=8)["LOCAL_RANK"] == "5"


def test_node_lists_are_expanded_like_slurm():
    layout = job_layout(slurm_step(nodes=2, tasks=2, proc=0, SLURM_STEP_NODELIST="nid[007,010-011],login1"))
    assert layout.master_addr == "nid007"


def test_hand_set_rendezvous_wins_and_is_named_as_the_source():
    layout = job_layout(slurm_step(nodes=2, tasks=2, proc=0, MASTER_ADDR="10.1.0.5", MASTER_PORT="29400"))
    assert (layout.master_addr, layout.master_port) == ("10.1.0.5", 29400)
    assert layout.sources["master_addr"] == "MASTER_ADDR=10.1.0.5"


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        (slurm_step(2, 2, 0, NNODES="4"), "NNODES=4 (set by hand) contradicts the scheduler's SLURM_STEP_NUM_NODES=2"),
        ({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}, "outside srun"),
        (slurm_step(2, 2, 0, SLURM_STEP_NODELIST="n[1-"), "is not a Slurm node list"),
        (slurm_step(2, 2, 0, SLURM_NODEID="x"), "SLURM_NODEID='x'"),
        (
            {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
            "rank 2 (NODE_RANK=2) is not below",
        ),
        ({"NNODES": "2", "MASTER_ADDR": "10.0.0.1"}, "no rendezvous: MASTER_PORT unset"),
        (slurm_step(2, 2, 1, SLURM_JOB_ID="abc"), "no rendezvous: MASTER_PORT unset"),
        (slurm_step(2, 4, 0, SLURM_PROCID="9"), "SLURM_PROCID=9 is not below the step's SLURM_STEP_NUM_TASKS=4"),
        ({"MASTER_PORT": "70000"}, "is not a TCP port"),
        # "²".isdigit() is True but int("²") raises: a traceback instead of exit 2 (found by the break session)
        ({"NNODES": "2", "MASTER_ADDR": "a", "MASTER_PORT": "²"}, "MASTER_PORT='²' is not a whole number"),
        ({"NNODES": "²"}, "NNODES='²' is not a whole number"),
        # 5000 digits: int() refuses more than 4300 (a ValueError traceback, found reading the change again)
        ({"NNODES": "2", "MASTER_ADDR": "a", "MASTER_PORT": "9" * 5000}, "is not a whole number"),
        (slurm_step(2, 2, 1, SLURM_JOB_ID="²"), "no rendezvous: MASTER_PORT unset"),
    ],
)
def test_layouts_that_cannot_start_are_refused_naming_the_variables(environ, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        job_layout(environ)


def test_the_batch_shell_of_a_one_node_job_is_one_process():
    layout = job_layout({"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"})
    assert (layout.engine, layout.mode, layout.nnodes) == ("slurm", "node", 1)


def test_compose_multinode_variables_still_work():
    layout = job_layout({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert (layout.engine, layout.nnodes, layout.node_rank, layout.master_addr) == ("env", 2, 1, "10.0.0.1")


def test_one_line_per_node_from_the_entrypoints_and_one_per_job_from_the_workers():
    assert is_first_rank({}) and is_first_rank(slurm_step(2, 2, 1))  # each node's entrypoint prints its lines
    assert is_first_rank(slurm_step(2, 4, 2)) and not is_first_rank(slurm_step(2, 4, 3))  # local id 0 of node 1
    assert not is_first_rank({"LOCAL_RANK": "0", "RANK": "2"}) and is_first_rank({"LOCAL_RANK": "0", "RANK": "0"})
    assert is_first_rank({"RANK": "1", "WORLD_SIZE": "2"})  # a PyTorchJob pod's RANK is the pod, not a process


def test_non_ascii_digits_in_slurm_counts_do_not_crash_the_rank_test():
    # "²".isdigit() is True but int("²") raises (found by the break session)
    assert is_first_rank({"SLURM_STEP_NUM_TASKS": "²", "SLURM_STEP_NUM_NODES": "1", "SLURM_LOCALID": "1"})
