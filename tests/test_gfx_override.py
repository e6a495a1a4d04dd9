"""GPU architecture handling (issue 30, item 8): the opt-in HSA_OVERRIDE_GFX_VERSION for a consumer card the image
lacks, a wrong or malformed override, an override on an Instinct GPU, a node mixing GPU families.

We have no AMD GPU: the device probe's results are INJECTED (shaped as rocmft.facts.probe reports them), and the KFD
topology is a SYNTHETIC sysfs tree under tmp_path in the kernel's format (tests/test_node_checks.py's builders,
which cite kfd_topology.c). Each case comes from a public report, named in its docstring.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.test_gpu_checks import GFX942_IMAGE, GFX1100_IMAGE, devices, gpu, plan
from tests.test_node_checks import kfd_node, node_plan

from rocmft.checks import FAIL, WARN, CheckSubject, node
from rocmft.checks import gpu as checks
from rocmft.facts import gfx

RX7800 = dict(arch="gfx1101", name="AMD Radeon RX 7800 XT", total=16.0, free=15.7)


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("HSA_OVERRIDE_GFX_VERSION", raising=False)


def with_launch(subject: CheckSubject, **variables: str) -> CheckSubject:
    """The same subject with variables the launch adds (rocmft.launch.LaunchSpec.environment)."""
    return CheckSubject(plan=subject.plan, probes=subject.probes, launch_environment=variables)


def rx7800_host(root: Path) -> Path:
    """SYNTHETIC KFD topology of one RX 7800 XT: gfx_target_version 110001 (gfx1101), its render node mapped."""
    kfd_node(root, 1, 5001, 110001, 128, 0x0300, "gfx1101")
    (root / "dev/dri").mkdir(parents=True)
    (root / "dev/dri/renderD128").touch()
    return root


def test_override_values_are_read_as_the_runtime_reads_them():
    assert [gfx.override_target(v) for v in ("11.0.0", "10.3.0", "9.4.2", "9.0.10", "11.5.1")] == [
        "gfx1100", "gfx1030", "gfx942", "gfx90a", "gfx1151"]  # fmt: skip
    assert [gfx.override_target(v) for v in ('"11.0.0"', "gfx1100", "11.0", "11.0.0.0", "")] == [None] * 5
    assert gfx.family("gfx1101") == gfx.family("gfx1100") != gfx.family("gfx1151")
    assert gfx.safe_override(["gfx1101", "gfx1100"], {"gfx1100"}) == "11.0.0"
    assert gfx.safe_override(["gfx1100"], {"gfx1100"}) is None  # nothing to override
    assert gfx.safe_override(["gfx1151"], {"gfx1100"}) is None  # RDNA3.5: no safe value
    assert gfx.safe_override(["gfx1101", "gfx942"], {"gfx1100", "gfx942"}) is None  # the override would hit both


def test_a_consumer_card_the_image_lacks_is_refused_naming_the_opt_in():
    """AUTOMATIC1111/stable-diffusion-webui#13534: an RX 7800 XT (gfx1101) runs only with
    HSA_OVERRIDE_GFX_VERSION=11.0.0 (11.0.1, its own number, did not work). Off by default: the refusal names both
    the opt-in and the value."""
    outcome = checks.gpu_arch(plan(image=GFX1100_IMAGE, probe=devices(gpu(**RX7800))))
    assert outcome.status == FAIL and "not gfx1101" in outcome.message
    assert "ROCMFT_GFX_OVERRIDE=auto" in outcome.remedy and "HSA_OVERRIDE_GFX_VERSION=11.0.0" in outcome.remedy


def test_opted_in_rocmft_sets_the_override_for_the_launch_and_says_so(tmp_path, capsys):
    """The same card with ROCMFT_GFX_OVERRIDE=auto: the launch adds HSA_OVERRIDE_GFX_VERSION=11.0.0 with its source
    (recorded in the manifest's launch record), one console line says it, and gpu-arch warns that the card runs as
    gfx1100. Not applied when the user set the variable, nor to a card with no safe value, nor with the setting off."""
    from rocmft.cli.common import _with_gfx_override
    from rocmft.facts.probes import Probes
    from rocmft.launch import spec

    image = GFX1100_IMAGE  # the build record the checks read too (PYTORCH_ROCM_ARCH=gfx1100)
    root = rx7800_host(tmp_path / "host")
    probe = devices(gpu(**RX7800))
    stand_in = SimpleNamespace(settings=SimpleNamespace(rocmft=SimpleNamespace(gfx_override="auto")))
    value, why = spec.gfx_override(stand_in, {}, root, probe, image)
    assert (value, why) == ("11.0.0", "ROCMFT_GFX_OVERRIDE=auto: gfx1101 run the image's gfx1100 code")
    assert spec.gfx_override(stand_in, {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}, root, probe, image) is None
    off = SimpleNamespace(settings=SimpleNamespace(rocmft=SimpleNamespace(gfx_override="off")))
    assert spec.gfx_override(off, {}, root, probe, image) is None
    strix = tmp_path / "strix"
    kfd_node(strix, 1, 7, 110501, 128, 0xC300, "gfx1151")
    (strix / "dev/dri").mkdir(parents=True)
    (strix / "dev/dri/renderD128").touch()
    assert spec.gfx_override(stand_in, {}, strix, devices(gpu(arch="gfx1151")), image) is None

    launch = spec.build_launch_spec(
        SimpleNamespace(settings=SimpleNamespace(rocmft=SimpleNamespace(gfx_override="auto", numa_bind="auto",
                                                                         collectives="default"), overridden={}),
                        layout=None, launcher="python", run_dir=tmp_path / "run", sources={}, arguments={},
                        device=SimpleNamespace(count=1, archs=["gfx1101"])),
        {}, root, devices=probe, image=GFX1100_IMAGE)  # fmt: skip
    assert launch.environment["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    assert launch.as_record()["communication"]["HSA_OVERRIDE_GFX_VERSION"]["source"] == f"rocmft: {why}"
    kept = _with_gfx_override({}, launch, Probes(injected={"devices": probe}), {"devices": probe})
    assert kept.known("devices") is probe  # an injected probe is not measured again
    assert capsys.readouterr().out == ""  # said once, in the block of automatic changes (below, and as a process)
    assert [c.line() for c in launch.changes if c.variable == "HSA_OVERRIDE_GFX_VERSION"] == [
        f"HSA_OVERRIDE_GFX_VERSION=11.0.0: {why} (ROCMFT_GFX_OVERRIDE=auto, rocmft.launch.spec.gfx_override)"
    ]
    subject = plan(image=GFX1100_IMAGE, probe=probe, node_root=str(root))
    outcome = checks.gpu_arch(with_launch(subject, HSA_OVERRIDE_GFX_VERSION="11.0.0"))
    assert outcome.status == WARN and "Running gfx1101 as gfx1100" in outcome.message
    assert "set by ROCMFT_GFX_OVERRIDE=auto" in outcome.message


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("10.3.0", "makes the gfx1101 GPU run gfx1030 code, of another family (gfx103, not gfx110)"),
        ('"11.0.0"', 'HSA_OVERRIDE_GFX_VERSION="11.0.0" is not a gfx version'),
        ("gfx1100", "HSA_OVERRIDE_GFX_VERSION=gfx1100 is not a gfx version"),
    ],
)
def test_a_wrong_or_malformed_override_is_named_and_refused(tmp_path, monkeypatch, value, words):
    """ROCm/legacy-rocm-build#887: an RX 5700 (gfx1010) crashed with HSA_OVERRIDE_GFX_VERSION=10.3.0, another
    family's value; likelovewant/ROCmLibs-for-gfx1103-AMD780M-APU#37: 11.0.0 on a gfx1150 gives
    HSA_STATUS_ERROR_INVALID_ISA; ollama/ollama#3107: a value set with its quotes is not read as a version. Here on
    an RX 7800 XT, whose probe (run under the override) reports what the runtime was told: the KFD's target is
    the card's own."""
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", value)
    root = rx7800_host(tmp_path)
    seen = gfx.override_target(value) or "gfx1101"
    outcome = checks.gpu_arch(plan(image=GFX1100_IMAGE, probe=devices(gpu(**{**RX7800, "arch": seen})),
                                   node_root=str(root)))  # fmt: skip
    assert outcome.status == FAIL and words in outcome.message and "(set in the environment)" in outcome.message
    assert outcome.remedy == ("Unset HSA_OVERRIDE_GFX_VERSION, or set HSA_OVERRIDE_GFX_VERSION=11.0.0 "
                              "(ROCMFT_GFX_OVERRIDE=auto sets it for you).")  # fmt: skip


def test_an_override_on_an_instinct_gpu_is_flagged(tmp_path, monkeypatch):
    """ROCm/legacy-rocm-build#5238: an MI210 left with HSA_OVERRIDE_GFX_VERSION for gfx1030 from another card showed
    as gfx1030 and died with "Memory access fault ... Reason: unknown"; ROCm/rocm-systems#3461 makes libhsakmt refuse
    an override that differs from supported hardware and warn when it equals it. rocmft does the same, earlier."""
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "10.3.0")
    kfd_node(tmp_path, 1, 1, 90010, 128, 0xC100, "aldebaran")  # SYNTHETIC: the MI210's KFD node, gfx90a
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/dri/renderD128").touch()
    mi210 = devices(gpu(arch="gfx1030", name="AMD Instinct MI210"))  # what the runtime reports under the override
    gfx90a_image = {**GFX942_IMAGE, "arch": "gfx90a", "pytorch_rocm_arch": "gfx90a"}
    wrong = checks.gpu_arch(plan(image=gfx90a_image, probe=mi210, node_root=str(tmp_path)))
    assert wrong.status == FAIL and "makes the gfx90a GPU run gfx1030 code" in wrong.message
    assert wrong.remedy == "Unset HSA_OVERRIDE_GFX_VERSION (the image has code for gfx90a)."
    monkeypatch.setenv("HSA_OVERRIDE_GFX_VERSION", "9.4.2")
    same = checks.gpu_arch(plan())  # an MI300X (gfx942) on the gfx942 image
    assert same.status == WARN and "set on an Instinct MI300X/MI325X (gfx942), which needs no override" in same.message
    assert same.remedy == "Unset HSA_OVERRIDE_GFX_VERSION: the image has gfx942 code."


def test_a_node_mixing_families_gets_the_exact_devices_to_hide(tmp_path):
    """ROCm/rocm-systems#6883: a W6800 beside an RX580 in one container stops ROCm's runtime for both; mapping only
    the supported card fixed it. Beside a GPU of a family the image lacks, rocmft names the exact visibility value
    that keeps the others: by the runtime's order of the mapped GPUs (gpu-families) and by torch's index
    (gpu-arch), the user's own HIP_VISIBLE_DEVICES translated."""
    root = tmp_path
    kfd_node(root, 1, 200, 100300, 128, 0x0300, "navi21")  # gfx1030 first in the topology
    kfd_node(root, 2, 100, 90402, 129, 0xC100, "aqua_vanjaram")  # gfx942
    kfd_node(root, 3, 300, 90402, 130, 0xC200, "aqua_vanjaram")
    (root / "dev/dri").mkdir(parents=True)
    for minor in (128, 129, 130):
        (root / f"dev/dri/renderD{minor}").touch()
    families = node.gpu_families(node_plan(root))  # the gfx942 image
    assert families.status == WARN and "ROCR_VISIBLE_DEVICES=1,2 (or HIP_VISIBLE_DEVICES=1,2 instead" in families.remedy
    mixed = devices(gpu(0, arch="gfx1030", name="AMD Radeon PRO W6800"), gpu(1), gpu(2), visible={})
    arch = checks.gpu_arch(plan(probe=mixed))
    assert arch.status == FAIL and "train on the others only: HIP_VISIBLE_DEVICES=1,2" in arch.remedy
    chosen = devices(gpu(0, arch="gfx1030"), gpu(1), visible={"HIP_VISIBLE_DEVICES": "3,5"})
    assert "HIP_VISIBLE_DEVICES=5 (was 3,5)" in checks.gpu_arch(plan(probe=chosen)).remedy


def test_rocmft_check_refuses_the_card_then_runs_it_opted_in(run_rocmft, tmp_path, tiny_model, demo_data):
    """End to end, as a user runs `rocmft check` on an RX 7800 XT with the gfx1100 image (INJECTED probes through
    ROCMFT_TEST_PROBES, the shapes of tests/test_rules_checks_cli.py): refused with exit 3 naming the opt-in; with
    ROCMFT_GFX_OVERRIDE=auto the console says the override once and gpu-arch warns, naming who set it
    (AUTOMATIC1111/stable-diffusion-webui#13534)."""
    import json

    from tests.test_rules_checks_cli import HEALTHY, IMAGE
    from tests.test_rules_checks_cli import devices as cli_devices
    from tests.test_rules_checks_cli import gpu as cli_gpu

    from rocmft.errors import ExitCode

    card = cli_gpu(0, "gfx1101", "AMD Radeon RX 7800 XT")
    probes = {**HEALTHY, "image": {**IMAGE, "arch": "gfx1100", "pytorch_rocm_arch": "gfx1100"},
              "devices": cli_devices(card), "device_nodes": HEALTHY["device_nodes"][:2]}  # fmt: skip
    (tmp_path / "probes.json").write_text(json.dumps(probes))
    env = {"ROCMFT_TEST_PROBES": str(tmp_path / "probes.json"), "ROCMFT_PRECISION": "fp32",
           "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
           "CUTOFF_LEN": "128"}  # fmt: skip
    refused = run_rocmft("check", env={**env, "OUTPUT_DIR": str(tmp_path / "off")})
    assert refused.returncode == ExitCode.CHECK_FAILED, refused.stdout[-3000:]
    report = json.loads((tmp_path / "off" / "rocmft" / "checks.json").read_text())
    arch = next(c for c in report["checks"] if c["id"] == "gpu-arch")
    assert arch["status"] == "fail" and "ROCMFT_GFX_OVERRIDE=auto" in arch["remedy"]
    assert "HSA_OVERRIDE_GFX_VERSION=11.0.0:" not in refused.stdout

    opted = run_rocmft("check", env={**env, "OUTPUT_DIR": str(tmp_path / "on"), "ROCMFT_GFX_OVERRIDE": "auto"})
    assert opted.returncode == ExitCode.OK, opted.stdout[-3000:]
    line = ("[rocmft]   HSA_OVERRIDE_GFX_VERSION=11.0.0: ROCMFT_GFX_OVERRIDE=auto: gfx1101 run the image's gfx1100 "
            "code (ROCMFT_GFX_OVERRIDE=auto, rocmft.launch.spec.gfx_override)")  # fmt: skip
    assert opted.stdout.count(line) == 1, opted.stdout[-3000:]
    report = json.loads((tmp_path / "on" / "rocmft" / "checks.json").read_text())
    arch = next(c for c in report["checks"] if c["id"] == "gpu-arch")
    assert arch["status"] == "warn" and "set by ROCMFT_GFX_OVERRIDE=auto" in arch["message"]


@pytest.mark.slow
def test_the_probe_child_runs_in_the_environment_it_is_given():
    """The re-probe under the override (rocmft.cli.common._with_gfx_override) and the library probe
    (rocmft.checks.system.libraries) hand the child a whole environment: the child sees it, not rocmft's own. The
    real device probe, on this machine's CPU torch, records the visibility variables it ran with."""
    import os

    from rocmft.facts.device import PROBE_TIMEOUT_S, run_probe

    seen = run_probe(["devices"], PROBE_TIMEOUT_S, env={**os.environ, "HIP_VISIBLE_DEVICES": "7"})
    assert seen.get("visible", {}).get("HIP_VISIBLE_DEVICES") == "7", seen
