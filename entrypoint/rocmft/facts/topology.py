"""Where the GPUs sit: NUMA binding and network choices for multi-GPU and multi-node launches.

Everything here only reads Linux sysfs/procfs files below a ``root`` folder (``/`` on a real host, a recorded
layout under ``tests/data/sysfs/`` in tests) and returns a decision with a one-line reason for the log. Nothing
is changed: the binding itself is done by torchrun (``--numa-binding=node``, :mod:`torch.numa.binding`), and
the network variables are handed to the launcher, which adds them to the workers' environment.

Sources:

* Linux ABI documents: ``Documentation/ABI/testing/sysfs-bus-pci`` (``/sys/bus/pci/devices/<addr>/numa_node``:
  the NUMA node a PCI device is attached to, ``-1`` when unknown), ``Documentation/ABI/stable/sysfs-devices-node``
  (``/sys/devices/system/node/online`` and ``node<N>/cpulist``), ``Documentation/ABI/stable/sysfs-class-infiniband``
  (``/sys/class/infiniband/<device>/ports/<port>/state`` and ``link_layer``); ``proc(5)`` for ``/proc/net/route``.
* NCCL's "Environment Variables" documentation (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ``NCCL_IB_DISABLE``);
  RCCL, the ROCm fork of NCCL, reads the same variable names.
* ``torch/numa/binding.py`` in torch 2.11: what ``torchrun --numa-binding=node`` does.
* HPE Slingshot and RCCL's network plugins: the sources are named in the "Slingshot" section below.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rocmft.errors import ConfigError
from rocmft.values import truthy

NUMA_BIND_VAR = "ROCMFT_NUMA_BIND"
NUMA_BIND_SETTINGS = ("auto", "on", "off")

# Linux route flags (include/uapi/linux/route.h): the route is usable.
_RTF_UP = 0x0001


# --------------------------------------------------------------------------------------------------------------
# CPU lists


def parse_ranges(text: str) -> set[int]:
    """The integers of a kernel range list such as ``"0-47,96-143"`` (the format of sysfs ``cpulist`` files).

    Blank text (a CPU-less NUMA node's ``cpulist`` is an empty line) gives an empty set.

    Raises:
        ValueError: on anything but comma-separated integers and ``a-b`` ranges with ``a <= b``.
    """
    ints: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        try:
            start = int(first)
            end = int(last) if sep else start
        except ValueError:
            raise ValueError(f"not a range list: {text.strip()!r} (bad part {part!r})") from None
        if start < 0 or end < start:
            raise ValueError(f"not a range list: {text.strip()!r} (bad range {part!r})")
        ints.update(range(start, end + 1))
    return ints


def format_ranges(ints: Iterable[int]) -> str:
    """The shortest range list for a set of integers: ``{0, 1, 2, 5}`` → ``"0-2,5"``; empty → ``""``.

    The inverse of :func:`parse_ranges` (the same notation numactl's ``--physcpubind`` takes).
    """
    parts: list[str] = []
    start = prev = None
    for n in sorted(set(ints)):
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = n
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# --------------------------------------------------------------------------------------------------------------
# NUMA


def numa_nodes(root: Path = Path("/")) -> dict[int, set[int]]:
    """The host's online NUMA nodes and the logical CPUs of each, from ``sys/devices/system/node``.

    Reads ``node<N>/cpulist`` for every node directory, keeping only the nodes listed in ``online`` when that
    file exists. A node without CPUs (memory-only, such as CXL or HBM exposed as its own node) maps to an
    empty set. A kernel built without NUMA has no such folder: the result is ``{}``, which callers treat as one
    node. These are the host's nodes and CPUs even inside a container (sysfs is not namespaced); what the
    container may run on is :func:`os.sched_getaffinity`.

    Args:
        root: the filesystem root the ``sys`` folder is under.

    Raises:
        ValueError: when a ``cpulist`` file is not a range list.
    """
    base = root / "sys/devices/system/node"
    online_text = _read(base / "online")
    online = parse_ranges(online_text) if online_text is not None else None
    nodes: dict[int, set[int]] = {}
    if not base.is_dir():
        return nodes
    for entry in base.iterdir():
        suffix = entry.name[4:]
        if not entry.name.startswith("node") or not suffix.isdecimal():
            continue
        index = int(suffix)
        if online is not None and index not in online:
            continue
        text = _read(entry / "cpulist")
        if text is not None:
            nodes[index] = parse_ranges(text)
    return dict(sorted(nodes.items()))


def pci_address(domain: int, bus: int, device: int, function: int = 0) -> str:
    """A sysfs PCI address from its numbers: ``pci_address(0, 0x85, 0)`` → ``"0000:85:00.0"``.

    Use it with torch's device properties (``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``, present on
    both ROCm and CUDA builds); torch's own NUMA binding builds the same address, with function 0.
    """
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def _normalize_pci(address: str) -> str:
    address = address.strip().lower()
    # "85:00.0" (no domain, as lspci prints it) means domain 0.
    return f"0000:{address}" if address.count(":") == 1 else address


def gpu_numa_node(pci_address: str, root: Path = Path("/")) -> int | None:
    """The NUMA node a GPU is attached to, or None when the kernel does not know it.

    The node comes from ``sys/bus/pci/devices/<pci_address>/numa_node`` (sysfs ABI ``sysfs-bus-pci``), which
    holds the node number or ``-1`` when the firmware did not report one, as on most single-socket hosts and
    many VMs. ``-1``, a missing device folder and an unreadable value all give None.

    Args:
        pci_address: the GPU's PCI address, ``"0000:85:00.0"`` (``"85:00.0"`` means domain 0; any case).
        root: the filesystem root the ``sys`` folder is under.
    """
    text = _read(root / "sys/bus/pci/devices" / _normalize_pci(pci_address) / "numa_node")
    try:
        node = int(text.strip()) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


@dataclass(frozen=True)
class BindingPlan:
    """Whether torchrun binds each worker to its GPU's NUMA node, and why.

    Attributes:
        enabled: True when the launch passes :meth:`torchrun_args`.
        mode: ``"node"`` when enabled (torchrun's ``--numa-binding`` mode), None otherwise.
        reason: one line for the log, e.g. ``"2 NUMA nodes; GPUs 0-3 on node 0, 4-7 on node 1"``.
        per_rank: one entry per local rank (= the GPU index torch uses for it): ``local_rank``,
            ``pci_address``, ``numa_node`` (None when unknown) and ``cpus``, the range list of the node's CPUs
            this process may use (what torch binds the rank to; ``""`` when unknown or none). Filled whether
            or not binding is enabled, so the log and the manifest show the topology either way.
    """

    enabled: bool
    mode: str | None
    reason: str
    per_rank: list[dict] = field(default_factory=list)

    def torchrun_args(self) -> list[str]:
        """``["--numa-binding", "node"]`` when enabled, else ``[]``; to put before the script in torchrun's argv."""
        return ["--numa-binding", self.mode] if self.enabled and self.mode else []

    def as_dict(self) -> dict:
        """A JSON-ready copy for the manifest."""
        return asdict(self)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _ranks_by_node(per_rank: list[dict]) -> str:
    groups: dict[int, list[int]] = {}
    for entry in per_rank:
        groups.setdefault(entry["numa_node"], []).append(entry["local_rank"])
    label = "GPU" if len(per_rank) == 1 else "GPUs"
    return f"{label} " + ", ".join(f"{format_ranges(ranks)} on node {node}" for node, ranks in sorted(groups.items()))


def binding_plan(
    gpu_pci_addresses: list[str],
    setting: str = "auto",
    root: Path = Path("/"),
    allowed_cpus: set[int] | None = None,
    numactl_available: bool | None = None,
) -> BindingPlan:
    """Decide whether ``torchrun --numa-binding=node`` binds each worker to the CPUs of its GPU's NUMA node.

    How the node is found: the worker with local rank *i* drives GPU *i* (``torch.device("cuda", i)``, the
    order after HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES). Its PCI address comes from torch's device
    properties ``pci_domain_id`` / ``pci_bus_id`` / ``pci_device_id`` (:func:`pci_address`), and its node
    from ``/sys/bus/pci/devices/<address>/numa_node`` (:func:`gpu_numa_node`): the same route torch's
    ``--numa-binding`` takes, so the plan logged here is the binding torch applies. Torch then restricts the
    worker to that node's CPUs (``node<N>/cpulist``) intersected with the CPUs the launcher may use.

    Why memory follows: the kernel's default memory policy allocates a page on the NUMA node of the CPU that
    first touches it. A worker confined to its GPU's node therefore gets its host memory there too (pinned
    staging buffers, the data loader's batches, the optimizer state of CPU offload), and host↔GPU copies do not
    cross the socket interconnect.

    Containers: ``docker run --cpuset-cpus`` (compose ``cpuset``) limits the CPUs a process may run on, visible
    as :func:`os.sched_getaffinity`. Torch binds to node CPUs ∩ allowed CPUs and fails to launch when that is
    empty, so a rank whose node has no allowed CPU disables binding (``auto``) or is an error (``on``).

    Args:
        gpu_pci_addresses: one PCI address per local rank, in torch's device order.
        setting: ROCMFT_NUMA_BIND: ``auto`` (bind when the host has more than one NUMA node with CPUs and every
            GPU's node is known), ``on`` (bind, or fail with a reason), ``off``. Case-insensitive.
        root: the filesystem root of the sysfs files.
        allowed_cpus: the CPUs this process may run on; None reads ``os.sched_getaffinity(0)`` (all of the
            host's CPUs where the platform has no affinity call).
        numactl_available: whether the ``numactl`` command is on PATH (torch 2.11 binds a script worker by
            running it under ``numactl --physcpubind`` and refuses to start without it); None looks it up.

    Raises:
        ConfigError: naming ROCMFT_NUMA_BIND, when ``setting`` is not auto/on/off, or when it is ``on`` and
            binding cannot be right: no GPU, a GPU whose NUMA node is unknown (torch would read ``-1`` as node 0
            and pin every such worker there), a rank whose node has none of the allowed CPUs, or no numactl.
    """
    mode = setting.strip().lower()
    if mode not in NUMA_BIND_SETTINGS:
        raise ConfigError(
            f"{NUMA_BIND_VAR}={setting!r} is not one of {', '.join(NUMA_BIND_SETTINGS)}",
            f"set {NUMA_BIND_VAR}=auto (bind workers to their GPU's NUMA node where that helps), on or off",
        )

    nodes = numa_nodes(root)
    if allowed_cpus is None:
        getaffinity = getattr(os, "sched_getaffinity", None)
        allowed = set(getaffinity(0)) if getaffinity else set().union(*nodes.values())
    else:
        allowed = set(allowed_cpus)
    per_rank = []
    for rank, address in enumerate(gpu_pci_addresses):
        node = gpu_numa_node(address, root)
        cpus = nodes.get(node, set()) & allowed if node is not None else set()
        per_rank.append(
            {"local_rank": rank, "pci_address": _normalize_pci(address), "numa_node": node, "cpus": format_ranges(cpus)}
        )

    def disabled(reason: str) -> BindingPlan:
        return BindingPlan(enabled=False, mode=None, reason=reason, per_rank=per_rank)

    def refuse(message: str, remedy: str) -> ConfigError:
        return ConfigError(f"{NUMA_BIND_VAR}=on: {message}", remedy)

    if mode == "off":
        return disabled(f"{NUMA_BIND_VAR}=off")
    if not per_rank:
        if mode == "on":
            raise refuse("no GPU is visible, so there is no GPU NUMA node to bind to", f"unset {NUMA_BIND_VAR}")
        return disabled("no GPU visible: nothing to bind")

    cpu_nodes = [n for n, cpus in nodes.items() if cpus]
    n_nodes = max(len(cpu_nodes), 1)
    one_node = "host has 1 NUMA node: binding would change nothing"
    unknown = [e for e in per_rank if e["numa_node"] is None]
    absent = [e for e in per_rank if e["numa_node"] is not None and e["numa_node"] not in nodes]
    if unknown or absent:
        bad = unknown or absent
        which = ", ".join(f"GPU {e['local_rank']} ({e['pci_address']})" for e in bad[:4])
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        what = "sysfs numa_node is -1 or missing" if unknown else f"node {bad[0]['numa_node']} is not an online node"
        if mode == "on":
            raise refuse(
                f"the NUMA node of {which}{more} is unknown ({what}); torch would bind such workers to node 0",
                f"set {NUMA_BIND_VAR}=auto or off"
                + ("; on a host with one NUMA node binding changes nothing" if n_nodes == 1 else ""),
            )
        if n_nodes == 1:
            return disabled(one_node)
        return disabled(f"{_plural(n_nodes, 'NUMA node')} but the node of {which}{more} is unknown ({what})")
    if n_nodes == 1 and mode == "auto":
        return disabled(one_node)

    starved = [e for e in per_rank if not e["cpus"]]
    if starved:
        starved_nodes = sorted({e["numa_node"] for e in starved})
        ranks = format_ranges(e["local_rank"] for e in starved)
        message = (
            f"the CPUs this container may use ({format_ranges(allowed) or 'none'}) include none of NUMA node "
            f"{', '.join(map(str, starved_nodes))}, the node of GPU(s) {ranks}: binding would leave them no CPU"
        )
        if mode == "on":
            raise refuse(message, f"allow CPUs of every GPU's node (docker --cpuset-cpus) or set {NUMA_BIND_VAR}=auto")
        return disabled(message)

    if numactl_available is None:
        numactl_available = shutil.which("numactl") is not None
    if not numactl_available:
        message = "numactl is not installed, and torchrun's --numa-binding runs workers under numactl"
        if mode == "on":
            raise refuse(message, f"install numactl in the image, or set {NUMA_BIND_VAR}=auto")
        return disabled(message)

    reason = f"{_plural(n_nodes, 'NUMA node')}; {_ranks_by_node(per_rank)}"
    if n_nodes == 1:
        reason = f"{NUMA_BIND_VAR}=on; {reason} (binding changes nothing on one node)"
    host_cpus = set().union(*(nodes[e["numa_node"]] for e in per_rank))
    if not host_cpus <= allowed:
        reason += f"; CPUs limited to the allowed {format_ranges(allowed & host_cpus)}"
    return BindingPlan(enabled=True, mode="node", reason=reason, per_rank=per_rank)


# --------------------------------------------------------------------------------------------------------------
# Network


def default_route_interface(root: Path = Path("/")) -> str | None:
    """The interface of the IPv4 default route, from ``proc/net/route``; None when there is none.

    The default route is the line whose Destination and Mask are ``00000000`` and whose flags say it is up;
    among several, the lowest Metric wins, as in the kernel. Inside a container this is the container's network
    namespace: multi-node training needs the host's network (``network_mode: host``), where it is the host's
    interface. IPv6-only hosts have no IPv4 default route: the result is None.

    Args:
        root: the filesystem root the ``proc`` folder is under.
    """
    text = _read(root / "proc/net/route")
    if text is None:
        return None
    best: tuple[int, str] | None = None
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        iface, destination, flags, metric, mask = fields[0], fields[1], fields[3], fields[6], fields[7]
        try:
            if int(destination, 16) or int(mask, 16) or not int(flags, 16) & _RTF_UP:
                continue
            candidate = (int(metric), iface)
        except ValueError:
            continue
        if best is None or candidate[0] < best[0]:
            best = candidate
    return best[1] if best else None


def infiniband_hcas(root: Path = Path("/")) -> list[dict]:
    """The ACTIVE RDMA ports (InfiniBand, or RoCE on Ethernet), from ``sys/class/infiniband``.

    Each entry: ``name`` (``"mlx5_0:1"``, device and port as NCCL_IB_HCA spells them), ``device``, ``port``
    (int) and ``link_layer`` (``"InfiniBand"`` or ``"Ethernet"``, the latter meaning RoCE). Ports whose
    ``state`` is not ``ACTIVE`` (e.g. ``"1: DOWN"``) are left out. Sorted by device and port. The folder shows
    the host's devices; a container also needs ``/dev/infiniband`` passed in to use them.

    Args:
        root: the filesystem root the ``sys`` folder is under.
    """
    base = root / "sys/class/infiniband"
    found: list[dict] = []
    if not base.is_dir():
        return found
    for device in sorted(base.iterdir()):
        ports = device / "ports"
        if not ports.is_dir():
            continue
        for port in ports.iterdir():
            if not port.name.isdecimal():
                continue
            state = _read(port / "state") or ""
            # "4: ACTIVE": the numeric state, then its name.
            if state.split(":")[-1].strip().upper() != "ACTIVE":
                continue
            found.append(
                {
                    "name": f"{device.name}:{port.name}",
                    "device": device.name,
                    "port": int(port.name),
                    "link_layer": (_read(port / "link_layer") or "").strip() or "unknown",
                }
            )
    return sorted(found, key=lambda h: (h["device"], h["port"]))


# --------------------------------------------------------------------------------------------------------------
# Slingshot (HPE Cray EX: LUMI, Frontier, El Capitan) and RCCL's OFI network plugin
#
# Sources (read for this code; nothing copied):
# * HPE, "Running RCCL-Based Applications" (HewlettPackard/shs-ccl-docs rccl/rccl_tuning_guide.md @ 1617c309):
#   RCCL needs the OFI plugin (aws-ofi-nccl) to use the Slingshot NICs, found as librccl-net.so through
#   LD_LIBRARY_PATH; the NCCL_* and FI_* values in SLINGSHOT_SETTINGS; NCCL_SOCKET_IFNAME should list the hsn
#   interfaces; "some RCCL versions search for libnccl-net.so instead of librccl-net.so ... set NCCL_NET_PLUGIN to
#   the explicit path of the .so file".
# * The cxi driver (HewlettPackard/shs-cxi-driver drivers/net/ethernet/hpe/ss1/cxi_user_core.c @ 04b26e57): each
#   Cassini NIC is a device of the class ``cxi_user`` with a node /dev/cxi<N> (mode 0666) that libfabric's cxi
#   provider opens; the Ethernet side of the NIC is the hsn<N> interface.
# * RCCL's plugin loading (ROCm/rocm-systems projects/rccl/src/plugin/net.cc @ 9512ccf8 and plugin_open.cc @
#   03a89144): NCCL_NET_PLUGIN unset means "librccl-net.so"; set, it is a comma-separated list ("none": no external
#   plugin), each entry dlopen()ed as given (RTLD_NOW | RTLD_LOCAL), then, unless it contains "/" or is already a
#   "lib*.so" name, as "librccl-net-<entry>.so"; a library loads when it exports ncclNetPlugin_v11 ... _v6 (first
#   found wins). NCCL_NET names the network a communicator must use, compared case-insensitively with each loaded
#   plugin's ``name`` (the first field of the ncclNetPlugin_v<N> struct: aws-ofi-nccl
#   3rd-party/nccl/cuda/include/nccl/net_v10.h @ 2daf7d30) and with the internal "IB" and "Socket" (ROCm/rccl
#   src/transport/net_ib.cc, net_socket.cc @ 0cbce2a7); when none matches, init fails with "Failed to initialize any
#   NET plugin", even on one node (LLNL's HPC-launcher hpc_launcher/systems/lc/el_capitan_family.py @ dbbb021e sets
#   NCCL_NET only when it found the plugin for that reason).
# * The plugins: aws-ofi-nccl >= 1.18.0 builds for ROCm (commit 0d49b7af "Add ROCm support to plugin", tested with
#   the CXI provider on Slingshot 11) and installs librccl-net.so and librccl-net-ofi.so (src/Makefile.am @
#   2daf7d30), exporting ncclNetPlugin_v6..v12 named "Libfabric" (src/nccl_ofi_interface_nvidia.cpp @ 2daf7d30).
#   The older ROCm/aws-ofi-rccl (@ 17d41cbf) exports only ncclNetPlugin_v5, "AWS Libfabric", which the RCCL above
#   no longer loads; LLNL's launcher switched to aws-ofi-nccl for ROCm >= 7.1 (HPC-launcher release v1.0.4).

NET_PLUGIN_VERSIONS = (11, 10, 9, 8, 7, 6)  # the ncclNetPlugin_v<N> symbols RCCL looks for, in its order
OLD_NET_PLUGIN_VERSIONS = (5, 4, 3, 2)  # exported by older plugins (aws-ofi-rccl: v5); named in the diagnosis only
DEFAULT_NET_PLUGIN = "librccl-net.so"
NET_PLUGIN_PREFIX = "librccl-net"
# RCCL's own transports, always there; IB-CAST is RCCL's when NCCL_NET=IB-CAST and NCCL_NET_PLUGIN is unset (net.cc)
INTERNAL_NETS = ("IB", "Socket", "IB-CAST")

# What HPE's RCCL guide (rccl/rccl_tuning_guide.md @ 1617c309) gives for RCCL over Slingshot, added when the OFI
# plugin loads. Left out on purpose: FI_CXI_RDZV_PROTO=alt_read and its FI_CXI_RDZV_* companions (they need the
# NIC driver's rdzv_get_en=0, which only the job can ask for: Slurm --network=disable_rdzv_get), and
# HSA_FORCE_FINE_GRAIN_PCIE (a GPU memory setting, not a fabric one).
SLINGSHOT_SETTINGS = {
    "NCCL_NET_GDR_LEVEL": ("PHB", "required to enable RDMA between GPUs"),
    "NCCL_CROSS_NIC": ("1", "found to improve performance on large systems"),
    "FI_MR_CACHE_MONITOR": ("userfaultfd", "the memory-registration cache monitor"),
    "FI_CXI_DISABLE_HOST_REGISTER": ("1", "avoids ROCm allocation calls from the provider that may deadlock RCCL"),
    "FI_CXI_DEFAULT_CQ_SIZE": ("131072", "a larger completion queue, for large jobs"),
    "FI_CXI_DEFAULT_TX_SIZE": ("2048", "for large jobs that depend on unexpected rendezvous messages"),
    "FI_CXI_RX_MATCH_MODE": ("hybrid", "falls back to software matching when the NIC's match resources run out"),
}
_HPE_GUIDE = "HPE's RCCL-on-Slingshot guide"


@dataclass(frozen=True)
class SlingshotFabric:
    """The HPE Slingshot NICs this host shows.

    Attributes:
        interfaces: the ``hsn<N>`` network interfaces in ``sys/class/net`` (the NICs' Ethernet side), sorted.
        devices: the Cassini NICs in ``sys/class/cxi_user`` or ``sys/class/cxi`` (``cxi0``, ...), sorted.
        device_nodes: the ``dev/cxi<N>`` character devices this process can see. sysfs shows the host's NICs
            even in a container; the nodes are there only when the container was given them (Apptainer binds the
            host's /dev by default; Docker needs ``--device /dev/cxi0``).
    """

    interfaces: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    device_nodes: tuple[str, ...] = ()

    @property
    def detected(self) -> bool:
        """True when an hsn interface or a cxi device is there."""
        return bool(self.interfaces or self.devices)

    def summary(self) -> str:
        """One line: ``"hsn0, hsn1; cxi0, cxi1; /dev/cxi0, /dev/cxi1"``-like, ``"no Slingshot NIC"`` when none."""
        if not self.detected:
            return "no Slingshot NIC (no hsn* interface, no cxi device)"
        interfaces = ", ".join(self.interfaces) or "no hsn interface"
        devices = ", ".join(self.devices) or "no cxi device"
        nodes = ", ".join(f"/dev/{n}" for n in self.device_nodes) or "no /dev/cxi* node visible"
        return f"{interfaces}; {devices}; {nodes}"

    def as_dict(self) -> dict:
        """A JSON-ready copy."""
        return {"interfaces": list(self.interfaces), "devices": list(self.devices),
                "device_nodes": list(self.device_nodes)}  # fmt: skip


def slingshot_fabric(root: Path = Path("/")) -> SlingshotFabric:
    """The Slingshot NICs under ``root``: hsn interfaces, cxi devices and the /dev/cxi nodes (see
    :class:`SlingshotFabric`; sources in the comment above it). Missing folders mean none; nothing is opened."""

    def names(folder: Path, prefix: str) -> set[str]:
        try:
            return {p.name for p in folder.iterdir() if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()}
        except OSError:
            return set()

    def natural(items: set[str]) -> tuple[str, ...]:
        return tuple(sorted(items, key=lambda n: (len(n), n)))

    devices = names(root / "sys/class/cxi_user", "cxi") | names(root / "sys/class/cxi", "cxi")
    return SlingshotFabric(
        interfaces=natural(names(root / "sys/class/net", "hsn")),
        devices=natural(devices),
        device_nodes=natural(names(root / "dev", "cxi")),
    )


@dataclass(frozen=True)
class NetPlugin:
    """What RCCL would load as its external network plugin in a process started with ``environ``.

    Attributes:
        requested: NCCL_NET_PLUGIN as set (None when unset, then RCCL looks for ``librccl-net.so``).
        tried: every file name or path looked for, in RCCL's order.
        search_path: where bare names were looked for: the LD_LIBRARY_PATH folders, then the dynamic loader's own
            places (its cache, /lib, /usr/lib), as ``"dir1:dir2 + ld.so cache, /lib, /usr/lib"``.
        path: the library that loaded and exports a ncclNetPlugin_v<N> RCCL takes; None when none did.
        symbol: that symbol (``"ncclNetPlugin_v10"``).
        name: the network name the plugin reports (what NCCL_NET must match), e.g. ``"Libfabric"``.
        problems: why each library found did not load (the loader's message, or the symbols it lacks).
    """

    requested: str | None
    tried: tuple[str, ...]
    search_path: str
    path: str | None = None
    symbol: str | None = None
    name: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def loads(self) -> bool:
        """True when a library loaded with a symbol RCCL takes."""
        return self.name is not None

    def describe(self) -> str:
        """One line for messages: what loaded, or what was looked for where and why it failed."""
        if self.loads:
            return f"{self.path} loads ({self.symbol}, network {self.name!r})"
        if self.requested is not None and not self.tried:
            return f"NCCL_NET_PLUGIN={self.requested}: no external plugin"
        why = "; ".join(self.problems) if self.problems else "not found"
        return f"no loadable plugin: looked for {', '.join(self.tried)} in {self.search_path} ({why})"

    def as_dict(self) -> dict:
        """A JSON-ready copy."""
        return {**asdict(self), "tried": list(self.tried), "problems": list(self.problems), "loads": self.loads}


def _plugin_names(requested: str | None) -> list[str]:
    if requested is None:
        return [DEFAULT_NET_PLUGIN]
    if requested.strip().lower() == "none":
        return []
    tried = []
    for entry in (e.strip() for e in requested.split(",")):
        if not entry:
            continue
        tried.append(entry)
        if "/" not in entry and not (entry.startswith("lib") and entry.endswith(".so")):
            tried.append(f"{NET_PLUGIN_PREFIX}-{entry}.so")
    return tried


def _open(path: str) -> tuple[ctypes.CDLL | None, str]:
    try:
        # The flags RCCL's plugin_open.cc uses: every symbol resolved now, so a missing dependency (libfabric.so.1)
        # or an unresolved function fails here as it would in RCCL.
        return ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL), ""
    except OSError as err:
        return None, str(err)


def _exported(lib: ctypes.CDLL, versions: Iterable[int]) -> tuple[str, str] | None:
    for version in versions:
        symbol = f"ncclNetPlugin_v{version}"
        try:
            # The symbol is a struct whose first field is `const char* name`: read it as a char pointer.
            name = ctypes.c_char_p.in_dll(lib, symbol).value
        except ValueError:  # the library does not export it
            continue
        return symbol, (name or b"").decode(errors="replace")
    return None


def net_plugin(environ: Mapping[str, str]) -> NetPlugin:
    """Find RCCL's external network plugin the way RCCL does, and really load it.

    Which names (RCCL's net.cc/plugin_open.cc, cited above :data:`NET_PLUGIN_VERSIONS`): NCCL_NET_PLUGIN unset (or
    empty) → ``librccl-net.so``; otherwise each comma-separated entry as given, then ``librccl-net-<entry>.so``
    unless the entry has a ``/`` or is a ``lib*.so`` name; ``none`` → no plugin. A name with a ``/`` is opened as
    that path. A bare name is looked for in each folder of ``environ``'s LD_LIBRARY_PATH, as the dynamic loader
    does; when no folder has it, it is handed to this process's loader (its cache, /lib, /usr/lib). Hand-written
    because the loader reads LD_LIBRARY_PATH once, at process start: the workers' environment (``environ``) has to
    be searched here, and ``ctypes.util.find_library`` answers a different question (it maps ``rccl-net`` to a
    file via ldconfig, ignoring LD_LIBRARY_PATH). Not modelled: the DT_RUNPATH of librccl.so itself.

    Each library found is opened with ``dlopen(RTLD_NOW | RTLD_LOCAL)`` through ctypes, as RCCL opens it (so its
    dependencies must resolve), and asked for ``ncclNetPlugin_v11`` … ``_v6``; the first that loads with one of
    them is the answer, with the network name read from the symbol. Loading runs the library's constructors in
    this process, as RCCL will in each worker; the library stays loaded.

    Args:
        environ: the workers' environment (NCCL_NET_PLUGIN and LD_LIBRARY_PATH are read; nothing is changed).
    """
    raw = environ.get("NCCL_NET_PLUGIN")
    requested = raw.strip() if raw is not None and raw.strip() else None
    names = _plugin_names(requested)
    folders = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    search_path = f"{':'.join(folders) or 'no LD_LIBRARY_PATH'} + ld.so cache, /lib, /usr/lib"
    problems: list[str] = []
    for name in names:
        if "/" in name:
            candidate = name if Path(name).exists() else None
        else:
            candidate = next((str(Path(d) / name) for d in folders if (Path(d) / name).exists()), name)
        if candidate is None:
            continue
        lib, error = _open(candidate)
        if lib is None:
            # a bare name the system loader does not know either: simply absent, not a problem to report
            if candidate == name and "/" not in name and "No such file" in error:
                continue
            problems.append(f"{candidate}: {error}")
            continue
        found = _exported(lib, NET_PLUGIN_VERSIONS)
        if found is None:
            old = _exported(lib, OLD_NET_PLUGIN_VERSIONS)
            lacks = f"exports no ncclNetPlugin_v{NET_PLUGIN_VERSIONS[0]}..v{NET_PLUGIN_VERSIONS[-1]}"
            if old:
                lacks += f", only {old[0]} ({old[1]!r}: an older plugin such as aws-ofi-rccl; use aws-ofi-nccl)"
            problems.append(f"{candidate}: {lacks}")
            continue
        where = getattr(lib, "_name", candidate)
        return NetPlugin(requested, tuple(names), search_path, where, found[0], found[1], tuple(problems))
    return NetPlugin(requested, tuple(names), search_path, problems=tuple(problems))


def net_names(plugin: NetPlugin) -> list[str]:
    """The network names NCCL_NET may take in a process where ``plugin`` is what loads: the plugin's (when it
    loads) and RCCL's internal "IB" and "Socket"."""
    return ([plugin.name] if plugin.loads and plugin.name else []) + list(INTERNAL_NETS)


@dataclass(frozen=True)
class NetworkEnvironment:
    """Variables to add to the workers' environment for collectives, and notes for the log.

    Attributes:
        variables: name → (value, reason) for each variable rocmft adds; variables the user set are never here.
        notes: one-line remarks (variables kept as the user set them, traffic over TCP, single node).
    """

    variables: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """Just name → value, to merge into the launch environment."""
        return {name: value for name, (value, _) in self.variables.items()}


def _user_set(environ: Mapping[str, str], name: str) -> bool:
    # An empty value (compose's `NAME: ${NAME:-}`) is treated as not set.
    return bool(environ.get(name, "").strip())


def network_environment(environ: Mapping[str, str], nnodes: int, root: Path = Path("/")) -> NetworkEnvironment:
    """Which interfaces and transport RCCL/NCCL and gloo use between nodes, for a run over ``nnodes`` hosts.

    For a multi-node run (``nnodes > 1``), added unless the user set them (the user's value always wins; an
    empty value counts as unset):

    * ``NCCL_SOCKET_IFNAME`` = ``=<iface>`` and ``GLOO_SOCKET_IFNAME`` = ``<iface>``, the default route's
      interface (:func:`default_route_interface`). NCCL reads its value as name prefixes, and a leading ``=``
      makes it an exact name (NCCL docs), so ``eth0`` cannot also match ``eth0.100``; gloo takes exact names.
      Without them NCCL may pick an interface that is up but does not reach the other nodes (docker0, a
      link-local one) and hang at init. On a Slingshot host (:func:`slingshot_fabric` finds hsn interfaces)
      NCCL_SOCKET_IFNAME is ``=hsn0,hsn1,...`` instead, the interfaces found (HPE's RCCL guide: list the hsn
      interfaces there); gloo keeps the default route's.
    * ``NCCL_IB_HCA`` = ``=<dev:port>,...``, every ACTIVE InfiniBand/RoCE port (:func:`infiniband_hcas`),
      exact names again; recorded so the run shows which HCAs it used. Skipped when ``NCCL_IB_DISABLE`` is set
      to a true value. With no active port and no OFI plugin in use, a note says traffic between nodes goes over
      TCP sockets.
    * On a Slingshot host whose OFI plugin loads (:func:`net_plugin`: found as RCCL finds it and really
      dlopen()ed) and whose /dev/cxi nodes this process sees: ``NCCL_NET`` = the network name the plugin reports
      (``"Libfabric"`` for aws-ofi-nccl), so that RCCL stops at init instead of silently running over sockets if
      the plugin cannot start; ``NCCL_NET_PLUGIN`` = the path of the library that loaded (HPE's guide: some RCCL
      versions look for libnccl-net.so, so name the file); and :data:`SLINGSHOT_SETTINGS` (HPE's values). NCCL_NET
      is never set when the plugin does not load: RCCL would then fail to initialize even on one node. Without a
      loadable plugin a note says RCCL falls back to TCP sockets over the hsn interfaces (the ``fabric`` health
      check warns).

    A single-node run adds nothing: GPUs in one host talk over peer-to-peer links (xGMI on MI300X) and shared
    memory, not the network.

    Args:
        environ: the launch environment (usually ``os.environ``); read, never changed.
        nnodes: number of hosts in the run (torchrun's ``--nnodes``, rocmft's NNODES).
        root: the filesystem root of the procfs/sysfs files (and of ``dev/cxi*``).

    Raises:
        ValueError: when ``nnodes`` is less than 1.
    """
    if nnodes < 1:
        raise ValueError(f"nnodes must be at least 1, got {nnodes}")
    result = NetworkEnvironment()
    if nnodes == 1:
        result.notes.append("single node: collectives use peer-to-peer links and shared memory; no network variables")
        return result

    def keep(name: str) -> bool:
        if _user_set(environ, name):
            result.notes.append(f"{name}={environ[name]} is yours: kept")
            return True
        return False

    fabric = slingshot_fabric(root)
    iface = default_route_interface(root)
    source = "proc/net/route"
    nccl_ifaces = fabric.interfaces or ((iface,) if iface else ())
    if not keep("NCCL_SOCKET_IFNAME"):
        if fabric.interfaces:
            result.variables["NCCL_SOCKET_IFNAME"] = (
                "=" + ",".join(fabric.interfaces),
                f"the Slingshot interfaces in sys/class/net ({_HPE_GUIDE}: list the hsn interfaces)",
            )
        elif iface is not None:
            result.variables["NCCL_SOCKET_IFNAME"] = (f"={iface}", f"the default route's interface ({source})")
    if iface is None:
        unset = [n for n in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
                 if not _user_set(environ, n) and n not in result.variables]  # fmt: skip
        if unset:
            result.notes.append(
                f"no IPv4 default route in {source}: set {' and '.join(unset)} to the "
                f"interface{'s' if len(unset) > 1 else ''} that reach{'' if len(unset) > 1 else 'es'} the other nodes"
            )
        keep("GLOO_SOCKET_IFNAME")
    elif not keep("GLOO_SOCKET_IFNAME"):
        result.variables["GLOO_SOCKET_IFNAME"] = (iface, f"the default route's interface ({source})")
        if _user_set(environ, "NCCL_SOCKET_IFNAME"):
            result.notes.append(
                f"GLOO_SOCKET_IFNAME={iface} (default route) while NCCL_SOCKET_IFNAME is yours: set "
                f"GLOO_SOCKET_IFNAME too if {iface} does not reach the other nodes"
            )

    ofi = _slingshot_transport(environ, fabric, result, keep) if fabric.detected else False
    if keep("NCCL_IB_HCA"):
        return result
    if truthy(environ.get("NCCL_IB_DISABLE", "")):
        result.notes.append("NCCL_IB_DISABLE is set: inter-node traffic goes over TCP sockets")
        return result
    hcas = infiniband_hcas(root)
    if hcas:
        listed = ", ".join(f"{h['name']} ({h['link_layer']})" for h in hcas)
        result.variables["NCCL_IB_HCA"] = (
            "=" + ",".join(h["name"] for h in hcas),
            f"the ACTIVE RDMA ports in sys/class/infiniband: {listed}",
        )
    elif not ofi:
        where = f" on {','.join(nccl_ifaces)}" if nccl_ifaces else ""
        result.notes.append(
            f"no ACTIVE InfiniBand/RoCE port in sys/class/infiniband: inter-node traffic goes over TCP sockets{where}"
            " (much slower than RDMA)"
        )
    return result


def _slingshot_transport(environ: Mapping[str, str], fabric: SlingshotFabric, result: NetworkEnvironment,
                         keep) -> bool:  # fmt: skip
    """network_environment's Slingshot part: NCCL_NET, NCCL_NET_PLUGIN and HPE's settings when the OFI plugin loads
    (see there). Returns True when inter-node traffic goes through the plugin."""
    plugin = net_plugin(environ)
    user_net = environ.get("NCCL_NET", "").strip() if _user_set(environ, "NCCL_NET") else None
    if not plugin.loads:
        unset = "NCCL_NET left unset" if user_net is None else f"your NCCL_NET={user_net} names no loaded network"
        result.notes.append(
            f"Slingshot NIC ({fabric.summary()}) but {plugin.describe()}: RCCL falls back to TCP sockets over "
            f"{','.join(fabric.interfaces) or 'the socket interface'}; {unset} (see the fabric check)"
        )
        keep("NCCL_NET")
        return False
    if not fabric.device_nodes:
        result.notes.append(
            f"Slingshot NIC and {plugin.describe()}, but no /dev/cxi* node is visible here: the plugin would find no "
            "NIC, so NCCL_NET is not set (give the container the devices: --device /dev/cxi0 ..., or Apptainer's "
            "default /dev)"
        )
        keep("NCCL_NET")
        return False
    if user_net is not None:
        keep("NCCL_NET")
        if user_net.lower() != (plugin.name or "").lower():
            return False  # the user chose another network (or one that does not exist: the fabric check refuses it)
    else:
        result.variables["NCCL_NET"] = (
            plugin.name or "",
            f"the network {plugin.path} reports ({plugin.symbol}); set because that plugin loads, so RCCL stops "
            "at init rather than silently falling back to TCP sockets",
        )
    if not keep("NCCL_NET_PLUGIN"):
        result.variables["NCCL_NET_PLUGIN"] = (
            plugin.path or "",
            f"the OFI plugin that loads, by path ({_HPE_GUIDE}: some RCCL versions look for libnccl-net.so)",
        )
    for name, (value, why) in SLINGSHOT_SETTINGS.items():
        if not keep(name):
            result.variables[name] = (value, f"{_HPE_GUIDE}: {why}")
    return True
