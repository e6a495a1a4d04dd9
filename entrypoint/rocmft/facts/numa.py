"""Where the GPUs sit: the host's NUMA nodes, each GPU's node, and whether torchrun binds each worker to it.

Everything here only reads Linux sysfs files below a ``root`` folder (``/`` on a real host, a recorded layout under
``tests/data/sysfs/`` in tests) and returns a decision with a one-line reason for the log. Nothing is changed: the
binding itself is done by torchrun (``--numa-binding=node``, :mod:`torch.numa.binding`). The public face is
:mod:`rocmft.facts.topology`, which also holds the network side (:mod:`rocmft.facts.netenv`).

Sources:

* Linux ABI documents: ``Documentation/ABI/testing/sysfs-bus-pci`` (``/sys/bus/pci/devices/<addr>/numa_node``:
  the NUMA node a PCI device is attached to, ``-1`` when unknown), ``Documentation/ABI/stable/sysfs-devices-node``
  (``/sys/devices/system/node/online`` and ``node<N>/cpulist``).
* ``torch/numa/binding.py`` in torch 2.11: what ``torchrun --numa-binding=node`` does.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rocmft.errors import ConfigError

NUMA_BIND_VAR = "ROCMFT_NUMA_BIND"
NUMA_BIND_SETTINGS = ("auto", "on", "off")


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
    mode = _binding_mode(setting)
    nodes = numa_nodes(root)
    allowed = _allowed_cpus(allowed_cpus, nodes)
    per_rank = _gpu_placements(gpu_pci_addresses, nodes, allowed, root)
    if mode == "off":
        return BindingPlan(enabled=False, mode=None, reason=f"{NUMA_BIND_VAR}=off", per_rank=per_rank)
    n_nodes = max(len([n for n, cpus in nodes.items() if cpus]), 1)
    obstacle = _binding_obstacle(mode, per_rank, nodes, n_nodes, allowed, numactl_available)
    if obstacle is not None:
        return BindingPlan(enabled=False, mode=None, reason=obstacle, per_rank=per_rank)
    return BindingPlan(enabled=True, mode="node", reason=_binding_reason(per_rank, nodes, n_nodes, allowed),
                       per_rank=per_rank)  # fmt: skip


_ONE_NODE = "host has 1 NUMA node: binding would change nothing"


def _binding_mode(setting: str) -> str:
    """ROCMFT_NUMA_BIND's value, lower-cased and stripped: one of :data:`NUMA_BIND_SETTINGS`.

    Raises:
        ConfigError: naming ROCMFT_NUMA_BIND, for any other value.
    """
    mode = setting.strip().lower()
    if mode not in NUMA_BIND_SETTINGS:
        raise ConfigError(
            f"{NUMA_BIND_VAR}={setting!r} is not one of {', '.join(NUMA_BIND_SETTINGS)}",
            f"set {NUMA_BIND_VAR}=auto (bind workers to their GPU's NUMA node where that helps), on or off",
        )
    return mode


def _allowed_cpus(allowed_cpus: set[int] | None, nodes: dict[int, set[int]]) -> set[int]:
    """The CPUs this process may run on: ``allowed_cpus`` when given, else ``os.sched_getaffinity(0)``, else (no
    affinity call on this platform) every CPU of ``nodes``."""
    if allowed_cpus is not None:
        return set(allowed_cpus)
    getaffinity = getattr(os, "sched_getaffinity", None)
    return set(getaffinity(0)) if getaffinity else set().union(*nodes.values())


def _gpu_placements(gpu_pci_addresses: list[str], nodes: dict[int, set[int]], allowed: set[int],
                    root: Path) -> list[dict]:  # fmt: skip
    """:attr:`BindingPlan.per_rank`: for each local rank's GPU, its normalized PCI address, its NUMA node (None
    when unknown) and the range list of that node's CPUs within ``allowed``."""
    per_rank = []
    for rank, address in enumerate(gpu_pci_addresses):
        node = gpu_numa_node(address, root)
        cpus = nodes.get(node, set()) & allowed if node is not None else set()
        per_rank.append(
            {"local_rank": rank, "pci_address": _normalize_pci(address), "numa_node": node, "cpus": format_ranges(cpus)}
        )
    return per_rank


def _refuse_or_disable(mode: str, message: str, remedy: str) -> str:
    """``message``, the reason binding is disabled (``auto``); with ``on``, the refusal instead.

    Raises:
        ConfigError: naming ``ROCMFT_NUMA_BIND=on``, with ``remedy``, when ``mode`` is ``on``.
    """
    if mode == "on":
        raise ConfigError(f"{NUMA_BIND_VAR}=on: {message}", remedy)
    return message


def _binding_obstacle(mode: str, per_rank: list[dict], nodes: dict[int, set[int]], n_nodes: int,
                      allowed: set[int], numactl_available: bool | None) -> str | None:  # fmt: skip
    """Why binding cannot be right (``mode`` auto or on), checked in this order: no GPU, a GPU whose node is
    unknown, one NUMA node (auto only: binding changes nothing), a rank whose node has none of the allowed CPUs,
    no numactl (looked up only when ``numactl_available`` is None and every earlier check passed). None when
    binding can go ahead.

    Raises:
        ConfigError: when ``mode`` is ``on`` and one of these (but one NUMA node) holds (see :func:`binding_plan`).
    """
    if not per_rank:
        if mode == "on":
            raise ConfigError(
                f"{NUMA_BIND_VAR}=on: no GPU is visible, so there is no GPU NUMA node to bind to",
                f"unset {NUMA_BIND_VAR}",
            )
        return "no GPU visible: nothing to bind"
    unknown = _unknown_node_obstacle(mode, per_rank, nodes, n_nodes)
    if unknown is not None:
        return unknown
    if n_nodes == 1 and mode == "auto":
        return _ONE_NODE
    starved = [e for e in per_rank if not e["cpus"]]
    if starved:
        starved_nodes = sorted({e["numa_node"] for e in starved})
        ranks = format_ranges(e["local_rank"] for e in starved)
        message = (
            f"the CPUs this container may use ({format_ranges(allowed) or 'none'}) include none of NUMA node "
            f"{', '.join(map(str, starved_nodes))}, the node of GPU(s) {ranks}: binding would leave them no CPU"
        )
        remedy = f"allow CPUs of every GPU's node (docker --cpuset-cpus) or set {NUMA_BIND_VAR}=auto"
        return _refuse_or_disable(mode, message, remedy)
    if numactl_available is None:
        numactl_available = shutil.which("numactl") is not None
    if not numactl_available:
        message = "numactl is not installed, and torchrun's --numa-binding runs workers under numactl"
        return _refuse_or_disable(mode, message, f"install numactl in the image, or set {NUMA_BIND_VAR}=auto")
    return None


def _unknown_node_obstacle(mode: str, per_rank: list[dict], nodes: dict[int, set[int]], n_nodes: int) -> str | None:
    """The reason binding is disabled when some GPU's NUMA node is unknown (sysfs ``-1`` or missing) or not an
    online node, naming up to four such GPUs (on one NUMA node: :data:`_ONE_NODE`); None when every node is known.

    Raises:
        ConfigError: when ``mode`` is ``on`` (torch would bind such workers to node 0).
    """
    unknown = [e for e in per_rank if e["numa_node"] is None]
    absent = [e for e in per_rank if e["numa_node"] is not None and e["numa_node"] not in nodes]
    if not (unknown or absent):
        return None
    bad = unknown or absent
    which = ", ".join(f"GPU {e['local_rank']} ({e['pci_address']})" for e in bad[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    what = "sysfs numa_node is -1 or missing" if unknown else f"node {bad[0]['numa_node']} is not an online node"
    if mode == "on":
        raise ConfigError(
            f"{NUMA_BIND_VAR}=on: the NUMA node of {which}{more} is unknown ({what}); torch would bind such workers "
            "to node 0",
            f"set {NUMA_BIND_VAR}=auto or off"
            + ("; on a host with one NUMA node binding changes nothing" if n_nodes == 1 else ""),
        )
    if n_nodes == 1:
        return _ONE_NODE
    return f"{_plural(n_nodes, 'NUMA node')} but the node of {which}{more} is unknown ({what})"


def _binding_reason(per_rank: list[dict], nodes: dict[int, set[int]], n_nodes: int, allowed: set[int]) -> str:
    """The log line of an enabled binding: the number of NUMA nodes, which GPUs sit on which node, and the
    allowed CPUs when they are fewer than the GPUs' nodes have (ROCMFT_NUMA_BIND=on on one node says so)."""
    reason = f"{_plural(n_nodes, 'NUMA node')}; {_ranks_by_node(per_rank)}"
    if n_nodes == 1:
        reason = f"{NUMA_BIND_VAR}=on; {reason} (binding changes nothing on one node)"
    host_cpus = set().union(*(nodes[e["numa_node"]] for e in per_rank))
    if not host_cpus <= allowed:
        reason += f"; CPUs limited to the allowed {format_ranges(allowed & host_cpus)}"
    return reason
