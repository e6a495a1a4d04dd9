"""Record a host's sysfs/procfs layout for rocmft.facts.topology's tests, with the same facts from other tools.

    python tests/data/sysfs/record.py OUT_DIR

copies, under OUT_DIR/root/, exactly the files rocmft.facts.topology reads (NUMA nodes and their CPU lists, each
GPU's PCI ``numa_node``, InfiniBand port states, ``proc/net/route``), and writes OUT_DIR/truth.json with what
*other* tools report on the same host at the same time: ``lscpu -p=CPU,NODE`` (CPUs per NUMA node), ``ip -j
route show default`` (the default route's interface), ``nvidia-smi`` / ``amd-smi`` (each GPU's PCI address and
NUMA node, where present). The tests then hold rocmft's reading of the copied files against that truth.
No value is written by hand.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")  # display (VGA, 3D, other) and processing accelerators


def _run(*command: str) -> str | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _copy(relative: str, out: Path) -> None:
    source = Path("/") / relative
    if source.is_file():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(source, target)
        except OSError:
            pass


def record(out: Path) -> dict:
    """Copy the files into ``out/root`` and return the truth (also written to ``out/truth.json``)."""
    root = out / "root"
    node = Path("/sys/devices/system/node")
    _copy("sys/devices/system/node/online", root)
    for entry in sorted(node.glob("node[0-9]*")):
        _copy(f"sys/devices/system/node/{entry.name}/cpulist", root)
    gpus = []
    for device in sorted(Path("/sys/bus/pci/devices").iterdir()):
        try:
            cls = (device / "class").read_text().strip()[:6]
        except OSError:
            continue
        if cls in GPU_CLASSES:
            gpus.append(device.name)
            _copy(f"sys/bus/pci/devices/{device.name}/numa_node", root)
            _copy(f"sys/bus/pci/devices/{device.name}/class", root)
    for port in sorted(Path("/sys/class/infiniband").glob("*/ports/*")):
        relative = str(port.relative_to("/"))
        _copy(f"{relative}/state", root)
        _copy(f"{relative}/link_layer", root)
    _copy("proc/net/route", root)

    truth: dict = {"pci_gpus": gpus}
    lscpu = _run("lscpu", "-p=CPU,NODE")
    if lscpu:
        per_node: dict[str, list[int]] = {}
        for line in lscpu.splitlines():
            if line and not line.startswith("#"):
                cpu, numa = line.split(",")[:2]
                per_node.setdefault(numa or "0", []).append(int(cpu))
        truth["lscpu_cpus_per_node"] = {k: sorted(v) for k, v in sorted(per_node.items())}
    route = _run("ip", "-j", "route", "show", "default")
    if route:
        routes = json.loads(route)
        truth["ip_default_route_dev"] = routes[0].get("dev") if routes else None
    smi = _run("nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader")
    if smi:
        truth["nvidia_smi_pci"] = [line.strip() for line in smi.splitlines() if line.strip()]
        truth["nvidia_smi_topo"] = _run("nvidia-smi", "topo", "-m")
    amd = _run("amd-smi", "list", "--json")
    if amd:
        truth["amd_smi_list"] = json.loads(amd)
    model = _run("lscpu")
    truth["lscpu"] = model
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/data/sysfs/record.py OUT_DIR")
    result = record(Path(sys.argv[1]))
    print(json.dumps({k: v for k, v in result.items() if k not in ("lscpu", "nvidia_smi_topo")}, indent=1))
