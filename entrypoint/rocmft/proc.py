"""Child processes: process groups, deadlines, free ports (the ground floor every step may use).

Every child rocmft starts (GPU probes, the parser child, the worker, torchrun) runs in its own session
(``start_new_session``), so that one signal to its process group reaches everything it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator


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


@contextlib.contextmanager
def inductor_cache_env_kept() -> Iterator[None]:
    """Undo what torch's inductor writes into ``os.environ`` inside the block.

    The first time inductor is asked for its cache folder it sets ``TORCHINDUCTOR_CACHE_DIR`` in ``os.environ``
    (torch/_inductor/runtime/cache_dir_utils.py, torch 2.11), which importing LLaMA-Factory or building a model can
    do. rocmft's environment then differed from the parser child's, and the first run on a fresh cache started a
    fresh worker instead of reusing the one that validated the configuration (tests/test_train.py caught it).
    """
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


__all__ = ["free_port", "inductor_cache_env_kept", "kill_group"]
