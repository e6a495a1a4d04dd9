"""The worker's record (rocmft.records.WorkerResult): worker-result.json, rewritten at every logged step, and
losses.jsonl beside it, one line appended per logged step. In-process: the training callback's own hooks
(rocmft.worker.callbacks._RocmftHooks) driven with a stand-in trainer state, and the record's writer and reader."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import rocmft.records_worker
from rocmft.cli.status import _progress
from rocmft.records import (
    LOSSES_FILE,
    RESULT_FILE,
    RESULT_VERSION,
    LossRecord,
    RunPolicy,
    WorkerResult,
    WorkerResultWriter,
    load_worker_result,
    read_worker_result,
    write_worker_result,
)
from rocmft.values import is_count
from rocmft.worker import callbacks

PRECISION = {"policy": "bf16", "compute_dtype": "bfloat16", "bf16": True, "fp16": False, "reason": "test"}
ARGS = SimpleNamespace(world_size=1, process_index=0, output_dir="unused")


def _hooks(run_dir: Path) -> callbacks._RocmftHooks:
    return callbacks._RocmftHooks(RunPolicy(precision=PRECISION), run_dir)


def _state(step: int) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=100_000, is_world_process_zero=True,
                           is_local_process_zero=True, num_input_tokens_seen=step * 64)  # fmt: skip


def _log(hooks: callbacks._RocmftHooks, step: int, loss: float) -> None:
    hooks.on_log(ARGS, _state(step), None, logs={"loss": loss, "learning_rate": 1e-4, "grad_norm": 1.0})


def _losses(n: int) -> tuple[LossRecord, ...]:
    return tuple(LossRecord(step, 2.0 + 1.0 / step) for step in range(1, n + 1))


def _bytes_of_one_logged_step(run_dir: Path, logged: int) -> int:
    """Bytes the callback writes for one logged step after ``logged`` losses: the record it rewrites plus what
    losses.jsonl grows by (the first logged step after filling the record is not counted: it writes them all)."""
    hooks = _hooks(run_dir)
    hooks.result = WorkerResult.start().updated(losses=_losses(logged), last_step=logged)
    _log(hooks, logged + 1, 1.5)
    losses = run_dir / LOSSES_FILE
    before = losses.stat().st_size if losses.is_file() else 0
    _log(hooks, logged + 2, 1.5)
    after = losses.stat().st_size if losses.is_file() else 0
    return (run_dir / RESULT_FILE).stat().st_size + after - before


def test_a_logged_step_writes_the_same_bytes_after_ten_thousand_as_after_ten(tmp_path, capsys):
    """The defect: the callback rewrote every loss logged so far at every logged step (6.4 MB and 320 ms a step
    after 50,000; O(n²) over a run, with every other rank waiting). Now a logged step writes a record of constant
    size and appends one line, whatever n. FAILS on the old layout (10,000 losses: ~640 kB a step)."""
    few = _bytes_of_one_logged_step(tmp_path / "ten", 10)
    many = _bytes_of_one_logged_step(tmp_path / "ten-thousand", 10_000)
    assert many <= few + 16, (few, many)  # a few more digits in the step numbers, nothing per loss
    assert many < 1024, many
    record = json.loads((tmp_path / "ten-thousand" / RESULT_FILE).read_text())
    assert record["version"] == RESULT_VERSION and "losses" not in record and record["losses_logged"] == 10_002


def test_the_callback_appends_the_loss_before_the_record_counts_it(tmp_path, monkeypatch, capsys):
    """At each write of the record, losses.jsonl already holds every step it counts (a reader never sees the
    record claim a step whose line is missing); the step logged is the last line."""
    seen = []
    write = rocmft.records_worker.atomic_write_json

    def checked(path, data):
        lines = (tmp_path / LOSSES_FILE).read_text().splitlines()
        seen.append((data["losses_logged"], len(lines), json.loads(lines[-1])["step"] if lines else None))
        return write(path, data)

    monkeypatch.setattr(rocmft.records_worker, "atomic_write_json", checked)
    hooks = _hooks(tmp_path)
    for step in (1, 2, 3):
        _log(hooks, step, 2.0 / step)
    assert seen == [(1, 1, 1), (2, 2, 2), (3, 3, 3)]
    assert [e.to_json() for e in read_worker_result(tmp_path).losses] == [
        {"step": s, "loss": 2.0 / s} for s in (1, 2, 3)
    ]


def test_ten_thousand_logged_losses_round_trip(tmp_path):
    """A record of 10,000 losses written whole, then grown step by step as the callback does, reads back equal:
    the same losses in order, the same JSON object (keys in their order), the same bytes when rewritten."""
    result = WorkerResult.start().updated(losses=_losses(10_000), max_steps=20_000, last_step=10_000)
    write_worker_result(tmp_path, result)
    assert read_worker_result(tmp_path) == result
    writer = WorkerResultWriter(tmp_path)
    writer.write(result)
    for step in range(10_001, 10_011):
        result = result.with_loss(LossRecord(step, 1.25, 3.5, 4.0)).updated(last_step=step)
        writer.write(result)
    back = read_worker_result(tmp_path)
    assert back == result and len(back.losses) == 10_010 and back.losses[-1] == LossRecord(10_010, 1.25, 3.5, 4.0)
    assert list(back.to_json().items()) == list(result.to_json().items())  # what the manifest embeds: inline
    text = (tmp_path / RESULT_FILE).read_text()
    WorkerResultWriter(tmp_path / "again").write(back)
    assert (tmp_path / "again" / RESULT_FILE).read_text() == text
    assert len((tmp_path / LOSSES_FILE).read_text().splitlines()) == 10_010


def test_a_torn_last_line_is_skipped(tmp_path):
    """The worker killed mid-append leaves half a line: the reader skips it, also when the record counts it (a
    damaged record), and the next write of a writer that goes on cuts it off before appending."""
    writer = WorkerResultWriter(tmp_path)
    result = WorkerResult.start()
    for step in (1, 2, 3):
        result = result.with_loss(LossRecord(step, 1.0 / step))
        writer.write(result)
    losses = tmp_path / LOSSES_FILE
    with losses.open("a") as handle:
        handle.write('{"step": 4, "lo')
    assert read_worker_result(tmp_path).losses == result.losses
    record = json.loads((tmp_path / RESULT_FILE).read_text())
    (tmp_path / RESULT_FILE).write_text(json.dumps({**record, "losses_logged": 4}))
    assert read_worker_result(tmp_path).losses == result.losses

    result = result.with_loss(LossRecord(4, 0.25))
    writer.write(result)  # a writer whose append failed half way goes on (disk full, then freed)
    assert [json.loads(line)["step"] for line in losses.read_text().splitlines()] == [1, 2, 3, 4]
    assert read_worker_result(tmp_path).losses == result.losses


@pytest.mark.parametrize("value", [0, 3, True, False, -1, 2.0, "3", None])
def test_one_count_check_serves_the_record_and_status(tmp_path, value):
    """A number of logged steps is an int >= 0 (not JSON's true/false, a float, a string) by one test,
    rocmft.values.is_count, in the record's reader and in `rocmft status`: a record whose losses_logged is no count
    is no worker record (not read as 0 or 1 losses); a last_step that is no count is a step unknown."""
    counted = type(value) is int and value >= 0
    assert is_count(value) is counted
    write_worker_result(tmp_path, WorkerResult.start().updated(losses=_losses(3), last_step=3))
    record = json.loads((tmp_path / RESULT_FILE).read_text())
    (tmp_path / RESULT_FILE).write_text(json.dumps({**record, "losses_logged": value}))
    if counted:
        assert load_worker_result(tmp_path).losses == _losses(3)[:value]
    else:
        with pytest.raises(ValueError, match=r"losses_logged is .*, not a number of logged steps"):
            load_worker_result(tmp_path)
    logged, words = _progress(WorkerResult(last_step=value, max_steps=10), Path("record"), None)
    assert logged is counted
    assert words == f"step {value}/10" if counted else value is None or "not a step number" in words


@pytest.mark.parametrize("damage", ["folder", "not-utf8", "odd-lines", "gone"])
def test_a_damaged_losses_file_reads_as_fewer_losses_never_an_error(tmp_path, damage):
    """losses.jsonl replaced by a folder, holding bytes that are not UTF-8 or lines that are no loss record, or
    gone: the record still reads, with the whole loss lines that are left."""
    write_worker_result(tmp_path, WorkerResult.start().updated(losses=_losses(3), last_step=3))
    losses = tmp_path / LOSSES_FILE
    kept = _losses(3)
    if damage == "folder":
        losses.unlink()
        losses.mkdir()
        kept = ()
    elif damage == "not-utf8":
        losses.write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe\n{"step": 3, "loss": 2.5}\n')
        kept = (LossRecord(1, 2.0), LossRecord(3, 2.5))
    elif damage == "odd-lines":
        losses.write_text('[1]\n{"step": 2}\n"x"\n{"step": 2, "loss": 2.5}\n')
        kept = (LossRecord(2, 2.5),)
    else:
        losses.unlink()
        kept = ()
    result = read_worker_result(tmp_path)
    assert result is not None and result.losses == kept and result.last_step == 3


@pytest.mark.parametrize(
    "lines",
    [
        '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 2.5}, {"step": 3, "loss": 2.25}\n{"step": 4, "loss": 1.0}\n',
        '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 2.5, "x": "\n"}\n{"step": 4, "loss": 1.0}\n',
    ],
    ids=["two-records-on-one-line", "two-torn-lines-that-join"],
)
def test_read_losses_counts_lines_not_the_values_of_their_join(tmp_path, lines):
    """read_losses parses every line at once, joined by commas into one JSON array; lines that are not one value
    each can join into a valid array of another length (a line holding two records; two torn halves whose join
    is one object). Such lines are skipped as a line-by-line read skips them, never read as records: the check of
    the array's length against the lines' number is what sends them to the line-by-line read."""
    (tmp_path / LOSSES_FILE).write_text(lines)
    assert rocmft.records_worker.read_losses(tmp_path) == (LossRecord(1, 2.0), LossRecord(4, 1.0))
    assert rocmft.records_worker.read_losses(tmp_path, limit=3) == (LossRecord(1, 2.0), LossRecord(4, 1.0))


def test_a_record_of_the_old_layout_still_reads(tmp_path):
    """A record written before losses.jsonl (layout 1: the losses inline, no version or version 1) reads with its
    losses, as `rocmft status` and `rocmft report` read old runs; a losses.jsonl beside it (an older rocmft that
    resumed in an OUTPUT_DIR a newer one trained in) is not read."""
    old = {"version": 1, "status": "finished", "losses": [{"step": 5, "loss": 1.5}, {"step": 10, "loss": 1.25,
           "gpu_memory_gib": 3.5, "peak_gpu_memory_gib": 4.0}], "max_steps": 10, "last_step": 10}  # fmt: skip
    (tmp_path / RESULT_FILE).write_text(json.dumps(old, indent=2) + "\n")
    (tmp_path / LOSSES_FILE).write_text('{"step": 1, "loss": 9.0}\n')
    result = read_worker_result(tmp_path)
    assert result.version == 1 and result.status == "finished" and result.last_step == 10
    assert result.losses == (LossRecord(5, 1.5), LossRecord(10, 1.25, 3.5, 4.0))
    assert result.to_json() == old  # the manifest embeds it as it was
    no_version = {k: v for k, v in old.items() if k != "version"}
    (tmp_path / RESULT_FILE).write_text(json.dumps(no_version))
    assert read_worker_result(tmp_path).losses == result.losses and read_worker_result(tmp_path).version == 1


def test_a_restarted_run_starts_a_fresh_losses_file(tmp_path, monkeypatch, capsys):
    """A new run in the same OUTPUT_DIR (a resumed one included: a new worker process, a new callback) starts
    with no losses, as its record does: train begin truncates losses.jsonl; the steps it then logs are its own
    (a resume from step 3 logs 4 and 5, not 1 to 5)."""
    monkeypatch.setattr(callbacks.STOP, "training", False)
    first = _hooks(tmp_path)
    first.on_train_begin(ARGS, _state(0), None, model=None)
    for step in (1, 2, 3):
        _log(first, step, 2.0 / step)
    assert len(read_worker_result(tmp_path).losses) == 3

    again = _hooks(tmp_path)
    again.on_train_begin(ARGS, _state(3), None, model=None)
    assert (tmp_path / LOSSES_FILE).read_text() == ""
    assert read_worker_result(tmp_path).losses == ()
    for step in (4, 5):
        _log(again, step, 1.0 / step)
    assert [entry.step for entry in read_worker_result(tmp_path).losses] == [4, 5]


def test_status_reads_the_last_loss_from_the_losses_file(rocmft_here, tmp_path):
    """`rocmft status` on a run of the new layout: the step from the record, the loss from losses.jsonl's last
    line the record counts (not a line appended after the record was last rewritten)."""
    run_dir = tmp_path / "out" / "rocmft"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"status": "running", "exit_code": None}))
    result = WorkerResult.start().updated(max_steps=100)
    writer = WorkerResultWriter(run_dir)
    for step in (10, 11, 12):
        result = result.with_loss(LossRecord(step, 2.0 - step / 8)).updated(last_step=step)
        writer.write(result)
    with (run_dir / LOSSES_FILE).open("a") as handle:  # the next step's line, its record not rewritten yet
        handle.write('{"step": 13, "loss": 0.1}\n')
    running = rocmft_here("status", str(tmp_path / "out"), "--max-idle", "600")
    assert running.returncode == 0 and running.stdout.startswith("running: step 12/100, loss 0.5000"), running.stdout
