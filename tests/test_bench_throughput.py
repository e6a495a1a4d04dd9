"""bench/throughput.py's peer run (issue 32's fourth column), in-process on the CPU: the argument check that runs
before any model is built, and the step-by-step loss comparison of a run against the expert's same rows."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def throughput():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("throughput")
    finally:
        sys.path.remove(str(BENCH))


def test_peer_before_expert_is_refused_before_anything_is_built(throughput, tmp_path, capsys):
    out = tmp_path / "bench"
    with pytest.raises(SystemExit) as stop:
        throughput.main(["--out", str(out), "--shape", "tiny", "--runs", "stock,peer,expert"])
    assert stop.value.code == 2
    assert "name expert before peer" in capsys.readouterr().err
    assert not out.exists()  # no model, data or half-written report


def test_peer_losses_compare_step_by_step_with_the_expert(throughput, capsys):
    expert = {"points": [(8192, 12.67), (16384, 12.63), (24576, 12.68)], "steady_tokens_per_s": 12606.0}
    peer = {"points": [(8192, 12.67), (16384, 12.64), (24576, 12.60)], "steady_tokens_per_s": 16461.0}
    report: dict = {}
    throughput._same_batches(report, "peer", expert, peer)
    result = report["peer_against_expert"]
    assert result["steps"] == 3 and result["same_tokens_each_step"] is True
    assert result["max_abs_loss_diff"] == pytest.approx(0.08)
    assert result["steady_ratio"] == pytest.approx(1.306, abs=1e-3)
    throughput._print_losses({"expert": expert, "peer": peer})
    printed = capsys.readouterr().out
    assert "loss per step" in printed and "12.6000 (    24576)" in printed
