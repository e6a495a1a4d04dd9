"""The gfx1201 (RDNA4: Radeon AI PRO R9700, RX 9070 XT) and gfx1151 (Strix Halo APU) images, from their shipped
profiles to the plan: the build record made from docker/arch/<arch>.env, the GPU checks on that record, and the
planner's attention and memory for the device.

INJECTED: no RDNA4 card or Strix Halo machine is here. The probe records follow rocmft.records.GpuRecord, shaped as
tests/test_gpu_checks.py injects them; the R9700's 32 GB as its owner gives it in Dao-AILab/flash-attention#2588
(torch's GiB figure assumed); the Strix Halo's numbers are test_gpu_checks' (a 64 GB machine with amdgpu's default
GTT pool, half of it)."""

from __future__ import annotations

import json

import pytest
from tests.test_gpu_checks import apu, devices, gpu, plan
from tests.test_images import REPO
from tests.test_planner import QWEN2_7B

from rocmft.checks import PASS, SKIP
from rocmft.checks import gpu as checks
from rocmft.facts.device import facts_from_probe
from rocmft.image import buildinfo
from rocmft.render import planner

R9700 = gpu(0, arch="gfx1201", name="AMD Radeon AI PRO R9700", total=31.86, free=31.5)
STRIX_HALO = apu({"mem_total_gib": 62.0, "mem_available_gib": 55.0, "gtt_total_gib": 31.0, "gtt_used_gib": 1.0},
                 name="AMD Radeon 8060S Graphics", arch="gfx1151", total=0.5, free=0.5)  # fmt: skip


def image_record(arch: str) -> dict:
    """The build record `make image ARCH=<arch>` writes, made from the shipped profile (no build steps or checks)."""
    profile = buildinfo.read_profile(REPO / "docker" / "arch" / f"{arch}.env")
    return buildinfo.record(profile, [], [], rehearsal=True)


@pytest.mark.parametrize(("arch", "card", "budget_gib"), [("gfx1201", R9700, 31.86), ("gfx1151", STRIX_HALO, 31.0)])
def test_the_new_profiles_image_accepts_its_gpu_and_plans_sdpa_with_its_memory(tmp_path, arch, card, budget_gib):
    """The image built from the profile takes its own GPU (gpu-arch), has AOTriton's experimental kernels on for
    SDPA (both targets are experimental in AOTriton 0.11: without the switch SDPA falls back to its math kernel),
    and the planner chooses SDPA with variable-length attention for packed rows (no flash-attn package for these
    targets) within the GPU's budget: on the APU the GTT pool (31 GiB), not torch's 512 MiB carve-out."""
    image = image_record(arch)
    assert (image["arch"], image["pytorch_rocm_arch"], image["flash_attn_backend"]) == (arch, arch, "none")
    assert image["runtime_profile"]["TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"] == "1"
    probe = devices(card)
    subject = plan(image=image, probe=probe)
    assert checks.gpu_arch(subject).status == PASS
    assert checks.collectives(subject).status == SKIP  # one GPU: RCCL_BUSBW_FLOOR_GBPS is not used

    model = tmp_path / "qwen2-7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN2_7B))
    device = facts_from_probe(probe)
    assert device.memory_gib == [budget_gib]
    arguments = {"stage": "sft", "finetuning_type": "lora", "lora_target": "all", "cutoff_len": 2048,
                 "model_name_or_path": str(model)}  # fmt: skip
    # flash_attn importable or not, the profile names no flash-attention backend for the target: SDPA
    for flash in (True, False):
        result = planner.plan_defaults(arguments, set(), device, compute_dtype="bfloat16", liger_available=True,
                                       flash_available=flash)  # fmt: skip
        choice = {c.name: c for c in result.choices}["flash_attn"]
        why = f"no flash-attention backend for {arch} (FLASH_ATTN_BACKEND in docker/arch/{arch}.env): PyTorch SDPA"
        assert (choice.value, choice.reason) == ("sdpa", why)
        assert result.packed_attention == "varlen" and result.arch == arch
        assert result.usable_gib == round(budget_gib * planner.USABLE_FRACTION, 2)
