"""Issue 29: the test hooks (injected probe results, injected faults) are off the production surface. A production
`rocmft` (`python -m rocmft`, the console script) installs no hooks and refuses ROCMFT_TEST_PROBES and ROCMFT_FAULT_*
as unknown settings (exit 2, nothing written), so that no variable a user sets can make a GPU check pass on a machine
without a GPU; the tests' launcher, tests/support/rocmft_under_test.py, is the one way in (rocmft.testhooks)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import PRODUCTION_ROCMFT, REPO, rocmft_in
from rocmft.errors import ExitCode
from rocmft.testhooks import FAULTS, VARIABLES, TestHooks
from test_rules_checks_cli import HEALTHY

PACKAGE = REPO / "entrypoint" / "rocmft"
FAULT_VALUES = {"ROCMFT_FAULT_NAN_AT_STEP": "6", "ROCMFT_FAULT_KILL_IN_SAVE_AT_STEP": "10",
                "ROCMFT_FAULT_SLOW_FINAL_SAVE_S": "2.5", "ROCMFT_FAULT_GRAD_SPIKE_AT_STEP": "8",
                "ROCMFT_FAULT_HANG_AT_STEP": "4"}  # fmt: skip


def _console_script() -> tuple[str, ...]:
    """The installed `rocmft` console script next to this Python (pyproject.toml's [project.scripts])."""
    found = shutil.which("rocmft", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"no rocmft console script in {Path(sys.executable).parent}; install the package (make venv)")
    return (found,)


def _check_environment(tmp_path: Path, tiny_model: Path, demo_data: Path) -> dict[str, str]:
    """`rocmft check` of the tiny model, with ROCMFT_TEST_PROBES naming probe results of a healthy 2 x MI300X host."""
    (tmp_path / "probes.json").write_text(json.dumps(HEALTHY))
    return {"ROCMFT_TEST_PROBES": str(tmp_path / "probes.json"), "ROCMFT_PRECISION": "fp32",
            "MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "rocmft_demo", "DATASET_DIR": str(demo_data),
            "CUTOFF_LEN": "128", "OUTPUT_DIR": str(tmp_path / "out")}  # fmt: skip


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow  # production rocmft as a process
@pytest.mark.parametrize("entry", ["python -m rocmft", "console script"])
def test_production_rocmft_refuses_the_test_hooks_and_passes_no_gpu_check(tmp_path, cache_dir, tiny_model,
                                                                          demo_data, entry):  # fmt: skip
    """The acceptance: a probe file that claims a healthy GPU, set as ROCMFT_TEST_PROBES (and the faults beside it)
    for the production command on this machine: exit 2 naming each variable as a test hook, no check run, nothing
    written (no OUTPUT_DIR, no checks.json)."""
    env = {**_check_environment(tmp_path, tiny_model, demo_data), **FAULT_VALUES}
    before = _files(tmp_path)
    command = PRODUCTION_ROCMFT if entry == "python -m rocmft" else _console_script()
    result = rocmft_in(tmp_path, cache_dir, "check", env=env, entry=command, timeout=300)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-3000:]
    assert "CONFIGURATION ERROR: Unknown settings:" in result.stdout, result.stdout[-3000:]
    for name in VARIABLES:
        assert f"{name} is a test hook of rocmft's own tests; the rocmft command does not read it." in result.stdout
    assert "Did you mean" not in result.stdout  # no unrelated setting offered (ROCMFT_TEMPLATES for TEST_PROBES)
    assert "Traceback" not in result.stdout and "gpu-devices" not in result.stdout
    assert not (tmp_path / "out").exists()
    assert _files(tmp_path) == before


def test_the_launcher_honours_the_same_probe_file(run_rocmft, tmp_path, tiny_model, demo_data):
    """The same environment through the tests' launcher: the injected healthy GPUs pass the GPU checks, so the
    refusal above is the production entry's, not a broken probe file."""
    env = _check_environment(tmp_path, tiny_model, demo_data)
    result = run_rocmft("check", env=env)
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    report = json.loads((tmp_path / "out" / "rocmft" / "checks.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert all(statuses[i] == "pass" for i in ("gpu-devices", "gpu-runtime", "gpu-arch", "collectives")), statuses
    assert "AMD Instinct MI300X" in json.dumps(report)  # the injected GPUs, not this machine's


def test_the_launcher_carries_the_faults_into_run_json_and_production_writes_none(run_rocmft, tmp_path):
    """Faults reach the worker only in run.json: written by the launcher's process, null from a production render
    (which has no hooks, as the refusal above shows for the variables)."""
    faulty = run_rocmft("render", env={"OUTPUT_DIR": str(tmp_path / "faulty"), **FAULT_VALUES})
    assert faulty.returncode == ExitCode.OK, faulty.stdout[-3000:]
    policy = json.loads((tmp_path / "faulty" / "rocmft" / "run.json").read_text())
    assert {k: policy[k] for k in policy if k.startswith("fault_")} == {
        "fault_nan_at_step": 6, "fault_kill_in_save_at_step": 10, "fault_slow_final_save_s": 2.5,
        "fault_grad_spike_at_step": 8, "fault_hang_at_step": 4}  # fmt: skip
    plain = run_rocmft("render", env={"OUTPUT_DIR": str(tmp_path / "plain")})
    assert plain.returncode == ExitCode.OK, plain.stdout[-3000:]
    policy = json.loads((tmp_path / "plain" / "rocmft" / "run.json").read_text())
    assert [policy[f"fault_{name}"] for name in FAULTS] == [None] * len(FAULTS)


@pytest.mark.parametrize(("name", "value", "words"), [
    ("ROCMFT_TEST_PROBES", "{missing}", "cannot be read as JSON"),
    ("ROCMFT_FAULT_NAN_AT_STEP", "0", "is not a positive int"),
    ("ROCMFT_FAULT_SLOW_FINAL_SAVE_S", "nan", "is not a positive float"),
    ("ROCMFT_FAULT_NAN_AT_STEPS", "3", "is not a test fault"),
])  # fmt: skip
def test_the_launcher_refuses_a_hook_it_cannot_read(run_rocmft, tmp_path, name, value, words):
    """A hook the launcher cannot read ends the run as a bad setting would (exit 2, rocmft's message, no traceback):
    a test with a typo in its hook fails instead of running without the hook."""
    result = run_rocmft("render", env={name: value.format(missing=tmp_path / "no.json"),
                                       "OUTPUT_DIR": str(tmp_path / "out")})  # fmt: skip
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-3000:]
    assert f"CONFIGURATION ERROR: {name}" in result.stdout and words in result.stdout, result.stdout[-3000:]
    assert "Traceback" not in result.stdout and not (tmp_path / "out").exists()


def test_hooks_refuse_an_unknown_or_non_positive_fault():
    assert TestHooks(faults={"nan_at_step": 3, "slow_final_save_s": 0.5}).faults["nan_at_step"] == 3
    for faults in ({"nan_at_steps": 3}, {"nan_at_step": 0}, {"nan_at_step": 1.5}, {"nan_at_step": True},
                   {"slow_final_save_s": -1.0}):  # fmt: skip
        with pytest.raises(ValueError, match="fault"):
            TestHooks(faults=faults)


def _string_constants(tree: ast.Module) -> list[str]:
    """The string constants of ``tree`` that are not docstrings (code, not prose)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]  # fmt: skip


def test_no_module_of_the_package_reads_a_test_hook_from_the_environment():
    """The source itself: no module under entrypoint/rocmft names ROCMFT_TEST_PROBES or a ROCMFT_FAULT_ variable in
    code (rocmft.testhooks alone, which names them to word production's refusal), and rocmft.testhooks touches no
    environment; no settings field is a hook. A module that read one from the environment would name it in code."""
    hook_name = re.compile(r"(?<![A-Za-z])(TEST_PROBES|FAULT_)")  # not DEFAULT_
    naming = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = [s for s in _string_constants(ast.parse(path.read_text(encoding="utf-8"))) if hook_name.search(s)]
        if found:
            naming[str(path.relative_to(PACKAGE))] = found
    # testhooks.VARIABLES: "ROCMFT_TEST_PROBES" and f"ROCMFT_FAULT_{name.upper()}" for each fault
    assert naming == {"testhooks.py": ["ROCMFT_TEST_PROBES", "ROCMFT_FAULT_"]}, naming
    hooks = ast.parse((PACKAGE / "testhooks.py").read_text(encoding="utf-8"))
    used = {n.id for n in ast.walk(hooks) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(hooks) if isinstance(n, ast.Attribute)}  # fmt: skip
    imported = {a.name for n in ast.walk(hooks) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert not {"os", "environ", "getenv", "sys", "argv"} & (used | imported), used | imported
    from rocmft.config.settings import RocmftSettings

    assert not [f for f in RocmftSettings.model_fields if f.startswith(("fault", "test_"))]
