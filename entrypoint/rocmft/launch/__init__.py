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

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from rocmft.errors import ConfigError, ExitCode
from rocmft.facts.image import ARCH_PROFILE, read_profile
from rocmft.facts.job import nnodes, node_rank
from rocmft.proc import free_port
from rocmft.render import Plan, processes_per_node

LOG_FILE = "train.log"
LOG_DIR = "logs"
# The variables that steer RCCL/NCCL, HIP and the collectives: printed and recorded with their source.
COMMUNICATION_PREFIXES = ("NCCL_", "RCCL_", "HSA_", "HIP_", "GPU_MAX_", "TORCH_NCCL_", "GLOO_", "ROCR_")


def check_world_size(plan: Plan) -> None:
    """Refuse a hand-set WORLD_SIZE that disagrees with NNODES × processes per node, and a NODE_RANK outside
    NNODES (torchrun would wait forever for ranks that never come).

    Raises:
        ConfigError: naming the variables and their values.
    """
    nodes, rank = nnodes(), node_rank()
    per_node = processes_per_node(plan)
    if rank >= nodes:
        raise ConfigError(f"NODE_RANK={rank} but NNODES={nodes}: node ranks run from 0 to {nodes - 1}.",
                          "Give each node a distinct NODE_RANK below NNODES.")  # fmt: skip
    if nodes > 1 and plan.launcher != "torchrun":
        raise ConfigError(f"NNODES={nodes} needs a torchrun launch, but this run is one process.",
                          "Set ROCMFT_DISTRIBUTED=ddp, deepspeed or fsdp for a multi-node run.")  # fmt: skip
    given = os.environ.get("WORLD_SIZE", "").strip()
    if given and given != str(nodes * per_node):
        raise ConfigError(
            f"WORLD_SIZE={given} disagrees with NNODES={nodes} x {per_node} processes per node = {nodes * per_node}.",
            "Unset WORLD_SIZE (torchrun sets it for every rank), or fix NNODES / ROCMFT_NPROC_PER_NODE.",
        )


def full_node_environment(per_node: int, environ: dict[str, str], profile: Path = ARCH_PROFILE) -> dict[str, str]:
    """The profile's settings for a node whose GPUs are all in use: each ``FULL_NODE_<NAME>=<value>`` line of the
    image's docker/arch/<ARCH>.env as NAME=value, when this node runs ``FULL_NODE_GPUS`` processes and the user
    has not set NAME; else nothing. gfx942's ``NCCL_MIN_NCHANNELS=112`` is tuned for the 8-GPU Infinity Fabric
    mesh (AMD's MI300X RCCL tuning notes) and only costs memory on fewer GPUs.

    Args:
        per_node: processes (GPUs) this node's launch starts.
        environ: the environment the launch starts from (a user's value wins).
    """
    values = read_profile(profile) if profile.is_file() else {}
    if per_node < 1 or per_node != int(values.get("FULL_NODE_GPUS") or 0):
        return {}
    settings = {k.removeprefix("FULL_NODE_"): v for k, v in values.items() if k.startswith("FULL_NODE_")}
    return {name: value for name, value in settings.items() if name != "GPUS" and name not in environ}


def communication_environment(environ: dict[str, str], added: dict[str, str],
                              profile: Path = ARCH_PROFILE) -> dict[str, dict[str, str]]:  # fmt: skip
    """The effective RCCL/NCCL/HIP variables of the launch, each with where it came from.

    Sources: ``arch profile`` (a ``RUNTIME_<NAME>`` line of the image's docker/arch/<ARCH>.env, which
    container-entry.sh exports unless the user set the name), ``arch profile, full node`` (a ``FULL_NODE_<NAME>``
    line, :func:`full_node_environment`), ``rocmft`` (the rest of ``added``: network detection for multi-node
    runs), or ``user`` (anything else: the user's value always wins over the profile's).
    """
    values = read_profile(profile) if profile.is_file() else {}
    defaults = {k.removeprefix("RUNTIME_"): v for k, v in values.items() if k.startswith("RUNTIME_")}
    full_node = {k.removeprefix("FULL_NODE_"): v for k, v in values.items() if k.startswith("FULL_NODE_")}
    effective = {}
    for name in sorted({**environ, **added}):
        if not name.startswith(COMMUNICATION_PREFIXES) or name.endswith("_VISIBLE_DEVICES"):
            continue
        value = added.get(name, environ.get(name, ""))
        if name in added:
            source = "arch profile, full node" if full_node.get(name) == value else "rocmft"
        else:
            source = "arch profile" if defaults.get(name) == value else "user"
        effective[name] = {"value": value, "source": source}
    return effective


def prepare_launch(plan: Plan, root: Path = Path("/"), numactl: bool | None = None,
                   allowed_cpus: set[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Decide how the worker starts and record it in ``plan.launch`` (for the manifest).

    Returns ``{"command", "environment" (additions), "numa", "network_notes", "communication"}``. The NUMA
    binding plan follows ROCMFT_NUMA_BIND (rocmft.facts.topology.binding_plan) for the local ranks' GPUs, by PCI
    address from the device probe; the network variables are added for multi-node runs only
    (rocmft.facts.topology.network_environment).

    Args:
        plan: the rendered run (its device probe gives the GPUs' PCI addresses).
        root: where /sys and /proc are (tests pass a recorded host layout).
        numactl: whether numactl is installed (torch binds through it); None looks on PATH.
        allowed_cpus: the CPUs this process may use; None reads os.sched_getaffinity (the container's cpuset).

    Raises:
        ConfigError: a bad NNODES/NODE_RANK/WORLD_SIZE, or ROCMFT_NUMA_BIND=on where binding cannot work.
    """
    from rocmft.facts.topology import binding_plan, network_environment

    check_world_size(plan)
    added = {"PYTHONUNBUFFERED": "1"}
    numa = None
    network_notes: list[str] = []
    if plan.launcher == "torchrun":
        added["FORCE_TORCHRUN"] = "1"  # LLaMA-Factory requires it for DeepSpeed
        network = network_environment(os.environ, nnodes(), root)
        added.update(network.env())
        added.update(full_node_environment(processes_per_node(plan), dict(os.environ)))
        network_notes = network.notes
        gpus = (plan.probes.get("devices") or {}).get("gpus", [])[: processes_per_node(plan)]
        addresses = [g.get("pci") for g in gpus]
        if all(addresses) and addresses:
            numa = binding_plan(addresses, plan.settings.rocmft.numa_bind, root, allowed_cpus, numactl)
        elif plan.settings.rocmft.numa_bind == "on":
            raise ConfigError("ROCMFT_NUMA_BIND=on, but the GPUs' PCI addresses are unknown (no GPU, or an old "
                              "torch).", "Set ROCMFT_NUMA_BIND=auto or off.")  # fmt: skip
    plan.launch = {
        "command": worker_command(plan, numa.torchrun_args() if numa else []),
        "environment": added,
        "numa": numa.as_dict() if numa else {"enabled": False, "reason": "one process, or no GPU PCI addresses"},
        "network_notes": network_notes,
        "communication": communication_environment(dict(os.environ), added),
    }
    return plan.launch


def worker_command(plan: Plan, numa_args: list[str] | None = None) -> list[str]:
    """The command line that starts the worker(s) for ``plan``.

    One process: ``python -m rocmft.worker RUN_DIR``. Otherwise torchrun (``python -m torch.distributed.run``)
    with LLaMA-Factory's launcher conventions: NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT from the
    environment, processes per node from :func:`processes_per_node`, each local rank's output also in
    ``RUN_DIR/logs`` (``--log-dir``, ``--tee 3``), and ``numa_args`` (``--numa-binding node``) when binding.
    """
    worker = ["-m", "rocmft.worker", str(plan.run_dir)]
    if plan.launcher != "torchrun":
        return [sys.executable, *worker]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nnodes()),
        "--node_rank", str(node_rank()),
        "--nproc_per_node", str(processes_per_node(plan)),
        "--master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1"),
        "--master_port", os.environ.get("MASTER_PORT", str(free_port())),
        "--log-dir", str(plan.run_dir / LOG_DIR), "--tee", "3",
        *(numa_args or []),
        *worker,
    ]  # fmt: skip


def _redactor(secrets: list[str]):
    secrets = [s for s in secrets if len(s) >= 4]

    def redact(line: str) -> str:
        for secret in secrets:
            line = line.replace(secret, "<redacted>")
        return line

    return redact


def graceful_stop_targets(pid: int, launcher: str) -> list[int]:
    """The processes a first SIGTERM/SIGINT is forwarded to: the ones that turn it into a stop at the next
    optimizer step with a checkpoint (rocmft.worker). That is the worker ``pid`` itself, or under torchrun its
    ranks (torchrun's own children; empty while it has started none).

    Not the process group: DataLoader worker processes (DATALOADER_NUM_WORKERS, 2 by default) die on SIGTERM,
    and the trainer then raises "DataLoader worker (pid N) is killed by signal: Terminated" mid-step, so a
    two-GPU run on 2 x H200 stopped with no checkpoint (BENCHMARKS.md, stop-resume). Nor torchrun: signalled,
    it shuts its ranks down and kills them 30 s later, whatever a checkpoint still needs.
    """
    if launcher != "torchrun":
        return [pid]
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def graceful_stop_recorded(run_dir: Path) -> bool:
    """Whether this node's worker record (RUN_DIR/worker-result.json) says training stopped early at a step
    boundary with a checkpoint (rocmft.worker: a signal here, or on another rank)."""
    from rocmft.records import read_worker_result

    result = read_worker_result(run_dir)
    return result is not None and result.stopped_at_step is not None


_STOPPED_AT_ONCE = (
    "[rocmft] stopped at once (a second signal, or a signal before training began): no checkpoint of the step in "
    "progress was written, and DataLoader errors above are this stop, not a crash. The next `rocmft train` with the "
    "same settings resumes from the newest complete checkpoint in OUTPUT_DIR, if there is one."
)


def run_worker(plan: Plan, secrets: dict[str, str]) -> int:
    """Run the worker as :func:`prepare_launch` decided and return its exit code (an :class:`ExitCode` value)."""
    launch = plan.launch or prepare_launch(plan)
    command = launch["command"]
    environ = {**os.environ, **launch["environment"]}
    redact = _redactor(list(secrets.values()))
    log_path = plan.run_dir / LOG_FILE
    interrupted: list[int] = []
    started: list[subprocess.Popen] = []  # the worker, once it runs

    def forward(signum, _frame):
        interrupted.append(signum)
        if not started:  # it has not started yet, and now will not (below)
            return
        pid = started[0].pid
        targets = graceful_stop_targets(pid, plan.launcher) if len(interrupted) == 1 else []
        try:
            for target in targets:
                os.kill(target, signum)
            if not targets:  # a second signal (stop now), or torchrun has no ranks yet: the whole group
                os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    # installed before the worker starts: a signal meanwhile killed rocmft and left the worker running alone
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    print(f"[rocmft] launching: {' '.join(command)}", flush=True)
    if plan.launcher == "torchrun":
        print(f"[rocmft] NUMA binding: {launch['numa']['reason']}", flush=True)
        for note in launch["network_notes"]:
            print(f"[rocmft] network: {note}", flush=True)
        shown = ", ".join(f"{k}={v['value']} ({v['source']})" for k, v in launch["communication"].items())
        print(f"[rocmft] communication settings: {shown or 'library defaults'}", flush=True)
    from rocmft.validate import take_kept

    kept = take_kept()
    why_not = kept.can_train(command, environ) if kept is not None else "no parser process was kept"
    if interrupted:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if kept is not None:
            kept.cancel()
        print(_STOPPED_AT_ONCE, flush=True)
        return ExitCode.INTERRUPTED
    if kept is not None and why_not is None:
        print("[rocmft] the worker is the process that validated the configuration (LLaMA-Factory already "
              "imported)", flush=True)  # fmt: skip
        proc = kept.train(plan.run_dir, environ)
    else:
        if kept is not None:
            print(f"[rocmft] a fresh worker process: {why_not}", flush=True)
            kept.cancel()
        proc = subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True,
        )  # fmt: skip
    started.append(proc)
    if interrupted:  # arrived while it started: before training, so it stops at once
        try:
            os.killpg(proc.pid, interrupted[0])
        except ProcessLookupError:
            pass
    try:
        with Path(log_path).open("a", encoding="utf-8") as log:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = redact(line)
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    graceful = graceful_stop_recorded(plan.run_dir)
    if code == ExitCode.OK and graceful:
        return ExitCode.INTERRUPTED  # torchrun's ranks exit 0 after a graceful stop (rocmft.worker.main)
    if code in (ExitCode.OK, ExitCode.NON_FINITE_LOSS):
        return ExitCode(code)
    if not interrupted and code != ExitCode.INTERRUPTED:
        return ExitCode.TRAINING_FAILED
    if not graceful:
        # the worker was stopped at once: by a second signal (which also kills the DataLoader workers, whose
        # errors then fill the log), or by one that came before training began
        print(_STOPPED_AT_ONCE, flush=True)
    return ExitCode.INTERRUPTED
