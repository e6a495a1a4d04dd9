"""The device probe for real on a GPU (skipped where none is visible): every dtype's GEMM within tolerance, fp32
really IEEE fp32, the BLAS library recorded, a discrete GPU not taken for an APU.

Needs no network and no model: ``python3 -m pytest -m gpu tests/test_gpu_probe.py -s`` on a GPU host (written for
an NVIDIA H200 with torch 2.11+cu130; on ROCm the same assertions hold, with hipBLAS(Lt) names).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch.cuda.is_available() is False)"),
]


@pytest.fixture(scope="module")
def probe():
    """The probe child exactly as the entrypoint runs it (rocmft.facts.device.run_probe: its own process)."""
    from rocmft.facts.device import run_probe

    result = run_probe(["devices"], timeout_s=180)
    assert "error" not in result, result
    return result


def test_every_dtype_is_within_tolerance_on_every_gpu(probe):
    from rocmft.facts.probe import GEMM_TOLERANCE

    assert len(probe["gpus"]) == torch.cuda.device_count()
    for gpu in probe["gpus"]:
        assert set(gpu["gemm"]) >= {"float16", "float32"}, gpu["gemm"]
        for dtype, gemm in gpu["gemm"].items():
            assert "error" not in gemm and gemm["finite"], (gpu["index"], dtype, gemm)
            assert gemm["max_rel_error"] <= GEMM_TOLERANCE[dtype], (gpu["index"], dtype, gemm)


def test_fp32_is_ieee_fp32_not_tf32(probe):
    """The probe's fp32 error is far below what the same GEMM gives with TF32 on, computed here the same way."""
    from rocmft.facts.probe import GEMM_SIZE

    assert probe["fp32_precision"] == "ieee" and probe["gpus"][0]["gemm"]["float32"]["precision"] == "ieee"
    generator = torch.Generator().manual_seed(0)  # the probe's inputs
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, generator=generator)
    reference = a.double() @ b.double()
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        tf32 = (a.cuda() @ b.cuda()).double().cpu()
    finally:
        matmul.fp32_precision = saved
    tf32_error = float((tf32 - reference).abs().max() / reference.abs().max())
    ieee_error = probe["gpus"][0]["gemm"]["float32"]["max_rel_error"]
    numbers = f"probe fp32 {ieee_error:.2e} vs the same GEMM with TF32 on {tf32_error:.2e}"
    print(numbers)
    assert ieee_error * 20 < tf32_error, numbers  # TF32 keeps 10 mantissa bits of fp32's 23: ~2^-13 vs ~2^-24


def test_the_blas_library_is_recorded_without_a_fallback(probe):
    blas = probe["blas"]
    libraries = {"cuda": {"cublas", "cublaslt"}, "rocm": {"hipblas", "hipblaslt", "ck"}}[probe["backend"]]
    assert blas["before"] in libraries and blas["after"] in libraries, blas
    assert blas["fallback_warnings"] == [], blas


def test_a_discrete_gpu_is_not_taken_for_an_apu(probe):
    from rocmft.facts.device import memory_budget

    name = torch.cuda.get_device_name(0)
    if "MI300A" in name or getattr(torch.cuda.get_device_properties(0), "is_integrated", False):
        pytest.skip(f"{name} is an APU")
    gpu = probe["gpus"][0]
    assert gpu["integrated"] is False and "unified_memory" not in gpu, gpu
    assert memory_budget(gpu).source == "torch.cuda.mem_get_info"


def test_the_probe_module_runs_as_a_command():
    """``python -m rocmft.facts.probe devices`` prints its one JSON line (rocmft.records.probe_line)."""
    from rocmft.records import read_probe_line

    out = subprocess.run([sys.executable, "-m", "rocmft.facts.probe", "devices"], capture_output=True, text=True,
                         timeout=180, check=True)  # fmt: skip
    assert read_probe_line(out.stdout)["gpus"][0]["gemm"]["float32"]["precision"] == "ieee"
