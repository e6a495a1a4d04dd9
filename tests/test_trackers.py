"""The ``trackers`` check (issue 33) and real runs that report to TensorBoard and W&B.

The check's tests build a run's settings in-process (a plan stand-in holding only what the check reads: the
rendered ``report_to``, its source and the run's environment); the MLflow endpoints are real HTTP servers on this
machine (a stand-in that answers MLflow's two routes, labelled as such: the MLflow server itself needs the full
mlflow, which the stack does not carry). The training tests run the built-in default for real and read the
records back with each tracker's own reader.
"""

from __future__ import annotations

import base64
import http.server
import importlib.util
import json
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import logged_losses
from rocmft.checks import FAIL, PASS, SKIP, CheckSubject
from rocmft.checks.trackers import report_to_names, shown_uri, trackers
from rocmft.errors import ExitCode


def subject(report_to, env: dict[str, str] | None = None) -> CheckSubject:
    """The check's input: a run whose train.yaml has ``report_to`` (from REPORT_TO) under environment ``env``."""
    source = {"report_to": "REPORT_TO (set in the environment)"}
    stand_in = SimpleNamespace(arguments={"report_to": report_to}, sources=source,
                               settings=SimpleNamespace(environ=dict(env or {})))  # fmt: skip
    return CheckSubject(plan=stand_in)


def test_names_are_read_as_transformers_reads_them():
    assert report_to_names(None) == [] and report_to_names("none") == [] and report_to_names(["none"]) == []
    assert report_to_names("tensorboard, wandb") == ["tensorboard", "wandb"]
    assert report_to_names(["mlflow"]) == ["mlflow"]


def test_no_tracker_skips():
    assert trackers(subject("none")).status == SKIP


def test_an_unknown_name_fails_with_transformers_list():
    outcome = trackers(subject(["tensorbord"]))
    assert (
        outcome.status == FAIL
        and "tensorbord" in outcome.message
        and "REPORT_TO (set in the environment)" in outcome.message
    )
    assert "tensorboard" in outcome.remedy and "wandb" in outcome.remedy


def test_a_tracker_not_installed_fails_before_the_model_loads():
    assert importlib.util.find_spec("comet_ml") is None  # the premise: the stack does not carry comet_ml
    outcome = trackers(subject(["tensorboard", "comet_ml"]))
    assert outcome.status == FAIL and outcome.value == "not installed: comet_ml"
    assert "remove comet_ml from REPORT_TO" in outcome.remedy


def test_the_stacks_three_trackers_are_installed(tmp_path):
    env = {"MLFLOW_TRACKING_URI": f"file:{tmp_path}/mlruns", "MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path)}  # fmt: skip
    outcome = trackers(subject(["tensorboard", "mlflow", "wandb"], env))
    assert outcome.status == PASS, outcome.message


def test_mlflows_default_sqlite_store_fails_without_sqlalchemy():
    assert importlib.util.find_spec("sqlalchemy") is None  # the premise: mlflow-skinny brings no SQLAlchemy
    outcome = trackers(subject(["mlflow"]))
    assert outcome.status == FAIL and "sqlite:///mlflow.db" in outcome.message
    assert "MLFLOW_TRACKING_URI=http://" in outcome.remedy and "MLFLOW_ALLOW_FILE_STORE=true" in outcome.remedy


def test_a_folder_store_needs_mlflows_opt_in_and_a_writable_folder(tmp_path):
    uri = f"file:{tmp_path}/mlruns"
    refused = trackers(subject(["mlflow"], {"MLFLOW_TRACKING_URI": uri}))
    assert refused.status == FAIL and "MLFLOW_ALLOW_FILE_STORE=true" in refused.remedy
    assert trackers(subject(["mlflow"], {"MLFLOW_TRACKING_URI": uri, "MLFLOW_ALLOW_FILE_STORE": "true"})).status == PASS
    unwritable = trackers(
        subject(["mlflow"], {"MLFLOW_TRACKING_URI": "file:/proc/mlruns", "MLFLOW_ALLOW_FILE_STORE": "1"})
    )
    assert unwritable.status == FAIL and "cannot be written" in unwritable.message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_stand_in(api_status: int = 200):
    """A real HTTP server on this machine answering MLflow's /health (200) and experiments/search (``api_status``),
    as an MLflow server whose host allow-list refuses this name answers (403). Yields (url, seen Authorization
    headers). A STAND-IN for the MLflow server, labelled: only the two routes the check asks for."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization", ""))
            code = 200 if self.path == "/health" else api_status
            body = b"OK" if self.path == "/health" else json.dumps({"experiments": []}).encode()
            self.send_response(code, "Invalid Host header" if code == 403 else None)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_an_mlflow_server_that_answers_passes_and_gets_the_uris_credentials_not_in_the_message():
    with mlflow_stand_in() as (url, seen):
        uri = url.replace("http://", "http://alice:s3cret@")
        outcome = trackers(subject(["mlflow"], {"MLFLOW_TRACKING_URI": uri}))
    assert outcome.status == PASS, outcome.message
    assert seen == ["Basic " + base64.b64encode(b"alice:s3cret").decode()] * 2
    assert "s3cret" not in outcome.message + outcome.value + outcome.remedy


def test_an_mlflow_server_refusing_the_api_fails_naming_the_host_allow_list():
    with mlflow_stand_in(api_status=403) as (url, _):
        outcome = trackers(subject(["mlflow"], {"MLFLOW_TRACKING_URI": url.replace("http://", "http://bob:pw@")}))
    assert outcome.status == FAIL and "HTTP 403" in outcome.message and "MLFLOW_SERVER_ALLOWED_HOSTS" in outcome.remedy
    assert "bob" not in outcome.message and "pw@" not in outcome.message


def test_an_mlflow_uri_nothing_answers_fails():
    outcome = trackers(subject(["mlflow"], {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{_free_port()}"}))
    assert outcome.status == FAIL and "did not answer /health" in outcome.message


def test_shown_uri_drops_user_and_password():
    assert shown_uri("https://u:p@mlflow.example:5000/x") == "https://mlflow.example:5000/x"
    assert shown_uri("file:/saves/mlruns") == "file:/saves/mlruns"


def test_online_wandb_needs_a_key_or_a_netrc_entry(tmp_path):
    home = {"HOME": str(tmp_path), "WANDB_DIR": str(tmp_path)}
    refused = trackers(subject(["wandb"], home))
    assert refused.status == FAIL and "WANDB_API_KEY" in refused.message and "WANDB_MODE=offline" in refused.remedy
    assert trackers(subject(["wandb"], {**home, "WANDB_API_KEY": "k" * 40})).status == PASS
    assert trackers(subject(["wandb"], {**home, "WANDB_MODE": "offline"})).status == PASS
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert trackers(subject(["wandb"], home)).status == PASS  # what `wandb login` leaves


def test_wandb_with_a_folder_it_cannot_write_fails(tmp_path):
    outcome = trackers(subject(["wandb"], {"WANDB_MODE": "offline", "WANDB_DIR": "/proc/wandb"}))
    assert outcome.status == FAIL and "WANDB_DIR" in outcome.message and "WANDB_DIR=/saves/wandb" in outcome.remedy


def test_a_tensorboard_folder_it_cannot_write_fails(tmp_path):
    outcome = trackers(subject(["tensorboard"], {"TENSORBOARD_LOGGING_DIR": "/proc/tb"}))
    assert outcome.status == FAIL and "TENSORBOARD_LOGGING_DIR=/proc/tb" in outcome.message
    assert trackers(subject(["tensorboard"], {"TENSORBOARD_LOGGING_DIR": str(tmp_path / "tb")})).status == PASS


@pytest.mark.train
def test_report_to_mlflow_without_a_store_is_refused_before_the_model_loads(run_rocmft):
    result = run_rocmft("check", env={"REPORT_TO": "mlflow"})
    assert result.returncode == ExitCode.CHECK_FAILED, result.stdout[-3000:]
    assert "sqlite:///mlflow.db" in result.stdout and "trackers" in result.stdout


@pytest.mark.train
def test_report_to_tensorboard_and_wandb_offline_train_and_leave_their_records(run_rocmft, tmp_path):
    """The built-in default trains with both trackers; TensorBoard's own reader gives the trainer's losses."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = {"REPORT_TO": "tensorboard,wandb", "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wb"),
           "MAX_STEPS": "4", "LOGGING_STEPS": "1"}  # fmt: skip
    result = run_rocmft("train", env=env)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    output = tmp_path / "saves" / "rocmft-demo"
    events = sorted(output.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {output}"
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    logged = [(e.step, e.value) for e in accumulator.Scalars("train/loss")]
    assert [s for s, _ in logged] == [1, 2, 3, 4]
    assert [v for _, v in logged] == pytest.approx(logged_losses(output), rel=1e-5)
    offline = list(Path(env["WANDB_DIR"]).glob("wandb/offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
