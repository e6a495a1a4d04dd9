"""The rank mapping under Kubernetes: the environment each pod of deploy/k8s's jobs gets, fed to job_layout.

No cluster runs here, so the operators are stood in for by two small functions that apply their rules as read in
their code (the newest releases): `pytorchjob_envs` kubeflow/trainer v1.9.4 pkg/controller.v1/pytorch/envvar.go
(setPodEnv), master.go and elastic.go with pkg/apis/kubeflow.org/v1/pytorch_defaults.go; `trainjob_envs` kubeflow/
trainer v2.3.0 pkg/runtime/framework/plugins/torch/torch.go (EnforceMLPolicy) and pkg/constants/constants.go, and
the Job controller's JOB_COMPLETION_INDEX for the Indexed Jobs JobSet creates. They read the shipped manifests,
so a change there (node count, port, nprocPerNode) is what these tests see.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocmft.errors import ConfigError
from rocmft.facts.scheduler import job_layout

K8S = Path(__file__).resolve().parents[1] / "deploy" / "k8s"
# what the kubelet sets in every pod, service links or not (pkg/kubelet/kubelet_pods.go, getServiceEnvVarMap)
KUBELET = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def manifest(name: str, kind: str) -> dict[str, Any]:
    """A copy of the document of ``kind`` in deploy/k8s/``name``."""
    return copy.deepcopy(next(d for d in yaml.safe_load_all((K8S / name).read_text()) if d and d["kind"] == kind))


def _container_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}  # valueFrom: a Secret, not here


def pytorchjob_envs(job: dict[str, Any]) -> list[dict[str, str]]:
    """Each pod's environment, Master first then Worker 0.., as the v1 operator sets it (v1.9.4 setPodEnv)."""
    spec, name = job["spec"], job["metadata"]["name"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(r.get("replicas", 1) for r in replicas.values())  # setDefaultReplicas: 1
    elastic = spec.get("elasticPolicy")
    nproc = spec.get("nprocPerNode", None if elastic and elastic.get("nProcPerNode") else "auto")  # defaults.go
    world = total * (int(nproc) if nproc and nproc.isdigit() else 1)  # getNprocPerNodeInt: 1 unless a number
    envs = []
    for role in ("Master", "Worker"):
        for index in range(replicas.get(role, {}).get("replicas", 1) if role in replicas else 0):
            container = next(c for c in replicas[role]["template"]["spec"]["containers"] if c["name"] == "pytorch")
            env = {**KUBELET, **_container_env(container), "PYTHONUNBUFFERED": "1"}
            if "Master" in replicas:
                master = next(c for c in replicas["Master"]["template"]["spec"]["containers"] if c["name"] == "pytorch")
                port = next((p["containerPort"] for p in master.get("ports", []) if p.get("name") == "pytorchjob-port"),
                            23456)  # fmt: skip
                rank = index + 1 if role == "Worker" else index
                env |= {"MASTER_PORT": str(port), "PET_MASTER_PORT": str(port), "MASTER_ADDR": f"{name}-master-0",
                        "PET_MASTER_ADDR": f"{name}-master-0", "WORLD_SIZE": str(world), "RANK": str(rank),
                        "PET_NODE_RANK": str(rank)}  # fmt: skip
            if nproc is not None:
                env["PET_NPROC_PER_NODE"] = nproc
            if elastic:
                low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
                workers = replicas["Worker"]["replicas"]
                env |= {"PET_RDZV_ENDPOINT": f"{name}-worker-0:23456", "PET_RDZV_BACKEND": "c10d",
                        "PET_NNODES": f"{low or workers}:{high or workers}"}  # fmt: skip
            else:
                env["PET_NNODES"] = str(total)
            envs.append(env)
    return envs


def trainjob_envs(trainjob: dict[str, Any], runtime: dict[str, Any]) -> list[dict[str, str]]:
    """Each node pod's environment, as Trainer's torch plugin sets it (v2.3.0 EnforceMLPolicy), in index order."""
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"].get("trainer", {})
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    resources = trainer.get("resourcesPerNode") or {}
    gpus = sum(int(v) for part in resources.values() for k, v in part.items() if "gpu" in k.lower())
    nproc = str(trainer["numProcPerNode"]) if "numProcPerNode" in trainer else "auto"
    if nproc == "auto" and gpus == 0:  # no GPU asked: the CPU request (or limit), at least 1
        cpu = (resources.get("requests") or resources.get("limits") or {}).get("cpu", "0")
        nproc = str(max(1, int(cpu)))
    job = next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    container = next(c for c in job["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == "node")
    # PET_NODE_RANK: fieldRef metadata.annotations['batch.kubernetes.io/job-completion-index'], the pod's index in
    # its Indexed Job, which the Job controller also exports as JOB_COMPLETION_INDEX
    return [{**KUBELET, **_container_env(container), **_container_env(trainer),
             "PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(i),
             "JOB_COMPLETION_INDEX": str(i), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}", "PET_MASTER_PORT": "29500"}
            for i in range(nodes)]  # fmt: skip


def _shipped_pytorchjob() -> dict[str, Any]:
    return manifest("pytorchjob.yaml", "PyTorchJob")


def _shipped_trainjob() -> tuple[dict[str, Any], dict[str, Any]]:
    return manifest("trainjob.yaml", "TrainJob"), manifest("trainjob.yaml", "TrainingRuntime")


def test_pytorchjob_pods_get_distinct_node_ranks() -> None:
    """The shipped PyTorchJob (Master + 1 Worker): 2 nodes, Master node 0 and the only first node, Worker node 1,
    rendezvous at the Master's service on its pytorchjob-port; nprocPerNode left to rocmft (auto)."""
    envs = pytorchjob_envs(_shipped_pytorchjob())
    layouts = [job_layout(env) for env in envs]
    assert [(lay.engine, lay.mode, lay.nnodes, lay.node_rank) for lay in layouts] == [
        ("kubernetes", "node", 2, 0), ("kubernetes", "node", 2, 1)]  # fmt: skip
    assert {(lay.master_addr, lay.master_port) for lay in layouts} == {("llm-sft-master-0", 23456)}
    assert [lay.is_first_node for lay in layouts] == [True, False]
    assert {lay.nproc_per_node for lay in layouts} == {None}
    assert layouts[1].sources["node_rank"] == "PET_NODE_RANK=1"


def test_pytorchjob_nnodes_is_pods_not_world_size() -> None:
    """nprocPerNode "8" with 4 pods: WORLD_SIZE is 32 (pods x nproc) but the layout has 4 nodes of 8 processes."""
    job = _shipped_pytorchjob()
    job["spec"]["nprocPerNode"] = "8"
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 3
    envs = pytorchjob_envs(job)
    assert {env["WORLD_SIZE"] for env in envs} == {"32"}
    layouts = [job_layout(env) for env in envs]
    assert [lay.node_rank for lay in layouts] == [0, 1, 2, 3]
    assert {(lay.nnodes, lay.nproc_per_node) for lay in layouts} == {(4, 8)}


def test_pytorchjob_before_v1_7_reads_world_size_as_pods() -> None:
    """The operator before kubeflow/training-operator#1840 (1417bbc3 envvar.go) set only WORLD_SIZE (the pods),
    RANK and MASTER_ADDR/PORT: the fallback reads those."""
    for env in pytorchjob_envs(_shipped_pytorchjob()):
        old = {k: v for k, v in env.items() if not k.startswith("PET_")}
        layout, new = job_layout(old), job_layout(env)
        assert (layout.nnodes, layout.node_rank, layout.master_addr, layout.master_port) == (
            new.nnodes, new.node_rank, new.master_addr, new.master_port)  # fmt: skip


def test_elastic_pytorchjob_is_refused_naming_the_variable() -> None:
    """An elasticPolicy gives no rank (PET_NNODES "min:max", a c10d endpoint): refused, not every pod node 0."""
    job = _shipped_pytorchjob()
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 2
    job["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 2}
    with pytest.raises(ConfigError, match=r"PET_NNODES='1:2'.*elastic") as err:
        job_layout(pytorchjob_envs(job)[0])
    assert "Master replica" in err.value.remedy


def test_pytorchjob_without_master_is_refused() -> None:
    """Workers only, not elastic: the operator sets PET_NNODES but no rank; refused instead of two node 0s."""
    job = _shipped_pytorchjob()
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 2
    with pytest.raises(ConfigError, match=r"PET_NNODES=2 but neither PET_NODE_RANK nor JOB_COMPLETION_INDEX"):
        job_layout(pytorchjob_envs(job)[1])


def test_trainjob_pods_get_distinct_node_ranks() -> None:
    """The shipped TrainJob (numNodes 2 on the rocmft-rocm runtime): node ranks 0 and 1 from the completion
    index, rendezvous at node 0's JobSet hostname on port 29500, processes per node left to rocmft (auto)."""
    envs = trainjob_envs(*_shipped_trainjob())
    layouts = [job_layout(env) for env in envs]
    assert [(lay.engine, lay.nnodes, lay.node_rank, lay.is_first_node) for lay in layouts] == [
        ("kubernetes", 2, 0, True), ("kubernetes", 2, 1, False)]  # fmt: skip
    assert {(lay.master_addr, lay.master_port, lay.nproc_per_node) for lay in layouts} == {
        ("llm-sft-node-0-0.llm-sft", 29500, None)}  # fmt: skip


def test_trainjob_num_proc_per_node_reaches_the_layout() -> None:
    """trainer.numProcPerNode 4 (an int in the TrainJob API) on 3 nodes: 3 nodes of 4 processes each."""
    trainjob, runtime = _shipped_trainjob()
    trainjob["spec"]["trainer"] |= {"numProcPerNode": 4, "numNodes": 3}
    layouts = [job_layout(env) for env in trainjob_envs(trainjob, runtime)]
    assert [(lay.nnodes, lay.node_rank, lay.nproc_per_node) for lay in layouts] == [(3, 0, 4), (3, 1, 4), (3, 2, 4)]


def test_indexed_job_alone_gives_the_node_rank() -> None:
    """A plain Indexed Job (no Kubeflow): JOB_COMPLETION_INDEX is the node rank; the node count comes by hand."""
    layout = job_layout({**KUBELET, "JOB_COMPLETION_INDEX": "1", "NNODES": "2", "MASTER_ADDR": "head",
                         "MASTER_PORT": "29500"})  # fmt: skip
    assert (layout.engine, layout.nnodes, layout.node_rank, layout.master_addr) == ("kubernetes", 2, 1, "head")


def _pytorchjob_worker() -> dict[str, str]:
    return pytorchjob_envs(_shipped_pytorchjob())[1]


def _trainjob_node1() -> dict[str, str]:
    return trainjob_envs(*_shipped_trainjob())[1]


@pytest.mark.parametrize(
    ("pod", "name", "value"),
    [
        (_pytorchjob_worker, "PET_NODE_RANK", "one"),
        (_pytorchjob_worker, "PET_NNODES", "two"),
        (_pytorchjob_worker, "PET_MASTER_PORT", "http"),
        (_pytorchjob_worker, "PET_NPROC_PER_NODE", "eight"),
        (_pytorchjob_worker, "MASTER_PORT", "-1"),
        (_trainjob_node1, "PET_NODE_RANK", "1.0"),
        (_trainjob_node1, "PET_NNODES", "0"),
        (_trainjob_node1, "PET_NPROC_PER_NODE", "0"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_it(pod: Any, name: str, value: str) -> None:
    """A variable that is not a (positive where it must be) number: ConfigError (exit 2) naming it and its value."""
    with pytest.raises(ConfigError, match=rf"^{name}={value!r}"):
        job_layout({**pod(), name: value})


@pytest.mark.parametrize("name", ["WORLD_SIZE", "RANK", "JOB_COMPLETION_INDEX"])
def test_a_bad_fallback_value_is_named(name: str) -> None:
    """The fallbacks (the operator before v1.7, a plain Indexed Job) name a bad value too."""
    env = {**KUBELET, "WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "m"} if name != "JOB_COMPLETION_INDEX" else {
        **KUBELET, "JOB_COMPLETION_INDEX": "0"}  # fmt: skip
    with pytest.raises(ConfigError, match=rf"^{name}='x'"):
        job_layout({**env, name: "x"})
