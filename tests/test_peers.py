"""The lost-node watch's rule, with a store and a clock the test drives (the real one: tests/test_resilience.py)."""

from __future__ import annotations

from rocmft.worker.peers import NodeLayout, Watch, node_layout


class Store:
    """The three calls of torch.distributed.Store the watch makes, on a dict."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    def get(self, key: str) -> bytes:
        return str(self.values[key]).encode()


def test_a_node_whose_counter_stands_still_past_the_timeout_is_lost():
    now = [0.0]
    store = Store()
    watches = [Watch(store, NodeLayout(node, 3, True), 30.0, "hb/", clock=lambda: now[0]) for node in range(3)]
    for _ in range(10):  # all three beat every 5 s: nobody is lost
        now[0] += 5
        assert [w.beat() for w in watches] == [None, None, None]
    stopped = now[0]  # node 2's last beat
    lost = None
    while lost is None:  # nodes 0 and 1 go on beating
        now[0] += 5
        lost, _ = watches[0].beat(), watches[1].beat()
    node, still = lost
    # more than the timeout after the last change node 0 saw (one round after node 2's last beat at most)
    assert node == 2 and still > 30.0 and 30.0 < now[0] - stopped <= 30.0 + 2 * 5


def test_a_node_that_never_beat_is_lost_after_the_timeout_from_the_start():
    now = [0.0]
    watch = Watch(Store(), NodeLayout(0, 2, True), 10.0, "hb/", clock=lambda: now[0])
    now[0] = 10.0
    assert watch.beat() is None
    now[0] = 10.5
    assert watch.beat() == (1, 10.5)


def test_the_layout_comes_from_torchrun_or_slurm_and_one_node_is_not_watched():
    assert node_layout({"GROUP_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "0"}) == (
        NodeLayout(1, 2, True))  # fmt: skip
    assert (
        node_layout({"GROUP_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "3"}).leader is False
    )
    assert node_layout({"SLURM_NODEID": "3", "SLURM_NNODES": "4", "SLURM_LOCALID": "0"}) == NodeLayout(3, 4, True)
    assert node_layout({"GROUP_RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}) is None
    assert node_layout({}) is None
    assert node_layout({"SLURM_NODEID": "x", "SLURM_NNODES": "2"}) is None


def test_a_closed_connection_error_shortens_the_watch_to_two_missed_heartbeats(monkeypatch):
    """verdict_after_error: a gloo closed-connection error (the words of the killed-node test's real error) makes
    the running watch judge after AFTER_ERROR_S and waits for it; any other error, or no watch, changes nothing
    and returns at once (time.sleep replaced to see whether it waits)."""
    from rocmft.worker import peers

    slept = []
    monkeypatch.setattr(peers.time, "sleep", slept.append)
    watch = Watch(Store(), NodeLayout(0, 2, True), 120.0, "p/", clock=lambda: 0.0)
    monkeypatch.setitem(peers._RUNNING, "watch", watch)
    peers.verdict_after_error(RuntimeError("CUDA out of memory"))
    assert (watch.timeout_s, watch.after_error, slept) == (120.0, None, [])
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:538] Read error [10.0.0.2]:20890: Connection reset by peer")
    peers.verdict_after_error(gloo)
    assert watch.timeout_s == peers.AFTER_ERROR_S and watch.after_error == "Connection reset by peer"
    assert slept and slept[0] > peers.AFTER_ERROR_S + peers.INTERVAL_S  # long enough for one more look
    monkeypatch.delitem(peers._RUNNING, "watch")
    peers.verdict_after_error(gloo)  # no watch in this process (not the node's local rank 0): returns at once
    assert len(slept) == 1
