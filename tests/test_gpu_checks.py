"""GPU checks on the CPU: the probe's results are data injected into the probe provider, shaped exactly as
rocmft.facts.probe reports them on a GPU host; every check's pass, warn, fail and skip path with its message."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rocmft.checks import FAIL, PASS, SKIP, WARN
from rocmft.checks import gpu as checks

GFX942_IMAGE = {"arch": "gfx942", "pytorch_rocm_arch": "gfx942", "torch_hip": "7.1.0", "rccl_busbw_floor_gbps": "100"}
GFX1100_IMAGE = {"arch": "gfx1100", "pytorch_rocm_arch": "gfx1100", "torch_hip": "7.1.0", "rccl_busbw_floor_gbps": "5"}


def gpu(index=0, arch="gfx942:sramecc+:xnack-", name="AMD Instinct MI300X", total=191.98, free=191.4,
        finite=True, error=3.0e-3):  # fmt: skip
    # the probe's shape and errors as `python -m rocmft.facts.probe devices` measured them on 2 x H200 (2026-11-30):
    # bf16 3.0e-3, fp16 3.5e-4, fp32 1.3e-6
    gemm = {"bfloat16": {"finite": finite, "max_rel_error": error, "seconds": 0.02},
            "float16": {"finite": True, "max_rel_error": 3.5e-4, "seconds": 0.01},
            "float32": {"finite": True, "max_rel_error": 1.3e-6, "seconds": 0.01}}  # fmt: skip
    return {"index": index, "name": name, "arch": arch, "total_gib": total, "free_gib": free, "bf16": True,
            "gemm": gemm}  # fmt: skip


def devices(*gpus, backend="rocm", visible=None):
    return {"backend": backend, "torch": "2.11.0+rocm7.1", "hip": "7.1.0", "cuda": None,
            "visible": visible or {"HIP_VISIBLE_DEVICES": ",".join(str(g["index"]) for g in gpus)},
            "gpus": list(gpus)}  # fmt: skip


def plan(image=GFX942_IMAGE, probe=None, launcher="python", nproc=None, workers=0, arguments=None, ds_config=None,
         **probes):  # fmt: skip
    from rocmft.checks import CheckSubject
    from rocmft.facts.device import facts_from_probe
    from rocmft.facts.job import job_shape
    from rocmft.facts.probes import Probes
    from rocmft.facts.scheduler import job_layout

    probe = probe if probe is not None else devices(gpu())
    stand_in = SimpleNamespace(
        device=facts_from_probe(probe), ds_config=ds_config,
        launcher=launcher, arguments={"dataloader_num_workers": workers, **(arguments or {})},
        settings=SimpleNamespace(rocmft=SimpleNamespace(nproc_per_node=nproc, distributed="none", offload="none"),
                                 environ=os.environ),  # the process environment, which the tests set (monkeypatch)
        precision=SimpleNamespace(compute_dtype="bfloat16"),
    )  # fmt: skip
    stand_in.layout = job_layout(os.environ)  # read once, as render does
    stand_in.job = job_shape(stand_in.settings, stand_in.device, launcher, stand_in.layout)  # once, as render does
    stand_in.world_size = stand_in.job.world_size  # a Rendered reads it from the job
    return CheckSubject(plan=stand_in, probes=Probes(injected={"image": image, "devices": probe, **probes}))


def test_runtime_passes_with_enough_gpus():
    outcome = checks.gpu_runtime(plan(probe=devices(gpu(0), gpu(1)), launcher="torchrun", nproc=2))
    assert outcome.status == PASS and outcome.value == "2 GPU(s), 2 process(es)"


def test_runtime_fails_when_asked_for_more_processes_than_gpus():
    outcome = checks.gpu_runtime(plan(probe=devices(gpu(0)), launcher="torchrun", nproc=2))
    assert outcome.status == FAIL and "asks for 2 processes per node but 1 GPU(s)" in outcome.message
    assert "HIP_VISIBLE_DEVICES=0" in outcome.message and "ROCMFT_NPROC_PER_NODE" in outcome.remedy


def test_runtime_fails_without_gpus_in_a_rocm_image_and_skips_on_a_cpu_machine():
    outcome = checks.gpu_runtime(plan(probe=devices(visible={"HIP_VISIBLE_DEVICES": ""})))
    assert outcome.status == FAIL and "No GPU is visible (HIP_VISIBLE_DEVICES=)" in outcome.message
    assert checks.gpu_runtime(plan(image=None, probe=devices(backend="cpu"))).status == SKIP


def test_runtime_fails_when_the_probe_crashed_or_torch_is_not_hip():
    crashed = checks.gpu_runtime(plan(probe={"error": "the probe exited -11: Segmentation fault", "timed_out": False}))
    assert crashed.status == FAIL and "Segmentation fault" in crashed.message
    cuda = checks.gpu_runtime(plan(probe=devices(gpu(), backend="cuda")))
    assert cuda.status == FAIL and "not the HIP build" in cuda.message


def test_arch_passes_for_the_built_target_and_advises_an_override_for_a_relative(monkeypatch):
    assert checks.gpu_arch(plan()).status == PASS
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)
    rx7800 = plan(image=GFX1100_IMAGE, probe=devices(gpu(arch="gfx1101", name="AMD Radeon RX 7800 XT")))
    outcome = checks.gpu_arch(rx7800)
    assert outcome.status == FAIL and "HSA_OVERRIDE_GFX_VERSION=11.0.0" in outcome.remedy
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
    assert checks.gpu_arch(rx7800).status == WARN


def test_arch_refuses_a_target_without_a_safe_override():
    outcome = checks.gpu_arch(plan(probe=devices(gpu(arch="gfx908:sramecc+:xnack-", name="AMD Instinct MI100"))))
    assert outcome.status == FAIL and "no safe override" in outcome.remedy and "gfx908" in outcome.message


def test_memory_in_use_warns_per_gpu():
    busy = plan(probe=devices(gpu(0), gpu(1, free=120.0)))
    outcome = checks.gpu_memory(busy)
    assert outcome.status == WARN and "GPU 1: 72.0 of 192.0 GiB in use" in outcome.message
    assert checks.gpu_memory(plan()).status == PASS


@pytest.mark.parametrize(("bad", "words"), [(dict(finite=False), "non-finite"), (dict(error=0.4), "error 4.00e-01")])
def test_compute_fails_on_wrong_results(bad, words):
    outcome = checks.gpu_compute(plan(probe=devices(gpu(0), gpu(1, **bad))))
    assert outcome.status == FAIL and f"GPU 1 (AMD Instinct MI300X): {words}" in outcome.message
    assert checks.gpu_compute(plan()).status == PASS


# Injected probe results for gpu-compute: the shape of `python -m rocmft.facts.probe devices`
# (rocmft.records.GemmRecord, BlasRecord); the numbers are made up to land on each side of GEMM_TOLERANCE, the
# warning texts are torch's own
# (aten/src/ATen/Context.cpp's override; AMDResearch/hpcfund#86's per-call recovery on MI300X, torch 2.11.0+rocm7.2).
OVERRIDE_WARNING = ("Attempting to use hipBLASLt on an unsupported architecture! Overriding blas backend to hipblas "
                    "(Triggered internally at /pytorch/aten/src/ATen/Context.cpp:373.)")  # fmt: skip
RECOVER_WARNING = ("bgemm_internal_cublaslt error: HIPBLAS_STATUS_INTERNAL_ERROR when calling hipblasLtMatmul with "
                   "transpose_mat1 n transpose_mat2 n m 1024 n 1024 k 1024 lda 1024 ldb 1024 ldc 1024 abType 0 cType 0 "
                   "computeType 2 scaleType 0. Will attempt to recover by calling cublas instead. "
                   "(Triggered internally at /pytorch/aten/src/ATen/hip/HIPBlas.cpp:575.)")  # fmt: skip


def with_gemm(gpu_record, dtype, **changes):
    gpu_record["gemm"][dtype] = {**gpu_record["gemm"][dtype], **changes}
    return gpu_record


def with_blas(probe, after="hipblaslt", warnings=(), prefer=None):
    probe["blas"] = {"before": after, "after": after, "fallback_warnings": list(warnings), "prefer_hipblaslt": prefer,
                     "prefer_cublaslt": None}  # fmt: skip
    return probe


def test_compute_judges_every_dtype_the_probe_ran():
    """Injected: all three dtypes within tolerance and fp32 recorded as IEEE -> pass, naming each dtype."""
    probe = with_blas(devices(with_gemm(gpu(0), "float32", precision="ieee"), gpu(1)))
    outcome = checks.gpu_compute(plan(probe=probe))
    assert outcome.status == PASS and "bfloat16, float16, float32 GEMMs correct" in outcome.message
    assert outcome.value == "max rel. error 3.0e-03, hipblaslt"


def test_a_wrong_gemm_in_another_dtype_warns_and_says_what_would_use_it():
    """Injected: the bf16 run is right, fp32 is 100x over its tolerance (what TF32 or a broken fp32 kernel gives)."""
    probe = devices(gpu(0), with_gemm(gpu(1), "float32", max_rel_error=1e-2))
    outcome = checks.gpu_compute(plan(probe=probe))
    assert outcome.status == WARN and "GPU 1 (AMD Instinct MI300X): error 1.00e-02 in float32" in outcome.message
    assert "ROCMFT_ON_NAN=fp32" in outcome.message and "ROCMFT_PRECISION=fp32" in outcome.message
    fp16 = checks.gpu_compute(plan(probe=devices(with_gemm(gpu(0), "float16", finite=False))))
    assert fp16.status == WARN and "non-finite result in float16" in fp16.message and "fp16" in fp16.message


def test_a_wrong_fp32_gemm_fails_when_the_nan_restart_would_train_in_fp32():
    probed = plan(probe=devices(with_gemm(gpu(0), "float32", max_rel_error=1e-2)))
    probed.plan.settings.rocmft.on_nan = "fp32"
    outcome = checks.gpu_compute(probed)
    assert outcome.status == FAIL and "ROCMFT_ON_NAN=fp32 restarts in it" in outcome.message


def test_fp32_that_ran_as_tf32_is_not_fp32():
    """Injected: an fp32 GEMM whose recorded precision is tf32 is wrong even when its error would pass."""
    outcome = checks.gpu_compute(plan(probe=devices(with_gemm(gpu(0), "float32", precision="tf32"))))
    assert outcome.status == WARN and "fp32 ran in tf32 precision, not IEEE fp32" in outcome.message


def test_a_gemm_that_raised_in_the_runs_dtype_fails():
    """Injected: the record _gemm writes when the product raised (hpcfund#86's AcceleratorError)."""
    raised = with_gemm(gpu(0), "bfloat16", finite=False, max_rel_error=float("inf"),
                       error="AcceleratorError: CUDA error: file not found")  # fmt: skip
    outcome = checks.gpu_compute(plan(probe=devices(raised)))
    assert outcome.status == FAIL and "raised AcceleratorError: CUDA error: file not found" in outcome.message


def test_a_hipblaslt_fallback_fails_with_the_fix_and_a_chosen_hipblas_passes():
    """Injected: torch's two fallback warnings as the probe records them."""
    recovered = checks.gpu_compute(
        plan(probe=with_blas(devices(gpu(0)), after="hipblaslt", warnings=[RECOVER_WARNING]))
    )
    assert recovered.status == FAIL and "BLAS fallback: bgemm_internal_cublaslt error" in recovered.message
    assert "Triggered internally" not in recovered.message
    assert "hpcfund#86" in recovered.remedy and "built for this gfx target" in recovered.remedy
    strix = devices(gpu(0, arch="gfx1151", name="AMD Radeon 8060S Graphics"))
    overridden = checks.gpu_compute(plan(probe=with_blas(strix, after="hipblas", warnings=[OVERRIDE_WARNING],
                                                         prefer="1")))  # fmt: skip
    assert overridden.status == FAIL and "Overriding blas backend to hipblas" in overridden.message
    assert (
        overridden.remedy.startswith("TORCH_BLAS_PREFER_HIPBLASLT=1 asks for hipBLASLt")
        and "unset it" in overridden.remedy
    )
    chosen = checks.gpu_compute(plan(probe=with_blas(devices(gpu(0)), after="hipblas")))
    assert chosen.status == PASS and chosen.value.endswith("hipblas")


def test_shm_is_sized_for_ranks_and_loader_workers():
    small = plan(probe=devices(gpu(0), gpu(1)), launcher="torchrun", workers=2, shm_bytes=64 << 20)
    outcome = checks.shm(small)
    assert outcome.status == FAIL and "need 3.00 GiB" in outcome.value and "ipc: host" in outcome.remedy
    assert checks.shm(plan(launcher="torchrun", shm_bytes=16 << 30)).status == PASS


def test_collectives_pass_warn_fail_and_skip():
    two = devices(gpu(0), gpu(1))
    good = {"world_size": 2, "bytes": 256 << 20, "seconds": 0.0025, "correct": True, "busbw_gbps": 107.4}
    assert checks.collectives(plan(probe=two, allreduce=good)).status == PASS
    slow = plan(probe=two, allreduce={**good, "busbw_gbps": 12.0})
    assert checks.collectives(slow).status == WARN
    hung = checks.collectives(plan(probe=two, allreduce={"error": "no answer in 90 s", "timed_out": True}))
    assert hung.status == FAIL and "IOMMU" in hung.remedy and "NCCL_P2P_DISABLE" in hung.remedy
    wrong = checks.collectives(plan(probe=two, allreduce={**good, "correct": False}))
    assert wrong.status == FAIL
    assert checks.collectives(plan()).status == SKIP


def test_device_nodes_fail_with_the_fix_when_no_gpu_was_passed_in():
    from pathlib import Path

    if Path("/dev/kfd").exists():
        pytest.skip("this machine has /dev/kfd")
    outcome = checks.gpu_devices(plan())
    assert outcome.status == FAIL and "/dev/kfd" in outcome.message and "--device=/dev/kfd" in outcome.remedy
    assert checks.gpu_devices(plan(image=None)).status == SKIP


def test_the_missing_device_remedy_prints_literally_in_the_table(capsys):
    """Issue 21's crash: in a ROCm image without /dev/kfd, the remedy "devices [/dev/kfd, /dev/dri]" was read as rich
    markup when the table printed (MarkupError: closing tag '[/dev/kfd, /dev/dri]'). The check's real outcome
    (its device nodes injected as none: the container got no GPU) now prints as written."""
    from rocmft.checks import CheckResult, print_table

    probed = plan(device_nodes=[])  # injected: what a container started without --device sees
    outcome = checks.gpu_devices(probed)
    assert "[/dev/kfd, /dev/dri]" in outcome.remedy
    print_table([CheckResult(**vars(outcome), id="gpu-devices")], None)
    printed = " ".join(capsys.readouterr().out.split())
    assert "devices: [/dev/kfd," in printed and "fail" in printed


def test_device_facts_come_from_the_probe():
    from rocmft.facts.device import facts_from_probe

    facts = facts_from_probe(devices(gpu(0), gpu(1)))
    assert (facts.backend, facts.count, facts.bf16, facts.archs[0]) == ("rocm", 2, True, "gfx942:sramecc+:xnack-")
    broken = facts_from_probe({"error": "the probe exited -11: Segmentation fault", "timed_out": False})
    assert (broken.backend, broken.count, broken.bf16) == ("cpu", 0, False)


# --- host settings, libraries (rocmft.checks.system) -------------------------------------------------------
def host_root(tmp_path, numa_balancing="1", nodes=2, iommu=("DMA-FQ", "DMA-FQ")):
    """A recorded host layout: the procfs/sysfs files host_settings() reads, as a 2-socket host has them."""
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/numa_balancing").write_text(f"{numa_balancing}\n")
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/sda1 ro amd_iommu=on quiet\n")
    node_dir = tmp_path / "sys/devices/system/node"
    node_dir.mkdir(parents=True)
    (node_dir / "online").write_text("0" if nodes == 1 else f"0-{nodes - 1}\n")
    for n in range(nodes):
        (node_dir / f"node{n}").mkdir()
        (node_dir / f"node{n}/cpulist").write_text(f"{n * 48}-{n * 48 + 47}\n")
    for i, kind in enumerate(iommu):
        (tmp_path / f"sys/kernel/iommu_groups/{i}").mkdir(parents=True)
        (tmp_path / f"sys/kernel/iommu_groups/{i}/type").write_text(f"{kind}\n")
    return tmp_path


def test_host_settings_are_read_from_procfs_and_sysfs(tmp_path):
    from rocmft.checks.system import host_settings

    facts = host_settings(host_root(tmp_path))
    assert facts["numa_balancing"] == "1" and facts["numa_nodes"] == 2
    assert facts["iommu_group_types"] == {"DMA-FQ": 2} and "amd_iommu=on" in facts["cmdline"]


def test_numa_balancing_warns_on_a_multi_node_host_only(tmp_path):
    from rocmft.checks.system import host_settings, numa_balancing

    on = numa_balancing(plan(host=host_settings(host_root(tmp_path / "a"))))
    assert on.status == WARN and "kernel.numa_balancing=0" in on.remedy and "2 NUMA nodes" in on.value
    one_node = numa_balancing(plan(host=host_settings(host_root(tmp_path / "b", nodes=1))))
    assert one_node.status == PASS and "one NUMA node" in one_node.value
    off = numa_balancing(plan(host=host_settings(host_root(tmp_path / "c", numa_balancing="0"))))
    assert off.status == PASS and off.value == "off"
    assert numa_balancing(plan(probe=devices(backend="cpu"))).status == SKIP


def test_iommu_warns_when_translating_with_several_gpus(tmp_path):
    from rocmft.checks.system import host_settings, iommu

    two = devices(gpu(0), gpu(1))
    translating = iommu(plan(probe=two, host=host_settings(host_root(tmp_path / "a"))))
    assert translating.status == WARN and "iommu=pt" in translating.remedy and "amd_iommu=on" in translating.message
    passthrough = iommu(plan(probe=two, host=host_settings(host_root(tmp_path / "b", iommu=("identity",) * 3))))
    assert passthrough.status == PASS and passthrough.value == "pass-through"
    assert iommu(plan(probe=two, host=host_settings(host_root(tmp_path / "c", iommu=())))).value == "off"
    assert iommu(plan()).status == SKIP  # one GPU


# the library probe's shape as `python -m rocmft.facts.probe libs bnb fa2` reports it
# (illustrative values, not a measurement)
BNB_OK = {"version": "0.49.1", "finite": True, "max_rel_error": 4.1e-3, "ok": True}
FA2_OK = {"version": "2.8.3", "finite": True, "max_rel_error": 3.9e-3, "ok": True}


def test_libraries_probe_what_the_configuration_needs():
    from rocmft.checks.system import libraries

    assert libraries(plan()).status == SKIP
    qlora = plan(arguments={"quantization_bit": 4, "flash_attn": "fa2"}, libs={"bnb": BNB_OK, "fa2": FA2_OK})
    outcome = libraries(qlora)
    assert (
        outcome.status == PASS and "bitsandbytes 0.49.1" in outcome.value and "flash-attention 2.8.3" in outcome.value
    )


@pytest.mark.parametrize(
    ("probe", "words"),
    [
        ({"ok": False, "error": "ModuleNotFoundError: No module named 'bitsandbytes'"}, "No module named"),
        ({"version": "0.42.0", "finite": False, "max_rel_error": float("nan"), "ok": False}, "non-finite result"),
        ({"ok": False, "error": "no GPU visible"}, "no GPU visible"),
    ],
)
def test_libraries_fail_when_bitsandbytes_has_no_working_gpu_backend(probe, words):
    from rocmft.checks.system import libraries

    outcome = libraries(plan(arguments={"quantization_bit": 4}, libs={"bnb": probe}))
    assert outcome.status == FAIL and "QUANTIZATION_BIT=4 needs bitsandbytes" in outcome.message
    assert words in outcome.message and "HIP library has code for its gfx target" in outcome.remedy


def test_libraries_fail_without_flash_attention_and_check_deepspeed_ops():
    from rocmft.checks.system import libraries

    fa2 = libraries(plan(arguments={"flash_attn": "fa2"}, libs={"fa2": {"ok": False, "error": "ImportError: x"}}))
    assert fa2.status == FAIL and "FLASH_ATTN=sdpa" in fa2.remedy
    ds = {"arguments": {"deepspeed": "/run/ds_config.json"}}
    jit = libraries(plan(**ds, deepspeed_ops={"cpu_adam": {"installed": False, "compatible": True}}))
    assert jit.status == WARN and "JIT" in jit.value
    built = libraries(plan(**ds, deepspeed_ops={"cpu_adam": {"installed": True, "compatible": True}}))
    assert built.status == PASS
    missing = libraries(plan(**ds, deepspeed_ops={"cpu_adam": {"installed": False, "compatible": False}}))
    assert missing.status == FAIL and "ROCMFT_OFFLOAD=none" in missing.remedy


def test_deepspeed_ops_needed_follow_the_offload_setting():
    from rocmft.checks.system import deepspeed_ops

    offloaded = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}}
    ops = deepspeed_ops(plan(arguments={"deepspeed": "x"}, ds_config=offloaded))
    assert set(ops) == {"cpu_adam"} and set(ops["cpu_adam"]) == {"installed", "compatible"}
    assert deepspeed_ops(plan(arguments={"deepspeed": "x"}, ds_config={"zero_optimization": {"stage": 2}})) == {}


# Qwen2-7B's shape (its config.json on the hub): the model of the memory-fit measurements in BENCHMARKS.md
QWEN2_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
            "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
            "vocab_size": 152064, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}  # fmt: skip
H200 = dict(name="NVIDIA H200", arch="sm_90", total=139.8, free=139.3)


def lora_arguments(model_dir, micro_batch, checkpointing):
    return {"model_name_or_path": str(model_dir), "finetuning_type": "lora", "cutoff_len": 2048, "packing": True,
            "per_device_train_batch_size": micro_batch, "gradient_accumulation_steps": 1,
            "disable_gradient_checkpointing": not checkpointing}  # fmt: skip


def test_memory_fit_passes_fails_with_fixes_and_skips(tmp_path):
    """The acceptance's cases on one H200: micro-batch 2 with checkpointing fits, 8 packed without does not
    (measured: it ran out of memory), and the fixes offered each fit when estimated again."""
    from rocmft.checks.system import memory_fit

    model = tmp_path / "qwen2-7b"
    model.mkdir()
    (model / "config.json").write_text(__import__("json").dumps(QWEN2_7B))
    h200 = devices(gpu(**H200), backend="cuda")
    fits = memory_fit(plan(image=None, probe=h200, arguments=lora_arguments(model, 2, True)))
    assert fits.status == PASS and "GiB of 139.3 GiB free" in fits.value, fits
    oom = memory_fit(plan(image=None, probe=h200, arguments=lora_arguments(model, 8, False)))
    assert oom.status == FAIL and "run out of GPU memory" in oom.message
    assert "DISABLE_GRADIENT_CHECKPOINTING=false" in oom.remedy and "PER_DEVICE_TRAIN_BATCH_SIZE=" in oom.remedy
    # beyond what may be filled (5% allocator headroom). The measured out-of-memory predates the worker's skipping
    # of peft's input casts, which saves ~13 GiB at this micro-batch: the estimate is now 135.4 GiB, not above 139.3
    from rocmft.render.memfit import ALLOCATOR_HEADROOM

    assert oom.data["estimate_gib"]["total"] > 139.3 * (1 - ALLOCATOR_HEADROOM)
    not_local = memory_fit(plan(image=None, probe=h200, arguments=lora_arguments(tmp_path / "hub-id", 2, True)))
    assert not_local.status == SKIP
    assert memory_fit(plan(probe=devices(backend="cpu"))).status == SKIP


# Unified-memory APUs, injected: no MI300A or Strix Halo here. The records follow rocmft.records.GpuRecord; the
# mem_get_info numbers are the two misreadings the budget corrects (an MI300A reporting all 128 GB of HBM as free
# although the OS holds part of it; a Strix Halo reporting its 512 MiB BIOS carve-out, the "total capacity of 512.00
# MiB" of the kernel commit "drm/amdkfd: Let VRAM allocations go to GTT domain on small APUs").
MI300A = dict(name="AMD Instinct MI300A", arch="gfx942:sramecc+:xnack-", total=128.0, free=127.5)
STRIX_HALO = dict(name="AMD Radeon 8060S Graphics", arch="gfx1151", total=0.5, free=0.5)


def apu(shared, integrated=True, **kind):
    record = gpu(**kind)
    record["integrated"] = integrated
    if shared is not None:
        record["unified_memory"] = shared
    return record


def test_an_apu_is_budgeted_from_system_memory_capped_by_the_gtt_pool():
    from rocmft.facts.device import facts_from_probe, memory_budget

    mi300a = memory_budget(apu({"mem_total_gib": 125.0, "mem_available_gib": 110.0, "gtt_total_gib": 120.0,
                                "gtt_used_gib": 0.2}, **MI300A))  # fmt: skip
    assert (mi300a.total_gib, mi300a.free_gib) == (110.0, 110.0) and "GTT 119.8 of 120.0" in mi300a.source
    # Strix Halo with the default GTT (half of 64 GB): the GTT pool, not the 512 MiB carve-out, nor all of RAM
    strix = apu({"mem_total_gib": 62.0, "mem_available_gib": 55.0, "gtt_total_gib": 31.0, "gtt_used_gib": 1.0},
                **STRIX_HALO)  # fmt: skip
    assert (memory_budget(strix).total_gib, memory_budget(strix).free_gib) == (31.0, 30.0)
    assert facts_from_probe(devices(strix)).memory_gib == [31.0]  # what the planner plans with
    no_gtt = memory_budget(apu({"mem_total_gib": 62.0, "mem_available_gib": 55.0}, **STRIX_HALO))
    assert (no_gtt.total_gib, no_gtt.free_gib) == (55.0, 55.0) and "no GTT size" in no_gtt.source


def test_discrete_gpus_and_old_records_keep_torchs_numbers():
    from rocmft.facts.device import is_unified, memory_budget

    mi300x = memory_budget(gpu())
    assert (mi300x.total_gib, mi300x.free_gib, mi300x.source) == (191.98, 191.4, "torch.cuda.mem_get_info")
    old = gpu(**STRIX_HALO)  # a record written before "integrated": the gfx target still tells an APU
    assert is_unified(old) and "no system memory was recorded" in memory_budget(old).source
    assert is_unified(gpu(**MI300A)) and not is_unified(apu(None, integrated=False, **MI300A))


def test_memory_fit_uses_the_apu_budget(tmp_path):
    from rocmft.checks.system import memory_fit

    model = tmp_path / "qwen2-7b"
    model.mkdir()
    (model / "config.json").write_text(__import__("json").dumps(QWEN2_7B))
    strix = apu({"mem_total_gib": 62.0, "mem_available_gib": 55.0, "gtt_total_gib": 31.0, "gtt_used_gib": 1.0},
                **STRIX_HALO)  # fmt: skip
    outcome = memory_fit(plan(image=None, probe=devices(strix), arguments=lora_arguments(model, 1, True)))
    assert "GiB of 30.0 GiB free" in outcome.value and "unified memory" in outcome.data["memory_source"]


def test_unified_memory_is_read_from_meminfo_and_amdgpu_sysfs(tmp_path):
    """Synthetic tree: /proc/meminfo in proc(5)'s format and amdgpu's mem_info_gtt_total/_used (bytes, one integer;
    drivers/gpu/drm/amd/amdgpu/amdgpu_gtt_mgr.c) under the GPU's PCI address."""
    from rocmft.facts.device import unified_memory

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       65011712 kB\nMemFree:  1 kB\nMemAvailable:   57671680 kB\n")
    device = tmp_path / "sys/bus/pci/devices/0000:c2:00.0"
    device.mkdir(parents=True)
    (device / "mem_info_gtt_total").write_text(f"{32 << 30}\n")
    (device / "mem_info_gtt_used").write_text(f"{1 << 29}\n")
    assert unified_memory("0000:c2:00.0", tmp_path) == {"mem_total_gib": 62.0, "mem_available_gib": 55.0,
                                                        "gtt_total_gib": 32.0, "gtt_used_gib": 0.5}  # fmt: skip
    assert unified_memory("0000:00:00.0", tmp_path) == {"mem_total_gib": 62.0, "mem_available_gib": 55.0}
    assert unified_memory(None, tmp_path / "nothing") == {}


def test_gpu_memory_judges_an_apu_by_its_pool_not_the_carve_out():
    """Injected Strix Halo records: its 512 MiB carve-out 90% used by the display says nothing about the 31 GiB
    GTT pool a run uses (pass); the pool itself 60% used is memory in use (warn, in the pool's numbers)."""
    carve_out_busy = apu({"mem_total_gib": 62.0, "mem_available_gib": 55.0, "gtt_total_gib": 31.0,
                          "gtt_used_gib": 1.0}, **{**STRIX_HALO, "free": 0.05})  # fmt: skip
    assert checks.gpu_memory(plan(probe=devices(carve_out_busy))).status == checks.PASS
    pool_busy = apu({"mem_total_gib": 62.0, "mem_available_gib": 55.0, "gtt_total_gib": 31.0,
                     "gtt_used_gib": 19.0}, **STRIX_HALO)  # fmt: skip
    outcome = checks.gpu_memory(plan(probe=devices(pool_busy), node_root="/nonexistent"))
    assert outcome.status == checks.WARN and "19.0 of 31.0 GiB in use" in outcome.message, outcome


def test_without_gpu_device_nodes_the_devices_probe_answers_as_torch_does(monkeypatch):
    """With no GPU device node (rocmft.facts.device.GPU_NODES) the devices probe answers from torch/version.py
    without importing torch; that answer is the one torch's own detection gives on the same machine, with and
    without a *_VISIBLE_DEVICES variable. Where a node exists (a GPU host) the shortcut is not taken."""
    from rocmft.facts import probe
    from rocmft.facts.device import gpu_node_present

    if gpu_node_present():
        assert probe._without_gpu_nodes() is None
        return
    assert probe._devices() == probe._devices(ask_torch=True)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,1")
    assert probe._devices() == probe._devices(ask_torch=True)
    assert probe._devices()["visible"] == {"HIP_VISIBLE_DEVICES": "0,1"} and probe._devices()["gpus"] == []


@pytest.mark.light_process
def test_the_probe_child_imports_no_torch_without_gpu_device_nodes():
    """The child the entrypoint starts (`python -m rocmft.facts.probe devices`) costs 0.14 s instead of torch's
    import (2.7 CPU-s on our CPU machines) where no GPU device node exists, and still prints the devices line."""
    import json
    import subprocess
    import sys

    from rocmft.facts.device import gpu_node_present

    if gpu_node_present():
        pytest.skip("a GPU device node exists here: the probe asks torch")
    code = "import sys; from rocmft.facts.probe import main; main(['devices']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    line, imported = result.stdout.strip().splitlines()
    assert json.loads(line)["result"]["gpus"] == [] and imported == "False"
