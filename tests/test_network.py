"""The multi-node network preflight: net-names, net-rdma, net-limits, net-rendezvous (rocmft.checks.network).

REAL (no injection): the rendezvous tests start two "nodes" as two processes on this machine (NNODES=2,
NODE_RANK=0/1, MASTER_ADDR=127.0.0.1, a free MASTER_PORT, GLOO_SOCKET_IFNAME=lo); each runs the net-names and
net-rendezvous check functions, which start the real child process, a real c10d TCPStore and a real gloo all-reduce.
The unresolvable MASTER_ADDR is a real lookup of a name under .invalid (RFC 6761: never resolves).

SYNTHETIC (injected): no RDMA NIC is here. The RDMA trees are hand-written under tmp_path in the layout of the
kernel's Documentation/ABI/stable/sysfs-class-infiniband (ports/<p>/state "4: ACTIVE", link_layer, gids/<i>,
gid_attrs/types/<i> "RoCE v2" / "IB/RoCE v1"), with plain files standing in for /dev/infiniband/uverbs<N>; the
GID values follow the ibv_devinfo listing in Juniper's JVD appendix (fe80 link-local, ::ffff:<IPv4> RoCE v2 at
index 3). The resource limits are injected through a stand-in getrlimit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from rocmft.checks import FAIL, PASS, SKIP, WARN, CheckSubject
from rocmft.checks.network import NODES_FILE, net_limits, net_names, net_rdma, node_list
from rocmft.facts.network import limits, rdma_facts, rendezvous_bound_s
from rocmft.facts.probes import Probes

NODE_SCRIPT = r"""
import json, os, sys
from pathlib import Path
from types import SimpleNamespace
from rocmft.checks import CheckSubject
from rocmft.checks.network import net_names, net_rendezvous
from rocmft.facts.probes import Probes
folder = Path(sys.argv[1])
folder.mkdir(parents=True, exist_ok=True)
plan = CheckSubject(
    plan=SimpleNamespace(
        settings=SimpleNamespace(rocmft=SimpleNamespace(net_timeout_s=float(sys.argv[2]), expected_nics=None),
                                 environ=os.environ),
        staging=folder, run_dir=folder),
    probes=Probes(injected={"rdma": {"devices": [], "uverbs": [], "gid_index": None, "ib_disabled": False},
                            "limits": {"memlock": [None, None], "nofile": [1048576, 1048576]}}))
out = {}
for fn in (net_names, net_rendezvous):
    o = fn(plan)
    out[fn.__name__] = {"status": o.status, "value": o.value, "message": o.message, "remedy": o.remedy,
                        "data": o.data}
print("RESULT " + json.dumps(out, default=str))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(rank: int, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROCMFT_", "SLURM_", "PET_", "KUBERNETES_", "NCCL_", "GLOO_"))}  # fmt: skip
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK"):
        env.pop(name, None)
    env.update(NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")  # fmt: skip
    env.update(extra)
    return env


def start_node(tmp_path: Path, rank: int, port: int, timeout_s: float = 4, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", NODE_SCRIPT, str(tmp_path / f"node{rank}"), str(timeout_s)],
                            env=node_env(rank, port, **extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


def finish(proc: subprocess.Popen) -> tuple[dict, str]:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), out


def test_two_local_nodes_meet_and_node_0_lists_both(tmp_path):
    port = free_port()
    nodes = [start_node(tmp_path, rank, port) for rank in (0, 1)]
    (zero, printed), (one, _) = finish(nodes[0]), finish(nodes[1])
    assert zero["net_names"]["status"] == PASS and one["net_names"]["status"] == PASS
    assert zero["net_rendezvous"]["status"] == PASS, zero["net_rendezvous"]
    assert one["net_rendezvous"]["status"] == PASS, one["net_rendezvous"]
    listing = json.loads((tmp_path / "node0" / NODES_FILE).read_text())
    assert [(row["node_rank"], row["status"], row["allreduce"]) for row in listing["nodes"]] == [
        (0, PASS, "ok"), (1, PASS, "ok")]  # fmt: skip
    assert {row["checks"]["net-names"] for row in listing["nodes"]} == {PASS}
    assert listing["bad_hosts"] == "" and "network preflight: all 2 nodes pass" in printed
    assert not (tmp_path / "node1" / NODES_FILE).exists()  # node 0 alone writes the list
    # each node's versions reach node 0 through the store (the same here: no drift); no GPU measured, no figures
    from rocmft import __version__

    assert [(row["versions"]["rocmft"], row["perf"], row["warnings"]) for row in listing["nodes"]] == [
        (__version__, None, [])] * 2  # fmt: skip


def test_the_port_is_free_for_torchruns_rendezvous_right_after(tmp_path):
    import torch.distributed as dist

    port = free_port()
    nodes = [start_node(tmp_path, rank, port) for rank in (0, 1)]
    assert all(finish(node)[0]["net_rendezvous"]["status"] == PASS for node in nodes)
    # what torchrun's c10d rendezvous does next on node 0: serve a TCPStore on the same port, at once
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    store.set("k", "v")
    del store
    with socket.socket() as plain:  # and a bind without SO_REUSEADDR: no TIME_WAIT left on node 0's side
        plain.bind(("0.0.0.0", port))


def test_rocmft_check_on_two_local_nodes(start_rocmft, tmp_path, tiny_model, demo_data):
    """The console script itself, twice: `rocmft check` as node 0 and node 1 (the demo configuration)."""
    port = free_port()
    common = {
        "ROCMFT_DISTRIBUTED": "ddp",
        "NNODES": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo",
        "ROCMFT_NET_TIMEOUT_S": "60",
        "OUTPUT_DIR": str(tmp_path / "out"),
    }
    nodes = [start_rocmft("check", env={**common, "NODE_RANK": str(rank)}) for rank in (0, 1)]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    for node, text in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, text[-3000:]
    assert "network preflight: all 2 nodes pass" in outputs[0]
    report = json.loads((tmp_path / "out" / "rocmft" / "checks.json").read_text())
    row = next(c for c in report["checks"] if c["id"] == "net-rendezvous")
    assert row["status"] == PASS and [n["status"] for n in row["data"]["list"]["nodes"]] == [PASS, PASS]
    assert (tmp_path / "out" / "rocmft" / NODES_FILE).is_file()
    node1 = json.loads((tmp_path / "out" / "rocmft-node1" / "checks.json").read_text())
    assert next(c for c in node1["checks"] if c["id"] == "net-rendezvous")["status"] == PASS


def test_a_node_that_never_starts_is_named_by_node_0_within_the_bound(tmp_path):
    port = free_port()
    started = time.monotonic()
    # SLURM_JOB_NODELIST alone (no SLURM_JOB_ID: the layout stays "by hand") names the hosts of the list
    zero, printed = finish(start_node(tmp_path, 0, port, timeout_s=3, SLURM_JOB_NODELIST="gpu[07-08]"))
    elapsed = time.monotonic() - started
    result = zero["net_rendezvous"]
    assert result["status"] == FAIL and "NODE_RANK 1 (gpu08) did not reach 127.0.0.1:" in result["message"]
    assert 3 <= elapsed < rendezvous_bound_s(3)
    listing = json.loads((tmp_path / "node0" / NODES_FILE).read_text())
    assert listing["bad_ranks"] == [1] and listing["bad_hosts"] == "gpu08"
    assert "NODE_RANK 1 of 2 fail; exclude them: sbatch --exclude=gpu08" in printed


def test_a_node_whose_port_never_answers_says_so(tmp_path):
    one, _ = finish(start_node(tmp_path, 1, free_port(), timeout_s=2))
    result = one["net_rendezvous"]
    assert result["status"] == FAIL and result["value"].startswith("MASTER_PORT")
    assert "refused: nothing listens there" in result["message"] and "MASTER_PORT=" in result["message"]


def test_the_port_answers_but_the_allreduce_cannot_complete(tmp_path):
    # node 1's gloo cannot open its data connections (an interface that does not exist): the store answered
    port = free_port()
    zero_p = start_node(tmp_path, 0, port, timeout_s=3)
    one_p = start_node(tmp_path, 1, port, timeout_s=3, GLOO_SOCKET_IFNAME="nosuch0")
    (zero, _), (one, _) = finish(zero_p), finish(one_p)
    assert zero["net_rendezvous"]["value"] == "port answered, all-reduce did not complete"
    assert "LlamaFactory#9350" in zero["net_rendezvous"]["message"] and one["net_rendezvous"]["status"] == FAIL
    listing = json.loads((tmp_path / "node0" / NODES_FILE).read_text())
    # node 1 raised its own error; node 0's is a timeout waiting for it, so node 1 alone is singled out
    assert listing["bad_ranks"] == [1] and "nosuch0" in listing["nodes"][1]["reasons"][0]


# ---- in-process: the names, RDMA (synthetic trees) and limits (injected) ----------------------------------------
@pytest.fixture
def two_nodes(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("SLURM_", "PET_", "KUBERNETES_", "NCCL_", "GLOO_")) or name in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NNODES", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    return monkeypatch


def plan_of(probes: dict | None = None, expected_nics: int | None = None) -> CheckSubject:
    """A check subject: ``probes`` injected, settings over the process environment (which the tests set)."""
    settings = SimpleNamespace(
        rocmft=SimpleNamespace(net_timeout_s=5.0, expected_nics=expected_nics), environ=os.environ
    )  # the process environment, which the tests set (monkeypatch)
    return CheckSubject(plan=SimpleNamespace(settings=settings), probes=Probes(injected=probes))


def test_a_master_addr_that_does_not_resolve_fails_naming_it_and_its_source(two_nodes):
    two_nodes.setenv("MASTER_ADDR", "no-such-host.invalid")
    outcome = net_names(plan_of())
    assert outcome.status == FAIL and outcome.value == "MASTER_ADDR=no-such-host.invalid does not resolve"
    assert "MASTER_ADDR=no-such-host.invalid (set in the environment) does not resolve on node 1" in (
        outcome.message)  # fmt: skip


def test_an_ipv6_rendezvous_address_is_written_in_brackets():
    from rocmft.checks.network import _endpoint

    assert (_endpoint("::1", 29500), _endpoint("10.0.0.2", 29500)) == ("[::1]:29500", "10.0.0.2:29500")


def test_one_node_skips_every_network_check(monkeypatch):
    for name in ("NNODES", "NODE_RANK", "SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    plan = plan_of()
    assert [fn(plan).status for fn in (net_names, net_rdma, net_limits)] == [SKIP, SKIP, SKIP]


GID_LL = "fe80:0000:0000:0000:a288:c2ff:fe3b:506a"
GID_V4 = "0000:0000:0000:0000:0000:ffff:0ac8:010a"


def rdma_tree(root: Path, ports: dict[str, dict], uverbs: int = 1) -> Path:
    """A SYNTHETIC sysfs + /dev tree (format: kernel Documentation/ABI/stable/sysfs-class-infiniband)."""
    for name, spec in ports.items():
        device, port = name.split(":")
        base = root / "sys/class/infiniband" / device / "ports" / port
        (base / "gids").mkdir(parents=True)
        (base / "gid_attrs/types").mkdir(parents=True)
        (base / "state").write_text(spec.get("state", "4: ACTIVE") + "\n")
        (base / "link_layer").write_text(spec.get("link_layer", "Ethernet") + "\n")
        for index in range(8):  # the kernel lists every table slot; unused ones read as zeros
            gid, kind = spec.get("gids", {}).get(index, ("0000:0000:0000:0000:0000:0000:0000:0000", None))
            (base / "gids" / str(index)).write_text(gid + "\n")
            if kind:
                (base / "gid_attrs/types" / str(index)).write_text(kind + "\n")
    (root / "dev/infiniband").mkdir(parents=True)
    for n in range(uverbs):
        (root / "dev/infiniband" / f"uverbs{n}").write_text("")
    return root


ROCE = {"gids": {0: (GID_LL, "IB/RoCE v1"), 1: (GID_LL, "RoCE v2"), 2: (GID_V4, "IB/RoCE v1"), 3: (GID_V4, "RoCE v2")}}


def rdma_check(tmp_path, ports, environ=None, uverbs=1, expected=None):
    facts = rdma_facts(rdma_tree(tmp_path, ports, uverbs), environ or {})
    return net_rdma(plan_of({"rdma": facts}, expected_nics=expected)), facts


def test_synthetic_roce_without_a_gid_index_passes_and_names_the_roce_v2_index(two_nodes, tmp_path):
    outcome, facts = rdma_check(tmp_path, {"bnxt_re0:1": ROCE})
    assert facts["devices"][0]["ports"][0]["gid_types"] == {0: "IB/RoCE v1", 1: "RoCE v2", 2: "IB/RoCE v1",
                                                            3: "RoCE v2"}  # fmt: skip
    assert outcome.status == PASS and "NCCL_IB_GID_INDEX=3" in outcome.message  # the IPv4-mapped RoCE v2 GID


def test_synthetic_gid_index_of_roce_v1_warns_and_a_missing_one_fails(two_nodes, tmp_path):
    outcome, _ = rdma_check(tmp_path / "v1", {"mlx5_0:1": ROCE}, {"NCCL_IB_GID_INDEX": "2"})
    assert outcome.status == WARN and "IB/RoCE v1" in outcome.message and "NCCL_IB_GID_INDEX=3" in outcome.remedy
    outcome, _ = rdma_check(tmp_path / "gone", {"mlx5_0:1": ROCE}, {"NCCL_IB_GID_INDEX": "6"})
    assert outcome.status == FAIL and "no GID at index 6" in outcome.message
    outcome, _ = rdma_check(tmp_path / "sup", {"mlx5_0:1": ROCE}, {"NCCL_IB_GID_INDEX": "²"})  # isdigit, not int
    assert outcome.status == FAIL and "no GID at index ²" in outcome.message


def test_synthetic_missing_uverbs_and_a_down_port_warn(two_nodes, tmp_path):
    ports = {"mlx5_0:1": {"link_layer": "InfiniBand"}, "mlx5_1:1": {"link_layer": "InfiniBand", "state": "1: DOWN"}}
    outcome, _ = rdma_check(tmp_path, ports, uverbs=0)
    assert outcome.status == WARN and outcome.value == "1 active port(s): mlx5_0:1"
    assert "no /dev/infiniband/uverbs*" in outcome.message and "mlx5_1:1 (DOWN)" in outcome.message


def test_synthetic_fewer_nics_than_expected_fails_and_none_at_all_skips(two_nodes, tmp_path):
    outcome, _ = rdma_check(tmp_path / "one", {"mlx5_0:1": ROCE, "mlx5_1:1": {**ROCE, "state": "1: DOWN"}},
                            expected=2)  # fmt: skip
    assert outcome.status == FAIL and outcome.value == "1 of 2 NICs"
    empty = rdma_facts(tmp_path / "none", {})
    assert net_rdma(plan_of({"rdma": empty})).status == SKIP
    assert net_rdma(plan_of({"rdma": empty}, expected_nics=1)).status == FAIL


def test_injected_rlimits(two_nodes, tmp_path):
    import resource

    fake = {resource.RLIMIT_MEMLOCK: (8 << 20, 8 << 20), resource.RLIMIT_NOFILE: (1024, 524288)}
    found = limits(lambda which: fake[which])
    assert found == {"memlock": [8 << 20, 8 << 20], "nofile": [1024, 524288]}
    rdma = rdma_facts(rdma_tree(tmp_path, {"mlx5_0:1": {"link_layer": "InfiniBand"}}), {})
    outcome = net_limits(plan_of({"limits": found, "rdma": rdma}))
    assert outcome.status == WARN and outcome.value == "ulimit -l 8192 (KiB), ulimit -n 1024"
    assert "memlock=-1" in outcome.remedy and "ulimit -n 524288" in outcome.remedy
    stuck = net_limits(plan_of({"limits": {"memlock": [None, None], "nofile": [20000, 20000]}, "rdma": rdma}))
    assert stuck.status == WARN and "ulimit -n" not in stuck.remedy  # the hard limit is no way out
    unlimited = {"memlock": [None, None], "nofile": [1048576, 1048576]}
    assert net_limits(plan_of({"limits": unlimited, "rdma": rdma})).status == PASS
    # without RDMA the locked-memory limit does not matter
    no_rdma = rdma_facts(tmp_path / "none", {})
    assert net_limits(plan_of({"limits": {**found, "nofile": [65536, 65536]}, "rdma": no_rdma})).status == PASS


def test_the_node_list_compresses_bad_hosts_with_hostlist():
    nodes = [{"node_rank": r, "arrived": r != 2, "allreduce": "ok" if r != 2 else None,
              "info": {"node_name": f"n{r:02d}", "checks": {"net-rdma": {"status": FAIL if r == 3 else PASS,
                                                                        "value": "1 of 2 NICs"}}} if r != 2 else None}
             for r in range(4)]  # fmt: skip
    listing = node_list(nodes, ["n00", "n01", "n02", "n03"])
    assert listing["bad_ranks"] == [2, 3] and listing["bad_hosts"] == "n[02-03]"
    assert listing["nodes"][3]["reasons"] == ["net-rdma failed: 1 of 2 NICs"]


@pytest.mark.slow  # waits out a network timeout (not the fast layer)
def test_a_silent_listener_on_master_port_is_named_not_a_crash_to_report(monkeypatch):
    """Found by the break session: a node other than 0 whose MASTER_PORT is held by a program that accepts but never
    speaks c10d's store protocol hung until the child was killed, then said only "did not end ... Report this"."""
    from rocmft.facts import network

    monkeypatch.setattr(network, "rendezvous_bound_s", lambda timeout_s: 12.0)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        spec = {"nnodes": 2, "node_rank": 1, "master_addr": "127.0.0.1", "master_port": port, "timeout_s": 2.0,
                "run_id": "silent", "info": {}}  # fmt: skip
        result = network.run_rendezvous(spec, {**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert result["stage"] == "store" and "never answered as node 0's rendezvous store" in result["error"]
