"""What the amdgpu/KFD kernel drivers and the kernel log say about this node's GPUs, read as text.

Every reader takes a ``root`` (``/`` in production; a folder under tmp_path in tests, holding a synthetic sysfs
tree) and returns plain data; nothing here opens a GPU. The formats follow the kernel source:

- RAS error counters: ``/sys/class/drm/card<N>/device/ras/<block>_err_count`` holds ``ue: <n>`` / ``ce: <n>``
  lines (UMC also ``de: <n>`` in newer kernels), or ``Query currently inaccessible`` while the driver recovers;
  ``ras/features`` holds ``feature mask: 0x<hex>``; ``ras/gpu_vram_bad_pages`` one ``0x<pfn> : 0x<size> : R|P|F``
  line per retired page. The ``ras`` folder exists only where the driver enabled RAS (amdgpu_ras_fs_init), so
  consumer GPUs have none. Source: drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c (torvalds/linux@001ebcf5b903,
  amdgpu_ras_sysfs_read, amdgpu_ras_sysfs_features_read, amdgpu_ras_sysfs_badpages_read; the "de" line is from
  the amd-gfx patch "Show deferred error count for UMC sysfs node"); documented by
  Documentation/gpu/amdgpu/ras.rst ("RAS Error Count sysfs Interface").
- Per-process VRAM: ``/sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>`` holds the bytes (``%llu``) the process has
  allocated on that GPU; ``<pid>`` is the process's pid in the initial PID namespace (lead_thread->pid), i.e. the
  host's, not the container's. Source: drivers/gpu/drm/amd/amdkfd/kfd_process.c (torvalds/linux@6f0f335b73a9,
  kfd_procfs_add_sysfs_files, kfd_procfs_show, kfd_create_process).
- KFD topology: ``/sys/class/kfd/kfd/topology/nodes/<n>/gpu_id`` (0 on CPU nodes) and ``properties``, one
  ``<key> <value>`` line per property (sysfs_show_32bit_prop/64bit_prop), among them ``gfx_target_version``
  (major*10000 + minor*100 + stepping: 90402 is gfx942, 90010 gfx90a, 80003 gfx803 Polaris; 0 on CPUs),
  ``drm_render_minor`` (the GPU's /dev/dri/renderD<minor>), ``location_id``/``domain`` (PCI address) and
  ``unique_id``. Source: drivers/gpu/drm/amd/amdkfd/kfd_topology.c (torvalds/linux@d7ab8e67aa52, node_show,
  kfd_build_sysfs_node_entry); gfx_target_version was added by the amd-gfx patch "drm/amdkfd: Expose GFXIP
  engine version to sysfs" (Graham Sider, 2021-08-04), which also lists the values per ASIC.
- Kernel log: /dev/kmsg records ``<prio>,<seq>,<usec since boot>,<flags>[,...];<text>`` with continuation lines
  starting with a space; a read returns one record, -EAGAIN with O_NONBLOCK when none is left, -EPIPE when records
  were overwritten. Source: Documentation/ABI/testing/dev-kmsg (torvalds/linux@07c7b547a796).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rocmft.values import whole_number

KFD = "sys/class/kfd/kfd"
# Device nodes through which a process holds GPU memory: ROCm's /dev/kfd and render nodes, NVIDIA's per-GPU nodes
# (not /dev/nvidiactl or /dev/nvidia-uvm, which every CUDA process opens whichever GPU it uses).
GPU_DEVICE_GLOBS = ("/dev/kfd", "/dev/dri/renderD*", "/dev/nvidia[0-9]*")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


# --- RAS -------------------------------------------------------------------------------------------------
def parse_err_count(text: str) -> dict[str, int] | None:
    """``{"ue": n, "ce": n[, "de": n]}`` from a ``<block>_err_count`` file's text, or None when it holds no
    counts (``Query currently inaccessible``: the driver is recovering from an error) or a count line whose value
    is not an unsigned number (a damaged file, never read as zero)."""
    lines = {m.group(1): whole_number(m.group(2)) for m in re.finditer(r"^\s*(ue|ce|de)\s*:(.*)$", text, re.M)}
    if any(n is None for n in lines.values()):  # a damaged count ("ue: -1", 5000 digits) is not a zero
        return None
    return lines or None


def amdgpu_cards(root: Path = Path("/")) -> list[dict[str, Any]]:
    """The amdgpu-driven DRM cards under ``root``: ``/sys/class/drm/card<N>`` whose ``device/driver`` links to
    a driver named ``amdgpu`` (connector entries such as card0-DP-1 are skipped).

    Returns, per card: ``card`` ("card0"), ``pci`` (the PCI address the device folder resolves to, e.g.
    "0000:c1:00.0"), ``ras`` (None when the card has no ``ras`` folder, else ``{"features": str|None,
    "blocks": {block: counts|None (query currently inaccessible)|"unreadable"|"unrecognised text '...'"},
    "bad_pages": int|None}``).
    """
    drm = root / "sys/class/drm"
    cards = []
    for card in sorted(drm.glob("card*"), key=lambda p: (len(p.name), p.name)) if drm.is_dir() else []:
        if not re.fullmatch(r"card\d+", card.name):
            continue
        device = card / "device"
        try:
            driver = os.path.basename(os.readlink(device / "driver"))
        except OSError:
            continue
        if driver != "amdgpu":
            continue
        try:
            pci = device.resolve().name
        except OSError:
            pci = "?"
        ras_dir = device / "ras"
        ras = None
        if ras_dir.is_dir():
            blocks: dict[str, Any] = {}
            for counter in sorted(ras_dir.glob("*_err_count")):
                text = _read(counter)
                counts = None if text is None else parse_err_count(text)
                if text is None:
                    counts = "unreadable"
                elif counts is None and "inaccessible" not in text.lower():  # the driver's recovery message
                    counts = f"unrecognised text {text.strip()[:40]!r}"
                blocks[counter.name.removesuffix("_err_count")] = counts
            features = _read(ras_dir / "features")
            bad = _read(ras_dir / "gpu_vram_bad_pages")
            ras = {
                "features": features.strip() if features else None,
                "blocks": blocks,
                "bad_pages": None if bad is None else sum(1 for line in bad.splitlines() if line.strip()),
            }
        cards.append({"card": card.name, "pci": pci, "ras": ras})
    return cards


# --- the driver's version ---------------------------------------------------------------------------------
def driver_version(root: Path = Path("/")) -> dict[str, Any]:
    """The host's amdgpu kernel driver under ``root``: ``{"loaded": bool, "version": str|None, "kernel": str|None}``.

    ``loaded``: /sys/module/amdgpu exists (the module is loaded; in a container sysfs shows the host's).
    ``version``: /sys/module/amdgpu/version, which only AMD's out-of-tree DKMS driver has (MODULE_VERSION; the
    kernel's own amdgpu sets none): e.g. ``6.14.14`` for the driver of ROCm 7.0 (amdgpu 30.10), the number amd-smi
    prints as "amdgpu version" and dmesg as "[drm] amdgpu version: ..."; None for the in-tree driver. ``kernel``:
    /proc/sys/kernel/osrelease (uname -r).
    """
    version = (_read(root / "sys/module/amdgpu/version") or "").strip() or None
    kernel = (_read(root / "proc/sys/kernel/osrelease") or "").strip() or None
    return {"loaded": (root / "sys/module/amdgpu").is_dir(), "version": version, "kernel": kernel}


# --- KFD topology and per-process memory -----------------------------------------------------------------
def gfx_target(version: int) -> str:
    """The gfx target name of a KFD ``gfx_target_version`` (major*10000 + minor*100 + stepping, minor and
    stepping printed in hex as LLVM names them): 90402 -> "gfx942", 90010 -> "gfx90a", 110001 -> "gfx1101"."""
    major, rest = divmod(version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def kfd_gpus(root: Path = Path("/")) -> list[dict[str, Any]] | None:
    """The GPU nodes of the KFD topology under ``root`` (CPU nodes, gpu_id 0, left out), or None when there is no
    KFD topology (no amdgpu/KFD driver, or sysfs not visible).

    Returns, per GPU: ``node`` (topology node number), ``gpu_id`` (the id in ``proc/<pid>/vram_<gpu_id>``),
    ``target`` ("gfx942"), ``major`` (9), ``render`` ("/dev/dri/renderD128", from drm_render_minor), ``pci``
    (domain:bus:dev.fn from domain/location_id), ``unique_id`` (int or None), ``name``.
    """
    nodes = root / KFD / "topology/nodes"
    if not nodes.is_dir():
        return None
    gpus = []
    for node in sorted((p for p in nodes.iterdir() if whole_number(p.name) is not None), key=lambda p: int(p.name)):
        gpu_id = whole_number(_read(node / "gpu_id"))
        props: dict[str, int] = {}
        for line in (_read(node / "properties") or "").splitlines():
            key, _, value = line.strip().partition(" ")
            if whole_number(value) is not None:
                props[key] = int(value)
        version = props.get("gfx_target_version", 0)
        if not gpu_id or not version:
            continue
        location = props.get("location_id", 0)  # bus << 8 | device << 3 | function
        pci = f"{props.get('domain', 0):04x}:{location >> 8:02x}:{(location >> 3) & 0x1F:02x}.{location & 7:x}"
        gpus.append({
            "node": int(node.name), "gpu_id": gpu_id, "target": gfx_target(version), "major": version // 10000,
            "render": f"/dev/dri/renderD{props['drm_render_minor']}" if "drm_render_minor" in props else None,
            "pci": pci, "unique_id": props.get("unique_id"), "name": (_read(node / "name") or "").strip(),
        })  # fmt: skip
    return gpus


def mapped_gpus(root: Path = Path("/")) -> list[dict[str, Any]] | None:
    """The GPUs of the KFD topology (:func:`kfd_gpus`) whose render node is mapped into this container (the file
    /dev/dri/renderD<drm_render_minor> exists under ``root``), in topology node order; None without a topology."""
    gpus = kfd_gpus(root)
    if gpus is None:
        return None
    return [g for g in gpus if g["render"] and (root / g["render"].lstrip("/")).exists()]


def real_targets(root: Path, devices: Mapping[str, Any] | None) -> list[str]:
    """The gfx targets of this container's GPUs as the hardware reports them: the mapped KFD GPUs' (the KFD's
    gfx_target_version, which HSA_OVERRIDE_GFX_VERSION does not change), else the device probe's gcnArchName
    without features (which the override does change), else none."""
    mapped = mapped_gpus(root)
    if mapped:
        return [g["target"] for g in mapped]
    return [str(g.get("arch", "")).split(":")[0] for g in (devices or {}).get("gpus", []) if g.get("arch")]


def kfd_processes(root: Path = Path("/")) -> list[dict[str, Any]] | None:
    """Processes with a KFD context, from ``/sys/class/kfd/kfd/proc`` under ``root``: ``{"pid": host pid,
    "vram": {gpu_id: bytes}}`` each, or None when the folder is not there (no KFD, or a kernel without it)."""
    procs = root / KFD / "proc"
    if not procs.is_dir():
        return None
    found = []
    for entry in sorted((p for p in procs.iterdir() if whole_number(p.name) is not None), key=lambda p: int(p.name)):
        vram = {}
        for file in entry.glob("vram_*"):
            size, gpu = whole_number(_read(file)), whole_number(file.name.removeprefix("vram_"))
            if size is not None and gpu is not None:
                vram[gpu] = size
        found.append({"pid": int(entry.name), "vram": vram})
    return found


# --- processes holding GPU device nodes ------------------------------------------------------------------
def own_processes() -> set[int]:
    """This process and its descendants (rocmft's own GPU probes run as children): never "foreign" holders."""
    import psutil

    me = psutil.Process()
    try:
        return {me.pid, *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def _short(cmdline: list[str], limit: int = 80) -> str:
    text = " ".join(cmdline)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def device_holders(globs: Iterable[str] = GPU_DEVICE_GLOBS, exclude: set[int] | None = None,
                   proc: Path = Path("/proc")) -> dict[str, Any]:  # fmt: skip
    """Processes visible in this PID namespace with a file descriptor open on a path matching ``globs``
    (fnmatch on the /proc/<pid>/fd link targets; psutil's open_files() lists regular files only, not devices).

    Args:
        globs: device path patterns (GPU_DEVICE_GLOBS; tests pass a pattern under tmp_path).
        exclude: pids to leave out (default: :func:`own_processes`).
        proc: the procfs mount.

    Returns:
        ``{"holders": [{"pid", "name", "user", "cmdline" (shortened), "devices": [paths]}], "unreadable": n}``
        where ``unreadable`` counts processes whose descriptors could not be listed (another user's, without
        CAP_SYS_PTRACE).
    """
    import psutil

    exclude = own_processes() if exclude is None else exclude
    patterns = tuple(globs)
    holders, unreadable = [], 0
    try:
        pids = list(proc.iterdir())
    except OSError:  # no procfs mounted here: nothing visible
        pids = []
    for pid_dir in pids:
        if whole_number(pid_dir.name) is None or int(pid_dir.name) in exclude:
            continue
        try:
            fds = os.listdir(pid_dir / "fd")
        except PermissionError:
            unreadable += 1
            continue
        except OSError:  # exited meanwhile
            continue
        devices = set()
        for fd in fds:
            try:
                target = os.readlink(pid_dir / "fd" / fd)
            except OSError:
                continue
            if any(fnmatch.fnmatchcase(target, p) for p in patterns):
                devices.add(target)
        if not devices:
            continue
        pid = int(pid_dir.name)
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                name, user, cmdline = p.name(), p.username(), p.cmdline()
        except (psutil.Error, KeyError):  # KeyError: a uid without a passwd entry
            name, user, cmdline = "?", "?", []
        holders.append({"pid": pid, "name": name, "user": user, "cmdline": _short(cmdline),
                        "devices": sorted(devices)})  # fmt: skip
    return {"holders": sorted(holders, key=lambda h: h["pid"]), "unreadable": unreadable}


# A KFD process not visible here is reported from this size on: rocmft's own probes, seen under their host pids
# when the container has its own PID namespace, hold a HIP context and at most two 256 MiB all-reduce buffers.
HIDDEN_MIN_BYTES = 1 << 30


def gpu_holders(root: Path = Path("/"), globs: Iterable[str] = GPU_DEVICE_GLOBS, exclude: set[int] | None = None,
                proc: Path = Path("/proc")) -> dict[str, Any]:  # fmt: skip
    """Who holds GPU memory: the processes of this PID namespace with a GPU device open (:func:`device_holders`,
    rocmft's own processes left out), each with its VRAM where the KFD reports it, and the KFD processes (ROCm;
    ``root``/sys/class/kfd/kfd/proc) with at least HIDDEN_MIN_BYTES that match none of them: a process of another
    container or the host (KFD names processes by their host pid; one that is not ours does not hold our /dev/kfd).

    Returns:
        ``{"visible": [holder + "vram_gib"], "hidden": [{"pid", "vram_gib", "gpus"}], "unreadable": n,
        "kfd": bool}`` (kfd: whether the KFD's per-process table was there to read).
    """
    exclude = own_processes() if exclude is None else exclude
    scan = device_holders(globs, exclude, proc)
    kfd = kfd_processes(root)
    renders: dict[int, str] = {g["gpu_id"]: g["render"] or f"gpu_id {g['gpu_id']}" for g in kfd_gpus(root) or []}
    by_pid = {h["pid"]: h for h in scan["holders"]}
    hidden = []
    for entry in kfd or []:
        total = sum(entry["vram"].values())
        holder = by_pid.get(entry["pid"])
        if holder is not None:
            holder["vram_gib"] = total / 2**30
        elif entry["pid"] not in exclude and total >= HIDDEN_MIN_BYTES:
            gpus = ", ".join(
                f"{renders.get(g, f'gpu_id {g}')} {b / 2**30:.1f} GiB" for g, b in entry["vram"].items() if b
            )
            hidden.append({"pid": entry["pid"], "vram_gib": total / 2**30, "gpus": gpus})
    return {"visible": scan["holders"], "hidden": hidden, "unreadable": scan["unreadable"], "kfd": kfd is not None}


# --- kernel log ------------------------------------------------------------------------------------------
# amdgpu's messages for the faults that matter before a run, matched on records that mention amdgpu:
# - VM/page faults: gmc_v9_0.c (and gmc_v10_0/v11_0) "[%s] %s page fault (src_id:%u ring:%u vmid:%u pasid:%u"
#   (older kernels: "[%s] page fault (src_id:..."), torvalds/linux@942baad21133 drivers/gpu/drm/amd/amdgpu/gmc_v9_0.c.
# - ring timeouts: amdgpu_job.c amdgpu_job_timedout "ring %s timeout, signaled seq=%u, emitted seq=%u" and
#   "ring %s timeout, but soft recovered" (torvalds/linux@0014952b1754).
# - GPU resets: amdgpu_device.c amdgpu_device_gpu_recover "GPU reset begin!" (torvalds/linux@f54d1867005c);
#   a recovery that failed: amdgpu_job.c "GPU Recovery Failed: %d".
FAULT_KINDS = {
    "recovery_failed": re.compile(r"GPU Recovery Failed|GPU reset\(\d+\) failed", re.I),
    "vm_fault": re.compile(r"page fault \(src_id:"),
    "ring_timeout": re.compile(r"ring \S+ timeout"),
    "gpu_reset": re.compile(r"GPU reset begin!"),
}


def parse_kmsg(records: Iterable[str]) -> list[dict[str, Any]]:
    """The amdgpu fault records among /dev/kmsg ``records`` (each ``prio,seq,usec,flags;text``, continuation
    lines ignored): ``{"kind", "seconds" (since boot), "text"}`` in log order. Records that are not in the
    dev-kmsg format, or do not mention amdgpu, are skipped."""
    found = []
    for record in records:
        head, sep, text = record.partition(";")
        if not sep:
            continue
        fields = head.split(",")
        if len(fields) < 3 or whole_number(fields[2]) is None:
            continue
        text = text.split("\n", 1)[0]
        if "amdgpu" not in text:
            continue
        for kind, pattern in FAULT_KINDS.items():
            if pattern.search(text):
                found.append({"kind": kind, "seconds": int(fields[2]) / 1e6, "text": text.strip()})
                break
    return found


def read_kmsg(path: str = "/dev/kmsg", max_records: int = 200_000, max_seconds: float = 3.0) -> dict[str, Any]:
    """Every record of the kernel log ring buffer, read from ``path`` without blocking (O_NONBLOCK, one record
    per read() until EAGAIN: Documentation/ABI/testing/dev-kmsg), bounded by ``max_records`` and ``max_seconds``.

    Returns:
        ``{"records": [str], "error": None}``, or ``{"records": [], "error": "EPERM ..."}`` when the log cannot
        be opened (kernel.dmesg_restrict=1 without CAP_SYSLOG, or no /dev/kmsg in the container); ``truncated``
        is True when a bound stopped the read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        return {"records": [], "error": f"{errno.errorcode.get(err.errno, err.errno)}: {err.strerror}",
                "truncated": False}  # fmt: skip
    records, deadline, truncated = [], time.monotonic() + max_seconds, False
    try:
        while True:
            if len(records) >= max_records or time.monotonic() > deadline:
                truncated = True
                break
            try:
                chunk = os.read(fd, 8192)  # a record is at most ~1 KiB of text plus its dictionary lines
            except BlockingIOError:
                break
            except BrokenPipeError:  # EPIPE: records were overwritten under us; the next read continues
                continue
            except OSError as err:
                return {"records": records, "error": f"{errno.errorcode.get(err.errno, err.errno)}: {err.strerror}",
                        "truncated": False}  # fmt: skip
            if not chunk:
                break
            records.append(chunk.decode("utf-8", errors="replace"))
    finally:
        os.close(fd)
    return {"records": records, "error": None, "truncated": truncated}


def seconds_since_boot() -> float:
    """CLOCK_MONOTONIC now, the clock /dev/kmsg stamps records with (a container shares the host's unless it has
    its own time namespace)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)
