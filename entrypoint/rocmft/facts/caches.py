"""Where the caches that break on shared file systems go on a cluster: a pure decision over the environment.

On a cluster node, ``$HOME`` and the project folders are network file systems (NFS, Lustre, GPFS), shared by every
node of the job. The caches below keep SQLite databases or take file locks there, or are filled by several nodes at
once, and fail or corrupt each other on such file systems. Under Apptainer/Singularity or in a Slurm job, rocmft
therefore points each of them at a node-local folder, unless the user set it. Elsewhere (Docker, a workstation)
nothing changes: the libraries' own defaults are local there.

Evidence for each variable is in :data:`NODE_LOCAL_CACHES`; the decision is :func:`node_local_caches`, hooked into
the launch by rocmft.launch.spec (``spec.environment``, each with its change: said before the checks and recorded
in the manifest's ``launch.changes``, rocmft.changes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

# What says "this process runs on a cluster node": Apptainer and Singularity set these inside every container they
# start (Apptainer's docs, "Environment and Metadata": APPTAINER_CONTAINER, and SINGULARITY_CONTAINER for
# compatibility); Slurm sets SLURM_JOB_ID in every job step (sbatch/srun man pages, OUTPUT ENVIRONMENT VARIABLES).
CLUSTER_MARKERS = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "SLURM_JOB_ID")

# variable -> (sub-folder of the node-local root, why it must be node-local)
NODE_LOCAL_CACHES: dict[str, tuple[str, str]] = {
    "MIOPEN_USER_DB_PATH": (
        "miopen/db",
        "MIOpen's user find/perf database is SQLite; on a shared file system it fails with disk I/O errors "
        "(OLCF's PyTorch-on-Frontier guide, olcf/olcf-user-docs software/analytics/pytorch_frontier.rst, puts it "
        "on /tmp 'to bypass MIOpen disk I/O errors'; the LUMI AI Guide's job scripts, Lumi-supercomputer/LUMI-AI-Guide "
        "01-quickstart/run.sh at a7e33871, put both MIOpen folders under mktemp -d: TMPDIR, else /tmp)",
    ),
    "MIOPEN_CUSTOM_CACHE_DIR": (
        "miopen/cache",
        "MIOpen's compiled-kernel cache (default ~/.cache/miopen, also SQLite); OLCF's guide sets it beside "
        "MIOPEN_USER_DB_PATH on /tmp",
    ),
    "TRITON_CACHE_DIR": (
        "triton",
        "Triton's kernel cache (default ~/.triton/cache) is written by every rank that compiles a kernel; "
        "node-local, the nodes do not race on one shared folder",
    ),
    "TORCHINDUCTOR_CACHE_DIR": (
        "inductor",
        "torch.compile's Inductor cache, kept with the other compile caches (torch's own default, "
        "/tmp/torchinductor_<user>, is node-local already, and torch writes it into os.environ when first asked "
        "(torch/_inductor/runtime/cache_dir_utils.py), so it is often set, and then kept, before the launch)",
    ),
    "HF_DATASETS_CACHE": (
        "datasets",
        "the tokenised-data cache: LLaMA-Factory 0.9.5 loads local files with datasets.load_dataset(cache_dir="
        "CACHE_DIR or None), so datasets 4.0 writes the Arrow files and the tokenizer's map() cache under "
        "HF_DATASETS_CACHE (default HF_HOME/datasets), with file locks that do not lock on NFS/Lustre/GPFS "
        "(huggingface/huggingface_hub PR #4228); LLaMA-Factory's own default (data_shared_file_system: false) "
        "tokenises once per node, which a node-local cache matches",
    ),
}


@dataclass(frozen=True)
class CacheChoice:
    """One variable rocmft adds: its ``name``, the folder ``value`` (an absolute path) and the ``reason``."""

    name: str
    value: str
    reason: str


def on_cluster(environ: Mapping[str, str]) -> str | None:
    """The first of :data:`CLUSTER_MARKERS` set (non-empty) in ``environ``, or None."""
    return next((name for name in CLUSTER_MARKERS if environ.get(name)), None)


def node_local_root(environ: Mapping[str, str], uid: int | None = None) -> PurePosixPath:
    """``$TMPDIR/rocmft-<uid>``, else ``/tmp/rocmft-<uid>``: node-local and per user.

    Slurm sites that give jobs node-local scratch either export TMPDIR to a per-job folder from a TaskProlog
    (slurm.schedmd.com/prolog_epilog.html: a TaskProlog's ``export NAME=value`` lines enter the task's environment)
    or give each job a private /tmp with the job_container/tmpfs plugin (slurm.schedmd.com/job_container_tmpfs.html);
    this follows both. The numeric uid, not USER: the rocmft image sets USER=rocmft for every uid, so two
    users of one node would otherwise share (and be refused) one folder. ``uid`` defaults to os.getuid().
    """
    base = environ.get("TMPDIR") or "/tmp"
    return PurePosixPath(base) / f"rocmft-{os.getuid() if uid is None else uid}"


def node_local_caches(environ: Mapping[str, str], uid: int | None = None) -> dict[str, CacheChoice]:
    """The cache variables to add for a process started with ``environ``: name -> :class:`CacheChoice`.

    Empty unless one of :data:`CLUSTER_MARKERS` is set. A variable the user set (even to an empty value, which some
    of these libraries read as "disabled") is never replaced. Pure: reads nothing but its arguments (and os.getuid()
    when ``uid`` is None), creates no folder (each library creates its own on first use).
    """
    marker = on_cluster(environ)
    if marker is None:
        return {}
    root = node_local_root(environ, uid)
    return {
        name: CacheChoice(name, str(root / sub), f"{marker} is set: {why}")
        for name, (sub, why) in NODE_LOCAL_CACHES.items()
        if name not in environ
    }


def cache_environment(environ: Mapping[str, str], uid: int | None = None) -> dict[str, str]:
    """:func:`node_local_caches` as plain ``{name: value}``, for a launch's added environment."""
    return {name: choice.value for name, choice in node_local_caches(environ, uid).items()}


# File system types (as Linux names them in /proc/self/mounts, which psutil reads) whose flock/fcntl locks do not
# exclude other clients, or fail: huggingface/huggingface_hub PR #4228 (Lustre, GPFS and many NFS mounts return
# success from flock(2) without locking; it detects Lustre, GPFS, NFS, SMB and CIFS), huggingface_hub issue #2038
# (CIFS), datasets issue #329 (FSx for Lustre). BeeGFS: its client checks locks on the local node only unless the site
# sets tuneUseGlobalFileLocks (default false in the BeeGFS client's configuration defaults, client_module Config.c).
NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs"})


@dataclass(frozen=True)
class Mount:
    """The mount a path lies on: ``mountpoint``, ``fstype`` (Linux's name: ext4, overlay, nfs4, lustre...) and
    ``device``. ``network`` says whether ``fstype`` is one of :data:`NETWORK_FILESYSTEMS`."""

    mountpoint: str
    fstype: str
    device: str

    @property
    def network(self) -> bool:
        """Whether file locks on this mount may not lock (:data:`NETWORK_FILESYSTEMS`)."""
        return self.fstype.lower() in NETWORK_FILESYSTEMS or self.fstype.lower().startswith("fuse.beegfs")


def mount_of(path: str | os.PathLike[str], partitions: list[Any] | None = None) -> Mount | None:
    """The mount ``path`` lies on: of the mounts in ``partitions``, the one with the longest mount point that
    contains the resolved path (symbolic links followed; parts that do not exist yet are kept as written).

    Args:
        path: any path (need not exist).
        partitions: ``psutil.disk_partitions(all=True)`` (the default: every mount, network and pseudo file systems
            included), or injected records with ``mountpoint``, ``fstype`` and ``device`` attributes.

    Returns:
        The :class:`Mount`, or None when no mount contains the path (an empty or unreadable table).
    """
    if partitions is None:
        import psutil

        partitions = psutil.disk_partitions(all=True)
    resolved = PurePosixPath(os.path.realpath(os.fspath(path)))
    best = None
    for part in partitions:
        point = PurePosixPath(part.mountpoint)
        if (resolved == point or point in resolved.parents) and (
            best is None or len(point.parts) >= len(PurePosixPath(best.mountpoint).parts)
        ):  # a later mount on the same point hides the earlier one: >= keeps the last
            best = part
    return None if best is None else Mount(best.mountpoint, best.fstype, best.device)


__all__ = ["CLUSTER_MARKERS", "NETWORK_FILESYSTEMS", "NODE_LOCAL_CACHES", "CacheChoice", "Mount", "cache_environment",
           "mount_of", "node_local_caches", "node_local_root", "on_cluster"]  # fmt: skip
