"""Node-local caches on clusters (rocmft.facts.caches) and the warning for a Hugging Face cache on a network file
system (the hf-cache-locks check). Mount tables marked "injected" are made up; one case reads this machine's own."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rocmft.changes import change_lines
from rocmft.checks import PASS, WARN, CheckSubject
from rocmft.checks.host import hf_cache_locks
from rocmft.facts.caches import NODE_LOCAL_CACHES, cache_environment, mount_of, node_local_caches
from rocmft.facts.probes import Probes
from rocmft.launch import prepare_launch

CACHE_VARIABLES = {"MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                   "HF_DATASETS_CACHE"}  # fmt: skip


def test_outside_a_cluster_nothing_moves():
    assert node_local_caches({"HOME": "/home/me", "HF_HOME": "/cache/huggingface"}, uid=1000) == {}


def test_a_slurm_job_moves_every_cache_under_its_tmpdir_per_user():
    choices = node_local_caches({"SLURM_JOB_ID": "4711", "TMPDIR": "/local/slurm-4711"}, uid=1234)
    assert set(choices) == CACHE_VARIABLES == set(NODE_LOCAL_CACHES)
    assert choices["MIOPEN_USER_DB_PATH"].value == "/local/slurm-4711/rocmft-1234/miopen/db"
    assert choices["HF_DATASETS_CACHE"].value == "/local/slurm-4711/rocmft-1234/datasets"
    assert len({c.value for c in choices.values()}) == len(choices)  # one folder each
    assert all(c.reason.startswith("SLURM_JOB_ID is set: ") for c in choices.values())


@pytest.mark.parametrize("marker", ["APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"])
def test_inside_apptainer_without_tmpdir_the_root_is_tmp(marker):
    values = cache_environment({marker: "/scratch/rocmft-cpu.sif"}, uid=1000)
    assert values["TRITON_CACHE_DIR"] == "/tmp/rocmft-1000/triton"
    assert values["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/rocmft-1000/inductor"


def test_the_users_own_values_win_even_empty_ones():
    environ = {"SLURM_JOB_ID": "1", "TRITON_CACHE_DIR": "/mine/triton", "MIOPEN_USER_DB_PATH": ""}
    values = cache_environment(environ, uid=0)
    assert "TRITON_CACHE_DIR" not in values and "MIOPEN_USER_DB_PATH" not in values
    assert set(values) == CACHE_VARIABLES - {"TRITON_CACHE_DIR", "MIOPEN_USER_DB_PATH"}


def test_the_launch_adds_and_records_them_and_says_so(render_env, monkeypatch, tmp_path):
    """prepare_launch of a real rendered plan in a (pretend) Slurm job: the variables are in the launch record
    (rocmft.launch.LaunchSpec.environment, written to the manifest), and the printed line names them."""
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node-local"))
    for name in CACHE_VARIABLES:  # torch's inductor sets TORCHINDUCTOR_CACHE_DIR in os.environ when first asked
        monkeypatch.delenv(name, raising=False)  # (by an earlier test in this process): the run's start has none
    plan = render_env({"DATASET": "identity"})
    launch = prepare_launch(plan)
    environment = launch.environment
    root = tmp_path / "node-local" / f"rocmft-{os.getuid()}"
    assert environment["TRITON_CACHE_DIR"] == str(root / "triton")
    assert {name for name in environment if name in NODE_LOCAL_CACHES} == CACHE_VARIABLES
    said = [line for line in change_lines(launch.changes) if f"TRITON_CACHE_DIR={root / 'triton'}: " in line]
    assert said and said[0].endswith("(node-local caches, rocmft.facts.caches)"), said


# ---- the file system a path lies on, and the hf-cache-locks check ----------------------------------------------
def table(*rows: tuple[str, str]) -> list[SimpleNamespace]:
    """An injected mount table: (mount point, fstype) rows in mount order."""
    return [SimpleNamespace(mountpoint=point, fstype=kind, device=f"dev-{i}") for i, (point, kind) in enumerate(rows)]


INJECTED_CLUSTER = table(("/", "overlay"), ("/home", "nfs4"), ("/lus", "lustre"), ("/lus/flare/projects", "gpfs"),
                         ("/tmp", "tmpfs"), ("/scratch", "beegfs"))  # fmt: skip


def test_mount_of_takes_the_longest_mount_point_prefix_injected():
    assert mount_of("/lus/flare/projects/p1/hf", INJECTED_CLUSTER).fstype == "gpfs"
    assert mount_of("/lus/other", INJECTED_CLUSTER).fstype == "lustre"
    assert mount_of("/homework/x", INJECTED_CLUSTER).fstype == "overlay"  # a prefix of the string, not of the path
    assert mount_of("/home", INJECTED_CLUSTER).mountpoint == "/home"
    assert mount_of("/x", []) is None


def test_mount_of_follows_symbolic_links_injected(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    rows = table(("/", "ext4"), (str(tmp_path / "real"), "nfs"))
    assert mount_of(tmp_path / "link" / "hub", rows).fstype == "nfs"


def plan_with(paths: dict[str, str], partitions=None) -> SimpleNamespace:
    probe = {"hf_paths": paths} if partitions is None else {"hf_paths": paths, "partitions": partitions}
    return CheckSubject(plan=SimpleNamespace(), probes=Probes(injected={"hf_cache": probe}))


@pytest.mark.parametrize(("home", "kind"), [("/home/me/.cache/huggingface", "nfs4"), ("/lus/p/hf", "lustre"),
                                            ("/lus/flare/projects/hf", "gpfs"), ("/scratch/hf", "beegfs")])  # fmt: skip
def test_hf_home_on_a_network_file_system_warns_with_a_remedy_injected(home, kind):
    outcome = hf_cache_locks(plan_with({"HF_HOME": home, "HF_HUB_CACHE": f"{home}/hub"}, INJECTED_CLUSTER))
    assert outcome.status == WARN and outcome.value == f"HF_HOME on {kind}"
    assert "PR #4228" in outcome.message and "HF_HUB_CACHE" in outcome.message
    assert "HF_HOME" in outcome.remedy and "HF_HUB_OFFLINE=1" in outcome.remedy


def test_only_the_hub_cache_on_cifs_warns_too_injected():
    rows = table(("/", "ext4"), ("/mnt/share", "cifs"))
    outcome = hf_cache_locks(plan_with({"HF_HOME": "/root/.cache/huggingface", "HF_HUB_CACHE": "/mnt/share/hub"}, rows))
    assert outcome.status == WARN and outcome.value == "HF_HUB_CACHE on cifs"


def test_node_local_hf_home_passes_injected():
    outcome = hf_cache_locks(plan_with({"HF_HOME": "/tmp/hf", "HF_HUB_CACHE": "/tmp/hf/hub"}, INJECTED_CLUSTER))
    assert outcome.status == PASS and outcome.value == "HF_HOME on tmpfs, HF_HUB_CACHE on tmpfs"


def test_this_machines_own_mounts_give_no_warning(tmp_path, monkeypatch):
    """The real mount table (psutil.disk_partitions(all=True)) and huggingface_hub's own resolution of HF_HOME:
    tmp_path here is on ext4, overlay or tmpfs, where locks lock."""
    import importlib

    import huggingface_hub.constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    importlib.reload(huggingface_hub.constants)
    try:
        outcome = hf_cache_locks(CheckSubject(plan=SimpleNamespace()))
    finally:
        monkeypatch.undo()
        importlib.reload(huggingface_hub.constants)
    assert outcome.status == PASS, outcome
    assert outcome.data["HF_HOME"]["path"] == str(tmp_path / "hf")
    assert outcome.data["HF_HOME"]["fstype"] in {"ext4", "overlay", "tmpfs", "xfs", "btrfs"}
    assert Path(outcome.data["HF_HUB_CACHE"]["path"]) == tmp_path / "hf" / "hub"
