"""Every message that asks the container for something gives the exact flag to pass (issue 30, item 11): Docker's
``docker run`` flag, the Compose key, and Apptainer's or Kubernetes' where there is one (rocmft.container, their one
home). Each message here is produced by the real check or rule on the fault it reports, with the machine's facts
injected into the probe provider (tests/test_gpu_checks.py's shapes: no GPU here) or the fault made for real (a
missing folder, a file where a folder goes). The reports behind the flags: ROCm/ROCm-docker#39 (which flags give a
container the GPUs), ROCm/legacy-rocm-build#1798 (/dev/kfd missing under Apptainer's --containall until bound)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.test_gpu_checks import devices, gpu, plan

from rocmft.checks import FAIL, WARN, CheckSubject, host, node
from rocmft.checks import gpu as checks
from rocmft.config.cmdline import parse_command_line
from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.facts.probes import Probes
from rocmft.validate.rules import render_checked

GPU_FLAGS = ["--device=/dev/kfd --device=/dev/dri --group-add video", "devices: [/dev/kfd, /dev/dri]",
             "group_add: [video]", "apptainer exec --rocm", "--bind /dev/kfd,/dev/dri"]  # fmt: skip


def has_all(text: str, words: list[str]) -> None:
    for word in words:
        assert word in text, (word, text)


# --- checks, with the machine's facts injected -----------------------------------------------------------------
def test_gpu_devices_missing_gives_the_device_flags():
    outcome = checks.gpu_devices(plan(device_nodes=[]))  # injected: a container started without --device
    assert outcome.status == FAIL
    has_all(outcome.remedy, GPU_FLAGS)


def test_gpu_devices_not_accessible_gives_the_group_flag():
    nodes = [{"path": "/dev/kfd", "gid": 44, "access": True}, {"path": "/dev/dri/renderD128", "gid": 109,
                                                                "access": False}]  # fmt: skip
    outcome = checks.gpu_devices(plan(device_nodes=nodes))  # injected: the render node's group not added
    assert outcome.status == FAIL
    has_all(outcome.remedy, ["docker run --group-add 109", "RENDER_GID=109 in .env", "usermod -aG render,video",
                             "RENDER_GID=109 deploy/k8s/render.sh"])  # fmt: skip


def test_gpu_runtime_without_gpus_gives_the_device_flags():
    outcome = checks.gpu_runtime(plan(probe=devices(visible={"HIP_VISIBLE_DEVICES": ""})))  # injected: no GPU
    assert outcome.status == FAIL
    has_all(outcome.remedy, [*GPU_FLAGS, "HIP_VISIBLE_DEVICES"])


def test_a_failed_gpu_probe_gives_the_device_flags():
    outcome = checks.gpu_runtime(plan(probe={"error": "the probe exited -11: Segmentation fault", "timed_out": False}))
    assert outcome.status == FAIL
    has_all(outcome.remedy, [*GPU_FLAGS, "dmesg"])


def test_a_hung_all_reduce_names_the_ipc_flag():
    hung = plan(probe=devices(gpu(0), gpu(1)), launcher="torchrun", allreduce={"error": "no answer", "timed_out": True})
    outcome = checks.collectives(hung)  # injected: the all-reduce probe timed out
    assert outcome.status == FAIL
    has_all(outcome.remedy, ["docker run --ipc=host", "--shm-size=8g", "compose: ipc: host", "shm_size: 8gb"])


def test_shm_too_small_gives_the_size_flags():
    outcome = checks.shm(plan(probe=devices(gpu(0), gpu(1)), launcher="torchrun", workers=2, shm_bytes=64 << 20))
    assert outcome.status == FAIL
    has_all(outcome.remedy, ["docker run --shm-size=3g", "--ipc=host", "compose: shm_size: 3gb", "medium: Memory"])


def test_an_unreadable_kernel_log_gives_the_flags_that_let_the_container_read_it(tmp_path):
    from tests.test_node_checks import card, node_plan

    card(tmp_path, 0, "0000:c1:00.0")  # SYNTHETIC sysfs: one amdgpu card
    # injected: what os.open("/dev/kmsg") gives a container under kernel.dmesg_restrict=1 without CAP_SYSLOG
    outcome = node.gpu_faults(node_plan(tmp_path, kmsg={"records": [], "error": "EPERM: Operation not permitted"}))
    assert outcome.status == WARN
    has_all(outcome.remedy, ["docker run --device=/dev/kmsg --cap-add=SYSLOG", "cap_add: [SYSLOG]"])


def test_a_hub_cache_where_locks_do_not_lock_gives_the_mount_flag():
    from tests.test_caches import INJECTED_CLUSTER, plan_with

    # injected: a mount table with HF_HOME on NFS
    outcome = host.hf_cache_locks(plan_with({"HF_HOME": "/home/me/hf", "HF_HUB_CACHE": "/home/me/hf/hub"},
                                            INJECTED_CLUSTER))  # fmt: skip
    assert outcome.status == WARN
    has_all(outcome.remedy, ['docker run -v "/local/disk/hf:/cache/huggingface"', "Apptainer: --bind /local/disk/hf"])


def _host_subject(tmp_path: Path, output_dir: Path | None = None, **arguments) -> CheckSubject:
    stand_in = SimpleNamespace(output_dir=output_dir or tmp_path / "a-file" / "out", sources={}, arguments=arguments,
                               settings=SimpleNamespace(environ={}))  # fmt: skip
    return CheckSubject(plan=stand_in, probes=Probes())


def test_an_unwritable_output_dir_gives_the_user_and_volume_flags(tmp_path):
    # for real: no folder can be made under /proc, even as root
    outcome = host.output_writable(_host_subject(tmp_path, output_dir=Path("/proc/rocmft-out")))
    assert outcome.status == FAIL
    has_all(outcome.remedy, ['docker run --user "$(id -u):$(id -g)"', "HOST_UID and HOST_GID in .env",
                             'docker run -v "$PWD/saves:/saves"', 'volumes: ["./saves:/saves"]'])  # fmt: skip
    (tmp_path / "a-file").write_text("")  # OUTPUT_DIR under a file: the file is named, and no volume advice
    outcome = host.output_writable(_host_subject(tmp_path))
    assert outcome.status == FAIL and outcome.value == f"{tmp_path / 'a-file'} is a file, not a folder"
    assert "not a file or a device" in outcome.remedy and "docker run" not in outcome.remedy


def test_a_model_path_that_is_not_there_gives_the_mount_flag(tmp_path):
    missing = str(tmp_path / "models" / "qwen")  # for real: a path with no folder behind it
    outcome = host.model(_host_subject(tmp_path, model_name_or_path=missing))
    assert outcome.status == FAIL
    has_all(outcome.remedy, [f'docker run -v "<the model folder on the host>:{missing}:ro"',
                             f"--bind <the model folder on the host>:{missing}:ro"])  # fmt: skip


# --- rules: the refusal's fix, from a real configuration -----------------------------------------------------
@pytest.fixture
def base(tmp_path, cache_dir, tiny_model) -> dict[str, str]:
    from tests.conftest import _clean_environment

    return {**_clean_environment(), "ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out"),
            "MODEL_NAME_OR_PATH": str(tiny_model)}  # fmt: skip


def _fixes(environ: dict[str, str], tmp_path: Path) -> str:
    """Every fix of the refusal of ``environ`` (rendered in-process as `rocmft render` does), joined."""

    def make_staging(_output_dir: Path) -> Path:
        (tmp_path / "staging").mkdir(exist_ok=True)
        return tmp_path / "staging"

    with pytest.raises(ConfigError) as caught:
        render_checked(load_settings(environ, parse_command_line([])), DeviceFacts(backend="cpu"), make_staging)
    return " ".join(f.fix for f in caught.value.reported())


def test_a_missing_adapter_folder_gives_the_mount_flag(base, tmp_path):
    fixes = _fixes({**base, "ADAPTER_NAME_OR_PATH": "/saves/gone"}, tmp_path)
    has_all(fixes, ['docker run -v "<the folder on the host>:/saves/gone"', 'volumes: ["<the folder on the host>'])


def test_a_windows_path_gives_the_mount_flag(base, tmp_path):
    fixes = _fixes({**base, "MODEL_NAME_OR_PATH": "C:\\Users\\me\\models\\Qwen2-0.5B"}, tmp_path)
    has_all(fixes, ['docker run -v "C:/models:/models:ro"', "/models/<name>"])


def test_a_missing_rocmft_config_gives_the_mount_flag(base, tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_settings({**base, "ROCMFT_CONFIG": "/config/mine.yaml"}, parse_command_line([]))
    has_all(caught.value.remedy, ['docker run -v "<your YAML on the host>:/config/mine.yaml:ro"'])


NVME3 = {"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3", "ROCMFT_OFFLOAD": "optimizer",
         "ROCMFT_OFFLOAD_DEVICE": "nvme"}  # fmt: skip


def test_nvme_offload_without_a_path_gives_the_mount_flag(base, tmp_path):
    fixes = _fixes({**base, **NVME3}, tmp_path)
    has_all(fixes, ["ROCMFT_NVME_PATH=/nvme", 'docker run -v "/mnt/nvme/rocmft:/nvme"'])


def test_an_nvme_path_that_is_not_there_gives_the_mount_flag(base, tmp_path):
    fixes = _fixes({**base, **NVME3, "ROCMFT_NVME_PATH": str(tmp_path / "nope")}, tmp_path)
    has_all(fixes, [f'docker run -v "<a folder on the NVMe disk>:{tmp_path / "nope"}"'])


def test_a_users_ds_config_with_nvme_and_no_path_gives_the_mount_flag(base, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}')
    fixes = _fixes({**base, "DEEPSPEED": str(ds)}, tmp_path)
    has_all(fixes, ['docker run -v "/mnt/nvme/rocmft:/nvme"'])


def test_render_into_an_unwritable_output_dir_gives_the_user_and_volume_flags(run_rocmft, tmp_path, tiny_model,
                                                                              demo_data):  # fmt: skip
    """`rocmft render` as a process (its refusal is made in the command, after the staging folder could not be):
    OUTPUT_DIR where no folder can be made (/proc, even as root), for real; under a file, the file is named."""
    env = {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
           "CUTOFF_LEN": "128", "OUTPUT_DIR": "/proc/rocmft-out"}  # fmt: skip
    result = run_rocmft("render", env=env)
    assert result.returncode == 2, result.stdout[-3000:]
    has_all(result.stdout, ["cannot be created or written", 'docker run -v "$PWD/saves:/saves"',
                            'docker run --user "$(id -u):$(id -g)"'])  # fmt: skip
    (tmp_path / "a-file").write_text("")
    result = run_rocmft("render", env={**env, "OUTPUT_DIR": str(tmp_path / "a-file" / "out")})
    assert result.returncode == 2, result.stdout[-3000:]
    has_all(result.stdout, [f"{tmp_path / 'a-file'} is a file, not a folder", "not a file or a device."])
    assert "docker run -v" not in result.stdout


def test_an_output_dir_through_a_file_or_device_is_named_as_not_a_folder(tmp_path):
    """OUTPUT_DIR=/dev/null (or a path through a file) said "FileExistsError" and gave volume and permission advice
    (a break-it trial, 2026-12-05); the reason now names what is in the way."""
    from rocmft.cli.workspace import Workspace

    (tmp_path / "notes.txt").write_text("x")
    for output_dir, said in ((tmp_path / "notes.txt" / "out", f"{tmp_path / 'notes.txt'} is a file, not a folder"),
                             (Path("/dev/null"), "/dev/null is a device or socket, not a folder")):  # fmt: skip
        workspace = Workspace()
        workspace.make_staging(output_dir)
        try:
            assert workspace.unwritable == said
        finally:
            workspace.discard()


def test_an_output_dir_through_a_symbolic_link_to_nothing_names_the_link_not_a_permission(tmp_path):
    """saves/ linked to a volume that is not mounted: mkdir says "File exists", and render's refusal and the output
    check said "FileExistsError" with volume and user advice ("not writable by uid 0", to root; a break-it trial,
    2026-12-06). They now name the link and its missing target."""
    from types import SimpleNamespace

    from rocmft.checks.host import output_writable
    from rocmft.cli.workspace import Workspace
    from rocmft.fsutil import folder_fix

    (tmp_path / "saves").symlink_to(tmp_path / "unmounted" / "saves")
    for output_dir in (tmp_path / "saves", tmp_path / "saves" / "run1"):
        workspace = Workspace()
        workspace.make_staging(output_dir)
        try:
            said = f"{tmp_path / 'saves'} is a symbolic link to nothing: its target {tmp_path}/unmounted/saves"
            assert workspace.unwritable.startswith(said), workspace.unwritable
            assert "Make the folder that link points to" in folder_fix("OUTPUT_DIR", workspace.unwritable)
        finally:
            workspace.discard()
        outcome = output_writable(SimpleNamespace(plan=SimpleNamespace(output_dir=output_dir, sources={})))
        assert outcome.status == "fail" and outcome.value.startswith(said), outcome
        assert "Make the folder that link points to" in outcome.remedy and "uid" not in outcome.message, outcome
    assert not (tmp_path / "unmounted").exists()
