"""The `rocmft` command as a user runs it: exit codes, messages, and what is (not) left behind.

render, check and status run in the pytest process (conftest's rocmft_here: rocmft.cli.main with the child's
environment and folder); `rocmft train` and `rocmft env` in a real child process. A test marked ``PARSES`` reaches
LLaMA-Factory's parser, which rocmft runs in a child process (rocmft.validate), so it stays out of the fast layer."""

from __future__ import annotations

import json

import pytest

from rocmft.errors import ExitCode

PARSES = pytest.mark.slow  # starts rocmft's parser child (python -m rocmft.validate.child)


@pytest.mark.parametrize(("environ", "named"), [
    ({"LEARNING_RATE": "abc"}, ["LEARNING_RATE"]),
    ({"FP16": "true", "BF16": "true"}, ["FP16", "BF16"]),
    ({"ROCMFT_PRECISON": "fp32"}, ["ROCMFT_PRECISON", "ROCMFT_PRECISION"]),
    ({"INCLUDE_TOKENS_PER_SECOND": "true"}, ["INCLUDE_TOKENS_PER_SECOND"]),
    ({"ROCMFT_SKIP_CHECKS": "disks"}, ["ROCMFT_SKIP_CHECKS", "disk"]),
])  # fmt: skip
@pytest.mark.parametrize("command", ["render", pytest.param("train", marks=pytest.mark.slow)])
def test_configuration_errors_exit_2_and_leave_nothing(request, rocmft_here, tmp_path, environ, named, command):
    output = tmp_path / "run"
    rocmft = request.getfixturevalue("run_rocmft") if command == "train" else rocmft_here  # train: a child process
    result = rocmft(command, env={**environ, "OUTPUT_DIR": str(output)})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout
    assert "CONFIGURATION ERROR" in result.stdout
    for name in named:
        assert name in result.stdout
    assert not output.exists()


@PARSES
def test_parser_rejection_names_the_variable(rocmft_here, tmp_path, tiny_model):
    # DO_PREDICT without PREDICT_WITH_GENERATE is refused by LLaMA-Factory's own parser, not by a rocmft rule
    output = tmp_path / "run"
    result = rocmft_here("render", env={"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "identity",
                                       "DO_PREDICT": "true", "OUTPUT_DIR": str(output)})  # fmt: skip
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout
    assert "rejected the configuration" in result.stdout and "predict_with_generate" in result.stdout
    assert not output.exists()


@PARSES
def test_missing_data_set_exits_3_with_only_the_check_report(rocmft_here, tmp_path, shared_data):
    output = tmp_path / "run"
    result = rocmft_here(
        "check", env={"DATASET": "not_there", "DATASET_DIR": str(shared_data), "OUTPUT_DIR": str(output)}
    )
    assert result.returncode == ExitCode.CHECK_FAILED, result.stdout
    assert "not_there" in result.stdout and str(shared_data) in result.stdout
    assert sorted(p.relative_to(output).as_posix() for p in output.rglob("*")) == ["rocmft", "rocmft/checks.json"]
    report = json.loads((output / "rocmft" / "checks.json").read_text())
    dataset = next(c for c in report["checks"] if c["id"] == "dataset")
    assert report["status"] == "fail" and dataset["status"] == "fail" and "not_there" in dataset["message"]


@PARSES
def test_misspelled_data_set_gets_a_did_you_mean(rocmft_here, tmp_path, shared_data):
    result = rocmft_here("check", env={"DATASET": "alpaca_zh_dmo", "DATASET_DIR": str(shared_data),
                                       "OUTPUT_DIR": str(tmp_path / "run")})  # fmt: skip
    assert result.returncode == ExitCode.CHECK_FAILED
    # the report, not the table: the table folds long lines wherever the terminal width puts them
    report = json.loads((tmp_path / "run" / "rocmft" / "checks.json").read_text())
    dataset = next(c for c in report["checks"] if c["id"] == "dataset")
    assert "Did you mean alpaca_zh_demo" in dataset["message"]


@PARSES
def test_column_mismatch_lists_missing_and_available_keys(rocmft_here, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "mine.json").write_text(json.dumps([{"question": "q", "answer": "a"}]))
    (data / "dataset_info.json").write_text(json.dumps({"mine": {"file_name": "mine.json"}}))
    result = rocmft_here(
        "check", env={"DATASET": "mine", "DATASET_DIR": str(data), "OUTPUT_DIR": str(tmp_path / "run")}
    )
    assert result.returncode == ExitCode.CHECK_FAILED
    assert "Health checks failed: dataset." in result.stdout
    # the check's own words, from its record: the console's table wraps them at the terminal's width
    report = json.loads((tmp_path / "run" / "rocmft" / "checks.json").read_text())
    message = next(c["message"] for c in report["checks"] if c["id"] == "dataset")
    assert "lacks instruction, output (has: answer, question)" in message, message


@PARSES
def test_missing_model_folder_fails_the_model_check(rocmft_here, tmp_path):
    environ = {"MODEL_NAME_OR_PATH": "/models/not-mounted", "DATASET": "rocmft_demo",
               "OUTPUT_DIR": str(tmp_path / "run"), "ROCMFT_SKIP_CHECKS": "dataset"}  # fmt: skip
    result = rocmft_here("check", env=environ)
    assert result.returncode == ExitCode.CHECK_FAILED
    assert "/models/not-mounted" in result.stdout and "Mount the model folder" in result.stdout


@PARSES
def test_uncached_hub_model_offline_fails_with_what_to_do(rocmft_here, tmp_path):
    result = rocmft_here("check", env={"MODEL_NAME_OR_PATH": "Qwen/Qwen2-7B", "DATASET": "x",
                                       "ROCMFT_SKIP_CHECKS": "dataset", "OUTPUT_DIR": str(tmp_path / "run"),
                                       "HF_HOME": str(tmp_path / "hf")})  # fmt: skip
    assert result.returncode == ExitCode.CHECK_FAILED
    assert "HF_HUB_OFFLINE" in result.stdout and "hf download" in result.stdout


@PARSES
def test_deepspeed_zero3_offload_render_is_accepted_by_llamafactory(rocmft_here, tmp_path):
    output = tmp_path / "run"
    result = rocmft_here("render", env={"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3",
                                       "ROCMFT_OFFLOAD": "optimizer", "OUTPUT_DIR": str(output)})  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout
    assert "LLaMA-Factory accepted the configuration" in result.stdout
    ds = json.loads((output / "rocmft" / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert not list(output.glob(".rocmft-staging-*"))


def test_env_prints_versions_and_device(run_rocmft):
    result = run_rocmft("env")
    assert result.returncode == ExitCode.OK
    facts = json.loads(result.stdout[result.stdout.index("{") :])
    assert facts["versions"]["llamafactory"] == "0.9.5" and facts["device"]["backend"] in ("cpu", "cuda", "rocm")


def test_readme_variable_reference_is_generated_from_the_code():
    from pathlib import Path

    from rocmft.config.envdoc import reference, updated_readme

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    assert updated_readme(readme) == readme, "README's variable reference is stale: run `make docs`"
    assert (repo / "docs" / "training-arguments.md").read_text() == reference(full=True), "run `make docs`"


@PARSES
def test_output_dir_under_a_file_is_a_configuration_error(rocmft_here, tmp_path):
    (tmp_path / "afile").write_text("not a folder")
    result = rocmft_here("render", env={"OUTPUT_DIR": str(tmp_path / "afile" / "run")})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout
    assert "OUTPUT_DIR" in result.stdout and "Traceback" not in result.stdout


@PARSES
def test_parser_rejection_names_an_unset_variable(rocmft_here, tmp_path, tiny_model):
    result = rocmft_here("render", env={"MODEL_NAME_OR_PATH": str(tiny_model), "OUTPUT_DIR": str(tmp_path / "run")})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout
    assert "dataset (not set; the variable is DATASET)" in result.stdout


@PARSES
def test_render_keeps_an_earlier_runs_record(rocmft_here, tmp_path):
    output = tmp_path / "run"
    earlier = output / "rocmft"
    earlier.mkdir(parents=True)
    (earlier / "manifest.json").write_text(
        json.dumps({"started_at": "2026-01-02T03:04:05+00:00", "status": "finished"})
    )
    (earlier / "train.log").write_text("the earlier run's log\n")
    result = rocmft_here("render", env={"OUTPUT_DIR": str(output)})
    assert result.returncode == ExitCode.OK, result.stdout
    kept = output / "rocmft-history" / "2026-01-02T030405+0000"
    assert (kept / "train.log").read_text() == "the earlier run's log\n" and (kept / "manifest.json").is_file()
    assert (output / "rocmft" / "train.yaml").is_file() and not (output / "rocmft" / "manifest.json").exists()
    assert str(kept) in result.stdout


def test_status_tells_a_stalled_run_from_a_progressing_one(rocmft_here, tmp_path):
    """`rocmft status` reads the manifest and the worker's result file (rewritten at every logging step)."""
    import os
    import time

    run_dir = tmp_path / "out" / "rocmft"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"status": "running", "exit_code": None}))
    starting = rocmft_here("status", str(tmp_path / "out"))
    assert starting.returncode == 0 and starting.stdout.startswith("running: no step logged yet"), starting.stdout
    result = run_dir / "worker-result.json"
    result.write_text(json.dumps({"last_step": 12, "max_steps": 100, "losses": [{"step": 10, "loss": 1.5}]}))
    running = rocmft_here("status", str(tmp_path / "out"), "--max-idle", "600")
    assert running.returncode == 0 and running.stdout.startswith("running: step 12/100, loss 1.5000"), running.stdout
    an_hour_ago = time.time() - 3600
    os.utime(result, (an_hour_ago, an_hour_ago))
    stalled = rocmft_here("status", str(tmp_path / "out"), "--max-idle", "600")
    assert stalled.returncode == 1 and stalled.stdout.startswith("stalled: step 12/100"), stalled.stdout
    nothing = rocmft_here("status")
    assert nothing.returncode == 1 and nothing.stdout.startswith("no run"), nothing.stdout


@pytest.mark.parametrize(("option", "value"), [("--max-idle", "nan"), ("--max-idle", "-5"), ("--max-start", "0"),
                                               ("--max-start", "soon")])  # fmt: skip
def test_status_refuses_a_limit_that_is_no_number_of_seconds(rocmft_here, tmp_path, option, value):
    """`--max-idle nan` made every running run "stalled" (no age is <= NaN) and a limit of 0 or less did too: exit 2
    from argparse naming the option, as for any bad option; `inf` means no limit (tried as a new user, 2026-12-05)."""
    run_dir = tmp_path / "out" / "rocmft"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"status": "running", "exit_code": None}))
    refused = rocmft_here("status", str(tmp_path / "out"), option, value)
    assert refused.returncode == 2, refused.stdout
    assert f"argument {option}: must be a number of seconds above 0, not {value!r}" in refused.stdout, refused.stdout
    assert "Traceback" not in refused.stdout
    unlimited = rocmft_here("status", str(tmp_path / "out"), option, "inf")
    assert unlimited.returncode == 0 and unlimited.stdout.startswith("running: no step logged yet"), unlimited.stdout


@pytest.mark.parametrize(("record", "words"), [
    ('{"last_step": 1, "losses": [{"step": 1, "loss": 2.5}]}',  # no max_steps: "step 1/None"
     "running: step 1 (total unknown: {path} has no max_steps), loss 2.5000, last update"),
    ('{"last_step": 1, "max_steps": "ten"}', "running: step 1 (total unknown: {path} has max_steps='ten'"),
    ('{"last_step": 12, "max_st', "running: step unknown ({path} cannot be read:"),  # cut short: "no step logged"
    ('{"last_step": "x", "max_steps": 10}', "running: step unknown ({path} has last_step='x'"),
    ('{"last_step": 3, "max_steps": 10, "losses": [{"step": 3, "loss": "x"}]}',  # a ValueError from the format
     "running: step 3/10, last update"),
])  # fmt: skip
def test_status_says_what_a_damaged_worker_record_leaves_unknown(rocmft_here, tmp_path, record, words):
    """A worker-result.json without max_steps printed "step 1/None", one cut short "no step logged yet" as if the
    worker had not started (a break-it trial, 2026-12-05): each now says what is unknown and names the file."""
    run_dir = tmp_path / "out" / "rocmft"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps({"status": "running", "exit_code": None}))
    (run_dir / "worker-result.json").write_text(record)
    said = rocmft_here("status", str(tmp_path / "out"))
    assert said.returncode == 0 and said.stdout.startswith(words.format(path=run_dir / "worker-result.json")), (
        said.stdout
    )
    assert "None" not in said.stdout and "no step logged yet" not in said.stdout and "Traceback" not in said.stdout


def test_status_names_a_damaged_run_record_once(rocmft_here, tmp_path):
    """A run folder whose rocmft/manifest.json is damaged: "no run" (exit 1) naming that file once; it was named
    twice, as "X (or X)", the alternative meant for a folder without rocmft/ (tried as a new user, 2026-12-05)."""
    record = tmp_path / "out" / "rocmft" / "manifest.json"
    record.parent.mkdir(parents=True)
    record.write_text("[]")
    damaged = rocmft_here("status", str(tmp_path / "out"))
    assert damaged.returncode == 1, damaged.stdout
    assert damaged.stdout == f"no run: cannot read {record} (it is not a JSON object)\n", damaged.stdout


def test_status_of_a_run_that_is_not_there_says_what_to_pass(rocmft_here, tmp_path):
    """A folder given that does not exist, and the temp folder's note of an earlier `rocmft train` whose run was
    deleted since: "no run" (exit 1) naming what is missing and what to pass. The first printed the bare errno, the
    second named the deleted run with no word on why (a newcomer's trial, 2026-12-05)."""
    from conftest import short_temp_folder

    absent = rocmft_here("status", str(tmp_path / "nothing"))
    assert absent.returncode == 1, absent.stdout
    assert absent.stdout == (f"no run: {tmp_path / 'nothing'} does not exist here; pass the OUTPUT_DIR a `rocmft "
                             "train` wrote to (as this machine or container sees it, e.g. saves/<run>)\n")  # fmt: skip
    pointer = short_temp_folder(tmp_path) / "rocmft-current-run"
    pointer.write_text(f"{tmp_path / 'deleted' / 'rocmft'}\n")
    stale = rocmft_here("status")
    assert stale.returncode == 1, stale.stdout
    assert stale.stdout.startswith(f"no run: {pointer} notes {tmp_path / 'deleted' / 'rocmft'}, the run of an "
                                   "earlier `rocmft train`, which no longer exists"), stale.stdout  # fmt: skip
    assert "pass the run's OUTPUT_DIR" in stale.stdout and "Errno" not in stale.stdout


def test_status_does_not_take_another_users_run_for_yours(rocmft_here, tmp_path, monkeypatch):
    """A /tmp shared by users (a host, Apptainer's default binds) holds the note of the first user's `rocmft train`,
    which the others' cannot replace (the sticky bit): their `rocmft status` printed that user's run and its health
    as their own (a break-it trial, 2026-12-06). The note is read only when it is this user's; here the note is
    another uid's, as this process sees it."""
    import os

    from conftest import short_temp_folder

    theirs = tmp_path / "theirs" / "rocmft"
    theirs.mkdir(parents=True)
    (theirs / "manifest.json").write_text('{"status": "running"}')
    pointer = short_temp_folder(tmp_path) / "rocmft-current-run"
    pointer.write_text(f"{theirs}\n")
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)
    result = rocmft_here("status")
    assert result.returncode == 1, result.stdout
    assert result.stdout == (f"no run: {pointer} notes the run of another user's `rocmft train` (uid {real_uid}), "
                             "not yours; pass the run's OUTPUT_DIR\n")  # fmt: skip


@PARSES
def test_a_failed_check_in_a_used_output_folder_keeps_the_earlier_run_and_leaves_only_its_report(rocmft_here, tmp_path):
    """The earlier training run's record moves to rocmft-history; rocmft/ then holds the new report alone."""
    output = tmp_path / "run"
    (output / "rocmft").mkdir(parents=True)
    (output / "rocmft" / "manifest.json").write_text(
        json.dumps({"status": "finished", "started_at": "2026-11-30T01:02:03"})
    )
    (output / "rocmft" / "train.yaml").write_text("stage: sft\n")
    result = rocmft_here("check", env={"DATASET": "nope", "OUTPUT_DIR": str(output)})
    assert result.returncode == ExitCode.CHECK_FAILED
    assert sorted(p.name for p in (output / "rocmft").iterdir()) == ["checks.json"]
    kept = output / "rocmft-history" / "2026-11-30T010203"
    assert json.loads((kept / "manifest.json").read_text())["status"] == "finished" and (kept / "train.yaml").is_file()


@PARSES
def test_lengths_check_passes_and_warns_of_truncation_and_of_records_beyond_the_context(
    rocmft_here, tmp_path, tiny_model, shared_data, demo_data
):
    """The tiny model's context is 1024 tokens (max_position_embeddings); alpaca_en_demo with its tokenizer has a
    p95 of 1170 (measured), the built-in demo data a max of 22."""

    def lengths(name: str, **env: str) -> dict:
        output = tmp_path / name
        result = rocmft_here("check", env={"MODEL_NAME_OR_PATH": str(tiny_model), "OUTPUT_DIR": str(output), **env})
        assert result.returncode == ExitCode.OK, result.stdout[-3000:]  # warnings do not stop a run
        checks = json.loads((output / "rocmft" / "checks.json").read_text())["checks"]
        return next(c for c in checks if c["id"] == "lengths")

    short = lengths("short", DATASET="rocmft_demo", DATASET_DIR=str(demo_data), CUTOFF_LEN="128")
    assert short["status"] == "pass" and short["data"]["over_cutoff_share"] == 0

    alpaca = {"DATASET": "alpaca_en_demo", "DATASET_DIR": str(shared_data), "TEMPLATE": "qwen"}
    truncated = lengths("truncated", **alpaca, CUTOFF_LEN="256")
    assert truncated["status"] == "warn" and truncated["data"]["over_cutoff_share"] > 0.05
    assert "will be truncated" in truncated["message"] and "Raise CUTOFF_LEN" in truncated["remedy"]

    beyond = lengths("beyond", **alpaca)  # the template's default CUTOFF_LEN, 2048, is beyond the context
    assert beyond["status"] == "warn" and beyond["data"]["over_cutoff_share"] == 0
    assert beyond["data"]["context_length"] == 1024 and beyond["data"]["over_context_share"] > 0.05
    assert "longer than the model's context length (1024" in beyond["message"]
    assert "CUTOFF_LEN=1024" in beyond["remedy"]
