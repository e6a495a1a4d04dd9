"""Who started this process and where it sits in the job: the job layout, read from the scheduler's variables.

One function, :func:`job_layout`, reads the environment once and returns a frozen :class:`JobLayout`: how many
nodes, which one this is, where the rendezvous is, and the launch mode. Engines recognised, first match wins:

* **Slurm step** (``srun``): ``SLURM_STEP_NUM_TASKS``/``SLURM_STEP_NUM_NODES`` are set only inside a step
  (``man srun``, OUTPUT ENVIRONMENT VARIABLES); one task per node (``--ntasks-per-node=1``) is the
  ``node`` mode (rocmft starts torchrun on each node), more tasks than nodes the ``task`` mode (one process per GPU
  started by the scheduler: rank ``SLURM_PROCID``, local rank ``SLURM_LOCALID``, world ``SLURM_STEP_NUM_TASKS``;
  no torchrun, as OLCF's Frontier guide runs PyTorch). The rendezvous host is the first host of
  ``SLURM_STEP_NODELIST`` expanded by python-hostlist (the node-list grammar of Slurm's ``hostlist.c``), the port
  is derived from ``SLURM_JOB_ID`` so that every node and a requeued job agree on it without talking.
* **Slurm batch shell** (``SLURM_JOB_ID`` without a step): one process; with more than one node allocated it is
  refused, since the other nodes would never start (the job script must use ``srun``).
* **Kubernetes** (``KUBERNETES_SERVICE_HOST``): Kubeflow's torch runtimes export ``PET_NNODES``, ``PET_NODE_RANK``,
  ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``/``PORT`` (TrainJob, kubeflow/trainer v2.3.0 torch.go, where the node
  rank comes from the job-completion index; PyTorchJob since training-operator v1.7, v1.9.4 envvar.go, which also
  sets ``WORLD_SIZE`` = pods × nprocPerNode and ``RANK`` = the pod's index); a PyTorchJob before v1.7 exports only
  ``WORLD_SIZE`` (the pods) and ``RANK`` beside ``MASTER_ADDR``/``PORT``. An Indexed Job's ``JOB_COMPLETION_INDEX``
  is the node rank when nothing else gives one; an elastic PyTorchJob (no rank) is refused. One pod per node,
  rocmft starts torchrun in it (``node`` mode). :func:`_kubernetes` cites each file at its commit.
* **By hand** (``NNODES``/``NODE_RANK``/``MASTER_ADDR``/``MASTER_PORT``, LLaMA-Factory's launcher variables, as
  compose.multinode.yaml sets them), else one node.

A value the user set by hand (``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) wins over the
scheduler's, except that an ``NNODES`` or ``NODE_RANK`` that contradicts the scheduler is refused: one of them is
wrong and the job would wait forever for a node that never comes. Read-only: nothing here changes the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rocmft.errors import ConfigError
from rocmft.values import whole_number

Engine = Literal["none", "env", "slurm", "kubernetes"]
Mode = Literal["node", "task"]

# The rendezvous port under Slurm when MASTER_PORT is unset: PORT_BASE + SLURM_JOB_ID mod PORT_SPAN, so every
# task of the job (and the job after a requeue, which keeps its id) computes the same port without talking, and
# jobs sharing a node rarely collide. 20000-29999 stays below Linux's ephemeral range (32768-60999,
# /proc/sys/net/ipv4/ip_local_port_range) and clear of torchrun's 29500 only by chance; set MASTER_PORT to choose.
PORT_BASE = 20000
PORT_SPAN = 10000


@dataclass(frozen=True)
class JobLayout:
    """Where this process sits in the job.

    Attributes:
        engine: who said so: ``none`` (one node, nothing set), ``env`` (NNODES/NODE_RANK by hand), ``slurm``,
            ``kubernetes``.
        mode: ``node``: rocmft starts this node's processes (torchrun when more than one, or for a multi-node
            run); ``task``: the scheduler started this process as one rank of many (no torchrun).
        nnodes: nodes in the job (≥ 1).
        node_rank: this node's index, 0 .. nnodes - 1.
        master_addr: the rendezvous host (None: one node, torchrun's 127.0.0.1).
        master_port: the rendezvous port (None: a free one, one node only).
        rank: task mode: this process's global rank, 0 .. world_size - 1; else None (torchrun assigns).
        local_rank: task mode: its index among the tasks of this node; else None.
        world_size: task mode: tasks in the job; else None.
        local_world_size: task mode: tasks on this node; else None.
        nproc_per_node: processes per node the scheduler asked for (Kubeflow's PET_NPROC_PER_NODE when a
            number); None leaves it to rocmft (ROCMFT_NPROC_PER_NODE, else one per visible GPU).
        job_id: the scheduler's job id (SLURM_JOB_ID), or None.
        sources: each decided field -> where it came from (``"SLURM_NODEID=1"``), for the printout and manifest.
    """

    engine: Engine = "none"
    mode: Mode = "node"
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    nproc_per_node: int | None = None
    job_id: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_first_node(self) -> bool:
        """Whether this is node 0 (in task mode: the process of global rank 0 writes the run's outputs)."""
        return self.rank == 0 if self.mode == "task" else self.node_rank == 0

    def as_record(self) -> dict[str, Any]:
        """The manifest's ``job`` record: every field, ``is_first`` (:attr:`is_first_node`) and ``description``
        (:meth:`describe`), JSON-ready."""
        return {
            "description": self.describe(), "is_first": self.is_first_node,
            "engine": self.engine, "mode": self.mode, "nnodes": self.nnodes, "node_rank": self.node_rank,
            "master_addr": self.master_addr, "master_port": self.master_port, "rank": self.rank,
            "local_rank": self.local_rank, "world_size": self.world_size, "local_world_size": self.local_world_size,
            "nproc_per_node": self.nproc_per_node, "job_id": self.job_id, "sources": dict(self.sources),
        }  # fmt: skip

    def describe(self) -> str:
        """One line for the log: engine, shape, this process's place, the rendezvous, each with its source."""
        where = {"none": "one node", "env": "NNODES/NODE_RANK by hand", "slurm": f"Slurm job {self.job_id}",
                 "kubernetes": "Kubernetes (Kubeflow)"}[self.engine]  # fmt: skip
        if self.mode == "task":
            shape = (
                f"{self.world_size} tasks on {self.nnodes} node(s), one process per task, no torchrun; this is "
                f"rank {self.rank} (local {self.local_rank} of {self.local_world_size}) on node {self.node_rank}"
            )
        else:
            shape = f"{self.nnodes} node(s), rocmft launches each node's processes; this is node {self.node_rank}"
        rendezvous = f"; rendezvous {self.master_addr}:{self.master_port}" if self.master_addr else ""
        sources = ", ".join(f"{k} from {v}" for k, v in self.sources.items())
        return f"{where}: {shape}{rendezvous}" + (f" ({sources})" if sources else "")

    def worker_environment(self) -> dict[str, str]:
        """Task mode: the variables torch.distributed's ``env://`` rendezvous and accelerate read (RANK, LOCAL_RANK,
        WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT: what torchrun would have set); {} in
        node mode (torchrun sets them)."""
        if self.mode != "task":
            return {}
        return {
            "RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": str(self.master_addr), "MASTER_PORT": str(self.master_port),
        }  # fmt: skip


def _number(environ: Mapping[str, str], name: str, *, minimum: int = 0, fix: str = "") -> int | None:
    """``environ[name]`` as an int ≥ ``minimum``; None when unset or empty. Raises ConfigError naming it."""
    text = (environ.get(name) or "").strip()
    if not text:
        return None
    value = whole_number(text)
    if value is None or value < minimum:
        raise ConfigError(f"{name}={text!r} is not a whole number of at least {minimum}.",
                          fix or f"Unset {name}, or set it to a number (the scheduler normally sets it).")  # fmt: skip
    return value


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (``nid[001-004],login1`` → ``nid001``), expanded by python-hostlist.

    Raises:
        ConfigError: a list python-hostlist cannot parse (names the list).
    """
    import hostlist

    try:
        hosts = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as err:
        raise ConfigError(
            f"SLURM_STEP_NODELIST={nodelist!r} is not a Slurm node list ({err}).",
            "Run rocmft under srun, which sets it; or set MASTER_ADDR to the first node.",
        ) from err
    if not hosts:
        raise ConfigError(f"SLURM_STEP_NODELIST={nodelist!r} names no host.", "Set MASTER_ADDR to the first node.")
    return hosts[0]


def _slurm(environ: Mapping[str, str]) -> dict[str, Any] | None:
    job = (environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or "").strip()
    if not job:
        return None
    tasks = _number(environ, "SLURM_STEP_NUM_TASKS", minimum=1)
    if tasks is None:  # the batch shell itself: one process on the first node of the allocation
        nodes = _number(environ, "SLURM_JOB_NUM_NODES", minimum=1) or _number(environ, "SLURM_NNODES", minimum=1)
        if nodes and nodes > 1:
            raise ConfigError(
                f"rocmft runs in the batch script of Slurm job {job}, which has {nodes} nodes (SLURM_JOB_NUM_NODES="
                f"{nodes}), outside srun: the other {nodes - 1} node(s) would never start.",
                "Start it with srun (deploy/slurm/train.sbatch: srun ... rocmft train), one task per node or per GPU.",
            )
        return {"engine": "slurm", "job_id": job}
    nodes = _number(environ, "SLURM_STEP_NUM_NODES", minimum=1) or 1
    node = _number(environ, "SLURM_NODEID") or 0
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    layout: dict[str, Any] = {
        "engine": "slurm", "job_id": job, "nnodes": nodes, "node_rank": node,
        "master_port": PORT_BASE + whole_number(job) % PORT_SPAN if whole_number(job) is not None else None,
        "sources": {"nnodes": f"SLURM_STEP_NUM_NODES={nodes}", "node_rank": f"SLURM_NODEID={node}",
                    "master_port": f"SLURM_JOB_ID={job} ({PORT_BASE} + id mod {PORT_SPAN})"},
    }  # fmt: skip
    if nodelist:
        layout["master_addr"] = first_host(nodelist)
        layout["sources"]["master_addr"] = f"first host of SLURM_STEP_NODELIST={nodelist}"
    if tasks > nodes:
        import hostlist

        per_node_text = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or ""
        try:
            per_node = hostlist.parse_slurm_tasks_per_node(per_node_text) if per_node_text else []
        except Exception:  # python-hostlist raises bare ValueError/IndexError on a malformed count list
            per_node = []
        layout.update(
            mode="task", world_size=tasks, rank=_number(environ, "SLURM_PROCID") or 0,
            local_rank=_number(environ, "SLURM_LOCALID") or 0,
            local_world_size=per_node[node] if node < len(per_node) else -(-tasks // nodes),
        )  # fmt: skip
        layout["sources"].update(rank=f"SLURM_PROCID={layout['rank']}", world_size=f"SLURM_STEP_NUM_TASKS={tasks}",
                                 local_rank=f"SLURM_LOCALID={layout['local_rank']}")  # fmt: skip
    return layout


# Kubeflow's operators, as read in their code (the newest releases the tools hold):
# * TrainJob, kubeflow/trainer v2.3.0 (658725bd) pkg/runtime/framework/plugins/torch/torch.go, EnforceMLPolicy: the
#   "node" container gets PET_NNODES (trainer.numNodes), PET_NPROC_PER_NODE ("auto", trainer.numProcPerNode, or the
#   CPU request when the node asks for no GPU), PET_NODE_RANK from the downward API's
#   metadata.annotations['batch.kubernetes.io/job-completion-index'] (pkg/constants/constants.go), PET_MASTER_ADDR
#   <trainjob>-node-0-0.<trainjob> and PET_MASTER_PORT 29500; no RANK, WORLD_SIZE or MASTER_ADDR.
# * PyTorchJob, kubeflow/trainer v1.9.4 (4445c12a; the v1 training operator) pkg/controller.v1/pytorch/envvar.go
#   setPodEnv and master.go: with a Master replica, MASTER_ADDR/PET_MASTER_ADDR (<job>-master-0), MASTER_PORT/
#   PET_MASTER_PORT (the container port named pytorchjob-port), RANK and PET_NODE_RANK = the pod's index (master 0,
#   worker i -> i + 1), WORLD_SIZE = pods x nprocPerNode (1 when nprocPerNode is not a number: "auto", the default
#   of pytorch_defaults.go); PET_NPROC_PER_NODE = nprocPerNode; PET_NNODES = the pods, or, with an elasticPolicy
#   (elastic.go), "min:max" beside PET_RDZV_ENDPOINT/PET_RDZV_BACKEND and no rank at all. These came with
#   kubeflow/training-operator#1840 (v1.7.0); before it (1417bbc3 envvar.go) only WORLD_SIZE = the pods, RANK and
#   MASTER_ADDR/PORT were set, which the fallback below reads.
# torchrun's --nproc_per_node words that mean "one per GPU" on a GPU node (torch/distributed/run.py,
# determine_local_world_size: auto counts the accelerators, gpu the CUDA/HIP devices); rocmft's own rule (one per
# visible GPU, or ROCMFT_NPROC_PER_NODE) then decides, as it does without a scheduler.
_PER_GPU_WORDS = ("auto", "gpu")


def _kubernetes(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The layout of a pod started by Kubeflow's TrainJob or PyTorchJob (or an Indexed Job); None outside a pod.

    One pod per node, rocmft starts torchrun in it. Raises ConfigError for an elastic PyTorchJob (no node rank is
    given: every pod would think it is node 0), for more than one node without a node rank, and for a variable
    that is not a number (naming it).
    """
    if not environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    nnodes_text = (environ.get("PET_NNODES") or "").strip()
    rdzv = [name for name in ("PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND") if (environ.get(name) or "").strip()]
    if ":" in nnodes_text or rdzv:
        what = f"PET_NNODES={nnodes_text!r}" if ":" in nnodes_text else f"{rdzv[0]}={environ[rdzv[0]].strip()!r}"
        raise ConfigError(
            f"{what}: this pod belongs to an elastic PyTorchJob (elasticPolicy), whose pods get no node rank; "
            "rocmft starts torchrun with a fixed node count and rank, so every pod would act as node 0.",
            "Remove elasticPolicy and give the PyTorchJob one Master replica and N-1 Workers "
            "(deploy/k8s/pytorchjob.yaml), or run it as a TrainJob (deploy/k8s/trainjob.yaml).",
        )
    if nnodes_text:  # TrainJob, and PyTorchJob v1.7+: torchrun's --nnodes/--node_rank/... as PET_* variables
        nodes = _number(environ, "PET_NNODES", minimum=1) or 1
        rank_name = next((n for n in ("PET_NODE_RANK", "JOB_COMPLETION_INDEX") if (environ.get(n) or "").strip()),
                         None)  # fmt: skip
        if rank_name is None and nodes > 1:
            raise ConfigError(
                f"PET_NNODES={nodes} but neither PET_NODE_RANK nor JOB_COMPLETION_INDEX is set: this pod's place in "
                "the job is unknown (a PyTorchJob without a Master replica gets no rank), so every pod would act "
                "as node 0.",
                "Give the PyTorchJob one Master replica (deploy/k8s/pytorchjob.yaml), or run it as a TrainJob.",
            )
        node = _number(environ, rank_name) if rank_name else 0
        sources = {"nnodes": f"PET_NNODES={nodes}", "node_rank": f"{rank_name}={node}" if rank_name else "one pod"}
        layout: dict[str, Any] = {"engine": "kubernetes", "nnodes": nodes, "node_rank": node or 0, "sources": sources}
        per_node = (environ.get("PET_NPROC_PER_NODE") or "").strip()
        if per_node and per_node.lower() not in _PER_GPU_WORDS:
            layout["nproc_per_node"] = _number(
                environ, "PET_NPROC_PER_NODE", minimum=1,
                fix="Set nprocPerNode (PyTorchJob) or trainer.numProcPerNode (TrainJob) to a number of processes "
                    "per pod, or leave it unset (auto: one per GPU).",
            )  # fmt: skip
            sources["nproc_per_node"] = f"PET_NPROC_PER_NODE={per_node}"
        for name, key in (("PET_MASTER_ADDR", "master_addr"), ("PET_MASTER_PORT", "master_port")):
            value = (environ.get(name) or "").strip()
            if value:
                layout[key] = value if key == "master_addr" else _number(environ, name, minimum=1)
                sources[key] = f"{name}={value}"
        return layout
    if environ.get("WORLD_SIZE") and environ.get("RANK") and environ.get("MASTER_ADDR"):  # PyTorchJob before v1.7
        nodes, node = _number(environ, "WORLD_SIZE", minimum=1), _number(environ, "RANK") or 0
        return {"engine": "kubernetes", "nnodes": nodes, "node_rank": node,
                "sources": {"nnodes": f"WORLD_SIZE={nodes} (PyTorchJob before v1.7: the pods)",
                            "node_rank": f"RANK={node} (PyTorchJob: the pod's index)"}}  # fmt: skip
    if environ.get("JOB_COMPLETION_INDEX"):
        node = _number(environ, "JOB_COMPLETION_INDEX") or 0
        return {"engine": "kubernetes", "node_rank": node,
                "sources": {"node_rank": f"JOB_COMPLETION_INDEX={node} (an Indexed Job)"}}  # fmt: skip
    return None


def job_layout(environ: Mapping[str, str]) -> JobLayout:
    """The job layout of this process, from ``environ`` (the run's snapshot, rocmft.config.settings.Settings.environ;
    the process environment only at a process's own edge); see the module docstring.

    Raises:
        ConfigError: a scheduler or launcher variable that is not a number, NNODES/NODE_RANK by hand that
            contradict the scheduler's, NODE_RANK ≥ NNODES, a multi-node Slurm batch shell outside srun.
    """
    found = _slurm(environ) or _kubernetes(environ) or {}
    layout: dict[str, Any] = {"engine": "none", **found, "sources": dict(found.get("sources", {}))}
    by_hand = {
        "nnodes": _number(environ, "NNODES", minimum=1, fix="Set NNODES to the number of hosts (1, 2, ...)."),
        "node_rank": _number(environ, "NODE_RANK", fix="Set NODE_RANK to 0 on the first node, 1, 2, ... on others."),
    }  # fmt: skip
    for key, value in by_hand.items():
        if value is None:
            continue
        name = key.upper()
        if key in layout["sources"] and layout.get(key) != value:
            raise ConfigError(
                f"{name}={value} (set by hand) contradicts the scheduler's {layout['sources'][key]}.",
                f"Unset {name}: under {layout['engine']} rocmft reads the job's shape from the scheduler.",
            )
        layout[key] = value
        layout["sources"].setdefault(key, f"{name}={value}")
        if layout["engine"] == "none":
            layout["engine"] = "env"
    # MASTER_ADDR/MASTER_PORT in the environment win: set by hand, or by the training operator v1 itself
    for name, key in (("MASTER_ADDR", "master_addr"), ("MASTER_PORT", "master_port")):
        if (environ.get(name) or "").strip():
            layout[key] = environ[name].strip() if key == "master_addr" else _number(environ, name, minimum=1)
            layout["sources"][key] = f"{name}={environ[name].strip()}"
    result = JobLayout(**layout)
    _refuse_unstartable(result)
    return result


def _refuse_unstartable(layout: JobLayout) -> None:
    """Raise ConfigError for a layout whose processes could never meet: a node or task rank outside the job, a
    rendezvous port outside 1-65535, or a multi-node job without a rendezvous address and port (each node would
    wait on its own 127.0.0.1 and free port until torchrun's timeout). Each message names the variables."""
    src = layout.sources
    if layout.node_rank >= layout.nnodes:
        raise ConfigError(
            f"This node's rank {layout.node_rank} ({src.get('node_rank', 'NODE_RANK')}) is not below the job's "
            f"{layout.nnodes} node(s) ({src.get('nnodes', 'NNODES')}): node ranks run from 0 to {layout.nnodes - 1}.",
            "Give each node a distinct NODE_RANK below NNODES (a scheduler sets both: run rocmft under srun / the "
            "operator without setting them by hand).",
        )
    if layout.mode == "task" and layout.rank is not None and layout.rank >= (layout.world_size or 1):
        raise ConfigError(f"{src.get('rank')} is not below the step's {src.get('world_size')}.",
                          "Run rocmft under srun, which sets both; do not set SLURM_* by hand.")  # fmt: skip
    if layout.master_port is not None and not 0 < layout.master_port < 65536:
        raise ConfigError(
            f"The rendezvous port {layout.master_port} ({src.get('master_port')}) is not a TCP port.",
            "Set MASTER_PORT to a free port between 1024 and 65535 (the same on every node).",
        )
    if layout.nnodes > 1 and (layout.master_addr is None or layout.master_port is None):
        wanted = {"MASTER_ADDR": (layout.master_addr, "node 0's address, reachable from the others"),
                  "MASTER_PORT": (layout.master_port, "a free port")}  # fmt: skip
        missing = [name for name, (value, _) in wanted.items() if value is None]
        raise ConfigError(
            f"This job has {layout.nnodes} nodes ({src.get('nnodes', 'NNODES')}), but no rendezvous: "
            f"{' and '.join(missing)} unset, so every node would wait on its own until torchrun's timeout.",
            "Set " + " and ".join(f"{n} ({wanted[n][1]})" for n in missing) + " the same on every node "
            "(compose.multinode.yaml lists what each node sets; under Slurm, MASTER_PORT when SLURM_JOB_ID is not "
            "a number).",
        )


__all__ = ["PORT_BASE", "PORT_SPAN", "JobLayout", "first_host", "job_layout"]
