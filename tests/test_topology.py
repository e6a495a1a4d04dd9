"""rocmft.facts.topology against sysfs layouts: hand-written models of hosts we have no access to, and layouts
recorded on real hosts with tests/data/sysfs/record.py (tests/data/sysfs/README.md says which is which)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rocmft.errors import ConfigError, ExitCode
from rocmft.facts.topology import (
    BindingPlan,
    binding_plan,
    default_route_interface,
    format_ranges,
    gpu_numa_node,
    infiniband_hcas,
    network_environment,
    numa_nodes,
    parse_ranges,
    pci_address,
)

LAYOUTS = Path(__file__).parent / "data" / "sysfs"
TWO_SOCKET = LAYOUTS / "two-socket-8gpu"
ONE_NODE = LAYOUTS / "one-node-1gpu"

MI300X_GPUS = [f"0000:{bus}:00.0" for bus in ("05", "26", "46", "65", "85", "a6", "c6", "e5")]
NODE0 = set(range(48)) | set(range(96, 144))
NODE1 = set(range(48, 96)) | set(range(144, 192))
ALL_CPUS = NODE0 | NODE1
VM_GPU = ["0000:00:1e.0"]


def copy_layout(src: Path, tmp_path: Path) -> Path:
    root = tmp_path / src.name
    shutil.copytree(src, root)
    return root


# --- range lists ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ints"),
    [
        ("0-47,96-143\n", NODE0),
        ("48-95,144-191", NODE1),
        ("0", {0}),
        ("0-2,4,6-7", {0, 1, 2, 4, 6, 7}),
        ("\n", set()),
        ("", set()),
    ],
)
def test_range_list_round_trip(text, ints):
    assert parse_ranges(text) == ints
    assert format_ranges(ints) == text.strip()
    assert parse_ranges(format_ranges(ints)) == ints


def test_format_ranges_sorts_and_dedups():
    assert format_ranges([7, 1, 0, 2, 2, 5]) == "0-2,5,7"


@pytest.mark.parametrize("text", ["a-b", "5-3", "1,,x", "-1", "0-"])
def test_parse_ranges_rejects_garbage(text):
    with pytest.raises(ValueError, match="not a range list"):
        parse_ranges(text)


# --- NUMA facts ----------------------------------------------------------------------------------------------


def test_numa_nodes_two_socket():
    assert numa_nodes(TWO_SOCKET) == {0: NODE0, 1: NODE1}


def test_numa_nodes_one_node():
    assert numa_nodes(ONE_NODE) == {0: set(range(8))}


def test_numa_nodes_keeps_only_online_nodes_and_cpuless_ones(tmp_path):
    root = copy_layout(TWO_SOCKET, tmp_path)
    base = root / "sys/devices/system/node"
    (base / "node2").mkdir()
    (base / "node2/cpulist").write_text("\n")  # a memory-only node, online
    (base / "node3").mkdir()
    (base / "node3/cpulist").write_text("200-207\n")  # present but offline
    (base / "online").write_text("0-2\n")
    assert numa_nodes(root) == {0: NODE0, 1: NODE1, 2: set()}


def test_numa_nodes_without_numa_folder(tmp_path):
    assert numa_nodes(tmp_path) == {}


def test_gpu_numa_node():
    assert [gpu_numa_node(a, TWO_SOCKET) for a in MI300X_GPUS] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpu_numa_node("85:00.0", TWO_SOCKET) == 1  # lspci's form, domain 0
    assert gpu_numa_node("0000:A6:00.0", TWO_SOCKET) == 1
    assert gpu_numa_node(VM_GPU[0], ONE_NODE) is None  # -1: unknown
    assert gpu_numa_node("0000:99:00.0", TWO_SOCKET) is None  # no such device


def test_pci_address_matches_sysfs_names():
    assert pci_address(0, 0x85, 0) == "0000:85:00.0"
    assert pci_address(1, 5, 0x1E, 1) == "0001:05:1e.1"


# --- binding plan --------------------------------------------------------------------------------------------


def test_plan_two_socket_binds_each_rank_to_its_gpus_node():
    plan = binding_plan(MI300X_GPUS, "auto", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=True)
    assert plan.enabled
    assert plan.mode == "node"
    assert plan.torchrun_args() == ["--numa-binding", "node"]
    assert plan.reason == "2 NUMA nodes; GPUs 0-3 on node 0, 4-7 on node 1"
    assert [r["numa_node"] for r in plan.per_rank] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [r["local_rank"] for r in plan.per_rank] == list(range(8))
    assert plan.per_rank[0] == {"local_rank": 0, "pci_address": "0000:05:00.0", "numa_node": 0, "cpus": "0-47,96-143"}
    assert plan.per_rank[7] == {
        "local_rank": 7,
        "pci_address": "0000:e5:00.0",
        "numa_node": 1,
        "cpus": "48-95,144-191",
    }
    assert plan.as_dict()["per_rank"] == plan.per_rank


def test_plan_on_is_case_insensitive_and_matches_auto_on_two_sockets():
    auto = binding_plan(MI300X_GPUS, "auto", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=True)
    on = binding_plan(MI300X_GPUS, " ON ", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=True)
    assert on == auto


def test_plan_reads_the_process_affinity_by_default(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(ALL_CPUS), raising=False)
    plan = binding_plan(MI300X_GPUS[4:], "auto", TWO_SOCKET, numactl_available=True)
    assert plan.enabled
    assert plan.reason == "2 NUMA nodes; GPUs 0-3 on node 1"  # local ranks 0-3 drive the node-1 GPUs


def test_plan_auto_one_node_is_disabled():
    plan = binding_plan(VM_GPU, "auto", ONE_NODE, allowed_cpus=set(range(8)), numactl_available=True)
    assert not plan.enabled
    assert plan.mode is None
    assert plan.torchrun_args() == []
    assert plan.reason == "host has 1 NUMA node: binding would change nothing"
    assert plan.per_rank == [{"local_rank": 0, "pci_address": "0000:00:1e.0", "numa_node": None, "cpus": ""}]


def test_plan_on_with_unknown_gpu_node_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        binding_plan(VM_GPU, "on", ONE_NODE, allowed_cpus=set(range(8)), numactl_available=True)
    assert "ROCMFT_NUMA_BIND" in err.value.message
    assert "0000:00:1e.0" in err.value.message
    assert "ROCMFT_NUMA_BIND=auto" in err.value.remedy
    assert err.value.code == ExitCode.CONFIG_ERROR


def test_plan_auto_two_nodes_with_unknown_gpu_node_is_disabled(tmp_path):
    root = copy_layout(TWO_SOCKET, tmp_path)
    (root / "sys/bus/pci/devices/0000:c6:00.0/numa_node").write_text("-1\n")
    plan = binding_plan(MI300X_GPUS, "auto", root, allowed_cpus=ALL_CPUS, numactl_available=True)
    assert not plan.enabled
    assert plan.reason.startswith("2 NUMA nodes but the node of GPU 6 (0000:c6:00.0) is unknown")
    with pytest.raises(ConfigError, match="ROCMFT_NUMA_BIND=on"):
        binding_plan(MI300X_GPUS, "on", root, allowed_cpus=ALL_CPUS, numactl_available=True)


def test_plan_gpu_on_a_node_that_is_not_online_is_unknown(tmp_path):
    root = copy_layout(TWO_SOCKET, tmp_path)
    (root / "sys/bus/pci/devices/0000:e5:00.0/numa_node").write_text("3\n")
    plan = binding_plan(MI300X_GPUS, "auto", root, allowed_cpus=ALL_CPUS, numactl_available=True)
    assert not plan.enabled
    assert plan.reason.endswith("GPU 7 (0000:e5:00.0) is unknown (node 3 is not an online node)")


def test_plan_on_one_node_with_known_gpu_node_binds(tmp_path):
    root = copy_layout(ONE_NODE, tmp_path)
    (root / "sys/bus/pci/devices/0000:00:1e.0/numa_node").write_text("0\n")
    plan = binding_plan(VM_GPU, "on", root, allowed_cpus=set(range(8)), numactl_available=True)
    assert plan.enabled
    assert plan.reason == "ROCMFT_NUMA_BIND=on; 1 NUMA node; GPU 0 on node 0 (binding changes nothing on one node)"


def test_plan_off():
    plan = binding_plan(MI300X_GPUS, "off", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=True)
    assert not plan.enabled
    assert plan.torchrun_args() == []
    assert plan.reason == "ROCMFT_NUMA_BIND=off"
    assert len(plan.per_rank) == 8  # the topology is still reported


def test_plan_rejects_unknown_setting():
    with pytest.raises(ConfigError, match="ROCMFT_NUMA_BIND='socket' is not one of auto, on, off"):
        binding_plan(MI300X_GPUS, "socket", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=True)


def test_plan_without_gpus():
    plan = binding_plan([], "auto", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=True)
    assert not plan.enabled
    assert plan.reason == "no GPU visible: nothing to bind"
    with pytest.raises(ConfigError, match="no GPU is visible"):
        binding_plan([], "on", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=True)


def test_plan_cpuset_without_node1_cpus_disables_binding():
    # docker --cpuset-cpus=0-47: the container may only run on node 0; torch would bind ranks 4-7 to nothing.
    plan = binding_plan(MI300X_GPUS, "auto", TWO_SOCKET, allowed_cpus=set(range(48)), numactl_available=True)
    assert not plan.enabled
    assert "(0-47)" in plan.reason
    assert "none of NUMA node 1" in plan.reason
    assert "GPU(s) 4-7" in plan.reason
    assert [r["cpus"] for r in plan.per_rank] == ["0-47"] * 4 + [""] * 4
    with pytest.raises(ConfigError, match="none of NUMA node 1") as err:
        binding_plan(MI300X_GPUS, "on", TWO_SOCKET, allowed_cpus=set(range(48)), numactl_available=True)
    assert "--cpuset-cpus" in err.value.remedy


def test_plan_cpuset_with_part_of_each_node_binds_to_the_allowed_cpus():
    allowed = set(range(24)) | set(range(48, 72))
    plan = binding_plan(MI300X_GPUS, "auto", TWO_SOCKET, allowed_cpus=allowed, numactl_available=True)
    assert plan.enabled
    assert [r["cpus"] for r in plan.per_rank] == ["0-23"] * 4 + ["48-71"] * 4
    assert plan.reason.endswith("; CPUs limited to the allowed 0-23,48-71")


def test_plan_without_numactl():
    plan = binding_plan(MI300X_GPUS, "auto", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=False)
    assert not plan.enabled
    assert "numactl is not installed" in plan.reason
    with pytest.raises(ConfigError, match="numactl") as err:
        binding_plan(MI300X_GPUS, "on", TWO_SOCKET, allowed_cpus=ALL_CPUS, numactl_available=False)
    assert "install numactl" in err.value.remedy


def test_binding_plan_args_need_enabled():
    assert BindingPlan(enabled=False, mode="node", reason="").torchrun_args() == []


# --- network -------------------------------------------------------------------------------------------------


def test_default_route_interface():
    assert default_route_interface(TWO_SOCKET) == "eth0"  # not docker0
    assert default_route_interface(ONE_NODE) == "ens5"


def test_default_route_interface_picks_lowest_metric_and_skips_down_routes(tmp_path):
    route = tmp_path / "proc/net/route"
    route.parent.mkdir(parents=True)
    route.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
        "down0\t00000000\t0101A8C0\t0002\t0\t0\t1\t00000000\t0\t0\t0\n"
        "eno1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    )
    assert default_route_interface(tmp_path) == "eno1"


def test_default_route_interface_none(tmp_path):
    assert default_route_interface(tmp_path) is None  # no proc/net/route
    route = tmp_path / "proc/net/route"
    route.parent.mkdir(parents=True)
    route.write_text("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n")
    assert default_route_interface(tmp_path) is None


def test_infiniband_hcas():
    assert infiniband_hcas(TWO_SOCKET) == [
        {"name": "mlx5_0:1", "device": "mlx5_0", "port": 1, "link_layer": "InfiniBand"},
        {"name": "mlx5_1:1", "device": "mlx5_1", "port": 1, "link_layer": "InfiniBand"},
    ]  # mlx5_2:1 is DOWN
    assert infiniband_hcas(ONE_NODE) == []


def test_network_two_nodes_on_the_two_socket_host():
    net = network_environment({}, 2, TWO_SOCKET)
    assert net.env() == {
        "NCCL_SOCKET_IFNAME": "=eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
    }
    assert "default route" in net.variables["NCCL_SOCKET_IFNAME"][1]
    assert "mlx5_0:1 (InfiniBand), mlx5_1:1 (InfiniBand)" in net.variables["NCCL_IB_HCA"][1]
    assert net.notes == []


def test_network_two_nodes_without_rdma_goes_over_tcp():
    net = network_environment({}, 2, ONE_NODE)
    assert net.env() == {"NCCL_SOCKET_IFNAME": "=ens5", "GLOO_SOCKET_IFNAME": "ens5"}
    assert len(net.notes) == 1
    assert "TCP sockets on ens5" in net.notes[0]


def test_network_users_values_win():
    environ = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "=mlx5_1:1", "GLOO_SOCKET_IFNAME": ""}
    net = network_environment(environ, 4, TWO_SOCKET)
    assert net.env() == {"GLOO_SOCKET_IFNAME": "eth0"}  # an empty value counts as unset
    assert "NCCL_SOCKET_IFNAME=ib0 is yours: kept" in net.notes
    assert "NCCL_IB_HCA==mlx5_1:1 is yours: kept" in net.notes
    assert any(n.startswith("GLOO_SOCKET_IFNAME=eth0 (default route) while NCCL_SOCKET_IFNAME") for n in net.notes)
    assert environ == {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "=mlx5_1:1", "GLOO_SOCKET_IFNAME": ""}


def test_network_ib_disabled_adds_no_hca():
    net = network_environment({"NCCL_IB_DISABLE": "1"}, 2, TWO_SOCKET)
    assert "NCCL_IB_HCA" not in net.variables
    assert net.notes == ["NCCL_IB_DISABLE is set: inter-node traffic goes over TCP sockets"]


def test_network_without_default_route(tmp_path):
    net = network_environment({}, 2, tmp_path)
    assert net.variables == {}
    assert net.notes[0].startswith("no IPv4 default route in proc/net/route: set NCCL_SOCKET_IFNAME")
    assert "over TCP sockets (much slower" in net.notes[1]
    both = {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1"}
    assert network_environment(both, 2, tmp_path).notes[:2] == [
        "NCCL_SOCKET_IFNAME=eth1 is yours: kept",
        "GLOO_SOCKET_IFNAME=eth1 is yours: kept",
    ]


@pytest.mark.parametrize("root", [TWO_SOCKET, ONE_NODE])
def test_network_single_node_adds_nothing(root):
    net = network_environment({}, 1, root)
    assert net.variables == {}
    assert net.env() == {}
    assert net.notes == ["single node: collectives use peer-to-peer links and shared memory; no network variables"]


def test_network_rejects_zero_nodes():
    with pytest.raises(ValueError, match="nnodes"):
        network_environment({}, 0, TWO_SOCKET)


RECORDED = sorted((LAYOUTS / "recorded").iterdir())


@pytest.mark.parametrize("host", RECORDED, ids=[h.name for h in RECORDED])
def test_recorded_hosts_read_as_their_own_tools_report(host):
    """On layouts copied from real hosts (record.py), rocmft's reading agrees with what lscpu, ip route and
    nvidia-smi reported on the same host at the same time (truth.json)."""
    import json

    truth = json.loads((host / "truth.json").read_text())
    root = host / "root"
    expected_nodes = {int(node): set(cpus) for node, cpus in truth["lscpu_cpus_per_node"].items()}
    assert numa_nodes(root) == expected_nodes
    if "ip_default_route_dev" in truth:  # the H200 host has no iproute2
        assert default_route_interface(root) == truth["ip_default_route_dev"]
    smi = [address[-12:].lower() for address in truth.get("nvidia_smi_pci", [])]  # 00000000:00:06.0 -> 0000:00:06.0
    assert sorted(smi) == sorted(truth["pci_gpus"])  # every GPU nvidia-smi sees has its PCI folder recorded
    allowed = set().union(*expected_nodes.values())
    plan = binding_plan(truth["pci_gpus"], "auto", root=root, allowed_cpus=allowed, numactl_available=True)
    if truth["pci_gpus"] and len(expected_nodes) == 1:  # one node: binding cannot help, whatever numa_node says
        assert not plan.enabled and "1 NUMA node" in plan.reason
    for rank in plan.per_rank:
        node = gpu_numa_node(rank["pci_address"], root)
        assert rank["numa_node"] == node
        assert node is None or node in expected_nodes
