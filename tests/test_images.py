"""The image definitions, checked by running what reads them: make, the entry script, compose, the locks.

The images themselves are built by tests/test_docker.py (cpu) and tests/test_rehearsal.py (the ROCm recipe
against a stand-in base); here nothing is built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocmft.image.buildinfo import read_profile

REPO = Path(__file__).resolve().parents[1]
PROFILES = sorted((REPO / "docker" / "arch").glob("*.env"))
ARCHS = [p.stem for p in PROFILES]
ROCM_ARCHS = [a for a in ARCHS if a != "cpu"]


def test_unknown_architecture_is_refused():
    result = subprocess.run(["make", "-s", "plan", "ARCH=gfx908"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0 and " ".join(ROCM_ARCHS) in result.stderr and "gfx1201" in ROCM_ARCHS


def test_the_shipped_profiles_are_valid():
    result = subprocess.run([sys.executable, "-m", "rocmft.image.buildinfo", "--validate", *map(str, PROFILES)],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr


def _broken(tmp_path: Path, arch: str, old: str, new: str) -> list[str]:
    """The validator's problems with ``arch``'s real profile, ``old`` replaced by ``new`` (file keeps its name)."""
    from rocmft.image.buildinfo import validate_profile

    text = (REPO / "docker" / "arch" / f"{arch}.env").read_text()
    assert old in text
    (tmp_path / f"{arch}.env").write_text(text.replace(old, new))
    return validate_profile(tmp_path / f"{arch}.env")


@pytest.mark.parametrize(("arch", "old", "new", "words"), [
    ("gfx942", "NVIDIA_WHEELS=forbidden\n", "", "NVIDIA_WHEELS is missing"),
    ("gfx942", "BITSANDBYTES=wheel", "BITSANDBYTES=yes", "BITSANDBYTES=yes is not one of wheel, source, none"),
    ("gfx942", "ROCM_VERSION=7.2", "ROCM_VERSION=7.1", "does not say ROCm 7.1 (ROCM_VERSION)"),
    ("gfx1100", "FLASH_ATTN_BACKEND=none", "FLASH_ATTN_BACKEND=ck", "supports gfx90a, gfx942, gfx950 only"),
    ("gfx90a", "ARCH=gfx90a", "ARCH=gfx942", "ARCH=gfx942 but the file is gfx90a.env"),
    ("gfx950", "BASE_DIGEST=", "BASE_DIGEST=latest", "not a sha256:<64 hex> digest"),
    ("gfx1201", "SERVE_IMAGE=none", "SERVE_IMAGE=", "SERVE_IMAGE is empty"),
])  # fmt: skip
def test_a_broken_profile_is_refused_naming_the_key(tmp_path, arch, old, new, words):
    """A profile with a key missing or wrong would have built on silent defaults (a missing NVIDIA_WHEELS read as
    allowed); one whose ROCm versions disagree builds a mixture."""
    problems = _broken(tmp_path, arch, old, new)
    assert any(words in p for p in problems), problems


def test_make_refuses_an_invalid_profile_before_building(tmp_path):
    """make image and make rehearse validate the profile first (profile-check)."""
    result = subprocess.run(["make", "-s", "profile-check", "ARCH=gfx942", "ARCH_FILE=/dev/null"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "ARCH is missing" in result.stderr, result.stderr


def test_serve_image_refuses_an_architecture_without_a_vllm_image():
    """SERVE_IMAGE=none (gfx1151, gfx1201: no published vLLM image names them) stops make serve-image with exit 2
    and the way out, before Docker is touched; the profile itself is valid."""
    result = subprocess.run(["make", "-s", "serve-image", "ARCH=gfx1201"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "no vLLM image is published for gfx1201" in result.stderr and "ROCMFT_SERVE_IMAGE" in result.stderr
    assert "docker" not in result.stdout


def test_an_unpinned_rocm_base_is_refused_where_a_pin_is_required():
    """The publishing workflow sets REQUIRE_PINNED_BASE=1: a moving tag stops the build before any pull (the
    profile's digest is emptied on the command line, so this holds once `make pin-bases` has filled it in)."""
    result = subprocess.run(["make", "image", "ARCH=gfx942", "BASE_DIGEST=", "REQUIRE_PINNED_BASE=1"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "is not pinned by digest" in result.stderr
    assert "rocm/dev-ubuntu-24.04:7.2.4-complete" in result.stderr and "make pin-bases" in result.stderr
    assert "pulling" not in result.stdout
    for value, refused in (("yes", True), ("true", True), ("0", False)):
        command = ["make", "-s", "pin-check", "ARCH=gfx942", "BASE_DIGEST=", f"REQUIRE_PINNED_BASE={value}"]
        shown = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        assert (shown.returncode != 0) == refused and "is not pinned by digest" in shown.stderr, (value, shown.stderr)
    typo = subprocess.run(["make", "-s", "pin-check", "ARCH=gfx942", "REQUIRE_PINNED_BASE=on"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    assert typo.returncode != 0 and "REQUIRE_PINNED_BASE=on: use 1" in typo.stderr


def entry_environment(tmp_path: Path, arch: str, **user: str) -> set[str]:
    """The environment container-entry.sh hands rocmft under ``arch``'s profile (a stand-in rocmft prints it)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "rocmft").write_text('#!/bin/sh\necho "args=$*"\nenv\n')
    (fake / "rocmft").chmod(0o755)
    environ = {"PATH": f"{fake}:{os.environ['PATH']}", "ARCH_PROFILE": str(REPO / f"docker/arch/{arch}.env"), **user}
    result = subprocess.run(["sh", str(REPO / "entrypoint" / "container-entry.sh"), "check"], env=environ,
                            capture_output=True, text=True, check=True)  # fmt: skip
    return set(result.stdout.splitlines())


def test_entry_script_leaves_the_runtime_profile_to_rocmft(tmp_path):
    """The profile's RUNTIME_ lines are applied by rocmft's launch (rocmft.launch.spec.runtime_environment;
    tests/test_launch.py), the one place every way of starting rocmft goes through: the entry script passes the
    arguments and the environment on unchanged, so a value in the launch record is never mistaken for the user's."""
    lines = entry_environment(tmp_path, "gfx942", NCCL_DEBUG="INFO")
    assert "args=check" in lines and "NCCL_DEBUG=INFO" in lines
    assert not any(line.startswith(("HSA_NO_SCRATCH_RECLAIM=", "HIP_FORCE_DEV_KERNARG=")) for line in lines)


def test_env_example_variables_are_accepted_by_rocmft():
    from rocmft.config.settings import load_settings

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


def _compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode
    ):
        pytest.fail("no `docker compose` here; `make docker-ready` links Compose v2 from .venv")
    return subprocess.run(["docker", "compose", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_the_build_file_refuses_to_run_without_make():
    """`docker compose build` outside make once built FROM "" (compose passed an empty BASE_IMAGE): the build
    file names the missing variable and make; compose.yaml, which users run, has nothing to build."""
    clean = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "ARCH", "BASE_IMAGE", "COMPOSE_FILE")}
    result = _compose("-f", "docker/build.yaml", "config", env={**clean, "IMAGE": "x"})
    assert result.returncode != 0 and "make image ARCH=<arch>" in result.stderr
    services = _compose("-f", "compose.yaml", "config", "--format", "json", env=clean)
    assert services.returncode == 0, services.stderr
    assert '"build"' not in services.stdout


def test_the_rocm_lock_has_no_cuda_pin_and_takes_torch_from_the_rocm_index():
    """One lock per flavour: nothing CUDA-only (nvidia-*, cuda-*, PyPI's triton) in the ROCm lock, and the torch
    triple at the profile's ROCm local version."""
    for arch in ROCM_ARCHS:
        values = read_profile(REPO / "docker" / "arch" / f"{arch}.env")
        pins = dict(line.split("==", 1) for line in (REPO / values["LOCK"]).read_text().splitlines()
                    if "==" in line and not line.startswith("#"))  # fmt: skip
        assert not [name for name in pins if re.match(r"^(nvidia-|cuda-|triton$)", name)], arch
        label = f"+rocm{values['ROCM_VERSION']}"
        assert all(pins[name].endswith(label) for name in ("torch", "torchvision", "torchaudio")), pins
        assert "triton-rocm" in pins and "bitsandbytes" in pins and "liger-kernel" in pins


def test_the_rocm_lock_refuses_a_profile_that_is_not_rocm():
    """Pointed at the cpu profile it once overwrote constraints.txt with a `+rocmnone` torch; now it refuses."""
    before = (REPO / "constraints.txt").read_text()
    result = subprocess.run([sys.executable, str(REPO / "docker" / "lock" / "rocm_lock.py"), "--write", "--profile",
                             str(REPO / "docker" / "arch" / "cpu.env")], capture_output=True, text=True)  # fmt: skip
    assert result.returncode != 0 and "is not a ROCm profile" in result.stderr and "make lock" in result.stderr
    assert (REPO / "constraints.txt").read_text() == before


def _rocm_lock_check(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "docker" / "lock" / "rocm_lock.py"), "--check", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=900)  # fmt: skip


def test_the_rocm_lock_is_what_resolving_pyproject_gives():
    """docker/lock/rocm7.2.txt is a complete resolution of pyproject.toml: resolving it again (uv, PyPI as of the
    lock's date) under the lock's own pins gives the same file. Held to the pins because this host's PyPI fills in
    late (rocm_lock.py's docstring; CI's run of de1c04b failed on regex 2026.11.24 arriving). Needs PyPI."""
    result = _rocm_lock_check()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


@pytest.mark.parametrize("edit", ["drop regex", "torch 2.10.0"])
def test_a_rocm_lock_that_no_longer_resolves_pyproject_is_stale(edit, tmp_path):
    """The check can fail: a lock missing a package the requirements bring (regex, via transformers) or pinning a
    version pyproject.toml excludes (torch==2.11.0 there) is reported stale, with the fix. Needs PyPI."""
    lock = REPO / read_profile(REPO / "docker" / "arch" / "gfx942.env")["LOCK"]
    lines = lock.read_text().splitlines(keepends=True)
    if edit == "drop regex":
        lines = [line for line in lines if not line.startswith("regex==")]
    else:
        lines = [line.replace("torch==2.11.0+", "torch==2.10.0+") for line in lines]
    edited = tmp_path / "rocm.txt"
    edited.write_text("".join(lines))
    assert edited.read_text() != lock.read_text()
    result = _rocm_lock_check("--profile", str(REPO / "docker" / "arch" / "gfx942.env"), "--lock", str(edited))
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    assert "make lock-rocm" in result.stderr
    if edit == "drop regex":
        assert "+regex==" in result.stdout


@pytest.mark.parametrize("lock", ["docker/lock/rocm7.2.txt", "constraints.txt"])
def test_the_pins_stage_gives_torch_and_flash_attn_only_their_own_pins(lock, tmp_path):
    """Issue 31, finding 2: docker/steps/pins.sh, run on each flavour's lock as the Dockerfile's pins stage runs it,
    gives the torch and flash-attn stages their pins at the lock's versions and nothing of the stack, so that a
    re-pin of the stack leaves those stages' files, and so their layers, as they were."""
    subprocess.run(["bash", str(REPO / "docker/steps/pins.sh"), str(REPO / lock), str(tmp_path)], check=True,
                   capture_output=True)  # fmt: skip

    def pins(path: Path) -> dict[str, str]:  # {PEP 503 name: version}; constraints.txt has Jinja2, typing_extensions
        lines = (line.split("==", 1) for line in path.read_text().splitlines() if "==" in line)
        return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in lines}

    locked = pins(REPO / lock)
    split = {name: pins(tmp_path / f"{name}.txt") for name in ("system", "torch", "flash-attn")}
    for stage in split.values():
        assert all(locked[name] == version for name, version in stage.items()), stage
    torch_needs = {"torch", "torchvision", "torchaudio", "typing-extensions", "jinja2", "markupsafe", "numpy"}
    assert torch_needs <= set(split["torch"]), split["torch"]
    assert {"ninja", "packaging"} <= set(split["flash-attn"])
    stack_only = {"httpx", "transformers", "llamafactory", "peft", "accelerate", "einops", "deepspeed"}
    assert not stack_only & (set(split["torch"]) | set(split["flash-attn"]) | set(split["system"])), split


def test_the_build_tools_are_locked_and_the_locked_wheel_gives_flash_attn_its_base_class(tmp_path):
    """Issue 31, finding 8: docker/steps/system.sh installs pyproject's build requirements (setuptools, wheel) under
    the lock, and flash-attn builds against them without isolation; its setup.py imports ``wheel.bdist_wheel``, a
    shim wheel announces it will remove. Each ROCm lock pins both, and at those versions, installed from PyPI, the
    import flash-attn 2.8.3 makes (its setup.py, line 20) gives a setuptools command it can subclass. Needs PyPI."""
    import tomllib

    names = [re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].lower()
             for r in tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]]  # fmt: skip
    assert names == ["setuptools", "wheel"]
    locks = {read_profile(REPO / "docker" / "arch" / f"{arch}.env")["LOCK"] for arch in ROCM_ARCHS}
    for lock in sorted(locks):
        pins = dict(line.split("==", 1) for line in (REPO / lock).read_text().splitlines()
                    if "==" in line and not line.startswith("#"))  # fmt: skip
        missing = [name for name in names if name not in pins]
        assert not missing, f"{lock} does not pin {missing}: system.sh would install whatever PyPI has that day"
        target = tmp_path / lock.replace("/", "_")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        *(f"{name}=={pins[name]}" for name in names)], check=True, timeout=300)  # fmt: skip
        probe = "\n".join([
            "import setuptools, wheel",
            "from wheel.bdist_wheel import bdist_wheel as _bdist_wheel",
            "from setuptools.command.bdist_wheel import bdist_wheel",
            "class CachedWheelsCommand(_bdist_wheel): pass",
            "print(setuptools.__version__, wheel.__version__, issubclass(CachedWheelsCommand, bdist_wheel))",
        ])  # fmt: skip
        result = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(target)},
                                capture_output=True, text=True, check=True)  # fmt: skip
        assert result.stdout.split() == [pins["setuptools"], pins["wheel"], "True"], result.stderr


def test_the_publishing_workflow_lint_catches_a_broken_workflow(tmp_path):
    """The workflow cannot run here; `make lint` validates it against GitHub's schema. That validator is real:
    it accepts ours and refuses a job with a misspelt key."""
    validator = [str(Path(sys.executable).with_name("check-jsonschema")), "--builtin-schema", "vendor.github-workflows"]
    ours = subprocess.run(
        [*validator, str(REPO / ".github" / "workflows" / "images.yml")], capture_output=True, text=True
    )
    assert ours.returncode == 0, ours.stdout + ours.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(
        (REPO / ".github" / "workflows" / "images.yml").read_text().replace("    steps:\n", "    stepz:\n")
    )
    refused = subprocess.run([*validator, str(broken)], capture_output=True, text=True)
    assert refused.returncode != 0 and "stepz" in refused.stdout


@pytest.mark.parametrize(
    ("dockerfile", "ignore", "copies"),
    [
        ("Dockerfile", ".dockerignore", 10),
        ("docker/serve/Dockerfile.cpu", "docker/serve/Dockerfile.cpu.dockerignore", 2),
        ("docker/trackers/Dockerfile", "docker/trackers/Dockerfile.dockerignore", 2),
    ],
)
def test_every_path_the_dockerfile_copies_is_in_the_build_context(dockerfile, ignore, copies):
    """A COPY whose source .dockerignore leaves out fails the build of every image (docker/patches, added without
    its .dockerignore line, broke the cpu image and every Docker test of a CI rehearsal). docker-py's own reading of
    .dockerignore (docker.utils.build.exclude_paths, Docker's matching rules) gives the files the context holds; the
    serve and trackers images read their own <Dockerfile>.dockerignore (BuildKit's rule for a Dockerfile's name)."""
    from docker.utils.build import exclude_paths

    context = exclude_paths(str(REPO), (REPO / ignore).read_text().splitlines())
    values = {"ARCH": "gfx942", "LOCK": "docker/lock/rocm7.2.txt"}
    sources = []
    for line in (REPO / dockerfile).read_text().splitlines():
        words = line.split()
        if words[:1] != ["COPY"] or any(w.startswith("--from") for w in words):
            continue
        paths = [w for w in words[1:-1] if not w.startswith("--")]
        sources += [re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], p).rstrip("/") for p in paths]
    assert len(sources) >= copies, sources  # the recipe's COPY lines were read
    missing = [s for s in sources if s not in context]
    assert not missing, f"COPY sources the build context lacks (add them to .dockerignore's allow-list): {missing}"


FAKE_DOCKER = """#!/bin/sh
# records each call with the BUILD_DATE it was given; every call succeeds (an engine, Compose and the base are "there")
echo "$* BUILD_DATE=${BUILD_DATE:-}" >> "$DOCKER_CALLS"
"""


def test_make_image_dates_unchanged_sources_by_their_commit_and_prunes_the_image_it_replaced(checkout_copy, tmp_path):
    """`make smoke` then `make test` built rocmft:cpu twice and left the first as a 6.9 GB <none> image (issue 33):
    the real recipe of `make image`, with a docker on PATH that records its calls, in a git checkout. Unchanged
    sources get their commit's date (a cache hit, the same image); changed ones the build's; after the tags move,
    only rocmft's own untagged images of this architecture and kind are pruned."""
    root, calls, shim = checkout_copy.root, tmp_path / "calls.log", tmp_path / "bin"
    shim.mkdir()
    (shim / "docker").write_text(FAKE_DOCKER)
    (shim / "docker").chmod(0o755)
    committed = "2026-01-02T03:04:05Z"
    git_env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_COMMITTER_DATE": committed}  # fmt: skip
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", *command], cwd=root, env=git_env, check=True, capture_output=True)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "DOCKER_CALLS": str(calls)}
    venv = REPO / ".venv"

    def make_image() -> list[str]:
        calls.write_text("")
        result = subprocess.run(["make", "-o", str(venv / "bin" / ".installed"), "image", "ARCH=cpu", f"VENV={venv}"],
                                cwd=root, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        return calls.read_text().splitlines()

    clean = make_image()
    build = next(line for line in clean if " build image " in line)
    assert build.endswith(f"BUILD_DATE={committed}"), build
    tag = next(i for i, line in enumerate(clean) if line.startswith("tag rocmft:cpu "))
    prune = [i for i, line in enumerate(clean) if line.startswith("image prune ")]
    assert prune and prune[0] > tag, clean
    assert clean[prune[0]].split(" BUILD_DATE=")[0] == (
        "image prune --force --filter label=org.opencontainers.image.title=rocmft --filter label=io.rocmft.arch=cpu "
        "--filter label=io.rocmft.rehearsal=0"
    )
    (root / "templates" / "demo.yaml").write_text((root / "templates" / "demo.yaml").read_text() + "# changed\n")
    changed = next(line for line in make_image() if " build image " in line)
    assert f"BUILD_DATE={committed}" not in changed and re.search(r"BUILD_DATE=20\d\d-\d\d-\d\dT", changed), changed
