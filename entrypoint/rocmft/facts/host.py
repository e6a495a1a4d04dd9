"""Facts of the host this process runs on (psutil): name, OS, Python, CPUs, memory, /dev/shm."""

from __future__ import annotations

import platform
import socket
import sys
from pathlib import Path
from typing import Any


def host_facts() -> dict[str, Any]:
    """Host facts (psutil): name, OS, Python, CPUs, memory, /dev/shm size."""
    import psutil

    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus_logical": psutil.cpu_count(logical=True),
        "cpus_physical": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }
    if Path("/dev/shm").is_dir():
        facts["shm_gib"] = round(psutil.disk_usage("/dev/shm").total / 2**30, 2)
    return facts


def shm_bytes() -> int | None:
    """The size of /dev/shm in bytes (psutil's statvfs of the mount: a container's own tmpfs, 64 MiB under Docker's
    default), or None where there is no /dev/shm."""
    import psutil

    return psutil.disk_usage("/dev/shm").total if Path("/dev/shm").is_dir() else None


__all__ = ["host_facts", "shm_bytes"]
