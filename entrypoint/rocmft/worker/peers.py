"""A lost node ends the job within ROCMFT_PEER_TIMEOUT_S instead of hanging in a collective.

When a node dies (power, kernel panic, OOM killer on the host, a cable), the ranks on the other nodes wait in their
next collective. gloo notices a closed TCP connection at once, but RCCL/NCCL waits for the process group's timeout,
and LLaMA-Factory sets ``ddp_timeout`` to 180000000 s (its default, kept by the template: rank 0 may tokenize for
hours while the others wait at a barrier) — the job hangs, holding every GPU. A frozen node (a hung driver, a
network partition) hangs the job even under gloo.

So on a multi-node run, local rank 0 of each node starts :func:`start` at train begin: a daemon thread that every
:data:`INTERVAL_S` increments its node's counter in the job's rendezvous store (a TCPStore client to
MASTER_ADDR:MASTER_PORT, where torchrun's agent on node 0, or rank 0 without torchrun, serves it) and reads every
other node's. A node whose counter has not moved for ROCMFT_PEER_TIMEOUT_S (measured on this node's monotonic
clock: no clock skew between nodes) is lost; an unreachable store means the rendezvous host (node 0) is. Then this
node prints which node and since when, records it, and ends its ranks (``os._exit``: a rank blocked inside a
collective never reaches Python again), so torchrun and the scheduler see the job end. The bound is
ROCMFT_PEER_TIMEOUT_S + INTERVAL_S, plus torchrun's teardown of the node's other ranks (seconds).

A killed node (its processes gone, their TCP connections closed) makes gloo fail at once on the other nodes
("Connection reset by peer"), before any heartbeat is missed. Then the failing rank on each node's local rank 0
asks the watch for a verdict (:func:`verdict_after_error`): a node that also misses two heartbeats
(:data:`AFTER_ERROR_S`) is named as lost the same way, within torchrun's 30 s grace before it kills the ranks of a
failed node.

The heartbeat is a thread, so it keeps beating while its rank is busy in C++ (a collective, a checkpoint save,
tokenization): a slow node is not a lost one. Before train begin (model load, tokenization) no node is watched.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

INTERVAL_S = 5.0  # seconds between two heartbeats (and two looks at the other nodes)
# after a collective failed on a closed connection: two missed heartbeats (and a second) make a node lost
AFTER_ERROR_S = 2 * INTERVAL_S + 1
# Words of the errors a collective raises when a peer's connection closed: gloo's tcp pair ("Read error ...:
# Connection reset by peer", "Connection closed by peer": torch/third_party/gloo gloo/transport/tcp/pair.cc; the
# first seen in tests/test_resilience.py's killed node), NCCL/RCCL's ncclRemoteError (ncclGetErrorString's "remote
# process exited or there was a network error", NVIDIA/nccl src/init.cc; torch prefixes "NCCL error: "), and a
# broken pipe on send.
PEER_ERRORS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "ncclRemoteError",
               "remote process exited")  # fmt: skip
# The words of a collective that timed out (the process group's timeout, DDP_TIMEOUT), by backend: torch's
# ProcessGroupNCCL watchdog, RCCL's on ROCm ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=...,
# OpType=ALLREDUCE, ...) ran for 600045 milliseconds before timing out": NVIDIA/nccl#1610, huggingface/open-r1#620;
# it then aborts the process, so it is found in the log, not in an exception), and gloo's tcp transport
# ("[.../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete" and, in
# tests/test_resilience.py's hang, "unbound_buffer.cc:129] ... for send operation ...", torch 2.11 with two ranks;
# facebookresearch/detectron2#5121 reports the send one).
COLLECTIVE_TIMEOUTS = (
    re.compile(r"Watchdog caught collective operation timeout[^\n]*"),
    re.compile(r"Timed out waiting \d+ms for (?:send|recv) operation to complete"),
)
_RUNNING: dict[str, Watch] = {}  # this process's watch, once its thread has reached the store


@dataclass(frozen=True)
class NodeLayout:
    """This process's place in a multi-node job: ``node`` (0 .. nodes - 1) of ``nodes``; ``leader``: whether it is
    the node's local rank 0 (the one that watches)."""

    node: int
    nodes: int
    leader: bool


def node_layout(environ: dict[str, str] | None = None) -> NodeLayout | None:
    """From torchrun's variables (GROUP_RANK, WORLD_SIZE / LOCAL_WORLD_SIZE, LOCAL_RANK), else Slurm's
    (SLURM_NODEID, SLURM_NNODES, SLURM_LOCALID); None for a one-node job or when neither says."""
    env = os.environ if environ is None else environ
    try:
        if "GROUP_RANK" in env and "LOCAL_WORLD_SIZE" in env:
            nodes = int(env.get("WORLD_SIZE", "1")) // max(1, int(env["LOCAL_WORLD_SIZE"]))
            layout = NodeLayout(int(env["GROUP_RANK"]), nodes, int(env.get("LOCAL_RANK", "0")) == 0)
        elif "SLURM_NODEID" in env and "SLURM_NNODES" in env:
            layout = NodeLayout(
                int(env["SLURM_NODEID"]), int(env["SLURM_NNODES"]), env.get("SLURM_LOCALID", "0") == "0"
            )
        else:
            return None
    except ValueError:
        return None
    return layout if layout.nodes > 1 else None


class Watch:
    """The heartbeat and the look at the other nodes, one round per :meth:`beat` (the thread calls it every
    :data:`INTERVAL_S`; tests call it directly).

    Args:
        store: a ``torch.distributed.Store`` (``add``/``get``/``check``); layout: this node's place;
        timeout_s: how long a node's counter may stand still; clock: ``time.monotonic`` (tests pass their own).
    """

    def __init__(self, store, layout: NodeLayout, timeout_s: float, prefix: str,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.store, self.layout, self.timeout_s, self.prefix, self.clock = store, layout, timeout_s, prefix, clock
        self.after_error: str | None = None  # the collective's error, once :func:`verdict_after_error` asked
        started = clock()
        self.seen = {node: (None, started) for node in range(layout.nodes) if node != layout.node}

    def beat(self) -> tuple[int, float] | None:
        """One round: add 1 to this node's counter, read the others'. Returns ``(node, seconds still)`` for the first
        node whose counter stood still for longer than the timeout, else None. Raises what the store raises (the
        rendezvous host is gone)."""
        self.store.add(f"{self.prefix}{self.layout.node}", 1)
        now = self.clock()
        for node, (count, since) in self.seen.items():
            key = f"{self.prefix}{node}"
            value = self.store.get(key) if self.store.check([key]) else None
            if value != count:
                self.seen[node] = (value, now)
            elif now - since > self.timeout_s:
                return node, now - since
        return None


def start(timeout_s: float, on_lost: Callable[[str], None], environ: dict[str, str] | None = None) -> bool:
    """Start the watch thread on this node's local rank 0 of a multi-node job (see the module docstring).

    Args:
        timeout_s: ROCMFT_PEER_TIMEOUT_S (0: off); on_lost: called once with the message, from the thread, before
            the process ends itself (it records the loss).

    Returns:
        Whether a thread was started (False: one node, not the node's leader, off, or no rendezvous address).
    """
    env = os.environ if environ is None else environ
    layout = node_layout(env)
    if not timeout_s or layout is None or not layout.leader or not env.get("MASTER_ADDR"):
        return False
    import torch.distributed as dist

    from rocmft.errors import ExitCode

    host, port = env["MASTER_ADDR"], int(env.get("MASTER_PORT") or 29500)
    prefix = f"rocmft/heartbeat/{env.get('TORCHELASTIC_RUN_ID') or env.get('SLURM_JOB_ID') or 'job'}/"

    def run() -> None:
        try:
            store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(INTERVAL_S * 2, 10)))
            watch = Watch(store, layout, timeout_s, prefix)
            _RUNNING["watch"] = watch
        except Exception as err:
            on_lost(f"the node watch could not reach the rendezvous store {host}:{port} ({err}); nodes are not "
                    "watched in this run")  # fmt: skip
            return
        while True:
            time.sleep(INTERVAL_S)
            try:
                lost = watch.beat()
            except Exception as err:
                message = (f"LOST: the rendezvous host {host}:{port} (node 0) stopped answering "
                           f"({type(err).__name__}); node {layout.node} stops now")  # fmt: skip
            else:
                if lost is None:
                    continue
                node, still = lost
                if watch.after_error:
                    message = (f"LOST: node {node} of {layout.nodes}: a collective failed on a closed connection "
                               f"({watch.after_error}) and node {node} has sent no heartbeat for {still:.0f} s since: "
                               f"its ranks died or its network did; node {layout.node} stops now")  # fmt: skip
                else:
                    message = (f"LOST: node {node} of {layout.nodes} has not sent a heartbeat for {still:.0f} s "
                               f"(ROCMFT_PEER_TIMEOUT_S={timeout_s:g}): its ranks died or its network did; node "
                               f"{layout.node} stops now instead of waiting in the next collective")  # fmt: skip
            try:
                on_lost(message)
            finally:
                os._exit(ExitCode.TRAINING_FAILED)

    threading.Thread(target=run, name="rocmft-node-watch", daemon=True).start()
    return True


def verdict_after_error(err: BaseException) -> None:
    """Called by a rank whose training raised ``err``: when this process runs the watch and ``err`` is a
    collective's closed-connection error (:data:`PEER_ERRORS`), shorten the watch's timeout to
    :data:`AFTER_ERROR_S` and wait for its verdict; a node found lost ends this process from the watch's thread
    (exit 4, naming it, as in :func:`start`). Returns, having changed nothing else, when there is no watch here,
    the error is of another kind, or no node was found lost in AFTER_ERROR_S + 2 heartbeats (≈ 22 s)."""
    watch = _RUNNING.get("watch")
    text = f"{type(err).__name__}: {err}"
    if watch is None or not any(words in text for words in PEER_ERRORS):
        return
    watch.after_error = next(words for words in PEER_ERRORS if words in text)
    watch.timeout_s = min(watch.timeout_s, AFTER_ERROR_S)
    time.sleep(AFTER_ERROR_S + 2 * INTERVAL_S + 1)


def collective_timeout(text: str) -> str | None:
    """The first words of :data:`COLLECTIVE_TIMEOUTS` found in ``text`` (an exception's message, a log), at most
    200 characters; None when no collective timed out there."""
    for pattern in COLLECTIVE_TIMEOUTS:
        found = pattern.search(text)
        if found:
            return found.group(0)[:200]
    return None


def resume_hint(output_dir: Path) -> str:
    """The sentence that tells where a resumed run starts (the newest complete checkpoint in ``output_dir``)."""
    from rocmft.render.resume import newest_complete

    checkpoint = newest_complete(output_dir).checkpoint
    where = f"from {checkpoint.name}" if checkpoint else "from the start (no complete checkpoint yet)"
    return f"`rocmft train` with the same settings on every node resumes {where}"


__all__ = [
    "AFTER_ERROR_S",
    "COLLECTIVE_TIMEOUTS",
    "INTERVAL_S",
    "NodeLayout",
    "Watch",
    "collective_timeout",
    "node_layout",
    "resume_hint",
    "start",
    "verdict_after_error",
]
