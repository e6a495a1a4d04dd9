"""The launch, decided: a pure builder of how the worker starts (accelerate's ``prepare_*_cmd_env`` is the model).

:func:`build_launch_spec` reads the plan, the environment it is given, the host layout under ``root`` and the
arch profile (rocmft.facts.image.launch_profile), and returns a frozen :class:`LaunchSpec` (command, the variables it
adds, each communication variable with its source, the NUMA binding); it starts nothing and changes nothing.
rocmft.launch.run starts it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmft.changes import Change
from rocmft.errors import ConfigError
from rocmft.facts.caches import node_local_caches
from rocmft.facts.image import launch_profile, read_profile
from rocmft.facts.scheduler import JobLayout, job_layout
from rocmft.launch.changes import LAUNCH, Added, argument_changes, cache_why, safe_collectives
from rocmft.proc import free_port
from rocmft.render import Plan

LOG_DIR = "logs"

# The variables that steer RCCL/NCCL, HIP and the collectives: printed and recorded with their source.
COMMUNICATION_PREFIXES = ("NCCL_", "RCCL_", "HSA_", "HIP_", "GPU_MAX_", "TORCH_NCCL_", "GLOO_", "ROCR_", "FI_")

NO_BINDING = {"enabled": False, "reason": "one process, or no GPU PCI addresses"}


@dataclass(frozen=True)
class LaunchSpec:
    """How the worker starts (the manifest's ``launch`` record, :meth:`as_record`).

    Attributes:
        command: the command line (``python -m rocmft.worker RUN_DIR``, or torchrun's).
        environment: the variables the launch adds to the entrypoint's environment (PYTHONUNBUFFERED, the arch
            profile's runtime settings, FORCE_TORCHRUN, network and full-node settings); the user's own values are
            never replaced.
        numa: the NUMA binding plan's record (rocmft.facts.topology.BindingPlan.as_dict), or
            ``{"enabled": False, "reason"}``.
        network_notes: what the network detection found, one line each.
        communication: each effective RCCL/NCCL/HIP variable -> ``{"value", "source"}``
            (:func:`communication_environment`).
        job: the job layout's record (rocmft.facts.scheduler.JobLayout.as_record): engine, launch mode, nodes,
            this process's place, the rendezvous, each with its source.
        changes: every automatic change of this launch (rocmft.changes.Change; rocmft.launch.changes): each
            variable of :attr:`environment`, the arch profile's runtime defaults, the training arguments and
            settings rocmft set. The console's block (rocmft.changes.say_changes) and the manifest's
            ``launch.changes`` are this one tuple.
    """

    command: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)
    numa: Mapping[str, Any] = field(default_factory=lambda: dict(NO_BINDING))
    network_notes: tuple[str, ...] = ()
    communication: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    job: Mapping[str, Any] = field(default_factory=lambda: JobLayout().as_record())
    changes: tuple[Change, ...] = ()

    def as_record(self) -> dict[str, Any]:
        """``{"command", "environment", "numa", "network_notes", "communication", "job", "changes"}``, JSON-ready."""
        return {
            "command": list(self.command),
            "environment": dict(self.environment),
            "numa": dict(self.numa),
            "network_notes": list(self.network_notes),
            "communication": {name: dict(entry) for name, entry in self.communication.items()},
            "job": dict(self.job),
            "changes": [change.as_dict() for change in self.changes],
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> LaunchSpec:
        """The spec of a launch record (:meth:`as_record`'s shape: the manifest's ``launch``)."""
        return cls(tuple(record["command"]), dict(record["environment"]), dict(record["numa"]),
                   tuple(record.get("network_notes") or ()), dict(record.get("communication") or {}),
                   dict(record.get("job") or JobLayout().as_record()),
                   tuple(Change.from_dict(c) for c in record.get("changes") or ()))  # fmt: skip

    def process_environment(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The worker's whole environment: ``environ`` with :attr:`environment` added."""
        return {**environ, **self.environment}


def _profile_values(profile: Path | None) -> dict[str, str]:
    return read_profile(profile) if profile is not None and profile.is_file() else {}


def runtime_environment(environ: Mapping[str, str], profile: Path | None) -> dict[str, str]:
    """The architecture profile's runtime settings this launch adds: each ``RUNTIME_<NAME>=<value>`` line of
    ``profile`` (rocmft.facts.image.launch_profile: docker/arch/<ARCH>.env) as NAME=value, unless ``environ`` sets
    NAME (even to ""): the user's value always wins. They reach the worker(s) through the launch's child
    environment (:meth:`LaunchSpec.process_environment`), so they apply wherever rocmft runs: the image's entry
    point, ``apptainer exec ... rocmft train`` (deploy/slurm/train.sbatch, which skips the entry point), a
    bare-metal install. Each value's reason and source are in the profile's comments.

    Args:
        environ: the environment the launch starts from.
        profile: the profile file, or None (nothing to add).
    """
    settings = {k.removeprefix("RUNTIME_"): v for k, v in _profile_values(profile).items() if k.startswith("RUNTIME_")}
    return {name: value for name, value in settings.items() if name not in environ}


def full_node_environment(per_node: int, environ: dict[str, str], profile: Path | None = None) -> dict[str, str]:
    """The profile's settings for a node whose GPUs are all in use: each ``FULL_NODE_<NAME>=<value>`` line of the
    image's docker/arch/<ARCH>.env as NAME=value, when this node runs ``FULL_NODE_GPUS`` processes and the user
    has not set NAME; else nothing. gfx942's ``NCCL_MIN_NCHANNELS=112`` is tuned for the 8-GPU Infinity Fabric
    mesh (AMD's MI300X RCCL tuning notes) and only costs memory on fewer GPUs.

    Args:
        per_node: processes (GPUs) this node's launch starts.
        environ: the environment the launch starts from (a user's value wins).
        profile: the profile file (rocmft.facts.image.launch_profile), or None (nothing to add).
    """
    values = _profile_values(profile)
    if per_node < 1 or per_node != int(values.get("FULL_NODE_GPUS") or 0):
        return {}
    settings = {k.removeprefix("FULL_NODE_"): v for k, v in values.items() if k.startswith("FULL_NODE_")}
    return {name: value for name, value in settings.items() if name != "GPUS" and name not in environ}


def communication_environment(environ: dict[str, str], added: dict[str, str], profile: Path | None = None,
                              reasons: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:  # fmt: skip
    """The effective RCCL/NCCL/HIP variables of the launch, each with where it came from.

    Sources: ``arch profile`` (a ``RUNTIME_<NAME>`` line of ``profile``, docker/arch/<ARCH>.env, which the launch
    adds unless the user set the name: :func:`runtime_environment`), ``arch profile, full node`` (a
    ``FULL_NODE_<NAME>`` line, :func:`full_node_environment`), ``rocmft`` (the rest of ``added``: network detection
    for multi-node runs; ``rocmft: <reason>`` where ``reasons`` gives one, e.g. the fabric found), or ``user``
    (anything ``environ`` sets: the user's value always wins over the profile's, even when it is the same).
    """
    values = _profile_values(profile)
    defaults = {k.removeprefix("RUNTIME_"): v for k, v in values.items() if k.startswith("RUNTIME_")}
    full_node = {k.removeprefix("FULL_NODE_"): v for k, v in values.items() if k.startswith("FULL_NODE_")}
    effective = {}
    for name in sorted({**environ, **added}):
        if not name.startswith(COMMUNICATION_PREFIXES) or name.endswith("_VISIBLE_DEVICES"):
            continue
        value = added.get(name, environ.get(name, ""))
        if name not in added:
            source = "user"
        elif full_node.get(name) == value:
            source = "arch profile, full node"
        elif defaults.get(name) == value:
            source = "arch profile"
        else:
            source = f"rocmft: {reasons[name]}" if (reasons or {}).get(name) else "rocmft"
        effective[name] = {"value": value, "source": source}
    return effective


def gfx_override(
    plan: Plan,
    environ: Mapping[str, str],
    root: Path = Path("/"),
    devices: Mapping[str, Any] | None = None,
    image: Mapping[str, Any] | None = None,
) -> tuple[str, str] | None:
    """The ``HSA_OVERRIDE_GFX_VERSION`` value rocmft sets for this launch and why, or None.

    Only with ROCMFT_GFX_OVERRIDE=auto, only when the user has not set HSA_OVERRIDE_GFX_VERSION, and only when every
    GPU of this container (rocmft.facts.amdgpu.real_targets: the KFD topology, else the device probe) is either one
    the image was built for (PYTORCH_ROCM_ARCH of ``image``, its build record: the same the gpu-arch check reads) or
    a family member with a well-known safe value for it (rocmft.facts.gfx.safe_override: 11.0.0 for gfx1101/gfx1102
    on the gfx1100 image).
    """
    from rocmft.facts.amdgpu import real_targets
    from rocmft.facts.gfx import OVERRIDE, built_targets, override_target, safe_override

    if getattr(plan.settings.rocmft, "gfx_override", "off") != "auto" or OVERRIDE in environ:
        return None
    built = built_targets(image)
    targets = real_targets(root, devices)
    value = safe_override(targets, built)
    if value is None:
        return None
    foreign = ", ".join(sorted({t for t in targets if t not in built}))
    return value, f"ROCMFT_GFX_OVERRIDE=auto: {foreign} run the image's {override_target(value)} code"


def build_launch_spec(plan: Plan, environ: Mapping[str, str], root: Path = Path("/"), numactl: bool | None = None,
                      allowed_cpus: set[int] | None = None,
                      devices: Mapping[str, Any] | None = None,
                      image: Mapping[str, Any] | None = None) -> LaunchSpec:  # fmt: skip
    """Decide how the worker starts for ``plan``; no side effects.

    Launch modes (rocmft.facts.scheduler): ``python`` (one process), ``torchrun`` (rocmft starts the node's ranks),
    ``task`` (the scheduler started this process as one rank: the worker runs directly, with what torchrun would
    have set, :func:`task_environment`). The NUMA binding plan follows ROCMFT_NUMA_BIND
    (rocmft.facts.topology.binding_plan) for the local ranks' GPUs, by PCI address from the device probe; the
    network variables are added for multi-node runs only (rocmft.facts.topology.network_environment).

    Args:
        plan: the rendered run.
        environ: the environment the launch starts from (the run's, rocmft.config.settings.Settings.environ), where
            the job layout is read (rocmft.facts.scheduler.job_layout).
        root: where /sys and /proc are (tests pass a recorded host layout).
        numactl: whether numactl is installed (torch binds through it); None looks on PATH.
        allowed_cpus: the CPUs this process may use; None reads os.sched_getaffinity (the container's cpuset).
        devices: the device probe's result (rocmft.facts.device.probe_devices_raw: its ``gpus``' ``pci`` addresses
            place the NUMA binding); None: the addresses are unknown.
        image: the image's build record (rocmft.facts.image.build_record; None outside an image): the gfx targets
            ROCMFT_GFX_OVERRIDE=auto compares the GPUs with (:func:`gfx_override`).

    Raises:
        ConfigError: ROCMFT_NUMA_BIND=on where binding cannot work, a bad job layout (NNODES/NODE_RANK, a
            scheduler variable).
    """
    from rocmft.facts.topology import binding_plan, network_environment

    environ = dict(environ)
    layout = plan.layout or job_layout(environ)
    arch = (plan.device.archs or [""])[0].split(":")[0]
    profile = launch_profile(environ, arch)
    added = _every_launch_adds(environ, profile, arch)
    numa = None
    network_notes: list[str] = []
    reasons: dict[str, str] = {}
    if plan.launcher != "python":  # the collectives' network: the same for torchrun's ranks and a scheduler's tasks
        network = network_environment(environ, layout.nnodes, root)
        reasons = {name: why for name, (_, why) in network.variables.items()}
        network_notes = list(network.notes)
    if plan.launcher == "task":
        added.add_all(task_environment(layout, plan.device.count), "what torchrun would set for this task",
                      "task mode, rocmft.launch")  # fmt: skip
        added.add_all(network.env(), reasons, "network detection, rocmft.facts.netenv")
        network_notes += _task_notes(layout, plan.device.count)
    if plan.launcher == "torchrun":
        added.add("FORCE_TORCHRUN", "1", "LLaMA-Factory refuses DeepSpeed and several GPUs without it "
                  "(hiyouga/LlamaFactory#6268)", LAUNCH)  # fmt: skip
        added.add_all(network.env(), reasons, "network detection, rocmft.facts.netenv")
        added.add_all(full_node_environment(plan.job.local_processes, environ, profile),
                      "tuned for a node whose GPUs all train", "docker/arch/<ARCH>.env FULL_NODE_ line")  # fmt: skip
        gpus = (devices or {}).get("gpus", [])[: plan.job.local_processes]
        addresses = [g.get("pci") for g in gpus]
        if all(addresses) and addresses:
            numa = binding_plan(addresses, plan.settings.rocmft.numa_bind, root, allowed_cpus, numactl)
        elif plan.settings.rocmft.numa_bind == "on":
            raise ConfigError("ROCMFT_NUMA_BIND=on, but the GPUs' PCI addresses are unknown (no GPU, or an old "
                              "torch).", "Set ROCMFT_NUMA_BIND=auto or off.")  # fmt: skip
    if override := gfx_override(plan, environ, root, devices, image):  # an opted-in automatic fix
        added.add("HSA_OVERRIDE_GFX_VERSION", *override, "ROCMFT_GFX_OVERRIDE=auto, rocmft.launch.spec.gfx_override")
        reasons["HSA_OVERRIDE_GFX_VERSION"] = override[1]
    safe_collectives(plan, environ, added)  # ROCMFT_COLLECTIVES=safe (a retry after a hang sets it)
    communication = communication_environment(environ, added.values, profile, reasons=reasons)
    return LaunchSpec(
        command=tuple(worker_command(plan, numa.torchrun_args() if numa else [], environ)),
        environment=added.values,
        numa=numa.as_dict() if numa else dict(NO_BINDING),
        network_notes=tuple(network_notes),
        communication=communication,
        job=layout.as_record(),
        changes=(*argument_changes(plan), *added.changes.values()),
    )


def _every_launch_adds(environ: Mapping[str, str], profile: Path | None, arch: str) -> Added:
    """What every launch adds, whatever its mode: PYTHONUNBUFFERED, the arch profile's runtime settings
    (:func:`runtime_environment`) and, under Apptainer/Slurm, node-local caches (rocmft.facts.caches)."""
    added = Added()
    added.add("PYTHONUNBUFFERED", "1", "the workers' lines reach the console and train.log as they are printed",
              LAUNCH)  # fmt: skip
    profile_arch = _profile_values(profile).get("ARCH") or arch or "image"
    added.add_all(runtime_environment(environ, profile), f"the {profile_arch} profile's runtime default",
                  f"RUNTIME_ line of {profile}")  # fmt: skip
    for choice in node_local_caches(environ).values():
        added.add(choice.name, choice.value, cache_why(choice.reason), "node-local caches, rocmft.facts.caches")
    return added


def task_environment(layout: JobLayout, visible_gpus: int) -> dict[str, str]:
    """Task mode: what torchrun would have set for this rank (:meth:`JobLayout.worker_environment`), with
    LOCAL_RANK pointing at a GPU this process can see. Slurm's ``--gpus-per-task=1``/``--gpu-bind`` leave each task
    one GPU (ROCR_VISIBLE_DEVICES narrowed by Slurm's gres plugin; OLCF's Frontier guide binds that way), so its
    index is 0 whatever SLURM_LOCALID is; with the node's GPUs all visible it is the local rank."""
    env = layout.worker_environment()
    if env and visible_gpus <= int(env["LOCAL_RANK"]):
        env["LOCAL_RANK"] = "0"
    return env


def _task_notes(layout: JobLayout, visible_gpus: int) -> list[str]:
    if visible_gpus and visible_gpus <= (layout.local_rank or 0):
        return [f"task {layout.rank} sees {visible_gpus} GPU(s) (the scheduler bound them): it uses GPU 0 of those"]
    return []


def worker_command(plan: Plan, numa_args: list[str] | None, environ: Mapping[str, str]) -> list[str]:
    """The command line that starts the worker(s) for ``plan``.

    One process, or one task of a scheduler's one-process-per-GPU launch: ``python -m rocmft.worker RUN_DIR``.
    Otherwise torchrun (``python -m torch.distributed.run``) with the job layout's nodes, node rank and rendezvous
    (rocmft.facts.scheduler: Slurm, Kubeflow, or NNODES/NODE_RANK/MASTER_ADDR/MASTER_PORT by hand), processes per
    node from ``plan.job`` (rocmft.facts.job.JobShape), each local rank's output also in
    ``RUN_DIR/logs`` (``--log-dir``, ``--tee 3``), and ``numa_args`` (``--numa-binding node``) when binding.
    ``environ``: where the job layout is read (the run's; a free port when no rendezvous is given).
    """
    layout = plan.layout or job_layout(environ)
    worker = ["-m", "rocmft.worker", str(plan.run_dir)]
    if plan.launcher != "torchrun":
        return [sys.executable, *worker]
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(layout.nnodes),
        "--node_rank", str(layout.node_rank),
        "--nproc_per_node", str(plan.job.local_processes),
        "--master_addr", layout.master_addr or "127.0.0.1",
        "--master_port", str(layout.master_port or free_port()),
        "--log-dir", str(plan.run_dir / LOG_DIR), "--tee", "3",
        *(numa_args or []),
        *worker,
    ]  # fmt: skip


__all__ = ["COMMUNICATION_PREFIXES", "LOG_DIR", "LaunchSpec", "build_launch_spec", "communication_environment",
           "full_node_environment", "runtime_environment", "worker_command"]  # fmt: skip
