"""The per-architecture image definitions, checked without building: plans, the entry script, .env.example."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rocmft.buildinfo import read_profile

REPO = Path(__file__).resolve().parents[1]
ARCHS = {
    # arch: (base image prefix, PYTORCH_ROCM_ARCH, bitsandbytes backend/arch, flash-attention backend)
    "gfx90a": ("rocm/dev-ubuntu-", "gfx90a", "hip (BNB_ROCM_ARCH=gfx90a)", "ck"),
    "gfx942": ("rocm/dev-ubuntu-", "gfx942", "hip (BNB_ROCM_ARCH=gfx942)", "ck"),
    "gfx1100": ("rocm/dev-ubuntu-", "gfx1100", "hip (BNB_ROCM_ARCH=gfx1100)", "triton"),
    "cpu": ("debian:", "-", "none (BNB_ROCM_ARCH=-)", "none"),
}


def plan(arch: str) -> dict[str, str]:
    result = subprocess.run(
        ["make", "-s", "plan", f"ARCH={arch}"], cwd=REPO, capture_output=True, text=True, check=True
    )
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in result.stdout.splitlines())}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_build_plan_per_architecture(arch):
    base, rocm_arch, bnb, flash = ARCHS[arch]
    shown = plan(arch)
    assert shown["base image"].startswith(base)
    assert shown["PYTORCH_ROCM_ARCH"] == rocm_arch and shown["bitsandbytes"] == bnb
    assert shown["flash-attention"] == flash
    if arch != "cpu":
        rocm = shown["ROCm"]
        assert shown["torch wheel index"] == f"https://download.pytorch.org/whl/rocm{rocm}"
        assert shown["base image"].endswith(f":{rocm}-complete")
        assert shown["nvidia wheels"] == "forbidden" and "FUSED_ADAM" in shown["DeepSpeed ops"]
        assert f"rocmft:0.1.0-rocm{rocm}-{arch}" in shown["tags"]


def test_unknown_architecture_is_refused():
    result = subprocess.run(["make", "-s", "plan", "ARCH=gfx908"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0 and "gfx1100 gfx90a gfx942" in result.stderr


def test_each_profile_has_the_same_keys():
    keys = {arch: {k for k in read_profile(REPO / "docker" / "arch" / f"{arch}.env") if not k.startswith("RUNTIME_")}
            for arch in ARCHS}  # fmt: skip
    assert all(k == keys["cpu"] for k in keys.values()), keys


def test_entry_script_applies_the_runtime_profile_and_the_user_wins(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "rocmft").write_text('#!/bin/sh\necho "args=$*"\nenv\n')
    (fake / "rocmft").chmod(0o755)
    environ = {"PATH": f"{fake}:{os.environ['PATH']}", "ARCH_PROFILE": str(REPO / "docker/arch/gfx942.env"),
               "NCCL_DEBUG": "INFO"}  # fmt: skip
    result = subprocess.run(["sh", str(REPO / "entrypoint" / "container-entry.sh"), "check"], env=environ,
                            capture_output=True, text=True, check=True)  # fmt: skip
    lines = set(result.stdout.splitlines())
    assert "args=check" in lines
    assert {"HSA_NO_SCRATCH_RECLAIM=1", "NCCL_MIN_NCHANNELS=112", "NCCL_DEBUG=INFO"} <= lines
    assert "NCCL_DEBUG=WARN" not in lines


def test_env_example_variables_are_accepted_by_rocmft():
    from rocmft.settings import load_settings

    environ = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        line = line.lstrip("# ").strip()
        if "=" in line and line.split("=", 1)[0].replace("_", "").isalnum() and line.split("=", 1)[0].isupper():
            key, value = line.split("=", 1)
            environ[key] = value.split()[0] if value else value
    assert {"ARCH", "HOST_UID", "RENDER_GID", "MODEL_NAME_OR_PATH", "ROCMFT_ZERO_STAGE", "COMPOSE_FILE"} <= set(environ)
    environ["ROCMFT_DISTRIBUTED"] = "deepspeed"  # the example's ZeRO lines go with it
    settings = load_settings(environ)
    assert settings.arguments["learning_rate"] == pytest.approx(1e-4) and settings.rocmft.zero_stage == 3
