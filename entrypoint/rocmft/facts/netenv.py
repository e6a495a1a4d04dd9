"""The network environment of a multi-node run: which interfaces and transport RCCL/NCCL and gloo use between
nodes, including HPE Slingshot and RCCL's external network plugin.

Everything here only reads Linux procfs/sysfs files below a ``root`` folder (``/`` on a real host, a recorded
layout under ``tests/data/sysfs/`` in tests) and returns a decision with a one-line reason for the log. Nothing
is changed: the network variables are handed to the launcher, which adds them to the workers' environment. The
public face is :mod:`rocmft.facts.topology`, which also holds the NUMA side (:mod:`rocmft.facts.numa`).

Sources:

* Linux ABI documents: ``Documentation/ABI/stable/sysfs-class-infiniband``
  (``/sys/class/infiniband/<device>/ports/<port>/state`` and ``link_layer``); ``proc(5)`` for ``/proc/net/route``.
* NCCL's "Environment Variables" documentation (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ``NCCL_IB_DISABLE``);
  RCCL, the ROCm fork of NCCL, reads the same variable names.
* HPE Slingshot and RCCL's network plugins: the sources are named in the "Slingshot" section below.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rocmft.values import truthy

# Linux route flags (include/uapi/linux/route.h): the route is usable.
_RTF_UP = 0x0001


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


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
    _socket_interfaces(environ, fabric, iface, result, keep)
    ofi = _slingshot_transport(environ, fabric, result, keep) if fabric.detected else False
    _rdma_ports(environ, root, result, keep, ofi, fabric.interfaces or ((iface,) if iface else ()))
    return result


def _socket_interfaces(environ: Mapping[str, str], fabric: SlingshotFabric, iface: str | None,
                       result: NetworkEnvironment, keep) -> None:  # fmt: skip
    """network_environment's socket part: NCCL_SOCKET_IFNAME (the Slingshot hsn interfaces, else the default
    route's ``iface``) and GLOO_SOCKET_IFNAME (``iface``), each unless ``keep`` finds the user's; notes when there
    is no default route, or when gloo's interface is rocmft's while NCCL's is the user's."""
    source = "proc/net/route"
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


def _rdma_ports(environ: Mapping[str, str], root: Path, result: NetworkEnvironment, keep, ofi: bool,
                nccl_ifaces: tuple[str, ...]) -> None:  # fmt: skip
    """network_environment's RDMA part: NCCL_IB_HCA = every ACTIVE InfiniBand/RoCE port, unless ``keep`` finds the
    user's or NCCL_IB_DISABLE is true; with no such port and no OFI plugin in use (``ofi`` False), a note that
    traffic goes over TCP sockets on ``nccl_ifaces``."""
    if keep("NCCL_IB_HCA"):
        return
    if truthy(environ.get("NCCL_IB_DISABLE", "")):
        result.notes.append("NCCL_IB_DISABLE is set: inter-node traffic goes over TCP sockets")
        return
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
