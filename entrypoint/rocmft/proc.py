"""Child processes: process groups, deadlines, free ports (the ground floor every step may use).

Every child rocmft starts (GPU probes, the parser child, the worker, torchrun) runs in its own session
(``start_new_session``), so that one signal to its process group reaches everything it started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for a one-process rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (started with ``start_new_session``) if it still runs, and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


__all__ = ["free_port", "kill_group"]
