"""The image-publishing workflow (.github/workflows/images.yml): what can be checked without GitHub.

The workflow cannot run here (no registry, no ROCm wheel index, no self-hosted builder), so these tests read it
as GitHub would (YAML, steps in order) and run its shell steps that need nothing but the checkout: the pin check
refuses an unpinned profile in seconds, before any rehearsal or build, on a GitHub-hosted runner before a
self-hosted one is taken. jactionlint (the lint `make lint` runs) passes on it and is shown to catch a real
mistake.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "images.yml"
# the venv's (a dev dependency, pinned in constraints.txt), else one on PATH
JACTIONLINT = next((str(p) for p in [Path(sys.executable).with_name("jactionlint")] if p.exists()),
                   shutil.which("jactionlint"))  # fmt: skip
SHELLCHECK = Path(sys.executable).with_name("shellcheck")


def jobs() -> dict[str, Any]:
    """The workflow's jobs, as GitHub reads them (``on`` is YAML 1.1's True to PyYAML; jobs are unaffected)."""
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def step_index(steps: list[dict[str, Any]], command: str) -> int:
    """The index of the first step whose ``run`` script calls make with ``command`` as a target."""
    pattern = re.compile(rf"\bmake\b[^\n|;&]*\s{re.escape(command)}(\s|$)", re.M)
    found = [i for i, step in enumerate(steps) if pattern.search(step.get("run", ""))]
    assert found, f"no step runs make {command}: {[s.get('name', s.get('uses')) for s in steps]}"
    return found[0]


def test_the_pin_check_comes_first_in_every_build() -> None:
    """In the build job, `make pin-check` is the first step after the checkout, before `make rehearse` and
    `make image`; and the job the build needs runs it for every profile first, so an unpinned base fails there."""
    build = jobs()["build"]
    steps = build["steps"]
    pin, rehearse, image = (step_index(steps, target) for target in ("pin-check", "rehearse", "image"))
    assert pin < rehearse < image, (pin, rehearse, image)
    assert all(step.get("uses", "").startswith("actions/checkout@") for step in steps[:pin]), steps[:pin]
    assert build["env"]["REQUIRE_PINNED_BASE"] == "1"
    needs = [build["needs"]] if isinstance(build["needs"], str) else build["needs"]
    assert any("pin-check" in step.get("run", "") for need in needs for step in jobs()[need]["steps"]), needs


def test_the_build_never_lands_on_a_github_hosted_runner() -> None:
    """GitHub-hosted runners have 14 GB of disk and a 6-hour job limit: the build asks for a self-hosted runner
    (no expression that could fall back to ubuntu-*), with a timeout past those 6 hours; the pin check, which
    needs no builder, runs on a hosted one."""
    runs_on = jobs()["build"]["runs-on"]
    labels = [runs_on] if isinstance(runs_on, str) else runs_on
    assert "self-hosted" in labels and not any("${{" in label or "ubuntu" in label for label in labels), labels
    assert jobs()["build"]["timeout-minutes"] > 360
    assert jobs()["archs"]["runs-on"].startswith("ubuntu-")


def _run_step(step: dict[str, Any], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One ``run`` step as the runner runs it with ``shell: bash`` (bash --noprofile --norc -eo pipefail)."""
    assert step.get("shell") == "bash", step
    command = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]]
    return subprocess.run(
        command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False
    )


def _checkout(tmp_path: Path) -> Path:
    """The files the first job reads: the Makefile, pyproject.toml and docker/ (the profiles)."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "docker", tree / "docker")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(ROOT / name, tree / name)
    return tree


def _first_job(tree: Path) -> subprocess.CompletedProcess[str]:
    """The archs job's steps after the checkout, run in ``tree``: the profile list, then the pin check with it."""
    steps = jobs()["archs"]["steps"]
    output = tree / "github_output"
    listed = _run_step(steps[1], tree, {"GITHUB_OUTPUT": str(output)})
    assert listed.returncode == 0, listed.stderr
    archs = output.read_text().strip().removeprefix("archs=")
    assert json.loads(archs), archs
    return _run_step(steps[2], tree, {"ARCHS": archs})


def test_an_unpinned_profile_stops_the_first_job(tmp_path: Path) -> None:
    """Run as the workflow runs it, the first job's pin check refuses every ROCm profile whose BASE_DIGEST is
    empty (all of them today), naming the file and `make pin-bases`, in seconds."""
    tree = _checkout(tmp_path)
    done = _first_job(tree)
    assert done.returncode != 0
    profiles = {p.name: p.read_text() for p in sorted((tree / "docker" / "arch").glob("*.env"))}
    unpinned = [name for name, text in profiles.items()
                if "ROCM_VERSION=none" not in text and re.search(r"^BASE_DIGEST=$", text, re.M)]  # fmt: skip
    assert unpinned
    for name in unpinned:
        assert f"BASE_DIGEST in docker/arch/{name}): run make pin-bases" in done.stderr, done.stderr


def test_pinned_profiles_pass_the_first_job(tmp_path: Path) -> None:
    """With a digest in every ROCm profile (as `make pin-bases` writes it), the same step passes: the check reads
    the profiles, it does not fail regardless."""
    tree = _checkout(tmp_path)
    for profile in (tree / "docker" / "arch").glob("*.env"):
        profile.write_text(re.sub(r"^BASE_DIGEST=$", "BASE_DIGEST=sha256:" + "0" * 64, profile.read_text(), flags=re.M))
    done = _first_job(tree)
    assert done.returncode == 0, done.stderr


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    assert JACTIONLINT, "jactionlint is not installed: it is a dev dependency (make venv)"
    return subprocess.run([JACTIONLINT, "--no-color", f"--shellcheck={SHELLCHECK}", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_jactionlint_passes_the_workflow_and_catches_a_hidden_failure(tmp_path: Path) -> None:
    """The workflow lint passes on images.yml; the same file with the Push step's `shell: bash` removed (its
    `make plan | sed` pipeline would then hide a failing make) is refused naming the rule."""
    ours = _lint(WORKFLOW)
    assert ours.returncode == 0, ours.stdout + ours.stderr
    text = WORKFLOW.read_text()
    push = text.index("- name: Push")
    broken = tmp_path / "images.yml"
    broken.write_text(text[:push] + text[push:].replace("        shell: bash\n", "", 1))
    refused = _lint(broken)
    assert refused.returncode == 1 and "[pipeline-without-pipefail]" in refused.stdout, refused.stdout
