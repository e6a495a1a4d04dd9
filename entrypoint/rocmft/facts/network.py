"""The network between the nodes of a job, checked from every node before the first collective (issue 21, item 5).

Three kinds of facts, each read without changing anything:

* **Names**: whether ``MASTER_ADDR`` and this node's own name resolve (:func:`resolve`, ``getaddrinfo`` under a
  timeout: a dead DNS server otherwise blocks for the resolver's own retries), what name and address this node
  advertises (:func:`advertised`: the source address the kernel picks to reach MASTER_ADDR is the one the others
  reach it at), and whether MASTER_ADDR is an address of node 0 itself (:func:`is_local_address`).
* **The rendezvous** (:func:`run_rendezvous`): one process per node (world = NNODES, rank = NODE_RANK) meets at a
  TCPStore that node 0 serves on MASTER_ADDR:MASTER_PORT, then runs a gloo all-reduce of one number. It runs in a
  child process (``python -m rocmft.facts.network``) killed at a hard deadline, so a hung gloo cannot hang the
  entrypoint. It tells apart: the port never answered (refused or timed out, seen from nodes other than 0); a node
  never arrived (node 0 names the missing NODE_RANKs); the port answered but the all-reduce did not complete
  (hiyouga/LlamaFactory#9350: the store's port is reachable, but gloo's data connections use other ports on the
  interface GLOO_SOCKET_IFNAME names, which a firewall or a wrong interface blocks). Each node sends node 0 its
  host name and its local network checks' statuses through the store; node 0 returns the per-node list.
* **RDMA and limits** (:func:`rdma_facts`, :func:`limits`): the devices and ports of ``sys/class/infiniband``
  (the format of the kernel's Documentation/ABI/stable/sysfs-class-infiniband: ``ports/<p>/state`` such as
  ``"4: ACTIVE"``, ``link_layer`` ``InfiniBand``/``Ethernet``, ``gids/<i>``, and
  ``gid_attrs/types/<i>`` ``"RoCE v2"`` or ``"IB/RoCE v1"``), the verbs device nodes in ``/dev/infiniband``, and
  RLIMIT_MEMLOCK / RLIMIT_NOFILE.

The port is free again when the child has exited: the store and the process group are closed, the other nodes
disconnect before node 0 closes its server (so the connections' TIME_WAIT is on their side), and the c10d TCPStore
server that torchrun starts next binds with SO_REUSEADDR (tests/test_network.py binds it again right after).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESOLVE_TIMEOUT_S = 5.0  # one getaddrinfo; a working resolver answers in milliseconds
GLOO_TIMEOUT_S = 30.0  # the gloo all-reduce after every node arrived (min(this, ROCMFT_NET_TIMEOUT_S))
LEAVE_S = 5.0  # how long node 0 waits for the others to disconnect before it closes the store
PREFIX = "rocmft/preflight"


def resolve(host: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> dict[str, Any]:
    """``host``'s addresses (``socket.getaddrinfo``, TCP), given at most ``timeout_s`` seconds.

    Returns ``{"host", "addresses": [str, ...] (empty when it does not resolve), "error": None or the resolver's
    message ("Name or service not known", "timed out after 5 s")}``. Never raises.
    """
    box: dict[str, Any] = {}

    def look() -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            box["addresses"] = list(dict.fromkeys(info[4][0] for info in infos))
        except (OSError, UnicodeError) as err:
            box["error"] = getattr(err, "strerror", None) or str(err)

    thread = threading.Thread(target=look, name="rocmft-resolve", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return {"host": host, "addresses": [], "error": f"timed out after {timeout_s:g} s"}
    return {"host": host, "addresses": box.get("addresses", []), "error": box.get("error")}


def is_local_address(address: str) -> bool:
    """Whether ``address`` (an IPv4/IPv6 literal) belongs to this host: a socket can bind to it (port 0)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def node_name(environ: Mapping[str, str]) -> str:
    """This node's name as a scheduler spells it: ``SLURMD_NODENAME`` (Slurm's name for the node, ``man srun``),
    else the short host name (``socket.gethostname()`` up to the first dot)."""
    return (environ.get("SLURMD_NODENAME") or "").strip() or socket.gethostname().split(".")[0]


def advertised(master_addr: str | None, master_port: int | None, environ: Mapping[str, str]) -> dict[str, Any]:
    """The name and address this node shows the others (``environ``: the run's, for :func:`node_name`).

    Returns ``{"hostname": gethostname(), "fqdn": getfqdn(), "node_name": :func:`node_name`, "address": the
    source address the kernel picks for MASTER_ADDR (a UDP ``connect`` sends nothing; None when there is no
    route), "hostname_resolves": its addresses or []}``. gloo, without GLOO_SOCKET_IFNAME, listens on the address
    the host name resolves to (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, createDefaultDevice), which is why
    the host name must resolve to an address the others reach.
    """
    address = None
    if master_addr and master_port:
        target = resolve(master_addr)
        if target["addresses"]:
            first = target["addresses"][0]
            family = socket.AF_INET6 if ":" in first else socket.AF_INET
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as probe:
                    probe.connect((first, master_port))
                    address = probe.getsockname()[0]
            except OSError:
                address = None
    hostname = socket.gethostname()
    return {"hostname": hostname, "fqdn": socket.getfqdn(), "node_name": node_name(environ), "address": address,
            "hostname_resolves": resolve(hostname)["addresses"]}  # fmt: skip


def probe_port(host: str, port: int, deadline: float, retry_s: float = 0.5) -> dict[str, Any]:
    """Try a TCP connection to ``host:port`` until it answers or ``time.monotonic()`` passes ``deadline``.

    Returns ``{"open": bool, "tries": n, "error": None or the last failure: "refused" (nothing listens: node 0 not
    started yet, or another port), "timed out" (a firewall drops the packets, or no route), or the OS's message}``.
    """
    tries, error = 0, None
    while True:
        tries += 1
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(remaining, 3.0), 0.1)):
                return {"open": True, "tries": tries, "error": None}
        except ConnectionRefusedError:
            error = "refused"
        except TimeoutError:
            error = "timed out"
        except OSError as err:
            error = err.strerror or str(err)
        if time.monotonic() + retry_s > deadline:
            return {"open": False, "tries": tries, "error": error}
        time.sleep(retry_s)


# ---------------------------------------------------------------------------------------------------------------
# The rendezvous and the gloo all-reduce, in a child process


def rendezvous_bound_s(timeout_s: float) -> float:
    """The hard deadline of :func:`run_rendezvous`, in seconds: the wait for the nodes (``timeout_s``), the gloo
    all-reduce (min(GLOO_TIMEOUT_S, timeout_s)) twice (node 0 then collects the others' results), LEAVE_S, and
    15 s to start the child (importing torch)."""
    return timeout_s + 2 * min(GLOO_TIMEOUT_S, timeout_s) + LEAVE_S + 15.0


def run_rendezvous(spec: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Run :func:`rendezvous` in a child process (``python -m rocmft.facts.network``) and return its result,
    killing the child's process group at :func:`rendezvous_bound_s`.

    Args:
        spec: ``nnodes``, ``node_rank``, ``master_addr``, ``master_port``, ``timeout_s``, ``run_id`` (a job id:
            nodes of the same job use the same), ``info`` (this node's record, JSON-ready).
        environ: the child's environment (default os.environ): GLOO_SOCKET_IFNAME there chooses gloo's interface.

    Returns:
        :func:`rendezvous`'s dict, or ``{"ok": False, "stage": "child", "error": ...}`` when the child crashed or
        missed the deadline. Never raises.
    """
    from rocmft.proc import kill_group

    bound = rendezvous_bound_s(float(spec["timeout_s"]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmft.facts.network"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, env=dict(environ),
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(json.dumps(dict(spec)), timeout=bound)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        partial, _ = proc.communicate()
        partial = partial or ""
        if PORT_OPEN in partial and STORE_JOINED not in partial:  # the port answered, but not in c10d's protocol
            host, port = spec["master_addr"], spec["master_port"]
            error = (f"{host}:{port} accepted the connection but never answered as node 0's rendezvous store "
                     f"(killed after {bound:.0f} s): another program listens on that port (a previous job, another "
                     "service)")  # fmt: skip
            return {"ok": False, "stage": "store", "error": error}
        return {"ok": False, "stage": "child", "error": f"the rendezvous did not end within {bound:.0f} s (killed)"}
    lines = stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        return {"ok": False, "stage": "child", "error": f"the rendezvous process exited {proc.returncode}: {tail}"}
    return result


def _wait_keys(store, keys: list[str], deadline: float, stop: str | None = None) -> list[str]:
    """Poll ``store`` until every key in ``keys`` is set, ``stop`` is set, or ``deadline``; returns those missing."""
    while True:
        missing = [key for key in keys if not store.check([key])]
        if not missing or time.monotonic() > deadline or (stop and store.check([stop])):
            return missing
        time.sleep(0.2)


PORT_OPEN = "rocmft-preflight: port open"  # the child's progress lines (nodes 1..N-1): MASTER_PORT answered,
STORE_JOINED = "rocmft-preflight: store joined"  # and node 0's store answered


def rendezvous(spec: Mapping[str, Any], progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Meet every node at node 0's TCPStore, then all-reduce one number over gloo (see the module docstring).

    Returns ``{"ok": bool, "stage": where it stopped ("port", "store", "arrival", "allreduce", "done"), "error":
    str or None, "seconds": float}``; on node 0 also ``"nodes"``: for each NODE_RANK ``{"node_rank", "arrived",
    "info" (what that node sent) or None, "allreduce": "ok", an error, or None (not run)}``; on other nodes
    ``"port"`` (:func:`probe_port`'s result). Never raises (errors are the result).
    """
    from datetime import timedelta

    import torch.distributed as dist

    started = time.monotonic()
    n, rank = int(spec["nnodes"]), int(spec["node_rank"])
    host, port, timeout_s = str(spec["master_addr"]), int(spec["master_port"]), float(spec["timeout_s"])
    gloo_s = min(GLOO_TIMEOUT_S, timeout_s)
    key = f"{PREFIX}/{spec.get('run_id') or 'job'}"
    deadline = started + timeout_s
    result: dict[str, Any] = {"ok": False, "stage": "port", "error": None, "node_rank": rank}

    def finish(**fields: Any) -> dict[str, Any]:
        result.update(fields, seconds=round(time.monotonic() - started, 2))
        return result

    if rank != 0:
        reached = probe_port(host, port, deadline)
        result["port"] = reached
        if not reached["open"]:
            return finish(error=f"{host}:{port} did not answer in {timeout_s:g} s ({reached['error']}, "
                                f"{reached['tries']} tries)")  # fmt: skip
        if progress:  # so that a child killed while joining says the port answered (a silent listener there)
            progress(PORT_OPEN)
    try:
        store = dist.TCPStore(host, port, world_size=None, is_master=rank == 0,
                              timeout=timedelta(seconds=max(deadline - time.monotonic(), 2.0)),
                              wait_for_workers=False)  # fmt: skip
    except Exception as err:  # c10d raises RuntimeError/DistNetworkError (bind in use, connect refused)
        what = "could not serve" if rank == 0 else "could not join"
        return finish(stage="store", error=f"node {rank} {what} the store on {host}:{port}: {err}")
    store.set(f"{key}/joined/{rank}", "1")  # the first reply from the store: a silent listener blocks here
    if progress and rank != 0:
        progress(STORE_JOINED)
    store.set(f"{key}/arrived/{rank}", json.dumps(spec.get("info") or {}))
    nodes, failed = _gather(store, key, n, rank, deadline, started, where=(host, port, timeout_s))
    if rank == 0:
        result["nodes"] = nodes
    if failed:
        return finish(stage="arrival", error=failed)
    error = _all_reduce(store, key, n, rank, gloo_s)
    if rank == 0:
        done = [f"{key}/done/{r}" for r in range(n)]
        late = _wait_keys(store, done, time.monotonic() + gloo_s + 2)
        for r in range(n):
            nodes[r]["allreduce"] = store.get(done[r]).decode() if done[r] not in late else "no answer"
    _leave(store, key, n, rank, started)
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank != 0:
        del store
        _until_closed(host, port, time.monotonic() + LEAVE_S + 3)
    if error:
        return finish(stage="allreduce", error=error)
    return finish(ok=True, stage="done")


def _gather(store, key: str, n: int, rank: int, deadline: float, started: float,
            where: tuple[str, int, float]) -> tuple[list[dict[str, Any]], str | None]:  # fmt: skip
    """The arrival: node 0 waits for every NODE_RANK's record in the store, then says go (or abort, naming the
    missing nodes, and leaves); the other nodes wait for that word.

    Returns:
        Node 0's row per NODE_RANK (``node_rank``, ``arrived``, ``allreduce`` None, ``info``; empty on other nodes),
        and the error when the nodes did not all arrive, else None.
    """
    host, port, timeout_s = where
    arrived = [f"{key}/arrived/{r}" for r in range(n)]
    nodes: dict[int, dict[str, Any]] = {}
    if rank == 0:
        missing = _wait_keys(store, arrived, deadline)
        for r in range(n):
            got = arrived[r] not in missing
            nodes[r] = {"node_rank": r, "arrived": got, "allreduce": None,
                        "info": json.loads(store.get(arrived[r])) if got else None}  # fmt: skip
        if missing:
            gone = [r for r in range(n) if not nodes[r]["arrived"]]
            store.set(f"{key}/abort", json.dumps(gone))
            _leave(store, key, n, rank, started)
            return list(nodes.values()), (f"NODE_RANK {', '.join(map(str, gone))} did not reach "
                                          f"{host}:{port} within {timeout_s:g} s")  # fmt: skip
        store.set(f"{key}/go", "1")
    else:
        _wait_keys(store, [f"{key}/go"], deadline + 10, stop=f"{key}/abort")
        if store.check([f"{key}/abort"]):
            gone = json.loads(store.get(f"{key}/abort"))
            return [], f"node 0 gave up: NODE_RANK {', '.join(map(str, gone))} did not arrive"
    return list(nodes.values()), None  # node 0's rows in NODE_RANK order; none on the other nodes


def _all_reduce(store, key: str, n: int, rank: int, gloo_s: float) -> str | None:
    """All-reduce one number over gloo through ``store`` (bounded by ``gloo_s``) and record this node's outcome in
    the store (``ok`` or the error); the error, or None."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    error = None
    try:
        dist.init_process_group("gloo", store=dist.PrefixStore(f"{key}/pg/", store), rank=rank, world_size=n,
                                timeout=timedelta(seconds=gloo_s))  # fmt: skip
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        if value.item() != n * (n + 1) / 2:
            error = f"the all-reduce gave {value.item():g}, not {n * (n + 1) / 2:g}"
    except Exception as err:  # gloo raises RuntimeError/DistError on a connect failure or its timeout
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else err}"[:400]
    store.set(f"{key}/done/{rank}", error or "ok")
    return error


def _until_closed(host: str, port: int, deadline: float) -> None:
    """Wait until node 0's preflight store stops answering on ``host:port`` (or ``deadline``), so that this node's
    torchrun, started next, cannot connect to the preflight's store instead of its own rendezvous."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                pass
        except OSError:
            return
        time.sleep(0.2)


def _leave(store, key: str, n: int, rank: int, started: float) -> None:
    """The other nodes say goodbye and disconnect first; node 0 waits up to LEAVE_S for them, then the store goes."""
    if rank != 0:
        store.set(f"{key}/left/{rank}", "1")
    else:
        _wait_keys(store, [f"{key}/left/{r}" for r in range(1, n) if store.check([f"{key}/arrived/{r}"])],
                   time.monotonic() + LEAVE_S)  # fmt: skip
        time.sleep(0.2)  # their close() follows their last set()


# ---------------------------------------------------------------------------------------------------------------
# RDMA: sys/class/infiniband, /dev/infiniband; the resource limits

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):  # an unused GID's type reads EINVAL (drivers/infiniband/core/sysfs.c)
        return None


def rdma_facts(root: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """The RDMA devices under ``root`` as the kernel shows them (Documentation/ABI/stable/sysfs-class-infiniband).

    Returns ``{"devices": [{"name", "ports": [{"port": int, "state": "ACTIVE"/"DOWN"/..., "link_layer",
    "gids": {index: gid} (non-zero GIDs only), "gid_types": {index: "RoCE v2" | "IB/RoCE v1"}}]}],
    "uverbs": the ``dev/infiniband/uverbs*`` nodes this process sees (sysfs shows the host's devices even in a
    container; the nodes are there only when ``--device /dev/infiniband`` gave them), "gid_index": NCCL_IB_GID_INDEX
    or None, "ib_disabled": NCCL_IB_DISABLE set to a true value}``.
    """
    devices = []
    base = root / "sys/class/infiniband"
    for device in sorted(base.iterdir()) if base.is_dir() else []:
        ports = []
        folder = device / "ports"
        for port in sorted(folder.iterdir(), key=lambda p: p.name) if folder.is_dir() else []:
            if not port.name.isdecimal():
                continue
            gids, types = {}, {}
            for entry in (port / "gids").iterdir() if (port / "gids").is_dir() else []:
                value = _read(entry)
                if entry.name.isdecimal() and value and value != ZERO_GID:
                    gids[int(entry.name)] = value
                    kind = _read(port / "gid_attrs" / "types" / entry.name)
                    if kind:
                        types[int(entry.name)] = kind
            ports.append({"port": int(port.name), "state": (_read(port / "state") or "").split(":")[-1].strip(),
                          "link_layer": _read(port / "link_layer") or "unknown",
                          "gids": dict(sorted(gids.items())), "gid_types": dict(sorted(types.items()))})  # fmt: skip
        devices.append({"name": device.name, "ports": ports})
    dev = root / "dev/infiniband"
    uverbs = sorted(p.name for p in dev.iterdir() if p.name.startswith("uverbs")) if dev.is_dir() else []
    gid_index = (environ.get("NCCL_IB_GID_INDEX") or "").strip() or None
    from rocmft.values import truthy

    return {"devices": devices, "uverbs": uverbs, "gid_index": gid_index,
            "ib_disabled": truthy(environ.get("NCCL_IB_DISABLE", ""))}  # fmt: skip


def roce_v2_index(port: Mapping[str, Any]) -> int | None:
    """The GID index NCCL would want on a RoCE port: the first RoCE v2 GID holding an IPv4-mapped address
    (``::ffff:a.b.c.d``, NCCL's default address family AF_INET), else the first RoCE v2 GID; None without one.
    NCCL's rule (NVIDIA/nccl v2.31.2-1 src/transport/net_ib/connect.cc: NCCL_IB_GID_INDEX default -1, chosen by
    NCCL_IB_ROCE_VERSION_NUM, default 2)."""
    v2 = [int(i) for i, kind in port.get("gid_types", {}).items() if kind == "RoCE v2"]
    mapped = [i for i in v2 if str(port["gids"].get(i, port["gids"].get(str(i), ""))).startswith(
        "0000:0000:0000:0000:0000:ffff:")]  # fmt: skip
    return (mapped or v2 or [None])[0]


def limits(getrlimit: Callable[[int], tuple[int, int]] | None = None) -> dict[str, Any]:
    """RLIMIT_MEMLOCK (bytes; ``ulimit -l`` shows KiB) and RLIMIT_NOFILE of this process, soft and hard, via
    ``resource.getrlimit`` (``getrlimit``: a stand-in for tests). ``None`` stands for RLIM_INFINITY (unlimited)."""
    import resource

    get = getrlimit or resource.getrlimit

    def pair(which: int) -> list[int | None]:
        return [None if v == resource.RLIM_INFINITY else int(v) for v in get(which)]

    return {"memlock": pair(resource.RLIMIT_MEMLOCK), "nofile": pair(resource.RLIMIT_NOFILE)}


def main() -> int:
    """The child of :func:`run_rendezvous`: the spec as JSON on stdin, the result as one JSON line on stdout."""
    spec = json.loads(sys.stdin.read())
    print(json.dumps(rendezvous(spec, lambda line: print(line, flush=True))), flush=True)
    return 0


__all__ = ["GLOO_TIMEOUT_S", "advertised", "is_local_address", "limits", "node_name", "probe_port", "rdma_facts",
           "rendezvous", "rendezvous_bound_s", "resolve", "roce_v2_index", "run_rendezvous"]  # fmt: skip

if __name__ == "__main__":
    raise SystemExit(main())
