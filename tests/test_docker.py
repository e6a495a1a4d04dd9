"""The cpu image, built and run for real with Docker and Compose (CI provisions both: `make docker-ready`)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import executed_steps, run_steps
from rocmft.errors import ExitCode

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.docker


@pytest.fixture
def compose(tmp_path):
    """Run `docker compose` on the repository's compose files with tmp_path as the project folder
    (its ./data, ./saves and .env), a project name of its own, and `down -v` afterwards."""
    project = f"rocmft-test-{uuid.uuid4().hex[:8]}"
    base = ["docker", "compose", "--project-directory", str(tmp_path), "-p", project,
            "-f", str(REPO / "compose.yaml"), "-f", str(REPO / "compose.cpu.yaml")]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ROCMFT_", "COMPOSE_"))}

    def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], env={**environ, "ARCH": "cpu", **env}, capture_output=True,
                              text=True, timeout=1200)  # fmt: skip

    yield run
    subprocess.run([*base, "down", "-v"], env={**environ, "ARCH": "cpu"}, capture_output=True, timeout=120)


def _host_user_dirs(tmp_path) -> dict[str, str]:
    """./saves and ./data owned by the host user; as root (CI), a host user with uid/gid 4321, the way a
    person sets HOST_UID/HOST_GID in .env. Returns those two variables."""
    uid, gid = (os.getuid(), os.getgid()) if os.getuid() != 0 else (4321, 4321)
    for folder in ("saves", "data"):
        (tmp_path / folder).mkdir(exist_ok=True)
        os.chown(tmp_path / folder, uid, gid)
    return {"HOST_UID": str(uid), "HOST_GID": str(gid)}


def test_a_version_bump_rebuilds_only_rocmft_itself(cpu_image, checkout_copy):
    """Changing rocmft's version (pyproject.toml) and code, and a runtime setting and a comment of the arch profile,
    rebuilds the runtime stage only: torch, the stack and DeepSpeed come from BuildKit's cache (the stack reads the
    dependency list, not pyproject.toml; the per-arch stages read the profile's build settings, not the file)."""
    checkout_copy.replace("pyproject.toml", 'version = "0.1.0"', 'version = "0.1.1"')
    checkout_copy.replace("entrypoint/rocmft/__init__.py", '__version__ = "0.1.0"', '__version__ = "0.1.1"')
    checkout_copy.replace("docker/arch/cpu.env", "RCCL_BUSBW_FLOOR_GBPS=0", "# a comment\nRCCL_BUSBW_FLOOR_GBPS=1")
    result = checkout_copy.make("image", "ARCH=cpu", "IMAGE=rocmft-layers:cpu", timeout=1800)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    steps = executed_steps(result.stdout + result.stderr)
    runs = run_steps(steps)
    assert {name.split()[0] for name in runs} >= {"system", "torch", "stack", "target", "runtime"}, steps
    rebuilt = {name.split()[0] for name, ran in runs.items() if ran}
    assert rebuilt <= {"requirements", "profile", "runtime"} and "runtime" in rebuilt, runs
    subprocess.run(["docker", "image", "rm", "rocmft-layers:cpu", "rocmft:0.1.1-cpu"], capture_output=True)


def test_image_runs_as_non_root_and_labels_match_the_build_record(cpu_image, docker_client):
    assert cpu_image.attrs["Config"]["User"] == "1000:1000"
    assert docker_client.containers.run("rocmft:cpu", entrypoint=["id", "-u"], remove=True).strip() == b"1000"
    record = json.loads(
        docker_client.containers.run("rocmft:cpu", entrypoint=["cat", "/etc/rocmft/build.json"], remove=True)
    )
    labels = cpu_image.labels
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert record["arch"] == labels["io.rocmft.arch"] == "cpu"
    assert record["rocm_version"] == labels["io.rocmft.rocm-version"] == "none"
    assert record["git_commit"] == labels["org.opencontainers.image.revision"] == head
    assert record["base_image"] == labels["org.opencontainers.image.base.name"] == "debian:bookworm-slim"
    assert record["versions"]["llamafactory"] == "0.9.5" and record["versions"]["rocmft"] == labels[
        "org.opencontainers.image.version"]  # fmt: skip
    assert "rocmft:0.1.0-cpu" in cpu_image.tags


def test_the_image_reads_llamafactorys_vocabulary_without_importing_it(cpu_image, docker_client):
    """A first start on an empty cache volume reads the vocabulary baked at build time (rocmft.config.lfargs.BAKED_DIR)
    instead of importing LLaMA-Factory in rocmft's own process."""
    script = ("import sys; from rocmft.config.lfargs import lf_arguments, vocabulary; v = vocabulary(); "
              "print(len(v['arguments']), 'cutoff_len' in lf_arguments(), 'llamafactory' in sys.modules)")  # fmt: skip
    output = docker_client.containers.run("rocmft:cpu", entrypoint=["python3", "-c", script], remove=True,
                                          environment={"ROCMFT_CACHE_DIR": "/tmp/empty-cache"})  # fmt: skip
    count, has_cutoff, imported = output.decode().split()
    assert int(count) > 100 and has_cutoff == "True" and imported == "False", output


def test_check_without_a_saves_volume_warns_that_nothing_would_persist(cpu_image, docker_client):
    """`docker run` with no volume: OUTPUT_DIR (saves/<run>, i.e. /saves/...) is on the container's own layer;
    the output check warns and says how to mount ./saves with `docker run` (a newcomer found the old remedy,
    "leave OUTPUT_DIR unset", odd when it was unset)."""
    script = "rocmft check > /dev/null; echo exit=$?; cat /saves/rocmft-demo/rocmft/checks.json"
    output = docker_client.containers.run("rocmft:cpu", entrypoint=["sh", "-c", script], remove=True).decode()
    exit_line, report = output.split("\n", 1)
    assert exit_line == "exit=0", output[-3000:]
    check = next(c for c in json.loads(report)["checks"] if c["id"] == "output")
    assert check["status"] == "warn" and check["value"] == "writable, not persistent"
    assert '-v "$PWD/saves:/saves"' in check["remedy"]


def test_compose_up_train_runs_the_builtin_default_into_saves_owned_by_the_user(cpu_image, compose, tmp_path):
    env = _host_user_dirs(tmp_path)
    uid, gid = int(env["HOST_UID"]), int(env["HOST_GID"])
    result = compose("up", "--exit-code-from", "train", "train", env=env)
    assert result.returncode == ExitCode.OK, (result.stdout + result.stderr)[-4000:]
    output = tmp_path / "saves" / "rocmft-demo"
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["image"]["arch"] == "cpu"
    assert manifest["image"]["git_commit"] == cpu_image.labels["org.opencontainers.image.revision"]
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in output.rglob("*")}
    assert owners == {(uid, gid)}, owners
    assert (output / "model.safetensors").is_file() and (output / "training_loss.png").is_file()


def test_compose_run_check_with_a_broken_env_file_exits_2(cpu_image, compose, tmp_path):
    (tmp_path / ".env").write_text("LEARNING_RATE=abc\n")
    (tmp_path / "saves").mkdir(mode=0o777)
    result = compose("run", "--rm", "check", env={"HOST_UID": "1000", "HOST_GID": "1000"})
    assert result.returncode == ExitCode.CONFIG_ERROR, (result.stdout + result.stderr)[-3000:]
    assert "LEARNING_RATE='abc'" in result.stdout + result.stderr


def test_compose_stop_interrupts_training_with_exit_143(cpu_image, compose, tmp_path):
    """`docker compose stop` reaches rocmft as SIGTERM: exit 143 with a checkpoint at the step boundary, well inside
    compose's grace period; `up` again resumes from that checkpoint in the same saves volume and trains on, which a
    second stop shows (a later step logged, a later checkpoint saved). The resumed run is not trained to its end:
    that ~600 s of CPU was this file's longest call (248 s in CI's run of de1c04b), and resuming to the same loss is
    test_resilience's and test_slurm's."""
    import re
    import time

    env = _host_user_dirs(tmp_path)
    output = tmp_path / "saves" / "rocmft-demo"
    # the built-in default, long enough to stop twice (the log is polled every ~2 s; 400 steps take tens of seconds)
    (tmp_path / ".env").write_text("MAX_STEPS=400\n")

    def stop_after_step(after: int) -> tuple[int, str]:
        """Start `train` detached, wait for a logged step above ``after``, stop it; its stopped step and log."""
        assert compose("up", "-d", "train", env=env).returncode == 0
        deadline = time.monotonic() + 300
        while max(map(int, re.findall(r"\[rocmft\] step (\d+)/", logs := compose("logs", "train", env=env).stdout)),
                  default=-1) <= after:  # fmt: skip
            assert time.monotonic() < deadline, logs[-3000:]
            time.sleep(2)
        started = time.monotonic()
        assert compose("stop", "train", env=env).returncode == 0
        stopped_in = time.monotonic() - started
        logs = compose("logs", "train", env=env).stdout
        state = json.loads(compose("ps", "-a", "--format", "json", "train", env=env).stdout.splitlines()[0])
        assert state["ExitCode"] == ExitCode.INTERRUPTED, logs[-3000:]
        assert stopped_in < 60  # well inside compose's stop_grace_period (2 min): rocmft stopped on SIGTERM
        manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
        assert manifest["status"] == "interrupted" and manifest["exit_code"] == ExitCode.INTERRUPTED
        stopped_at = manifest["worker"]["stopped_at_step"]
        assert (output / f"checkpoint-{stopped_at}" / "trainer_state.json").is_file()  # saved at the step boundary
        return stopped_at, logs

    first, _ = stop_after_step(0)
    second, logs = stop_after_step(first)
    assert f"resuming from /saves/rocmft-demo/checkpoint-{first}" in logs, logs[-3000:]
    assert second > first, logs[-3000:]


def test_a_configuration_error_under_the_restart_policy_does_not_loop(cpu_image, compose, tmp_path):
    import time

    env = _host_user_dirs(tmp_path)
    (tmp_path / ".env").write_text("LEARNING_RATE=abc\n")
    assert compose("up", "-d", "train", env=env).returncode == 0
    deadline = time.monotonic() + 180
    while "not restarting" not in (logs := compose("logs", "train", env=env).stdout):
        assert time.monotonic() < deadline, logs[-3000:]
        time.sleep(2)
    time.sleep(3)
    state = json.loads(compose("ps", "-a", "--format", "json", "train", env=env).stdout.splitlines()[0])
    restarts = subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", state["Name"]], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
    assert state["State"] == "running" and restarts == "0", (state, restarts)
    assert "LEARNING_RATE='abc'" in logs


@pytest.fixture(scope="session")
def trackers_image(docker_client):
    """`make trackers-image`, once per session (cold 2m05s on a 2-core machine; seconds from BuildKit's cache)."""
    from conftest import make

    result = make("trackers-image", timeout=1800)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def _get_json(url: str, body: dict | None = None) -> dict:
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def _mlflow_losses(base: str) -> dict[int, float]:
    """The one run on the MLflow server at ``base``: its `loss` history through the REST API, {step: value}."""
    experiments = _get_json(f"{base}/api/2.0/mlflow/experiments/search", {"max_results": 100})["experiments"]
    ids = [e["experiment_id"] for e in experiments]
    runs = _get_json(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": ids}).get("runs", [])
    assert len(runs) == 1, runs
    run_id = runs[0]["info"]["run_id"]
    history = _get_json(f"{base}/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key=loss")["metrics"]
    return {m["step"]: m["value"] for m in history}


def _tensorboard_losses(base: str, saves: Path) -> tuple[dict[int, float], dict[int, float]]:
    """`train/loss` as the TensorBoard server at ``base`` serves it (its scalars plugin's HTTP API) and as its
    EventAccumulator reads the event files under ``saves``: two {step: value}."""
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = saves.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    from_files = {e.step: e.value for e in accumulator.Scalars("train/loss")}
    run = str(events.parent.relative_to(saves))
    served: list = []
    deadline = time.monotonic() + 60  # TensorBoard rereads its folder every 5 s (--reload_interval)
    while len(served) < len(from_files) and time.monotonic() < deadline:
        if "train/loss" in _get_json(f"{base}/data/plugin/scalars/tags").get(run, {}):
            served = _get_json(f"{base}/data/plugin/scalars/scalars?run={run}&tag=train/loss")
        time.sleep(2)
    return {step: value for _, step, value in served}, from_files


def test_compose_tensorboard_and_mlflow_show_the_loss_of_compose_up_train(cpu_image, trackers_image, compose, tmp_path):
    """The README's way to watch a run: `docker compose up -d tensorboard mlflow`, then `docker compose up train` with
    REPORT_TO=tensorboard,mlflow (train reaches the server as http://mlflow:5000). The loss the MLflow server holds
    (REST) and the one in TensorBoard's event files (read by the tensorboard service too) is trainer_state.json's."""
    from rocmft.proc import free_port

    # ROCMFT_HOLD_ON_CONFIG_ERROR=0: a refused check (an unreachable MLflow) ends `up train` with exit 3 at once
    env = {**_host_user_dirs(tmp_path), "MLFLOW_PORT": str(free_port()),
           "TENSORBOARD_PORT": str(free_port()), "ROCMFT_HOLD_ON_CONFIG_ERROR": "0"}  # fmt: skip
    (tmp_path / ".env").write_text("REPORT_TO=tensorboard,mlflow\nMAX_STEPS=6\nLOGGING_STEPS=1\n")
    up = compose("up", "-d", "--wait", "tensorboard", "mlflow", env=env)
    assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]
    result = compose("up", "--exit-code-from", "train", "train", env=env)
    assert result.returncode == ExitCode.OK, (result.stdout + result.stderr)[-4000:]
    saves = tmp_path / "saves"
    history = json.loads((saves / "rocmft-demo" / "trainer_state.json").read_text())["log_history"]
    expected = {e["step"]: e["loss"] for e in history if "loss" in e}
    assert len(expected) == 6, history
    mlflow = _mlflow_losses(f"http://127.0.0.1:{env['MLFLOW_PORT']}")
    served, from_files = _tensorboard_losses(f"http://127.0.0.1:{env['TENSORBOARD_PORT']}", saves)
    for name, logged in (("mlflow", mlflow), ("tensorboard files", from_files), ("tensorboard http", served)):
        assert logged == pytest.approx(expected, rel=1e-6), (name, logged, expected)
