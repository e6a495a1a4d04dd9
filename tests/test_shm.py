"""/dev/shm against the data loader's workers (issue 30, item 7; docs/rules.md row 12 and the row of this item).

A container started with Docker's defaults has a 64 MiB /dev/shm, and torch's DataLoader workers die in it with
"DataLoader worker ... is killed by signal: Bus error" (pytorch/pytorch#5040; in a Docker training container:
open-mmlab/mmdetection#1997, fixed with --shm-size in fastai/docker-containers#21). rocmft's own default of 2
loader workers made its ``shm`` check refuse that healthy single-GPU container. Now render plans the workers that
fit when the user did not choose their number, and says so; a number the user chose is refused with the number
that fits and the flag. The GPU and /dev/shm's size are injected (this machine has neither to spare): the device as
rocmft.facts.device.DeviceFacts and the probe provider's ``shm_bytes``, the shapes the probes measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rocmft.changes import say_changes
from rocmft.checks import FAIL, PASS, CheckSubject
from rocmft.checks import gpu as checks
from rocmft.config.provenance import Kind
from rocmft.errors import ExitCode
from rocmft.facts.device import DeviceFacts
from rocmft.facts.probes import Probes
from rocmft.launch.changes import argument_changes

DOCKER_DEFAULT_SHM = 64 << 20  # Docker's default /dev/shm (docker run reference, --shm-size)
# one injected GPU, shaped as the device probe's facts (an MI300X's 192 GiB)
ONE_GPU = DeviceFacts(backend="rocm", count=1, names=["AMD Instinct MI300X"], archs=["gfx942:sramecc+:xnack-"],
                      memory_gib=[191.98], bf16=True)  # fmt: skip


@pytest.fixture
def render_shm(tmp_path, cache_dir, tiny_model, demo_data):
    """render(environ, shm_bytes) -> the staged Plan, for the tiny model on the demo data and one injected GPU."""
    from tests.conftest import _clean_environment

    def run(environ: dict[str, str], shm_bytes: int | None, device: DeviceFacts = ONE_GPU, model: bool = True):
        from rocmft.config.settings import load_settings
        from rocmft.validate.rules import render_checked

        base = {"ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out")}
        if model:  # else the built-in default (templates/demo.yaml)
            base.update({"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo",
                         "DATASET_DIR": str(demo_data), "CUTOFF_LEN": "128"})  # fmt: skip
        settings = load_settings({**_clean_environment(), **base, **environ})
        staging = tmp_path / "staging"

        def make_staging(_output_dir: Path) -> Path:
            staging.mkdir(parents=True, exist_ok=True)
            return staging

        return render_checked(settings, device, make_staging, shm_bytes)

    return run


def shm_outcome(plan, shm_bytes: int):
    """The real ``shm`` check on ``plan`` with /dev/shm's size injected into the probe provider (``shm_bytes``)."""
    return checks.shm(CheckSubject(plan=plan, probes=Probes(injected={"shm_bytes": shm_bytes})))


def test_the_default_workers_give_way_to_dockers_default_shm_and_say_so(render_shm, capsys):
    """Injected: one GPU and a 64 MiB /dev/shm. The template's 2 workers (512 MiB) do not fit: the run plans 0,
    the check passes, the console line names the setting, its value, /dev/shm's size and the flags."""
    plan = render_shm({}, DOCKER_DEFAULT_SHM)
    assert plan.arguments["dataloader_num_workers"] == 0
    assert OmegaConf.load(plan.files["train.yaml"])["dataloader_num_workers"] == 0
    assert plan.sources["dataloader_num_workers"].kind is Kind.PLAN
    outcome = shm_outcome(plan, DOCKER_DEFAULT_SHM)
    assert outcome.status == PASS, outcome
    assert "0 loader worker(s)" in outcome.message
    say_changes(argument_changes(plan))  # the block of automatic changes `_prepare` prints (rocmft.changes)
    line = next(x for x in capsys.readouterr().out.splitlines() if "DATALOADER_NUM_WORKERS=0" in x)
    assert line.startswith("[rocmft]   DATALOADER_NUM_WORKERS=0: ") and line.endswith(" (rocmft plan)"), line
    for words in ("/dev/shm holds 64 MiB", "default 2 loader workers", "--shm-size=1g", "shm_size: 1gb",
                  "DATALOADER_NUM_WORKERS"):  # fmt: skip
        assert words in line, (words, line)
    # recorded as the planner's other choices are: the manifest's plan keeps it
    recorded = {c.name: c for c in plan.perf.choices}["dataloader_num_workers"]
    assert recorded.planned and recorded.value == 0


def test_the_builtin_default_passes_under_dockers_default_shm(render_shm):
    """Injected: one GPU and 64 MiB. The built-in default (no model given: templates/demo.yaml) loads its data in the
    main process already; it passes with nothing to plan."""
    plan = render_shm({}, DOCKER_DEFAULT_SHM, model=False)
    assert plan.demo and plan.arguments["dataloader_num_workers"] == 0
    assert shm_outcome(plan, DOCKER_DEFAULT_SHM).status == PASS
    assert "dataloader_num_workers" not in {c.name for c in plan.perf.choices}


def test_a_shm_that_holds_some_workers_keeps_as_many_as_fit(render_shm):
    """Injected: 300 MiB of /dev/shm holds one 256 MiB worker of the default two; 1 GiB holds both (unchanged)."""
    plan = render_shm({}, 300 << 20)
    assert plan.arguments["dataloader_num_workers"] == 1
    assert shm_outcome(plan, 300 << 20).status == PASS
    roomy = render_shm({}, 1 << 30)
    assert roomy.arguments["dataloader_num_workers"] == 2
    assert "dataloader_num_workers" not in {c.name for c in roomy.perf.choices}


def test_without_a_gpu_the_workers_are_planned_all_the_same(render_shm, capsys):
    """The CPU image's container under Docker's default meets the same false alarm; the performance planner is off
    there, the loader workers are not, and the console says both."""
    from rocmft.cli.common import _say_plan

    plan = render_shm({}, DOCKER_DEFAULT_SHM, device=DeviceFacts(backend="cpu"))
    assert plan.arguments["dataloader_num_workers"] == 0 and not plan.perf.active
    assert shm_outcome(plan, DOCKER_DEFAULT_SHM).status == PASS
    _say_plan(plan.perf)
    say_changes(argument_changes(plan))
    out = capsys.readouterr().out
    assert "only dataloader_num_workers is planned, for /dev/shm" in out
    assert "[rocmft]   DATALOADER_NUM_WORKERS=0: /dev/shm holds 64 MiB" in out, out


@pytest.mark.parametrize(("environ", "named"), [
    ({"DATALOADER_NUM_WORKERS": "4"}, "DATALOADER_NUM_WORKERS=4 (set in the environment)"),
])  # fmt: skip
def test_workers_the_user_set_are_kept_and_refused_with_the_number_that_fits(render_shm, environ, named):
    """Injected: one GPU, 64 MiB. The user's 4 workers stay; the check refuses, naming the variable with the value
    that fits (0) and the exact flags that grow /dev/shm to what the 4 need (1 GiB)."""
    plan = render_shm(environ, DOCKER_DEFAULT_SHM)
    assert plan.arguments["dataloader_num_workers"] == 4
    assert "dataloader_num_workers" not in {c.name for c in plan.perf.choices}
    outcome = shm_outcome(plan, DOCKER_DEFAULT_SHM)
    assert outcome.status == FAIL
    assert named in outcome.message and "/dev/shm is too small: it holds 64 MiB" in outcome.message
    assert outcome.remedy.startswith("Set DATALOADER_NUM_WORKERS=0 (what this /dev/shm holds)")
    assert "docker run --shm-size=1g" in outcome.remedy and "compose: shm_size: 1gb" in outcome.remedy


def test_workers_set_in_the_users_yaml_are_named_where_they_were_written(render_shm, tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("dataloader_num_workers: 3\n")
    plan = render_shm({"ROCMFT_CONFIG": str(config)}, 300 << 20)
    outcome = shm_outcome(plan, 300 << 20)
    assert outcome.status == FAIL and f"dataloader_num_workers: 3 (in ROCMFT_CONFIG ({config}))" in outcome.message
    assert outcome.remedy.startswith("Set DATALOADER_NUM_WORKERS=1 ")


def test_processes_that_communicate_need_more_than_fewer_workers_can_free(render_shm):
    """Injected: two GPUs (torchrun, two communicating processes need 2 GiB) and 64 MiB: no number of workers lets
    the run pass, so none is planned and the refusal gives the flags for the whole need."""
    two = DeviceFacts(backend="rocm", count=2, names=["AMD Instinct MI300X"] * 2,
                      archs=["gfx942:sramecc+:xnack-"] * 2, memory_gib=[191.98] * 2, bf16=True)  # fmt: skip
    plan = render_shm({}, DOCKER_DEFAULT_SHM, device=two)
    assert plan.arguments["dataloader_num_workers"] == 2
    outcome = shm_outcome(plan, DOCKER_DEFAULT_SHM)
    assert outcome.status == FAIL and "2 communicating local process(es)" in outcome.message
    assert "--shm-size=3g" in outcome.remedy and "--ipc=host" in outcome.remedy
    assert "DATALOADER_NUM_WORKERS" not in outcome.remedy


def test_rocmft_check_passes_a_single_gpu_container_with_dockers_default_shm(run_rocmft, tmp_path, tiny_model,
                                                                              demo_data):  # fmt: skip
    """`rocmft check` as a process, with one GPU and a 64 MiB /dev/shm injected (ROCMFT_TEST_PROBES, the shapes of
    tests/test_rules_checks_cli.py): exit 0, the shm check passes, the console line is there."""
    from tests.test_rules_checks_cli import HEALTHY, devices, gpu

    probes = {**HEALTHY, "devices": devices(gpu(0)), "shm_bytes": DOCKER_DEFAULT_SHM}
    probes["device_nodes"] = HEALTHY["device_nodes"][:2]
    probes.pop("allreduce")
    (tmp_path / "probes.json").write_text(json.dumps(probes))
    output = tmp_path / "out"
    env = {"ROCMFT_TEST_PROBES": str(tmp_path / "probes.json"), "ROCMFT_PRECISION": "fp32",
           "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
           "CUTOFF_LEN": "128", "OUTPUT_DIR": str(output)}  # fmt: skip
    result = run_rocmft("check", env=env)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    assert "[rocmft]   DATALOADER_NUM_WORKERS=0: /dev/shm holds 64 MiB" in result.stdout, result.stdout[-3000:]
    assert "--shm-size=1g" in result.stdout
    report = json.loads((output / "rocmft" / "checks.json").read_text())
    assert {c["id"]: c["status"] for c in report["checks"]}["shm"] == "pass"
