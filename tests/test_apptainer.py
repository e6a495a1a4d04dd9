"""The cpu image as an Apptainer image (SIF), run the way a cluster runs it: read-only, as the invoking user,
``--containall``, writing only to bound folders.

This machine has no apptainer (Debian packages it only in sid, for glibc >= 2.38), so `make sif` builds the SIF in
the helper image of docker/apptainer/helper-image.sh, and the run happens in that same helper image: a Docker
container (with what HELPER_RUN lists, for the user namespace and FUSE mount apptainer makes) in which a non-root user
runs ``apptainer run``. On a host with apptainer, both use it directly.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from rocmft.errors import ExitCode

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.docker
# apptainer on this host, run by a user: that user; else (this machine: no apptainer, tests run as root) the helper
# image, run as uid/gid 4321, a non-root invoking user as in test_docker.py
HOST_APPTAINER = bool(shutil.which("apptainer")) and os.getuid() != 0
USER = (os.getuid(), os.getgid()) if HOST_APPTAINER else (4321, 4321)
# The built-in default's tiny model and demo data, for 30 optimizer steps instead of its 240 (several minutes on a
# 2-core CI machine; the full run is what test_docker.py's compose test trains)
STEPS = 30


def place(sif: Path, target: Path) -> None:
    """The session's SIF at ``target``: a hard link where both are on one file system (no copy of several GB);
    ``target``'s folder is made traversable for the invoking user (pytest makes its folders 0700)."""
    target.parent.chmod(0o755)
    try:
        os.link(sif, target)
    except OSError:
        shutil.copy(sif, target)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="session")
def cpu_sif(request, tmp_path_factory) -> Path:
    """`make sif ARCH=cpu` of the docker tests' cpu image (built once per session by the cpu_image fixture), or
    the SIF named by SIF_UNDER_TEST, one `make sif ARCH=cpu` already made of this checkout's cpu image (the build
    reads the 6.9 GB image once: minutes on a 2-core machine, docs/clusters.md)."""
    if os.environ.get("SIF_UNDER_TEST"):
        return Path(os.environ["SIF_UNDER_TEST"])
    request.getfixturevalue("cpu_image")
    sif = tmp_path_factory.mktemp("sif") / "rocmft-cpu.sif"
    started = time.monotonic()
    result = subprocess.run(["make", "sif", "ARCH=cpu", f"SIF={sif}"], cwd=REPO, capture_output=True, text=True,
                            timeout=3600)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    print(f"make sif ARCH=cpu: {time.monotonic() - started:.0f} s, {sif.stat().st_size / 2**30:.2f} GiB")
    return sif


# What a Docker container needs for an unprivileged apptainer inside it (tried here, 2026-12-01): user namespaces
# (docker's default seccomp profile refuses them: seccomp=unconfined, and SYS_ADMIN), /dev/fuse usable by the user
# (squashfuse mounts the SIF), and /proc without docker's masked paths (apptainer mounts a new proc in its user
# namespace, which the kernel refuses over a partly covered /proc: systempaths=unconfined). --privileged itself
# fails on this machine: its bounding set lacks CAP_SYS_RESOURCE ("unable to apply caps").
HELPER_RUN = ["--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
              "--security-opt", "systempaths=unconfined", "--device", "/dev/fuse"]  # fmt: skip
# as root in the helper: make /dev/fuse the user's, give the uid a passwd entry (apptainer needs one), become it
AS_USER = ('chmod 666 /dev/fuse && groupadd -g "$1" user && useradd -u "$1" -g "$1" -M -d /w/home user && '
           'mkdir -p /w/home && chown "$1:$1" /w/home && shift && exec setpriv --reuid user --regid user '
           '--init-groups env HOME=/w/home apptainer "$@"')  # fmt: skip


def apptainer(folder: Path, *args: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess, str]:
    """``apptainer ARGS`` as uid/gid 4321, ``{w}`` in ARGS standing for ``folder`` as apptainer sees it. On this host
    when it has apptainer and we are not root; else in the helper image, with ``folder`` at /w. Returns the
    result and what ``{w}`` stood for."""
    if HOST_APPTAINER:
        args = tuple(a.replace("{w}", str(folder)) for a in args)
        return subprocess.run(["apptainer", *args], capture_output=True, text=True, timeout=timeout), str(folder)
    helper = subprocess.run([str(REPO / "docker/apptainer/helper-image.sh")], capture_output=True, text=True)
    assert helper.returncode == 0, helper.stderr
    args = tuple(a.replace("{w}", "/w") for a in args)
    command = ["docker", "run", "--rm", *HELPER_RUN, "-v", f"{folder}:/w", "--entrypoint", "sh", helper.stdout.strip(),
               "-c", AS_USER, "sh", str(USER[0]), *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout), "/w"


def test_the_sif_trains_the_builtin_default_read_only_into_the_bound_saves_folder(cpu_sif, tmp_path):
    """`apptainer run --containall` with saves, cache, data and models bound and a node-local work folder
    (--workdir: /tmp inside) trains the built-in default (MAX_STEPS=30): exit 0, the run in the bound saves folder
    owned by the invoking user, the caches under the node-local folder, and the SIF unchanged."""
    sif = tmp_path / "rocmft-cpu.sif"
    place(cpu_sif, sif)
    before = sha256(sif)
    folders = {name: tmp_path / name for name in ("saves", "cache", "data", "models", "node-local")}
    for folder in folders.values():
        folder.mkdir()
        if os.getuid() == 0:
            os.chown(folder, *USER)
    binds = ",".join(f"{{w}}/{n}:/{n}" for n in ("saves", "cache", "data", "models"))
    started = time.monotonic()
    result, _ = apptainer(tmp_path, "run", "--containall", "--workdir", "{w}/node-local", "--bind", binds,
                          "--env", f"MAX_STEPS={STEPS}", "{w}/rocmft-cpu.sif", "train")  # fmt: skip
    seconds = time.monotonic() - started
    log = result.stdout + result.stderr
    print(f"apptainer run ... train: {seconds:.0f} s")
    assert result.returncode == ExitCode.OK, log[-6000:]
    output = folders["saves"] / "rocmft-demo"
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["image"]["arch"] == "cpu"
    assert json.loads((output / "trainer_state.json").read_text())["global_step"] == STEPS
    assert (output / "model.safetensors").is_file() and (output / "training_loss.png").is_file()
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in output.rglob("*")}
    assert owners == {USER}, owners
    # the node-local caches: decided (printed, recorded in the launch record) and used (the tokenised data is there)
    environment = manifest["launch"]["environment"]
    local = f"/tmp/rocmft-{USER[0]}"
    assert environment["HF_DATASETS_CACHE"] == f"{local}/datasets", environment
    assert environment["MIOPEN_USER_DB_PATH"] == f"{local}/miopen/db"
    assert f"HF_DATASETS_CACHE={local}/datasets: " in log and "(node-local caches, rocmft.facts.caches)" in log
    datasets = folders["node-local"] / "tmp" / f"rocmft-{USER[0]}" / "datasets"
    assert any(datasets.rglob("*.arrow")), sorted(str(p) for p in folders["node-local"].rglob("*"))[:50]
    assert sha256(sif) == before


def test_the_image_is_read_only_and_runs_as_the_invoking_user(cpu_sif, tmp_path):
    """Inside the SIF nothing outside the bound folders can be written, and the process is the invoking user."""
    script = "id -u; touch /opt/venv/x 2>&1; touch /home/rocmft/x 2>&1; echo ok > /saves/x && cat /saves/x"
    (tmp_path / "saves").mkdir()
    if os.getuid() == 0:
        os.chown(tmp_path / "saves", *USER)
    sif = tmp_path / "rocmft-cpu.sif"
    place(cpu_sif, sif)
    result, _ = apptainer(tmp_path, "exec", "--containall", "--bind", "{w}/saves:/saves", "{w}/rocmft-cpu.sif",
                          "sh", "-c", script)  # fmt: skip
    lines = result.stdout.splitlines()
    assert lines[0] == str(USER[0]), result.stdout + result.stderr
    assert "Read-only file system" in lines[1] and "Read-only file system" in lines[2], lines
    assert lines[3] == "ok" and (tmp_path / "saves" / "x").stat().st_uid == USER[0]


# Stand-ins for what build-sif.sh runs before its squashfs step: docker (the image exists, its architecture, OS and
# configuration; `docker run` of the helper image), apptainer and mksquashfs. Each records its call and the one that
# would start the conversion (apptainer build here, docker run in the helper) exits 3, so the script stops there.
STAND_INS = {
    "docker": """#!/bin/sh
echo "docker $1" >>"$CALLS"
case "$*" in
  *Architecture*) echo amd64 ;;
  *.Os*) echo linux ;;
  *"json .Config"*) echo '{}' ;;
  run*) exit 3 ;;
esac
""",
    "apptainer": '#!/bin/sh\necho "apptainer $1" >>"$CALLS"\nexit 3\n',
}


@pytest.mark.parametrize(("version_line", "where"), [
    ("mksquashfs version 4.5.1 (2022/03/17)", "in rocmft-apptainer:1.4.5"),
    ("mksquashfs version 4.3-git (2014/06/09)", "in rocmft-apptainer:1.4.5"),
    ("mksquashfs: unknown option", "in rocmft-apptainer:1.4.5"),
    ("mksquashfs version 4.6.1 (2023/03/25)", "on this host"),
    ("mksquashfs version 4.7.2 (2025/07/01)", "on this host"),
])  # fmt: skip
def test_a_host_mksquashfs_older_than_4_6_is_said_and_the_helper_image_used(tmp_path, version_line, where):
    """Issue 31, finding 8: the host branch pipes two concatenated tars into `mksquashfs -tar -ignore-zeros`, which
    squashfs-tools reads from 4.6 on; RHEL 8/9 and Ubuntu 22.04 ship older. build-sif.sh runs with stand-ins whose
    mksquashfs prints ``version_line`` for ``-version``: the branch taken is the one the version allows."""
    fake = tmp_path / "bin"
    fake.mkdir()
    scripts = {**STAND_INS, "mksquashfs": f'#!/bin/sh\necho "mksquashfs $1" >>"$CALLS"\necho "{version_line}"\n'}
    for name, text in scripts.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    calls, out = tmp_path / "calls", tmp_path / "out"
    out.mkdir()
    result = subprocess.run(["bash", str(REPO / "docker/apptainer/build-sif.sh"), "rocmft:cpu", str(out / "x.sif")],
                            env={"PATH": f"{fake}:/usr/bin:/bin", "CALLS": str(calls)}, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert f"Apptainer's OCI conversion of rocmft:cpu's configuration ({where})" in result.stderr
    old = "needs squashfs-tools >= 4.6: building in the helper image instead" in result.stderr
    assert old == (where != "on this host"), result.stderr
    ran = calls.read_text().splitlines()  # each call's program and first argument
    assert "mksquashfs -version" in ran
    assert ("apptainer -q" in ran, "docker run" in ran) == ((True, False) if where == "on this host" else (False, True))
    assert not list(out.iterdir())  # nothing half-written beside the target: the work folder is removed
