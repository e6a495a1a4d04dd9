"""The exact flags that give a container what a check or a rule found missing, in one place: ``docker run``'s flag,
the Compose key (compose.yaml's spelling), and the Apptainer/Slurm or Kubernetes equivalent where there is one.
Every message that tells the user to give the container GPUs, shared memory, IPC, a group, a capability or a
folder takes its words from here, so no message stops short of what to type (issue 30, item 11).

Sources: ROCm's container instructions (``docker run --device=/dev/kfd --device=/dev/dri --group-add video``,
ROCm/ROCm-docker#39; the same line in AMD's PyTorch-on-ROCm install guide); Apptainer's user guide, GPU support
(``--rocm``; under ``--contain``/``--containall`` /dev is minimal and the nodes need ``--bind /dev/kfd,/dev/dri``,
ROCm/legacy-rocm-build#1798); Docker's ``docker run`` reference (``--shm-size``, ``--ipc``, ``--group-add``,
``--cap-add``, ``--device``, ``-v``, ``--user``) and the Compose specification (``devices``, ``group_add``,
``shm_size``, ``ipc``, ``cap_add``, ``volumes``, ``user``); the kernel's Documentation/ABI/testing/dev-kmsg and
``kernel.dmesg_restrict`` (reading /dev/kmsg then needs CAP_SYSLOG). rocmft's own compose.yaml has every GPU key
below; deploy/slurm/train.sbatch runs ``apptainer exec --rocm --containall``; deploy/k8s/pytorchjob.yaml mounts a
memory-backed emptyDir at /dev/shm.
"""

from __future__ import annotations

import math

GiB = 1 << 30

# The GPU device nodes: /dev/kfd (the compute interface) and /dev/dri (the render nodes), and the video group that
# owns them on many hosts (ROCm/ROCm-docker#39).
GPU_DEVICES = (
    "docker run --device=/dev/kfd --device=/dev/dri --group-add video; compose: devices: [/dev/kfd, /dev/dri] and "
    "group_add: [video] (compose.yaml has them; compose.cpu.yaml removes them: do not use it on a GPU node); "
    "Apptainer: apptainer exec --rocm (with --contain/--containall also --bind /dev/kfd,/dev/dri); Kubernetes: "
    "resources.limits amd.com/gpu (deploy/k8s/pytorchjob.yaml)"
)


def render_group(gid: int | str) -> str:
    """The flags that add group ``gid`` (the owner of a GPU device node) to the container's user."""
    return (
        f"docker run --group-add {gid}; compose: RENDER_GID={gid} in .env (compose.yaml's group_add: "
        f'["${{RENDER_GID}}"]); Kubernetes: RENDER_GID={gid} deploy/k8s/render.sh deploy/k8s/<job>.yaml | '
        "kubectl apply -f - (the pod's supplementalGroups); Apptainer and Slurm keep your own groups: "
        "`sudo usermod -aG render,video $USER` on the host"
    )


def shm_gib(need_bytes: int) -> int:
    """The whole GiB of /dev/shm that hold ``need_bytes`` (at least 1): the figure the flags below are given."""
    return max(1, math.ceil(need_bytes / GiB))


def shm_size(gib: int, short: bool = False) -> str:
    """The flags that give the container ``gib`` GiB of /dev/shm (or the host's, with its IPC namespace); ``short``:
    Docker's and Compose's alone, for a console line."""
    flags = f"docker run --shm-size={gib}g or --ipc=host; compose: shm_size: {gib}gb or ipc: host"
    if short:
        return flags
    return flags + (" (compose.yaml has ipc: host); Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm "
                    "(deploy/k8s/pytorchjob.yaml)")  # fmt: skip


IPC_HOST = "docker run --ipc=host (or --shm-size=8g); compose: ipc: host (compose.yaml has it) or shm_size: 8gb"

# Reading the kernel log: /dev/kmsg is not in a container's /dev unless passed in, and kernel.dmesg_restrict=1 (the
# default of most distributions) lets only CAP_SYSLOG read it.
KERNEL_LOG = "docker run --device=/dev/kmsg --cap-add=SYSLOG; compose: devices: [/dev/kmsg] and cap_add: [SYSLOG]"

# The user that writes OUTPUT_DIR: yours, so a mounted folder of yours is writable (compose.yaml's user: key).
AS_YOU = 'docker run --user "$(id -u):$(id -g)"; compose: HOST_UID and HOST_GID in .env (`id -u`, `id -g`)'


def mount(host: str, inside: str, read_only: bool = False) -> str:
    """The flags that mount the host's ``host`` at ``inside`` (read-only when ``read_only``). A ``./`` path is the
    compose file's folder to Compose and ``$PWD/`` to ``docker run`` (Docker Engines before 23.0 read a relative
    ``-v`` source as a volume name)."""
    suffix = ":ro" if read_only else ""
    docker = "$PWD/" + host[2:] if host.startswith("./") else host
    return (
        f'docker run -v "{docker}:{inside}{suffix}"; compose: volumes: ["{host}:{inside}{suffix}"]; '
        f"Apptainer: --bind {docker}:{inside}{suffix}"
    )


__all__ = ["AS_YOU", "GPU_DEVICES", "IPC_HOST", "KERNEL_LOG", "GiB", "mount", "render_group", "shm_gib", "shm_size"]
