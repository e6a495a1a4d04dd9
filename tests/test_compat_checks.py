"""Version skew and known-bad versions (issue 30: the driver and runtime compatibility check, item 4, item 8e):
rocmft.checks.compat's `driver`, `rocm-builds` and `library-versions`.

We have no AMD GPU. The host's driver is a SYNTHETIC sysfs tree under tmp_path (/sys/module/amdgpu/version as the
DKMS module writes it), the device probe's results are INJECTED (shaped as rocmft.facts.probe reports them), and
bitsandbytes is the REAL PyPI wheel installed in .venv (0.50.2: libbitsandbytes_rocm64/70/71/72/714/715.so, whose
gfx targets are read from their code objects). Each case comes from a public report named in its docstring.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.test_gpu_checks import GFX942_IMAGE, devices, gpu, plan
from tests.test_node_checks import kfd_node

from rocmft.checks import FAIL, PASS, SKIP, WARN, CheckSubject, compat

ROCM72 = {**GFX942_IMAGE, "rocm_version": "7.2", "versions": {"torch": "2.11.0+rocm7.2"},
          "torch_index_url": "https://download.pytorch.org/whl/rocm7.2"}  # fmt: skip


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in ("HSA_OVERRIDE_GFX_VERSION", "BNB_ROCM_VERSION"):
        monkeypatch.delenv(name, raising=False)


def host_driver(root: Path, version: str | None, kernel: str = "6.8.0-90-generic") -> Path:
    """SYNTHETIC /sys/module/amdgpu (with its version file only when ``version``: the DKMS driver's MODULE_VERSION)
    and /proc/sys/kernel/osrelease."""
    (root / "sys/module/amdgpu").mkdir(parents=True)
    if version:
        (root / "sys/module/amdgpu/version").write_text(f"{version}\n")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(f"{kernel}\n")
    return root


def rocm_probe(hip: str, *gpus) -> dict:
    probe = devices(*(gpus or (gpu(),)))
    return {**probe, "hip": hip, "torch": f"2.11.0+rocm{'.'.join(hip.split('.')[:2])}"}


# --- driver ----------------------------------------------------------------------------------------------------
def test_a_driver_older_than_the_images_rocm_supports_warns_with_the_range_and_its_source(tmp_path):
    """FoldingAtHome/containers#26: a ROCm 5.0 container works on hosts with ROCm 4.5's DKMS driver or later, "but
    may not work with earlier dkms drivers"; unsloth#10657: a host and wheels of different ROCm fail every run. Here
    ROCm 6.3's driver (6.10.5) under the ROCm 7.2 image, whose release notes list the 30.10-30.30 drivers."""
    outcome = compat.driver(plan(image=ROCM72, node_root=str(host_driver(tmp_path, "6.10.5"))))
    assert outcome.status == WARN and outcome.value == "amdgpu 6.10.5, ROCm 6.3's driver (amdgpu-dkms 6.10.5.60300)"
    assert "AMD GPU Driver 30.10.x, 30.20.x or 30.30.x (amdgpu 6.14.14 or newer" in outcome.message
    assert "releases/tag/rocm-7.2.2" in outcome.message and "user-kernel-space-compat-matrix" in outcome.message
    assert "amdgpu-install" in outcome.remedy


def test_a_supported_or_in_tree_driver_passes_and_no_driver_skips(tmp_path):
    """ROCm 7.1.1's DKMS driver reports 6.16.6 (ROCm/legacy-rocm-build#5624): supported under ROCm 7.2. The kernel's
    own amdgpu has no version file: named, not judged. No amdgpu module, or the cpu image: nothing to compare."""
    ok = compat.driver(plan(image=ROCM72, node_root=str(host_driver(tmp_path / "a", "6.16.6"))))
    assert ok.status == PASS and ok.value == "amdgpu 6.16.6, AMD GPU Driver 30.20.x (ROCm 7.1)"
    in_tree = compat.driver(plan(image=ROCM72, node_root=str(host_driver(tmp_path / "b", None, "6.17.8"))))
    assert in_tree.status == PASS and in_tree.value == "in-tree (kernel 6.17.8)"
    assert compat.driver(plan(image=ROCM72, node_root=str(tmp_path / "none"))).value == "no amdgpu driver"
    assert compat.driver(plan(image={"arch": "cpu", "rocm_version": "none"})).status == SKIP


# --- rocm-builds -----------------------------------------------------------------------------------------------
def test_a_torch_of_another_rocm_than_the_image_fails_with_the_images_torch():
    """unslothai/unsloth#10657: PyTorch for ROCm 7.2 where ROCm 7.14 is installed: every fine-tuning run failed. In
    an image the same skew is a torch installed over the image's: its ROCm libraries and the image's in one process."""
    outcome = compat.rocm_builds(plan(image=ROCM72, probe=rocm_probe("7.14.26015-fc0010cf6a")))
    assert outcome.status == FAIL and "is built for ROCm 7.14" in outcome.message and "are 7.2" in outcome.message
    assert "pip install torch==2.11.0+rocm7.2 --index-url https://download.pytorch.org/whl/rocm7.2" in outcome.remedy
    assert compat.rocm_builds(plan(image=ROCM72, probe=rocm_probe("7.2.53211"))).status == PASS


def test_bitsandbytes_loading_another_rocms_library_fails_when_quantizing(monkeypatch):
    """unslothai/unsloth#10273: torch 2.6.0+rocm6.1 with bitsandbytes 0.50.2, whose wheel has no
    libbitsandbytes_rocm61.so, so it loaded rocm64's: training crashed with SIGSEGV. The real wheel makes the same
    choice here (bitsandbytes' own rule, rocmft.facts.rocmlibs); BNB_ROCM_VERSION forcing another library likewise."""
    image61 = {**ROCM72, "rocm_version": "6.1"}
    probe = rocm_probe("6.1.40091-a8dbc0c19")
    quantized = compat.rocm_builds(plan(image=image61, probe=probe, arguments={"quantization_bit": 4}))
    assert quantized.status == FAIL and "bitsandbytes loads libbitsandbytes_rocm64.so (ROCm 6.4: fallback) under " \
        "torch's HIP 6.1" in quantized.message  # fmt: skip
    assert "unslothai/unsloth#10273" in quantized.message and "libbitsandbytes_rocm61.so" in quantized.remedy
    assert compat.rocm_builds(plan(image=image61, probe=probe)).status == WARN  # not used by this run
    monkeypatch.setenv("BNB_ROCM_VERSION", "64")
    forced = compat.rocm_builds(plan(image=ROCM72, probe=rocm_probe("7.2.53211"), arguments={"quantization_bit": 4}))
    assert forced.status == FAIL and "(ROCm 6.4: BNB_ROCM_VERSION=64)" in forced.message


def test_a_bitsandbytes_library_without_the_cards_target_names_both(tmp_path, monkeypatch):
    """bitsandbytes-foundation/bitsandbytes#1955 (a gfx1201 the pip wheel did not support) and ROCm/bitsandbytes#29
    ("invalid device function" on a 7900 XTX): a library without the card's target fails at the first kernel.
    The real rocm72 library has gfx1030 but not gfx1031 (RX 6700 XT): the refusal names the card's target (from the
    SYNTHETIC KFD topology), the library's targets, and the safe override that runs its gfx1030 code."""
    kfd_node(tmp_path, 1, 9, 100301, 128, 0x0300, "navi22")  # gfx_target_version 100301: gfx1031
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/dri/renderD128").touch()
    rx6700 = rocm_probe("7.2.53211", gpu(arch="gfx1031", name="AMD Radeon RX 6700 XT"))
    image = {**ROCM72, "arch": "gfx1030", "pytorch_rocm_arch": "gfx1030"}
    subject = plan(image=image, probe=rx6700, arguments={"quantization_bit": 4}, node_root=str(tmp_path))
    outcome = compat.rocm_builds(subject)
    assert outcome.status == FAIL and "libbitsandbytes_rocm72.so has none for gfx1031: the GPU is gfx1031" in \
        outcome.message  # fmt: skip
    assert "the library has gfx1030, gfx1100" in outcome.message and "gfx950" in outcome.message
    assert outcome.remedy.startswith("ROCMFT_GFX_OVERRIDE=auto or HSA_OVERRIDE_GFX_VERSION=10.3.0 runs the gfx1030")
    assert "-DBNB_ROCM_ARCH=gfx1031" in outcome.remedy
    overridden = CheckSubject(plan=subject.plan, probes=subject.probes,
                              launch_environment={"HSA_OVERRIDE_GFX_VERSION": "10.3.0"})  # fmt: skip
    assert compat.rocm_builds(overridden).status == PASS  # the runtime then loads the gfx1030 code it has


def test_rocm_builds_skip_outside_a_rocm_image():
    assert compat.rocm_builds(plan(image=None, probe=devices(backend="cpu"))).status == SKIP


# --- library-versions ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("installed", "arguments", "status", "words"),
    [
        ({"flash-attn": "2.0.4"}, {"flash_attn": "fa2"}, FAIL, "flash-attn 2.0.4 (<2.1.0"),
        ({"flash-attn": "2.0.4"}, {}, WARN, "hiyouga/LlamaFactory#3464"),
        ({"flash-attn": "2.8.3"}, {"flash_attn": "fa2"}, PASS, "no installed version"),
        ({"bitsandbytes": "0.49.2"}, {"quantization_bit": 4}, FAIL, "unslothai/unsloth#4954"),
        ({"bitsandbytes": "0.50.2"}, {"quantization_bit": 4}, PASS, "no installed version"),
    ],
)
def test_known_bad_versions_are_refused_with_the_version_to_install(installed, arguments, status, words):
    """hiyouga/LlamaFactory#3464: flash-attn 2.0.4 (ROCm's fork) imports and runs, and transformers refuses it only
    when the model loads (Dao-AILab/flash-attention#965: the fork stopped at 2.0.4; turboderp-org/exllamav2#397:
    before 2.1 the causal mask is right only for equal lengths). unslothai/unsloth#4954: bitsandbytes 0.49.2's 4-bit
    GEMV is broken on every ROCm target. The installed versions are INJECTED (importlib.metadata's answer)."""
    outcome = compat.library_versions(plan(arguments=arguments, library_versions=installed))
    assert outcome.status == status and words in outcome.message
    if status != PASS:
        name = next(iter(installed))
        pinned = {"flash-attn": "'flash-attn==2.8.3'", "bitsandbytes": "'bitsandbytes==0.50.2'"}[name]
        assert outcome.remedy.startswith(f"pip install {pinned} (the versions rocmft's images pin;")


def test_the_rocm_only_row_is_not_applied_to_a_cuda_torch_and_real_versions_are_read():
    cuda = compat.library_versions(plan(probe=devices(gpu(), backend="cuda"), arguments={"quantization_bit": 4},
                                        library_versions={"bitsandbytes": "0.49.2"}))  # fmt: skip
    assert cuda.status == PASS
    real = compat.installed_versions()  # this environment's, by importlib.metadata
    assert real.get("bitsandbytes") == "0.50.2"
    assert compat.library_versions(plan(arguments={"quantization_bit": 4})).status == PASS


def test_a_torch_rocm_bitsandbytes_ships_no_library_for_fails_naming_what_it_has():
    """ROCm/bitsandbytes#82: with torch and ROCm versions that do not match what the wheel was built for,
    bitsandbytes looks for a library it does not ship and fails. The real wheel has no ROCm 8 library at all."""
    image = {**ROCM72, "rocm_version": "8.0"}
    outcome = compat.rocm_builds(plan(image=image, probe=rocm_probe("8.0.1"), arguments={"quantization_bit": 4}))
    assert outcome.status == FAIL and "would load libbitsandbytes_rocm80.so (missing), which is not there" in \
        outcome.message  # fmt: skip
    assert "libbitsandbytes_rocm72.so" in outcome.message and "libbitsandbytes_rocm80.so" in outcome.remedy


def test_the_quantization_record_imports_no_bitsandbytes_and_still_finds_its_layers(monkeypatch):
    """The worker's record of a QLoRA base (rocmft.worker.callbacks.quantization_record) finds bitsandbytes' layers
    when bitsandbytes built the model, and answers None for a model built without it, without importing it (2.8 s
    of every run's start before)."""
    import sys

    import torch

    from rocmft.worker.callbacks import quantization_record

    monkeypatch.delitem(sys.modules, "bitsandbytes", raising=False)
    assert quantization_record(torch.nn.Sequential(torch.nn.Linear(16, 16))) is None
    assert "bitsandbytes" not in sys.modules
    monkeypatch.undo()
    bnb = pytest.importorskip("bitsandbytes")
    model = torch.nn.Sequential(bnb.nn.Linear8bitLt(16, 16, has_fp16_weights=False), torch.nn.Linear(16, 2))
    record = quantization_record(model)
    assert record is not None and (record["bits"], record["layers"], record["weights"]) == (8, 1, 256)
