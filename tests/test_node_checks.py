"""The node checks (rocmft.checks.node: gpu-ras, gpu-faults, gpu-families) and the named holders of gpu-memory.

We have no AMD GPU: every amdgpu/KFD fact here is SYNTHETIC, a sysfs tree written under tmp_path (or kmsg records
written as text) in the format the kernel source prints, cited beside each builder (the same citations as
rocmft/facts/amdgpu.py). The /proc scan for processes holding a device is tested for real, on a child process of
this test holding a file open.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.test_gpu_checks import GFX942_IMAGE, devices, gpu, plan

from rocmft.checks import FAIL, PASS, SKIP, WARN, node
from rocmft.checks import gpu as gpu_checks
from rocmft.facts import amdgpu


def card(root: Path, n: int, pci: str, driver: str = "amdgpu", ras: dict[str, str] | None = None,
         features: str = "feature mask: 0x3fff\n", bad_pages: int = 0) -> None:  # fmt: skip
    """SYNTHETIC /sys/class/drm/card<n>: device -> ../../devices/pci0000:00/<pci>, its driver link, and (when
    ``ras`` is given) ras/<block>_err_count files holding "ue: N\\nce: N\\n" (amdgpu_ras.c@001ebcf5b903,
    amdgpu_ras_sysfs_read), ras/features ("feature mask: 0x%x\\n") and ras/gpu_vram_bad_pages
    ("0x%08x : 0x%08x : R\\n" per page)."""
    device = root / "sys/devices/pci0000:00" / pci
    device.mkdir(parents=True)
    drivers = root / "sys/bus/pci/drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (device / "driver").symlink_to(drivers)
    (root / "sys/class/drm").mkdir(parents=True, exist_ok=True)
    (root / f"sys/class/drm/card{n}").mkdir()
    (root / f"sys/class/drm/card{n}/device").symlink_to(device)
    (root / f"sys/class/drm/card{n}-DP-1").mkdir()  # a connector entry: not a card
    if ras is not None:
        (device / "ras").mkdir()
        (device / "ras/features").write_text(features)
        for block, text in ras.items():
            (device / f"ras/{block}_err_count").write_text(text)
        (device / "ras/gpu_vram_bad_pages").write_text(
            "".join(f"0x{i:08x} : 0x00001000 : R\n" for i in range(bad_pages))
        )


def node_plan(root: Path, **probes):
    return plan(node_root=str(root), **probes)


# --- gpu-ras ---------------------------------------------------------------------------------------------
def test_ras_reads_the_synthetic_counters(tmp_path):
    card(tmp_path, 0, "0000:c1:00.0", ras={"umc": "ue: 0\nce: 2\nde: 1\n", "gfx": "ue: 0\nce: 0\n"}, bad_pages=3)
    card(tmp_path, 1, "0000:00:08.0", driver="nvidia")
    found = amdgpu.amdgpu_cards(tmp_path)
    assert [c["card"] for c in found] == ["card0"]
    assert found[0]["pci"] == "0000:c1:00.0" and found[0]["ras"]["features"] == "feature mask: 0x3fff"
    assert found[0]["ras"]["blocks"] == {"gfx": {"ue": 0, "ce": 0}, "umc": {"ue": 0, "ce": 2, "de": 1}}
    assert found[0]["ras"]["bad_pages"] == 3
    assert amdgpu.parse_err_count("Query currently inaccessible\n") is None


def test_ras_passes_warns_and_fails(tmp_path):
    card(tmp_path / "clean", 0, "0000:c1:00.0", ras={"umc": "ue: 0\nce: 0\n", "gfx": "ue: 0\nce: 0\n"})
    clean = node.gpu_ras(node_plan(tmp_path / "clean"))
    assert clean.status == PASS and "2 RAS counter(s) on 1 card(s) read zero" in clean.message

    card(tmp_path / "ce", 0, "0000:c1:00.0", ras={"umc": "ue: 0\nce: 5\n"})
    corrected = node.gpu_ras(node_plan(tmp_path / "ce"))
    assert corrected.status == WARN and "card0 (PCI 0000:c1:00.0) umc: 5 correctable" in corrected.message

    card(tmp_path / "ue", 0, "0000:c1:00.0", ras={"umc": "ue: 0\nce: 0\n"})
    card(tmp_path / "ue", 1, "0000:c2:00.0", ras={"sdma": "ue: 1\nce: 0\n"})
    bad = node.gpu_ras(node_plan(tmp_path / "ue"))
    assert bad.status == FAIL and "card1 (PCI 0000:c2:00.0) sdma: 1 uncorrectable" in bad.message
    assert "Drain the node" in bad.remedy and "ROCR_VISIBLE_DEVICES" in bad.remedy


def test_ras_warns_while_the_driver_recovers_and_skips_without_ras_or_amdgpu(tmp_path):
    card(tmp_path / "busy", 0, "0000:c1:00.0", ras={"umc": "Query currently inaccessible\n"})
    recovering = node.gpu_ras(node_plan(tmp_path / "busy"))
    assert recovering.status == WARN and "query currently inaccessible" in recovering.message
    card(tmp_path / "radeon", 0, "0000:03:00.0")  # a consumer card: the driver made no ras folder
    no_ras = node.gpu_ras(node_plan(tmp_path / "radeon"))
    assert no_ras.status == SKIP and no_ras.value == "no RAS"
    card(tmp_path / "nvidia", 0, "0000:00:08.0", driver="nvidia")
    assert node.gpu_ras(node_plan(tmp_path / "nvidia")).value == "no amdgpu GPU"


def test_damaged_numbers_in_sysfs_and_kmsg_read_as_no_number_never_raise_or_pass(tmp_path):
    """Found by the break session: "²" (str.isdigit() but not int()) and numbers over 4300 digits (int()'s limit)
    raised ValueError out of the readers; a damaged "ue:" line next to "ce: 0" passed as "read zero"."""
    huge = "9" * 5000
    damaged = {"sup": "ue: ²\n", "huge": f"ue: {huge}\nce: 0\n", "neg": "ue: -1\nce: 0\n", "junk": "hi"}
    for name, text in damaged.items():
        card(tmp_path / name, 0, "0000:c1:00.0", ras={"umc": text})
        outcome = node.gpu_ras(node_plan(tmp_path / name))
        assert outcome.status == WARN and "umc: unrecognised text" in outcome.message, name
    assert amdgpu.parse_kmsg(["6,1,²,-;amdgpu: GPU reset begin!", f"6,2,{huge},-;amdgpu: GPU reset begin!"]) == []
    nodes = tmp_path / "kfd/sys/class/kfd/kfd/topology/nodes"
    for n, (gpu_id, props) in enumerate([("²", "gfx_target_version 90402\n"), ("1", f"gfx_target_version {huge}\n"),
                                         ("2", "gfx_target_version 90402\ndrm_render_minor ²\n")]):  # fmt: skip
        (nodes / str(n)).mkdir(parents=True)
        (nodes / str(n) / "gpu_id").write_text(gpu_id)
        (nodes / str(n) / "properties").write_text(props)
    (nodes / "²").mkdir()
    assert [(g["gpu_id"], g["render"]) for g in amdgpu.kfd_gpus(tmp_path / "kfd")] == [(2, None)]
    procs = tmp_path / "kfd/sys/class/kfd/kfd/proc"
    for pid, files in {"10": {"vram_1": "²", "vram_²": "5", "vram_3": huge, "vram_4": "7"}, "²": {}}.items():
        (procs / pid).mkdir(parents=True)
        for file, text in files.items():
            (procs / pid / file).write_text(text)
    assert amdgpu.kfd_processes(tmp_path / "kfd") == [{"pid": 10, "vram": {4: 7}}]


# --- gpu-faults ------------------------------------------------------------------------------------------
# SYNTHETIC /dev/kmsg records ("prio,seq,usec,flags;text" + " KEY=value" continuation lines,
# Documentation/ABI/testing/dev-kmsg@07c7b547a796) carrying amdgpu's own messages: gmc_v9_0.c's page fault,
# amdgpu_job.c@0014952b1754's ring timeout and "GPU Recovery Failed: %d", amdgpu_device.c's "GPU reset begin!".
NOW = 200_000.0  # seconds since boot
BOOT_NOISE = "6,1,1000000,-;Linux version 6.8.0-52-generic\n"
FAULT = ("3,812,{us},-;amdgpu 0000:c1:00.0: amdgpu: [gfxhub] no-retry page fault (src_id:0 ring:24 vmid:8 "
         "pasid:32769)\n SUBSYSTEM=pci\n DEVICE=+pci:0000:c1:00.0\n")  # fmt: skip
TIMEOUT = "3,813,{us},-;amdgpu 0000:c1:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1001, emitted seq=1003\n"
RESET = "6,814,{us},-;amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!\n"
FAILED = "3,815,{us},-;amdgpu 0000:c1:00.0: amdgpu: GPU Recovery Failed: -110\n"


def kmsg(*records: tuple[str, float]) -> dict:
    return {"records": [BOOT_NOISE] + [r.format(us=int(s * 1e6)) for r, s in records], "error": None}


def test_kmsg_records_are_parsed_by_kind():
    faults = amdgpu.parse_kmsg(kmsg((FAULT, 10.0), (TIMEOUT, 11.0), (RESET, 12.0), (FAILED, 13.0))["records"])
    assert [f["kind"] for f in faults] == ["vm_fault", "ring_timeout", "gpu_reset", "recovery_failed"]
    assert faults[0]["seconds"] == 10.0 and faults[0]["text"].endswith("pasid:32769)")  # continuation lines dropped


def test_faults_pass_warn_and_fail(tmp_path):
    card(tmp_path, 0, "0000:c1:00.0")
    quiet = node.gpu_faults(node_plan(tmp_path, kmsg=kmsg((FAULT, 10.0)), kmsg_now=NOW))  # 55 h ago: history
    assert quiet.status == PASS and "1 older amdgpu fault(s)" in quiet.message
    recent = node.gpu_faults(node_plan(tmp_path, kmsg=kmsg((FAULT, NOW - 7200), (TIMEOUT, NOW - 600),
                                                           (RESET, NOW - 599)), kmsg_now=NOW))  # fmt: skip
    assert recent.status == WARN and recent.value == "1 vm fault, 1 ring timeout, 1 gpu reset"
    assert "Newest (10 min ago): amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!" in recent.message
    failed = node.gpu_faults(node_plan(tmp_path, kmsg=kmsg((RESET, NOW - 60), (FAILED, NOW - 30)), kmsg_now=NOW))
    assert failed.status == FAIL and "Reboot the node" in failed.remedy


def test_faults_warn_when_the_log_cannot_be_read_and_skip_without_amdgpu(tmp_path):
    card(tmp_path / "amd", 0, "0000:c1:00.0")
    # what os.open("/dev/kmsg") gives a container under kernel.dmesg_restrict=1 without CAP_SYSLOG (injected)
    denied = node.gpu_faults(
        node_plan(tmp_path / "amd", kmsg={"records": [], "error": "EPERM: Operation not permitted"})
    )
    assert denied.status == WARN and "EPERM" in denied.message
    assert "dmesg" in denied.remedy and "journalctl -k" in denied.remedy
    assert node.gpu_faults(node_plan(tmp_path / "none")).status == SKIP


def test_read_kmsg_reads_records_until_eagain_and_reports_a_missing_log(tmp_path):
    """Real reads: a FIFO with O_NONBLOCK returns what was written, then EAGAIN (as /dev/kmsg does at its end);
    a path that is not there is reported, not raised."""
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # keeps the FIFO open so the reader gets EAGAIN, not EOF
    os.write(writer, RESET.format(us=5_000_000).encode())
    log = amdgpu.read_kmsg(str(fifo))
    os.close(writer)
    assert log["error"] is None and amdgpu.parse_kmsg(log["records"])[0]["kind"] == "gpu_reset"
    assert amdgpu.read_kmsg(str(tmp_path / "absent"))["error"].startswith("ENOENT")


# --- gpu-families ----------------------------------------------------------------------------------------
def kfd_node(root: Path, n: int, gpu_id: int, version: int, minor: int, location: int, name: str) -> None:
    """SYNTHETIC /sys/class/kfd/kfd/topology/nodes/<n>: gpu_id, name and properties as "key value" lines
    (kfd_topology.c@d7ab8e67aa52 node_show; gfx_target_version from the patch "drm/amdkfd: Expose GFXIP engine
    version to sysfs": polaris10 80003, sienna_cichlid 100300)."""
    folder = root / "sys/class/kfd/kfd/topology/nodes" / str(n)
    folder.mkdir(parents=True)
    (folder / "gpu_id").write_text(f"{gpu_id}\n")
    (folder / "name").write_text(f"{name}\n")
    (folder / "properties").write_text(
        f"cpu_cores_count 0\nsimd_count 240\ngfx_target_version {version}\nvendor_id 4098\nlocation_id {location}\n"
        f"domain 0\ndrm_render_minor {minor}\nunique_id 1770566398462353091\n"
    )


def families_host(root: Path, mapped: tuple[int, ...]) -> Path:
    """ROCm/rocm-systems#6883's host: a W6800 (gfx1030, renderD128) and an RX580 (gfx803, renderD129), plus the
    CPU node 0 (gpu_id 0); ``mapped`` says which render minors the container got."""
    cpu = root / "sys/class/kfd/kfd/topology/nodes/0"
    cpu.mkdir(parents=True)
    (cpu / "gpu_id").write_text("0\n")
    (cpu / "properties").write_text("cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\n")
    kfd_node(root, 1, 48231, 100300, 128, 0x0300, "navi21")
    kfd_node(root, 2, 7113, 80003, 129, 0x0800, "ellesmere")
    (root / "dev/dri").mkdir(parents=True)
    for minor in mapped:
        (root / f"dev/dri/renderD{minor}").touch()
    return root


GFX1030_IMAGE = {**GFX942_IMAGE, "arch": "gfx1030", "pytorch_rocm_arch": "gfx1030"}


def test_kfd_topology_is_read():
    assert [amdgpu.gfx_target(v) for v in (90402, 90010, 80003, 110001, 100300)] == [
        "gfx942", "gfx90a", "gfx803", "gfx1101", "gfx1030"]  # fmt: skip


def test_families_fail_when_a_legacy_gpu_is_mapped_in(tmp_path, monkeypatch):
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    root = families_host(tmp_path, mapped=(128, 129))  # --device /dev/dri: both cards
    gpus = amdgpu.kfd_gpus(root)
    assert [(g["target"], g["render"], g["pci"]) for g in gpus] == [
        ("gfx1030", "/dev/dri/renderD128", "0000:03:00.0"),
        ("gfx803", "/dev/dri/renderD129", "0000:08:00.0"),
    ]
    outcome = node.gpu_families(node_plan(root, image=GFX1030_IMAGE))
    assert outcome.status == FAIL and "/dev/dri/renderD129 (gfx803, ellesmere, PCI 0000:08:00.0)" in outcome.message
    assert "--device /dev/kfd --device /dev/dri/renderD128 (not --device /dev/dri)" in outcome.remedy
    assert "devices [/dev/kfd, /dev/dri/renderD128]" in outcome.remedy


def test_families_pass_when_only_the_supported_gpu_is_mapped(tmp_path):
    outcome = node.gpu_families(node_plan(families_host(tmp_path, mapped=(128,)), image=GFX1030_IMAGE))
    assert outcome.status == PASS and "1 GPU(s) of the host not mapped in" in outcome.message


def test_families_warn_for_a_newer_gpu_the_image_was_not_built_for(tmp_path, monkeypatch):
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    root = tmp_path
    kfd_node(root, 1, 100, 90402, 128, 0xC100, "aqua_vanjaram")
    kfd_node(root, 2, 200, 100300, 129, 0x0300, "navi21")
    (root / "dev/dri").mkdir(parents=True)
    (root / "dev/dri/renderD128").touch()
    (root / "dev/dri/renderD129").touch()
    outcome = node.gpu_families(node_plan(root))  # the gfx942 image
    assert outcome.status == WARN and "/dev/dri/renderD129 (gfx1030" in outcome.message
    assert "--device /dev/dri/renderD128" in outcome.remedy and "ROCR_VISIBLE_DEVICES" in outcome.remedy


def test_families_skip_without_kfd_or_a_rocm_image(tmp_path):
    assert node.gpu_families(node_plan(tmp_path)).value == "no KFD topology"
    assert node.gpu_families(node_plan(tmp_path, image=None)).status == SKIP


# --- gpu-memory names the holders ------------------------------------------------------------------------
def kfd_proc(root: Path, pid: int, vram: dict[int, int]) -> None:
    """SYNTHETIC /sys/class/kfd/kfd/proc/<host pid>/vram_<gpu_id> ("%llu\\n" bytes; kfd_process.c@6f0f335b73a9)."""
    folder = root / "sys/class/kfd/kfd/proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "pasid").write_text("32769\n")
    for gpu_id, size in vram.items():
        (folder / f"vram_{gpu_id}").write_text(f"{size}\n")


def test_kfd_processes_not_in_this_container_are_named_by_host_pid(tmp_path):
    kfd_node(tmp_path, 1, 100, 90402, 128, 0xC100, "aqua_vanjaram")
    kfd_proc(tmp_path, 4_000_001, {100: 70 << 30})  # a host process: no such pid here
    kfd_proc(tmp_path, 4_000_002, {100: 300 << 20})  # under 1 GiB: e.g. rocmft's own probe seen by its host pid
    held = amdgpu.gpu_holders(tmp_path, globs=(str(tmp_path / "nothing*"),), proc=tmp_path / "noproc")
    assert held["visible"] == [] and held["kfd"] is True
    assert held["hidden"] == [{"pid": 4_000_001, "vram_gib": 70.0, "gpus": "/dev/dri/renderD128 70.0 GiB"}]
    busy = plan(probe=devices(gpu(0, free=120.0)), gpu_holders=held)
    outcome = gpu_checks.gpu_memory(busy)
    assert outcome.status == WARN and "another container or the host): host pid 4000001: 70.0 GiB" in outcome.message


def test_busy_memory_without_a_holder_here_says_so():
    held = {"visible": [], "hidden": [], "unreadable": 0, "kfd": False}
    outcome = gpu_checks.gpu_memory(plan(probe=devices(gpu(0, free=120.0)), gpu_holders=held))
    assert outcome.status == WARN and "No process of this container holds a GPU" in outcome.message


@pytest.fixture
def holder(tmp_path):
    """A REAL child process of this test holding a file open at a path that stands in for a device node."""
    fake = tmp_path / "fakegpu0"
    fake.touch()
    # The child says "open" once it holds the file; waiting for that line needs no polling of /proc, where the
    # interpreter's own short-lived descriptors can vanish between listdir and readlink (a CI run's FileNotFoundError).
    code = f"f = open({str(fake)!r}); print('open', flush=True); import time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "open", "the child did not open the stand-in device"
        yield child, str(tmp_path / "fakegpu*")
    finally:
        child.kill()
        child.wait()


@pytest.mark.light_process  # the holder: a Python that opens a file and sleeps
def test_the_proc_scan_finds_a_real_process_holding_the_device(holder, tmp_path):
    child, glob = holder
    found = amdgpu.device_holders([glob], exclude={os.getpid()})
    assert [h["pid"] for h in found["holders"]] == [child.pid]
    cmdline = found["holders"][0]["cmdline"]  # shortened to 80 characters
    assert found["holders"][0]["name"].startswith("python") and cmdline.startswith(f"{sys.executable} -c f = open(")
    assert len(cmdline) == 80 and cmdline.endswith("…")
    assert found["holders"][0]["devices"] == [str(tmp_path / "fakegpu0")]
    busy = plan(probe=devices(gpu(0, free=120.0)), gpu_holders=amdgpu.gpu_holders(tmp_path, [glob], {os.getpid()}))
    assert f"Held by: pid {child.pid} python" in gpu_checks.gpu_memory(busy).message


@pytest.mark.light_process  # the holder: a Python that opens a file and sleeps
def test_rocmfts_own_processes_never_count(holder):
    """By default the scan leaves out this process and its descendants (rocmft's probes are its children): the
    child holding the 'device' is one of ours, so nothing is found."""
    child, glob = holder
    assert child.pid in amdgpu.own_processes()
    assert amdgpu.device_holders([glob])["holders"] == []
