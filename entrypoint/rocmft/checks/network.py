"""Multi-node network preflight, run on every node before the first collective (issue 21, item 5).

``net-names`` (MASTER_ADDR and this node's name resolve), ``net-rdma`` (RDMA devices, ports, /dev/infiniband, the
RoCE v2 GID for NCCL_IB_GID_INDEX, the NIC count against ROCMFT_EXPECTED_NICS), ``net-limits`` (``ulimit -l`` and
``ulimit -n``), then ``net-rendezvous``: every node meets at node 0's store on MASTER_ADDR:MASTER_PORT and
all-reduces one number over gloo (:mod:`rocmft.facts.network`), each node sending its own checks' statuses, its GPUs'
figures and its versions (rocmft.checks.perf.node_record); node 0 returns the per-node pass/warn/fail list, with
the slow nodes and those on other versions than its own marked (rocmft.checks.perf.judge_nodes), in its ``data``,
in ``rocmft/network-nodes.json``, and one printed line with the hosts to exclude. One node: all skip. The Slingshot
side of the fabric is the ``fabric`` check (rocmft.checks.system).

Facts come from the run's probe provider (``subject.probes``, rocmft.facts.probes): injected when a test put
synthetic trees' facts there (``rdma``, ``limits``), else read once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmft.checks import FAIL, PASS, SKIP, WARN, Outcome, check
from rocmft.checks.perf import judge_nodes, node_record, on_slow
from rocmft.errors import ConfigError
from rocmft.values import whole_number

NODES_FILE = "network-nodes.json"
# RLIMIT_NOFILE floor. rocmft's own number, not an upstream one: each rank keeps sockets to its peers (RCCL's
# bootstrap and socket transport, gloo) and ROCm's VMM allocator held one descriptor per allocation on ROCm 7.14
# (ROCm/legacy-rocm-build#6661, "out of memory" at `ulimit -n`); the 1024 soft limit that systemd gives services by
# default (systemd.exec(5), DefaultLimitNOFILE=1024:524288) is what runs out, and ROCm/MAD#228 found a raised nofile
# mandatory for multi-node RCCL runs. 65536 is far above what one node's ranks open, and below the hard limits
# container runtimes give (Docker: 1048576).
NOFILE_FLOOR = 65536
_MEMLOCK_REMEDY = (
    "Give the container unlimited locked memory: docker run --ulimit memlock=-1 (compose: ulimits: memlock: -1); "
    "Slurm: make sure slurmd runs with LimitMEMLOCK=infinity and PropagateResourceLimits passes it; Kubernetes: "
    "containerd's LimitMEMLOCK=infinity (a pod cannot raise it)."
)


def _multi_node_layout(subject):
    """``(layout, None)`` for a multi-node job (rocmft.facts.scheduler.job_layout), else ``(None, outcome)``: a
    skip on one node, a fail naming the variable when the job layout cannot be read."""
    from rocmft.facts.scheduler import job_layout

    try:
        layout = job_layout(subject.plan.settings.environ)
    except ConfigError as err:
        return None, Outcome(FAIL, "bad job layout", err.message, err.remedy)
    if layout.nnodes == 1:
        return None, Outcome(SKIP, "one node", "One node: collectives do not cross the network.")
    return layout, None


def _source(layout, key: str, variable: str, value) -> str:
    """Where ``layout``'s ``key`` came from, in words: "set in the environment" when it is ``variable=value`` itself
    (the message already shows that), else the scheduler's variable (``first host of SLURM_STEP_NODELIST=…``)."""
    found = layout.sources.get(key)
    return "set in the environment" if found in (None, f"{variable}={value}") else found


def _endpoint(host: str, port) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:29500``), as sockets and URLs write it."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def names_facts(layout, environ) -> dict[str, Any]:
    """What ``net-names`` judges: :func:`rocmft.facts.network.resolve` of MASTER_ADDR, its addresses that are this
    host's own (:func:`is_local_address`), and :func:`advertised` (``environ``: the run's)."""
    from rocmft.facts.network import advertised, is_local_address, resolve

    master = resolve(layout.master_addr)
    return {"master": master, "local": [a for a in master["addresses"] if is_local_address(a)],
            "self": advertised(layout.master_addr, layout.master_port, environ)}  # fmt: skip


def _gloo_ifname(subject) -> str | None:
    launch = subject.launch_environment
    environ = subject.plan.settings.environ
    return (environ.get("GLOO_SOCKET_IFNAME") or launch.get("GLOO_SOCKET_IFNAME") or "").strip() or None


@check("net-names", "network: MASTER_ADDR and this node's name resolve", timeout_s=20)
def net_names(subject) -> Outcome:
    """Multi-node: MASTER_ADDR must resolve on every node (**fail**, naming it, its value and where it came from);
    on node 0 it should be one of node 0's own addresses (**warn** otherwise: the others would wait at another
    host); this node's host name should resolve (**warn**: gloo, without GLOO_SOCKET_IFNAME, listens on the address
    of the host name: torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, createDefaultDevice)."""
    layout, outcome = _multi_node_layout(subject)
    if outcome is not None:
        return outcome
    facts = subject.probes.get("net-names", lambda: names_facts(layout, subject.plan.settings.environ))
    master, me = facts["master"], facts["self"]
    source = _source(layout, "master_addr", "MASTER_ADDR", layout.master_addr)
    if not master["addresses"]:
        return Outcome(
            FAIL, f"MASTER_ADDR={layout.master_addr} does not resolve",
            f"MASTER_ADDR={layout.master_addr} ({source}) does not resolve on node {layout.node_rank} "
            f"({me['node_name']}): {master['error']}. Every node connects to it to meet the others.",
            "Set MASTER_ADDR to node 0's host name or IP address as this node can resolve it (check /etc/hosts and "
            "the DNS search domain: getent hosts <name>); under Slurm the first host of SLURM_STEP_NODELIST.",
            data=facts,
        )  # fmt: skip
    where = f"MASTER_ADDR {layout.master_addr} -> {', '.join(master['addresses'][:3])}"
    value = f"{where}; this node {me['node_name']} ({me['address'] or 'no route'})"
    if layout.node_rank == 0 and not facts["local"]:
        return Outcome(
            WARN, value,
            f"This is node 0, but MASTER_ADDR={layout.master_addr} ({source}) resolves to "
            f"{', '.join(master['addresses'])}, none of them an address of this host: the other nodes would look "
            "for the rendezvous there.",
            "Set MASTER_ADDR to this node's name or address on every node (a Kubernetes ClusterIP service in front "
            "of node 0 is fine: ignore this warning then).",
            data=facts,
        )  # fmt: skip
    if not me["hostname_resolves"] and not _gloo_ifname(subject):
        return Outcome(
            WARN, value,
            f"This node's host name {me['hostname']} does not resolve, and GLOO_SOCKET_IFNAME is unset: gloo "
            "listens on the host name's address, so it may fail to start.",
            "Set GLOO_SOCKET_IFNAME to the interface that reaches the other nodes, or add the host name to "
            "/etc/hosts.",
            data=facts,
        )  # fmt: skip
    return Outcome(PASS, value, f"node {layout.node_rank} of {layout.nnodes}", data=facts)


def _rdma(subject) -> dict[str, Any]:
    from rocmft.facts.network import rdma_facts

    return subject.probes.get("rdma", lambda: rdma_facts(Path("/"), subject.plan.settings.environ))


def _expected_nics(subject) -> int | None:
    return getattr(subject.plan.settings.rocmft, "expected_nics", None)


@check("net-rdma", "network: RDMA devices, ports and the RoCE GID", timeout_s=10)
def net_rdma(subject) -> Outcome:
    """Multi-node, with RDMA devices in ``/sys/class/infiniband`` (skip without, unless ROCMFT_EXPECTED_NICS asks
    for some; skip with NCCL_IB_DISABLE):

    * fewer ACTIVE ports than ROCMFT_EXPECTED_NICS: **fail** (a node missing a NIC slows every collective).
    * no ``/dev/infiniband/uverbs*`` in the container: **warn**: RCCL cannot open the devices and silently falls
      back to TCP sockets (vllm-project/vllm#42075; ROCm/MAD#228 saw nodes fall back from bnxt_re).
    * a port not ACTIVE: **warn** (rocmft's NCCL_IB_HCA leaves it out, rocmft.facts.topology.infiniband_hcas).
    * RoCE (link_layer Ethernet) with NCCL_IB_GID_INDEX set: the GID there must exist and be non-zero (**fail**:
      RCCL's queue pairs cannot connect with it) and of type ``RoCE v2`` (**warn**: RoCE v1 is not routed
      between subnets). NCCL_IB_GID_INDEX unset: the RoCE v2 index is named (NCCL picks one itself since 2.21:
      NVIDIA/nccl v2.31.2-1 src/transport/net_ib/connect.cc); no RoCE v2 GID at all: **warn**.
    """
    _, outcome = _multi_node_layout(subject)
    if outcome is not None:
        return outcome
    facts = _rdma(subject)
    expected = _expected_nics(subject)
    if facts["ib_disabled"]:
        return Outcome(SKIP, "NCCL_IB_DISABLE", "NCCL_IB_DISABLE is set: RCCL does not use RDMA.", data=facts)
    ports = [(d["name"], p) for d in facts["devices"] for p in d["ports"]]
    active = [(name, p) for name, p in ports if p["state"].upper() == "ACTIVE"]
    if not ports and not expected:
        return Outcome(SKIP, "no RDMA device", "No device in /sys/class/infiniband.", data=facts)
    listed = ", ".join(f"{n}:{p['port']}" for n, p in active) or "none"
    value = f"{len(active)} active port(s): {listed}"
    if expected and len(active) < expected:
        return Outcome(
            FAIL, f"{len(active)} of {expected} NICs",
            f"ROCMFT_EXPECTED_NICS={expected}, but this node has {len(active)} ACTIVE RDMA port(s) ({listed}; "
            f"{len(ports)} port(s) in /sys/class/infiniband).",
            "Exclude this node (the list node 0 prints) or fix its NICs (ibstat; a cable, the switch port, the "
            "driver); set ROCMFT_EXPECTED_NICS to what every node has.",
            data=facts,
        )  # fmt: skip
    gid = facts["gid_index"]
    problems = _device_problems(facts, ports) + _gid_problems(active, gid)
    hint = _gid_hint(active, gid)
    if not problems:
        return Outcome(PASS, value, f"/dev/infiniband: {', '.join(facts['uverbs'])}{hint}", data=facts)
    status = FAIL if any(s == FAIL for s, _, _ in problems) else WARN
    return Outcome(status, value, "; ".join(w for _, w, _ in problems) + hint,
                   " ".join(dict.fromkeys(r for _, _, r in problems)), data=facts)  # fmt: skip


def _device_problems(facts: dict[str, Any], ports: list[tuple[str, dict]]) -> list[tuple[str, str, str]]:
    """``(status, what, remedy)`` for the RDMA devices: no /dev/infiniband/uverbs* in the container, ports not
    ACTIVE."""
    problems: list[tuple[str, str, str]] = []  # (status, what, remedy)
    if not facts["uverbs"]:
        problems.append(
            (
                WARN,
                "no /dev/infiniband/uverbs* in this container: RCCL cannot open the RDMA devices "
                "and falls back to TCP sockets",
                "Pass the devices in: docker run --device "
                "/dev/infiniband (compose: devices: [/dev/infiniband]); Apptainer binds /dev by default.",
            )
        )
    down = [f"{n}:{p['port']} ({p['state'] or 'unknown'})" for n, p in ports if p["state"].upper() != "ACTIVE"]
    if down:
        problems.append((WARN, f"port(s) not ACTIVE: {', '.join(down)}", "Check them with ibstat (cable, switch "
                         "port, subnet manager for InfiniBand); RCCL uses only the active ones."))  # fmt: skip
    return problems


def _gid_problems(active: list[tuple[str, dict]], gid: str | None) -> list[tuple[str, str, str]]:
    """``(status, what, remedy)`` for the RoCE ports among the ``active`` ones: without NCCL_IB_GID_INDEX (``gid``),
    no RoCE v2 GID; with it, no GID at that index, or one that is not RoCE v2."""
    from rocmft.facts.network import roce_v2_index

    problems: list[tuple[str, str, str]] = []
    for name, port in active:
        if port["link_layer"] != "Ethernet":
            continue
        best = roce_v2_index(port)
        gids = {int(i): g for i, g in port["gids"].items()}
        types = {int(i): t for i, t in port["gid_types"].items()}
        here = f"{name}:{port['port']}"
        if gid is None:
            if best is None:
                problems.append(
                    (
                        WARN,
                        f"{here} (RoCE) has no RoCE v2 GID",
                        "Give the interface an IP address "
                        "(RoCE v2 GIDs follow the interface's addresses); RoCE v1 is not routed.",
                    )
                )
            continue
        if whole_number(gid) not in gids:
            problems.append(
                (
                    FAIL,
                    f"NCCL_IB_GID_INDEX={gid}, but {here} has no GID at index {gid}",
                    f"Set NCCL_IB_GID_INDEX={best} (the RoCE v2 GID of {here}), or unset it."
                    if best is not None
                    else "Unset NCCL_IB_GID_INDEX; give the interface an IP address.",
                )
            )
        elif types.get(int(gid)) != "RoCE v2":
            problems.append((WARN, f"NCCL_IB_GID_INDEX={gid} is a {types.get(int(gid), 'untyped')} GID on {here}",
                             f"Set NCCL_IB_GID_INDEX={best} (RoCE v2)." if best is not None else
                             "Give the interface an IP address for a RoCE v2 GID."))  # fmt: skip
    return problems


def _gid_hint(active: list[tuple[str, dict]], gid: str | None) -> str:
    """With NCCL_IB_GID_INDEX unset, the RoCE v2 indexes RCCL will pick on the active RoCE ports ("" otherwise)."""
    from rocmft.facts.network import roce_v2_index

    roce = [(n, p) for n, p in active if p["link_layer"] == "Ethernet"]
    hint = ""
    if gid is None and roce:
        best = {f"{n}:{p['port']}": roce_v2_index(p) for n, p in roce}
        found = sorted({i for i in best.values() if i is not None})
        if found:
            hint = (f"; NCCL_IB_GID_INDEX unset, RoCE v2 at index {'/'.join(map(str, found))} "
                    f"(RCCL picks it; to pin it: NCCL_IB_GID_INDEX={found[0]})")  # fmt: skip
    return hint


def _limits(subject) -> dict[str, Any]:
    from rocmft.facts.network import limits

    return subject.probes.get("limits", limits)


def _shown(value: int | None, unit: int = 1) -> str:
    return "unlimited" if value is None else str(value // unit)


@check("net-limits", "network: ulimit -l and ulimit -n", timeout_s=5)
def net_limits(subject) -> Outcome:
    """Multi-node: ``ulimit -n`` (RLIMIT_NOFILE, soft) below :data:`NOFILE_FLOOR` **warns**; with RDMA ports (and
    NCCL_IB_DISABLE unset) ``ulimit -l`` (RLIMIT_MEMLOCK) other than unlimited **warns**: RDMA pins the buffers it
    registers, and rdma-core's libibverbs.md ("Using libibverbs") asks for a locked-memory limit large enough for
    them, in practice unlimited (Docker's default is 8 MiB, where ibv_reg_mr fails: ROCm/cvs#452; NCCL then falls
    back to sockets: NVIDIA/nvidia-container-toolkit#2037)."""
    _, outcome = _multi_node_layout(subject)
    if outcome is not None:
        return outcome
    found = _limits(subject)
    memlock, nofile = found["memlock"], found["nofile"]
    rdma = _rdma(subject)
    uses_rdma = not rdma["ib_disabled"] and any(p["state"].upper() == "ACTIVE" for d in rdma["devices"]
                                                 for p in d["ports"])  # fmt: skip
    value = f"ulimit -l {_shown(memlock[0], 1024)} (KiB), ulimit -n {_shown(nofile[0])}"
    problems = []
    if uses_rdma and memlock[0] is not None:
        problems.append((f"locked memory is limited to {memlock[0] // 1024} KiB (ulimit -l): RDMA memory "
                         "registration fails or RCCL falls back to TCP sockets", _MEMLOCK_REMEDY))  # fmt: skip
    if nofile[0] is not None and nofile[0] < NOFILE_FLOOR:
        raise_to = "unlimited" if nofile[1] is None else nofile[1]
        by_hand = f", or `ulimit -n {raise_to}` (the hard limit) before rocmft starts" if raise_to != nofile[0] else ""
        problems.append(
            (
                f"open files are limited to {nofile[0]} (ulimit -n; rocmft asks for {NOFILE_FLOOR}): "
                "ranks run out of descriptors for sockets and GPU memory handles at scale",
                f"docker run --ulimit nofile=1048576:1048576 (compose: ulimits: nofile){by_hand}.",
            )
        )
    if problems:
        return Outcome(WARN, value, "; ".join(p for p, _ in problems), " ".join(r for _, r in problems), data=found)
    return Outcome(PASS, value, "RDMA in use: locked memory unlimited" if uses_rdma else "no RDMA port", data=found)


# ---------------------------------------------------------------------------------------------------------------
LOCAL_CHECKS = ("net-names", "net-rdma", "net-limits")


def _local_statuses(subject) -> dict[str, dict[str, str]]:
    """This node's own network checks (run again on their cached facts: cheap), for node 0's list."""
    found = {}
    for name, fn in (("net-names", net_names), ("net-rdma", net_rdma), ("net-limits", net_limits)):
        try:
            outcome = fn(subject)
            found[name] = {"status": outcome.status, "value": outcome.value}
        except Exception as err:  # the check itself reports its crash in its own row
            found[name] = {"status": FAIL, "value": f"{type(err).__name__}"}
    return found


def _slurm_hosts(environ) -> list[str]:
    import hostlist

    text = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    try:
        return hostlist.expand_hostlist(text) if text else []
    except hostlist.BadHostlist:
        return []


def node_list(nodes: list[dict[str, Any]], slurm_hosts: list[str] | None = None) -> dict[str, Any]:
    """Node 0's per-node pass/fail list from :func:`rocmft.facts.network.rendezvous`'s ``nodes``.

    A node **fails** when it never arrived, when one of its own network checks failed, or when its all-reduce
    raised an error of its own (an error that is a timeout is a consequence of another node's and names nobody;
    when every node timed out, the data path is blocked everywhere and no node is singled out).

    A node that did not fail **warns** when node 0 finds it slow or on other versions than node 0's
    (rocmft.checks.perf.judge_nodes, from the figures and versions each node sent).

    Returns ``{"nodes": [{"node_rank", "host" (its name; for a node that never arrived the Slurm node list's entry,
    else None), "address", "status": "pass"/"warn"/"fail", "reasons": [...], "warnings": [...], "checks": {id:
    status}, "perf", "versions"}], "bad_hosts": a python-hostlist expression of the failing hosts (``"n[01,03]"``)
    or "", "bad_ranks": [int], "slow_ranks", "drift_ranks": [int], "exclude_hosts": the failing and warned hosts}``.
    """
    import hostlist

    slurm_hosts = slurm_hosts or []
    warned = judge_nodes({node["node_rank"]: node["info"] for node in nodes if node.get("info")})
    rows = []
    for node in nodes:
        info = node.get("info") or {}
        r = node["node_rank"]
        host = info.get("node_name") or (slurm_hosts[r] if r < len(slurm_hosts) else None)
        reasons = []
        if not node["arrived"]:
            reasons.append("did not arrive at the rendezvous")
        for name, entry in (info.get("checks") or {}).items():
            if entry.get("status") == FAIL:
                reasons.append(f"{name} failed: {entry.get('value')}")
        reduce = node.get("allreduce")
        if reduce not in (None, "ok") and "timeout" not in reduce.lower() and "timed out" not in reduce.lower():
            reasons.append(f"all-reduce: {reduce}")
        warnings = warned.get(r, [])
        checks = {k: v.get("status") for k, v in (info.get("checks") or {}).items()}
        rows.append({"node_rank": r, "host": host, "address": info.get("address"),
                     "status": FAIL if reasons else WARN if warnings else PASS, "reasons": reasons,
                     "warnings": warnings, "checks": checks, "allreduce": reduce, "perf": info.get("perf"),
                     "versions": info.get("versions")})  # fmt: skip

    def hosts(chosen: list[dict[str, Any]]) -> str:
        named = [row["host"] for row in chosen if row["host"]]
        return hostlist.collect_hostlist(list(dict.fromkeys(named))) if named else ""

    bad = [row for row in rows if row["status"] == FAIL]
    kinds = {kind: [row["node_rank"] for row in rows if row["status"] == WARN
                    and any(w.startswith(prefix) for w in row["warnings"])]
             for kind, prefix in (("slow_ranks", "slow"), ("drift_ranks", "versions"))}  # fmt: skip
    return {"nodes": rows, "bad_ranks": [row["node_rank"] for row in bad], "bad_hosts": hosts(bad), **kinds,
            "exclude_hosts": hosts([row for row in rows if row["status"] != PASS])}  # fmt: skip


def _write_nodes(subject, listing: dict[str, Any]) -> str | None:
    from rocmft.fsutil import atomic_write_json

    staging = getattr(subject.plan, "staging", None)
    if staging is None:
        return None
    try:
        atomic_write_json(Path(staging) / NODES_FILE, listing)
    except OSError:
        return None
    return (
        str(Path(subject.plan.run_dir) / NODES_FILE)
        if getattr(subject.plan, "run_dir", None)
        else str(Path(staging) / NODES_FILE)
    )


def exclude_line(listing: dict[str, Any], total: int) -> str:
    """The line node 0 prints: every node passed, or the failing, slow and other-version hosts as a Slurm exclude
    list (``exclude_hosts``; ``bad_hosts`` in a list written before it)."""
    named = [(listing[key], words) for key, words in (("bad_ranks", f" of {total} fail"), ("slow_ranks", " slow"),
             ("drift_ranks", " on other versions than node 0")) if listing.get(key)]  # fmt: skip
    if not named:
        return f"network preflight: all {total} nodes pass"
    hosts = listing.get("exclude_hosts", listing["bad_hosts"])
    tail = f"; exclude them: sbatch --exclude={hosts}" if hosts else " (host names unknown)"
    return "network preflight: " + "; ".join(f"NODE_RANK {', '.join(map(str, r))}{w}" for r, w in named) + tail


def _timeout_s(subject) -> float:
    return float(getattr(subject.plan.settings.rocmft, "net_timeout_s", 120.0))


@check("net-rendezvous", "network: every node meets at MASTER_ADDR:MASTER_PORT, gloo all-reduce",
       timeout_s=630, needs=("net-names",))  # fmt: skip
def net_rendezvous(subject) -> Outcome:
    """Multi-node: every node reaches node 0's store at MASTER_ADDR:MASTER_PORT and a gloo all-reduce of one number
    across the nodes completes, bounded by ROCMFT_NET_TIMEOUT_S for the arrival plus min(30 s, it) for the
    all-reduce (hard-killed at :func:`rocmft.facts.network.rendezvous_bound_s`). **Fail** naming what did not work:
    the port did not answer (refused / timed out, from nodes other than 0), NODE_RANKs that never arrived (node 0),
    the all-reduce did not complete although the port answered (hiyouga/LlamaFactory#9350), or a node whose own
    network checks failed (node 0's list); **warn** (**fail** with ROCMFT_ON_SLOW_NODE=fail) on node 0 when every
    node passed but some are slow or on other versions than node 0's. Node 0 writes the per-node list
    (:func:`node_list`) to ``rocmft/network-nodes.json`` and prints :func:`exclude_line`."""
    layout, outcome = _multi_node_layout(subject)
    if outcome is not None:
        return outcome
    if layout.mode == "task":  # one process per GPU: every task of a node has its NODE_RANK, and the tasks that
        # finish their checks first would connect their env:// rendezvous to the preflight's store on MASTER_PORT
        return Outcome(SKIP, "task mode", "Slurm started one task per GPU: the rendezvous preflight runs in node mode "
                       "(--ntasks-per-node=1) only; net-names, net-rdma and net-limits ran.")  # fmt: skip
    timeout_s = _timeout_s(subject)
    result, environ = _meet(subject, layout, timeout_s)
    data: dict[str, Any] = {"result": result, "timeout_s": timeout_s}
    listing = _publish_list(subject, layout, result, data)
    if result.get("ok") and not (listing and listing["bad_ranks"]):
        where = _endpoint(layout.master_addr, layout.master_port)
        value = f"{layout.nnodes} nodes, all-reduce in {result.get('seconds', 0):.1f} s"
        warned = [row for row in (listing or {}).get("nodes", []) if row["status"] == WARN]
        if warned:
            return Outcome(FAIL if on_slow(subject) == "fail" else WARN, f"{value}, {len(warned)} to exclude",
                           exclude_line(listing, layout.nnodes) + ": " + "; ".join(
                               f"NODE_RANK {row['node_rank']}: {'; '.join(row['warnings'])}" for row in warned),
                           "Resubmit with that --exclude, or tell the operator (a slow node slows every step of a "
                           "data-parallel run; nodes on other versions can fail or hang in a collective); "
                           "ROCMFT_ON_SLOW_NODE=fail stops here instead of warning.", data=data)  # fmt: skip
        return Outcome(PASS, value, f"every node reached {where} and the gloo all-reduce completed", data=data)
    return _rendezvous_failure(layout, result, listing, environ, timeout_s, data)


def _meet(subject, layout, timeout_s: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Meet the other nodes at MASTER_ADDR:MASTER_PORT and all-reduce over gloo, sending this node's name, address
    and own checks' statuses (once: the result is kept by the probe provider as ``rendezvous``).

    Returns:
        The rendezvous result (rocmft.facts.network.run_rendezvous) and the environment it ran with.
    """
    from rocmft.facts.network import run_rendezvous

    me = subject.probes.known("net-names", {}).get("self") or {}
    info = {"node_name": me.get("node_name"), "hostname": me.get("hostname"), "address": me.get("address"),
            "checks": _local_statuses(subject), **node_record(subject)}  # fmt: skip
    launch_env = subject.launch_environment
    environ = {**subject.plan.settings.environ, **{k: v for k, v in launch_env.items() if k in ("GLOO_SOCKET_IFNAME",)}}
    spec = {"nnodes": layout.nnodes, "node_rank": layout.node_rank, "master_addr": layout.master_addr,
            "master_port": layout.master_port, "timeout_s": timeout_s, "run_id": layout.job_id or "job",
            "info": info}  # fmt: skip
    return subject.probes.get("rendezvous", lambda: run_rendezvous(spec, environ)), environ


def _publish_list(subject, layout, result: dict[str, Any], data: dict[str, Any]) -> dict[str, Any] | None:
    """Node 0 (the node whose result lists the nodes): the per-node pass/fail list, written to
    ``rocmft/network-nodes.json`` and its :func:`exclude_line` printed; put into ``data``. None on other nodes."""
    from rocmft.console import say

    listing = None
    if result.get("nodes"):
        listing = node_list(result["nodes"], _slurm_hosts(subject.plan.settings.environ))
        data["list"] = listing
        written = _write_nodes(subject, listing)
        data["file"] = written
        say(exclude_line(listing, layout.nnodes) + (f" ({written})" if written else ""), all_ranks=True)
    return listing


def _rendezvous_failure(layout, result: dict[str, Any], listing: dict[str, Any] | None, environ: dict[str, str],
                        timeout_s: float, data: dict[str, Any]) -> Outcome:  # fmt: skip
    """The failing Outcome, by the stage the rendezvous stopped at: the port, node 0's store, the nodes' arrival,
    the all-reduce; else the nodes that failed their own checks."""
    from rocmft.facts.network import GLOO_TIMEOUT_S

    where = _endpoint(layout.master_addr, layout.master_port)
    sources = ", ".join(dict.fromkeys(_source(layout, k, k.upper(), getattr(layout, k))
                                      for k in ("master_addr", "master_port")))  # fmt: skip
    gloo_if = environ.get("GLOO_SOCKET_IFNAME") or "unset: the address of the host name"
    stage, error = result.get("stage"), result.get("error")
    if stage == "port":
        why = {"refused": "refused: nothing listens there (node 0 not started, on another MASTER_PORT, or its port "
                          "is taken)",
               "timed out": "timed out: a firewall drops the packets, or there is no route"}.get(
            (result.get("port") or {}).get("error"), error)  # fmt: skip
        return Outcome(
            FAIL, f"MASTER_PORT {layout.master_port} not reachable",
            f"Node {layout.node_rank} could not connect to {where} (MASTER_ADDR={layout.master_addr}, "
            f"MASTER_PORT={layout.master_port}: {sources}) within "
            f"{timeout_s:g} s: {why}.",
            "Start node 0 with the same MASTER_PORT; open the port between the nodes (firewall, security group); "
            "raise ROCMFT_NET_TIMEOUT_S when node 0 starts much later.",
            data=data,
        )  # fmt: skip
    if stage == "store":
        return Outcome(FAIL, f"store on {where}", error or "", "Choose another MASTER_PORT (the same on every node): "
                       "another process holds this one, or the address is not this host's.", data=data)  # fmt: skip
    if stage == "arrival":
        missing = (listing or {}).get("nodes") or []
        named = [f"{row['node_rank']} ({row['host']})" if row["host"] else str(row["node_rank"])
                 for row in missing if "did not arrive at the rendezvous" in row["reasons"]]  # fmt: skip
        message = (f"NODE_RANK {', '.join(named)} did not reach {where} within ROCMFT_NET_TIMEOUT_S={timeout_s:g} s."
                   if named else f"{error}.")  # fmt: skip
        return Outcome(
            FAIL, f"{len(named) or '?'} of {layout.nnodes} node(s) missing", message,
            "Check that those nodes started rocmft with the same NNODES, MASTER_ADDR and MASTER_PORT and a NODE_RANK "
            "of their own (their own net-names / net-rendezvous rows say why they could not connect); raise "
            "ROCMFT_NET_TIMEOUT_S when nodes start late; exclude them with the line printed above.",
            data=data,
        )  # fmt: skip
    if stage == "allreduce":
        gloo_s = min(GLOO_TIMEOUT_S, timeout_s)
        others = "; ".join(f"node {row['node_rank']}: {row['allreduce']}" for row in (listing or {}).get("nodes", [])
                           if row.get("allreduce") not in (None, "ok"))  # fmt: skip
        return Outcome(
            FAIL, "port answered, all-reduce did not complete",
            f"Every node reached the store at {where}, but the gloo all-reduce did not complete within {gloo_s:g} s "
            f"({others or error}). gloo's data connections use other ports, on the interface GLOO_SOCKET_IFNAME "
            f"names ({gloo_if}), not the store's (hiyouga/LlamaFactory#9350).",
            "Set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface that reaches the other nodes (the same "
            "name on every node); let the nodes reach each other on any TCP port (firewall: the ephemeral range "
            "net.ipv4.ip_local_port_range) and check that each host name resolves to that interface's address.",
            data=data,
        )  # fmt: skip
    if listing and listing["bad_ranks"]:
        return Outcome(FAIL, f"{len(listing['bad_ranks'])} node(s) fail their own checks",
                       exclude_line(listing, layout.nnodes) + ": " + "; ".join(
                           f"NODE_RANK {row['node_rank']}: {', '.join(row['reasons'])}"
                           for row in listing["nodes"] if row["reasons"]),
                       "Fix or exclude those nodes (their own check rows say what failed).", data=data)  # fmt: skip
    return Outcome(FAIL, "rendezvous failed", error or "no result", "Report this with the checks.json.", data=data)
