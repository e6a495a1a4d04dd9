"""Issue 7's exit-3 kinds end to end: `rocmft check` as a user runs it, with the probes' results injected
through the test hook ROCMFT_TEST_PROBES (a JSON file the tests' launcher installs as rocmft.testhooks) in the shapes
rocmft.facts.probe and the checks record on a GPU host (tests/test_gpu_checks.py has the same shapes). Each case
asserts exit 3, the failed check's id, its remedy, and that OUTPUT_DIR holds only rocmft/checks.json. The cases run
in the pytest process (conftest's rocmft_here, the hooks installed as the launcher installs them), the healthy machine
in a real child process. They stay out of the fast layer: `rocmft check` starts LLaMA-Factory's parser child."""

from __future__ import annotations

import json

import pytest

from rocmft.errors import ExitCode

IMAGE = {"arch": "gfx942", "pytorch_rocm_arch": "gfx942", "torch_hip": "7.1.0", "rccl_busbw_floor_gbps": "100"}


def gpu(index: int, arch: str = "gfx942:sramecc+:xnack-", name: str = "AMD Instinct MI300X") -> dict:
    # bf16/fp16/fp32 errors as `python -m rocmft.facts.probe devices` measured them on 2 x H200
    # (tests/test_gpu_checks.py)
    gemm = {"bfloat16": {"finite": True, "max_rel_error": 3.0e-3, "seconds": 0.02},
            "float16": {"finite": True, "max_rel_error": 3.5e-4, "seconds": 0.01},
            "float32": {"finite": True, "max_rel_error": 1.3e-6, "seconds": 0.01}}  # fmt: skip
    return {"index": index, "name": name, "arch": arch, "total_gib": 191.98, "free_gib": 191.4, "bf16": True,
            "gemm": gemm, "pci": None}  # fmt: skip


def devices(*gpus: dict) -> dict:
    return {"backend": "rocm", "torch": "2.11.0+rocm7.1", "hip": "7.1.0", "cuda": None,
            "visible": {"HIP_VISIBLE_DEVICES": ",".join(str(g["index"]) for g in gpus)},
            "gpus": list(gpus)}  # fmt: skip


NODES = [{"path": "/dev/kfd", "gid": 44, "access": True}, {"path": "/dev/dri/renderD128", "gid": 109, "access": True},
         {"path": "/dev/dri/renderD136", "gid": 109, "access": True}]  # fmt: skip
ALLREDUCE_OK = {"world_size": 2, "bytes": 256 << 20, "seconds": 0.0025, "correct": True, "busbw_gbps": 107.4}
HEALTHY = {"image": IMAGE, "devices": devices(gpu(0), gpu(1)), "device_nodes": NODES, "allreduce": ALLREDUCE_OK,
           "shm_bytes": 64 << 30, "host": {"numa_balancing": "0", "numa_nodes": 1, "iommu_group_types": {},
                                           "cmdline": ""}}  # fmt: skip

# kind: (probe results replacing the healthy ones, environment, failed check id, words in its message and remedy)
CASES = {
    "13 render node not accessible": (
        {"device_nodes": [NODES[0], {**NODES[1], "access": False}, NODES[2]]}, {},
        "gpu-devices", ["/dev/dri/renderD128 (group id 109)", "RENDER_GID=109", "--group-add 109"]),
    "14 gfx target not built for": (
        {"devices": devices(gpu(0, "gfx1101", "AMD Radeon RX 7800 XT"), gpu(1, "gfx1101", "AMD Radeon RX 7800 XT")),
         "image": {**IMAGE, "arch": "gfx1100", "pytorch_rocm_arch": "gfx1100"}}, {},
        "gpu-arch", ["not gfx1101", "HSA_OVERRIDE_GFX_VERSION=11.0.0"]),
    "12 shm too small": ({"shm_bytes": 64 << 20}, {}, "shm", ["/dev/shm is too small", "ipc: host", "--shm-size"]),
    "15 collectives hang": (
        {"allreduce": {"error": "no answer in 90 s", "timed_out": True}}, {},
        "collectives", ["did not finish", "iommu=pt", "NCCL_P2P_DISABLE=1"]),
    "16 bitsandbytes without a GPU backend": (
        {"libs": {"bnb": {"ok": False, "error": "RuntimeError: invalid device function"}}},
        {"QUANTIZATION_BIT": "4", "FINETUNING_TYPE": "lora"},
        "libraries", ["QUANTIZATION_BIT=4 needs bitsandbytes", "invalid device function",
                      "HIP library has code for its gfx target"]),
    "10 flash-attention missing": (
        {"libs": {"fa2": {"ok": False, "error": "ModuleNotFoundError: No module named 'flash_attn'"}}},
        {"FLASH_ATTN": "fa2"}, "libraries", ["flash_attn", "FLASH_ATTN=sdpa"]),
}  # fmt: skip


@pytest.mark.slow  # starts rocmft's parser child (python -m rocmft.validate.child)
@pytest.mark.parametrize("kind", list(CASES))
def test_each_check_failure_exits_3_naming_the_check_and_the_fix(rocmft_here, tmp_path, tiny_model, demo_data, kind):
    probes, environ, check_id, words = CASES[kind]
    (tmp_path / "probes.json").write_text(json.dumps({**HEALTHY, **probes}))
    output = tmp_path / "out"
    env = {"ROCMFT_TEST_PROBES": str(tmp_path / "probes.json"), "ROCMFT_PRECISION": "fp32",
           "MODEL_NAME_OR_PATH": str(tiny_model),
           "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data), "CUTOFF_LEN": "128",
           "OUTPUT_DIR": str(output), **environ}  # fmt: skip
    result = rocmft_here("check", env=env)
    assert result.returncode == ExitCode.CHECK_FAILED, result.stdout[-3000:]
    files = sorted(str(p.relative_to(output)) for p in output.rglob("*") if p.is_file())
    assert files == ["rocmft/checks.json"], files
    report = json.loads((output / "rocmft" / "checks.json").read_text())
    failed = {c["id"]: c for c in report["checks"] if c["status"] == "fail"}
    assert set(failed) == {check_id}, {k: v["message"] for k, v in failed.items()}
    text = failed[check_id]["message"] + " " + failed[check_id]["remedy"]
    for word in words:
        assert word in text, (word, text)
    assert f"Health checks failed: {check_id}" in result.stdout


def test_the_same_machine_passes_when_healthy(run_rocmft, tmp_path, tiny_model, demo_data):
    """The injected healthy machine passes every GPU check: the failures above come from the one fault each."""
    (tmp_path / "probes.json").write_text(json.dumps(HEALTHY))
    output = tmp_path / "out"
    env = {"ROCMFT_TEST_PROBES": str(tmp_path / "probes.json"), "ROCMFT_PRECISION": "fp32",
           "MODEL_NAME_OR_PATH": str(tiny_model),
           "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data), "CUTOFF_LEN": "128",
           "OUTPUT_DIR": str(output)}  # fmt: skip
    result = run_rocmft("check", env=env)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    report = json.loads((output / "rocmft" / "checks.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert all(statuses[i] == "pass" for i in ("gpu-devices", "gpu-runtime", "gpu-arch", "shm", "collectives"))
