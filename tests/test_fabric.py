"""Slingshot / libfabric: fabric detection, the OFI network plugin decision and the ``fabric`` health check.

We have no Slingshot host. The host layouts here are synthetic sysfs trees written under tmp_path (labelled
"injected" in the test names): the same paths the cxi driver and the kernel create (sys/class/net/hsn<N>,
sys/class/cxi_user/cxi<N>, dev/cxi<N>), with plain files standing in for the device nodes.

The plugin decision is NOT injected: the stand-in plugins are real shared libraries compiled here with gcc and
really dlopen()ed through LD_LIBRARY_PATH / NCCL_NET_PLUGIN, as RCCL opens them: one exporting ncclNetPlugin_v10
(the symbol version aws-ofi-nccl and RCCL share), one exporting only ncclNetPlugin_v5 (what the old aws-ofi-rccl
exports), one exporting no plugin symbol, and one that fails to load (it needs a library that is not there, as a
plugin does when libfabric is not bound into the container). RCCL itself and a real fabric are not exercised.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rocmft.checks import FAIL, PASS, SKIP, WARN
from rocmft.checks.system import fabric, fabric_facts
from rocmft.errors import ExitCode
from rocmft.facts.topology import (
    SLINGSHOT_SETTINGS,
    net_plugin,
    network_environment,
    slingshot_fabric,
)

LAYOUTS = Path(__file__).parent / "data" / "sysfs"
ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "nmn0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
)


def plugin_source(symbol: str | None, name: str = "Libfabric") -> str:
    # The shape RCCL reads: the exported symbol is a struct whose first field is the network's name
    # (net_v10.h: `const char* name;` then the function pointers, left NULL here: nothing calls them).
    if symbol is None:
        return "int not_a_net_plugin(void) { return 0; }\n"
    return (
        "typedef struct { const char* name; void* init; void* devices; } stand_in_net_t;\n"
        f'__attribute__((visibility("default"))) stand_in_net_t {symbol} = {{"{name}", 0, 0}};\n'
    )


def compile_library(folder: Path, file_name: str, source: str, link: list[str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    c_file = folder / (file_name + ".c")
    c_file.write_text(source)
    target = folder / file_name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(target), str(c_file), *(link or [])], check=True)
    c_file.unlink()
    return target


@pytest.fixture(scope="module")
def plugins(tmp_path_factory) -> dict[str, Path]:
    """Folders holding one compiled librccl-net.so each (and librccl-net-ofi.so for the NCCL_NET_PLUGIN=ofi form)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in plugins")
    base = tmp_path_factory.mktemp("plugins")
    compile_library(base / "good", "librccl-net.so", plugin_source("ncclNetPlugin_v10"))
    compile_library(base / "named", "librccl-net-ofi.so", plugin_source("ncclNetPlugin_v10"))
    compile_library(base / "old", "librccl-net.so", plugin_source("ncclNetPlugin_v5", "AWS Libfabric"))
    compile_library(base / "nosymbol", "librccl-net.so", plugin_source(None))
    # linked against a libfabric stand-in (by its soname, as a plugin needs libfabric.so.1) that is then removed:
    # dlopen fails on the missing dependency
    fake = compile_library(base / "deps", "libstandin-fabric.so.1", "int fi_getinfo(void) { return 0; }\n",
                           ["-Wl,-soname,libstandin-fabric.so.1"])  # fmt: skip
    uses_it = plugin_source("ncclNetPlugin_v10") + "int fi_getinfo(void);\nint probe(void) { return fi_getinfo(); }\n"
    compile_library(base / "broken", "librccl-net.so", uses_it, [f"-L{fake.parent}", "-l:libstandin-fabric.so.1"])
    fake.unlink()
    (base / "empty").mkdir()
    return {p.name: p for p in base.iterdir()}


def slingshot_host(root: Path, nics: int = 2, device_nodes: bool = True) -> Path:
    """A synthetic (injected) Slingshot compute node: eth-less, a management interface with the default route
    (nmn0, as on HPE Cray EX nodes) and ``nics`` hsn interfaces with their cxi devices."""
    for name in ["lo", "nmn0", *(f"hsn{i}" for i in range(nics))]:
        (root / "sys/class/net" / name).mkdir(parents=True)
    for i in range(nics):
        (root / "sys/class/cxi_user" / f"cxi{i}").mkdir(parents=True)
        if device_nodes:
            (root / "dev").mkdir(exist_ok=True)
            (root / "dev" / f"cxi{i}").write_text("")
    (root / "proc/net").mkdir(parents=True)
    (root / "proc/net/route").write_text(ROUTE)
    return root


def ld_path(*folders: Path) -> str:
    return ":".join(str(f) for f in folders)


# --- fabric detection (synthetic sysfs) ----------------------------------------------------------------------


def test_slingshot_nics_are_found_in_an_injected_sysfs_layout(tmp_path):
    root = slingshot_host(tmp_path, nics=4)
    (root / "sys/class/net/hsn_bond").mkdir()  # not hsn<N>: ignored
    (root / "sys/class/cxi").mkdir(parents=True)
    (root / "sys/class/cxi/cxi0").mkdir()  # the same NIC under the driver's other class
    found = slingshot_fabric(root)
    assert found.interfaces == ("hsn0", "hsn1", "hsn2", "hsn3")
    assert found.devices == ("cxi0", "cxi1", "cxi2", "cxi3")
    assert found.device_nodes == ("cxi0", "cxi1", "cxi2", "cxi3")
    assert found.detected


@pytest.mark.parametrize("layout", ["two-socket-8gpu", "one-node-1gpu", "recorded/ci-vm-cpu/root",
                                    "recorded/h200-vm-1gpu/root"])  # fmt: skip
def test_hosts_without_slingshot_are_not_detected(layout):
    found = slingshot_fabric(LAYOUTS / layout)
    assert not found.detected and found.as_dict() == {"interfaces": [], "devices": [], "device_nodes": []}


# --- the plugin, found the way RCCL finds it and really loaded ------------------------------------------------


def test_a_plugin_exporting_the_symbol_loads_from_ld_library_path(plugins):
    plugin = net_plugin({"LD_LIBRARY_PATH": ld_path(plugins["empty"], plugins["good"])})
    assert plugin.loads
    assert plugin.path == str(plugins["good"] / "librccl-net.so")
    assert (plugin.symbol, plugin.name) == ("ncclNetPlugin_v10", "Libfabric")
    assert plugin.tried == ("librccl-net.so",)


def test_an_old_v5_plugin_does_not_load_and_says_why(plugins):
    plugin = net_plugin({"LD_LIBRARY_PATH": ld_path(plugins["old"])})
    assert not plugin.loads
    assert "only ncclNetPlugin_v5 ('AWS Libfabric'" in plugin.problems[0]
    assert "aws-ofi-nccl" in plugin.describe()


def test_a_library_without_the_symbol_does_not_load(plugins):
    plugin = net_plugin({"LD_LIBRARY_PATH": ld_path(plugins["nosymbol"])})
    assert not plugin.loads and "exports no ncclNetPlugin_v11..v6" in plugin.problems[0]


def test_a_plugin_whose_dependency_is_missing_fails_to_load_with_the_loaders_message(plugins):
    plugin = net_plugin({"LD_LIBRARY_PATH": ld_path(plugins["broken"], plugins["good"])})
    # the loader stops at the first folder holding the name, as the dynamic loader does: the broken one
    assert not plugin.loads
    assert "libstandin-fabric.so.1" in plugin.problems[0] and str(plugins["broken"]) in plugin.problems[0]


def test_no_plugin_anywhere(plugins):
    plugin = net_plugin({"LD_LIBRARY_PATH": ld_path(plugins["empty"])})
    assert not plugin.loads and plugin.problems == ()
    assert plugin.describe() == (
        f"no loadable plugin: looked for librccl-net.so in {plugins['empty']} + ld.so cache, /lib, /usr/lib (not found)"
    )


def test_nccl_net_plugin_names_the_library_by_suffix_by_file_name_or_by_path(plugins):
    by_suffix = net_plugin({"NCCL_NET_PLUGIN": "ofi", "LD_LIBRARY_PATH": ld_path(plugins["named"])})
    assert by_suffix.tried == ("ofi", "librccl-net-ofi.so") and by_suffix.loads
    assert by_suffix.path == str(plugins["named"] / "librccl-net-ofi.so")
    by_name = net_plugin({"NCCL_NET_PLUGIN": "librccl-net-ofi.so", "LD_LIBRARY_PATH": ld_path(plugins["named"])})
    assert by_name.tried == ("librccl-net-ofi.so",) and by_name.loads
    by_path = net_plugin({"NCCL_NET_PLUGIN": str(plugins["good"] / "librccl-net.so")})
    assert by_path.loads and by_path.path == str(plugins["good"] / "librccl-net.so")
    listed = net_plugin({"NCCL_NET_PLUGIN": f"{plugins['old']}/librccl-net.so,ofi",
                         "LD_LIBRARY_PATH": ld_path(plugins["named"])})  # fmt: skip
    assert listed.loads and listed.path.endswith("librccl-net-ofi.so") and "only ncclNetPlugin_v5" in listed.problems[0]


def test_nccl_net_plugin_none_means_no_external_plugin(plugins):
    plugin = net_plugin({"NCCL_NET_PLUGIN": "none", "LD_LIBRARY_PATH": ld_path(plugins["good"])})
    assert not plugin.loads and plugin.tried == ()
    assert plugin.describe() == "NCCL_NET_PLUGIN=none: no external plugin"


# --- network_environment on an injected Slingshot layout ------------------------------------------------------


def test_injected_slingshot_two_nodes_with_a_loadable_plugin_sets_nccl_net(tmp_path, plugins):
    root = slingshot_host(tmp_path)
    net = network_environment({"LD_LIBRARY_PATH": ld_path(plugins["good"])}, 2, root)
    env = net.env()
    assert env["NCCL_NET"] == "Libfabric"
    assert env["NCCL_NET_PLUGIN"] == str(plugins["good"] / "librccl-net.so")
    assert env["NCCL_SOCKET_IFNAME"] == "=hsn0,hsn1"
    assert env["GLOO_SOCKET_IFNAME"] == "nmn0"  # gloo keeps the default route's interface
    for name, (value, _) in SLINGSHOT_SETTINGS.items():
        assert env[name] == value
    assert "ncclNetPlugin_v10" in net.variables["NCCL_NET"][1]
    assert all(net.variables[name][1].startswith("HPE's RCCL-on-Slingshot guide") for name in SLINGSHOT_SETTINGS)
    assert not any("TCP sockets" in note for note in net.notes)


@pytest.mark.parametrize("folder", ["old", "nosymbol", "broken", "empty"])
def test_injected_slingshot_without_a_loadable_plugin_never_sets_nccl_net(tmp_path, plugins, folder):
    root = slingshot_host(tmp_path)
    net = network_environment({"LD_LIBRARY_PATH": ld_path(plugins[folder])}, 2, root)
    assert "NCCL_NET" not in net.variables and "NCCL_NET_PLUGIN" not in net.variables
    assert not set(SLINGSHOT_SETTINGS) & set(net.variables)
    assert net.env()["NCCL_SOCKET_IFNAME"] == "=hsn0,hsn1"
    assert any("RCCL falls back to TCP sockets over hsn0,hsn1" in note for note in net.notes), net.notes


def test_injected_slingshot_without_dev_cxi_nodes_leaves_nccl_net_unset(tmp_path, plugins):
    root = slingshot_host(tmp_path, device_nodes=False)
    net = network_environment({"LD_LIBRARY_PATH": ld_path(plugins["good"])}, 2, root)
    assert "NCCL_NET" not in net.variables
    assert any("no /dev/cxi* node is visible" in note for note in net.notes)


def test_injected_slingshot_the_users_values_win(tmp_path, plugins):
    root = slingshot_host(tmp_path)
    environ = {"LD_LIBRARY_PATH": ld_path(plugins["good"]), "NCCL_NET": "libfabric", "FI_CXI_DEFAULT_CQ_SIZE": "65536",
               "NCCL_SOCKET_IFNAME": "hsn0", "NCCL_NET_PLUGIN": str(plugins["good"] / "librccl-net.so")}  # fmt: skip
    net = network_environment(environ, 2, root)
    for name in ("NCCL_NET", "FI_CXI_DEFAULT_CQ_SIZE", "NCCL_SOCKET_IFNAME", "NCCL_NET_PLUGIN"):
        assert name not in net.variables and f"{name}={environ[name]} is yours: kept" in net.notes
    assert net.env()["FI_MR_CACHE_MONITOR"] == "userfaultfd"  # the rest still comes (the user's NCCL_NET is the plugin)
    other = network_environment({"LD_LIBRARY_PATH": ld_path(plugins["good"]), "NCCL_NET": "Socket"}, 2, root)
    assert "NCCL_NET" not in other.variables and not set(SLINGSHOT_SETTINGS) & set(other.variables)


def test_injected_slingshot_without_a_default_route_asks_only_for_gloos_interface(tmp_path, plugins):
    root = slingshot_host(tmp_path)
    (root / "proc/net/route").write_text(ROUTE.splitlines()[0] + "\n")  # the header only: no default route
    net = network_environment({"LD_LIBRARY_PATH": ld_path(plugins["good"]), "NCCL_NET": "OFI"}, 2, root)
    assert net.env() == {"NCCL_SOCKET_IFNAME": "=hsn0,hsn1"}  # "OFI" is not the stand-in's name: nothing else
    assert net.notes[0] == (
        "no IPv4 default route in proc/net/route: set GLOO_SOCKET_IFNAME to the interface that reaches the other nodes"
    )
    assert "NCCL_NET=OFI is yours: kept" in net.notes


def test_injected_slingshot_single_node_is_untouched(tmp_path, plugins):
    net = network_environment({"LD_LIBRARY_PATH": ld_path(plugins["good"])}, 1, slingshot_host(tmp_path))
    assert net.variables == {}


# --- the fabric health check -----------------------------------------------------------------------------------


def subject(facts: dict):
    """The check's subject: the facts injected, and settings whose environment is the test's process environment
    (which the test sets with monkeypatch)."""
    import os
    from types import SimpleNamespace

    from rocmft.checks import CheckSubject
    from rocmft.facts.probes import Probes

    return CheckSubject(plan=SimpleNamespace(settings=SimpleNamespace(environ=os.environ)),
                        probes=Probes(injected={"fabric": facts}))  # fmt: skip


def run_check(monkeypatch, root: Path, environ: dict, nodes: int):
    monkeypatch.setenv("NNODES", str(nodes))
    # a multi-node job needs its rendezvous (rocmft.facts.scheduler refuses one without)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    return fabric(subject(fabric_facts(root, environ)))


def test_check_warns_on_injected_slingshot_multi_node_without_a_plugin(tmp_path, plugins, monkeypatch):
    outcome = run_check(monkeypatch, slingshot_host(tmp_path), {"LD_LIBRARY_PATH": ld_path(plugins["old"])}, 2)
    assert outcome.status == WARN and outcome.value == "Slingshot (hsn0, hsn1), no OFI plugin"
    assert "TCP sockets on hsn0, hsn1" in outcome.message and "only ncclNetPlugin_v5" in outcome.message
    for words in ("LD_LIBRARY_PATH", "NCCL_NET_PLUGIN=", "aws-ofi-nccl >= 1.18", "singularity-AI-bindings",
                  "/opt/cray/libfabric"):  # fmt: skip
        assert words in outcome.remedy


def test_check_passes_on_injected_slingshot_with_the_plugin(tmp_path, plugins, monkeypatch):
    outcome = run_check(monkeypatch, slingshot_host(tmp_path), {"LD_LIBRARY_PATH": ld_path(plugins["good"])}, 2)
    assert outcome.status == PASS and outcome.value == "Libfabric via ncclNetPlugin_v10"


def test_check_warns_when_the_container_sees_no_dev_cxi(tmp_path, plugins, monkeypatch):
    root = slingshot_host(tmp_path, device_nodes=False)
    outcome = run_check(monkeypatch, root, {"LD_LIBRARY_PATH": ld_path(plugins["good"])}, 2)
    assert outcome.status == WARN and "--device /dev/cxi0" in outcome.remedy


def test_check_one_node_needs_no_plugin(tmp_path, plugins, monkeypatch):
    outcome = run_check(monkeypatch, slingshot_host(tmp_path), {"LD_LIBRARY_PATH": ld_path(plugins["empty"])}, 1)
    assert outcome.status == PASS and outcome.value == "Slingshot (hsn0, hsn1), one node"


@pytest.mark.parametrize("nodes", [1, 2])
def test_check_fails_when_the_users_nccl_net_names_a_plugin_that_does_not_load(tmp_path, plugins, monkeypatch, nodes):
    environ = {"LD_LIBRARY_PATH": ld_path(plugins["broken"]), "NCCL_NET": "AWS Libfabric"}
    outcome = run_check(monkeypatch, slingshot_host(tmp_path), environ, nodes)
    assert outcome.status == FAIL and outcome.value == "NCCL_NET=AWS Libfabric: no such network"
    assert "Failed to initialize any NET plugin" in outcome.message
    assert f"looked for librccl-net.so in {plugins['broken']}" in outcome.message
    assert "libstandin-fabric.so.1" in outcome.message and "unset NCCL_NET" in outcome.remedy


def test_check_accepts_a_users_nccl_net_the_plugin_or_rccl_provides(tmp_path, plugins, monkeypatch):
    root = slingshot_host(tmp_path)
    for environ in ({"LD_LIBRARY_PATH": ld_path(plugins["good"]), "NCCL_NET": "libfabric"},
                    {"LD_LIBRARY_PATH": ld_path(plugins["empty"]), "NCCL_NET": "Socket"}):  # fmt: skip
        assert run_check(monkeypatch, root, environ, 2).status == PASS


def test_check_skips_without_slingshot(monkeypatch, plugins):
    outcome = run_check(monkeypatch, LAYOUTS / "two-socket-8gpu", {"LD_LIBRARY_PATH": ld_path(plugins["good"])}, 2)
    assert outcome.status == SKIP


def test_rocmft_check_refuses_a_nccl_net_without_its_plugin_before_the_model_loads(run_rocmft, tmp_path, tiny_model,
                                                                                  demo_data):  # fmt: skip
    """`rocmft check` as a user runs it on this machine (no Slingshot, no plugin: nothing injected): NCCL_NET set to
    the plugin's network is refused with exit 3 and the fabric check's message, and only checks.json is written."""
    output = tmp_path / "out"
    env = {"ROCMFT_PRECISION": "fp32", "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo",
           "DATASET_DIR": str(demo_data), "CUTOFF_LEN": "128", "OUTPUT_DIR": str(output),
           "NCCL_NET": "Libfabric"}  # fmt: skip
    result = run_rocmft("check", env=env)
    assert result.returncode == ExitCode.CHECK_FAILED, result.stdout[-3000:]
    report = json.loads((output / "rocmft" / "checks.json").read_text())
    failed = {c["id"]: c for c in report["checks"] if c["status"] == "fail"}
    assert set(failed) == {"fabric"}, {k: v["message"] for k, v in failed.items()}
    assert "NCCL_NET=Libfabric names a network nothing here provides" in failed["fabric"]["message"]
    assert "looked for librccl-net.so in" in failed["fabric"]["message"]
    assert sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file()) == ["rocmft/checks.json"]
