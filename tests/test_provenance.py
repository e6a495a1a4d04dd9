"""Issue 29: a verdict never depends on how a setting was written. Sources are typed
(rocmft.config.provenance.Source); decisions read the kind, never the text; a restart is rocmft's own override,
never a write to the process environment.

Everything here runs in-process through the real path (load_settings, render_checked). Devices named
"injected" are DeviceFacts built here (data, not hardware: this machine has no GPU).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmft.cli.train import restart_overrides
from rocmft.config.cmdline import parse_command_line
from rocmft.config.provenance import Kind, Source
from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.outputs.manifest import Restart
from rocmft.validate.rules import render_checked

# An injected bf16 GPU, shaped as rocmft's probe reports one MI300X.
INJECTED_BF16_GPU = DeviceFacts(backend="rocm", names=["AMD Instinct MI300X"], archs=["gfx942:sramecc+:xnack-"],
                                bf16=True, count=1, memory_gib=[191.98])  # fmt: skip
# Words that the old text test (`"default" not in source`) or a text-based source test would trip over.
TRAP_WORDS = ["default", "command line", "environment", "rocmft plan", "the built-in default", "CONFIG"]


def _render(environ: dict[str, str], staging: Path, arguments: list[str] | None = None, device=None, overrides=None):
    """render_checked as `rocmft render` runs it, in-process."""
    settings = load_settings(environ, parse_command_line(arguments or []), overrides=overrides)

    def make_staging(output_dir: Path) -> Path:
        staging.mkdir(parents=True, exist_ok=True)
        return staging

    return render_checked(settings, device or DeviceFacts(backend="cpu"), make_staging)


def _base(tmp_path: Path, cache_dir: Path, tiny_model: Path) -> dict[str, str]:
    return {"ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out"),
            "MODEL_NAME_OR_PATH": str(tiny_model)}  # fmt: skip


# --- failure 2 of the issue: a refusal disappeared by file name --------------------------------------------------


@pytest.mark.parametrize("route", ["command line", "ROCMFT_CONFIG"])
@pytest.mark.parametrize("where", ["default-qwen.yaml", "c.yaml", "default/c.yaml", "command line/c.yaml",
                                   "environment/c.yaml", "my environment default.yaml"])  # fmt: skip
def test_a_refusal_does_not_depend_on_the_config_files_name(tmp_path, cache_dir, tiny_model, where, route):
    """cutoff_len: 999999 on the tiny model (context 1024) is refused whatever the YAML is called. On 1c709cb
    `rocmft render default-qwen.yaml` exited 0 here and c.yaml exited 2 (user_set tested the text for
    "default")."""
    config = tmp_path / where
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("cutoff_len: 999999\n")
    environ = _base(tmp_path, cache_dir, tiny_model)
    arguments = [str(config)] if route == "command line" else []
    if route == "ROCMFT_CONFIG":
        environ["ROCMFT_CONFIG"] = str(config)
    with pytest.raises(ConfigError) as caught:
        _render(environ, tmp_path / "staging", arguments)
    assert "cutoff_len: 999999" in caught.value.message and "beyond the model's context length (1024" in (
        caught.value.message
    )
    assert f"({config})" in caught.value.message


def test_user_chosen_reads_the_kind_not_the_text():
    """The answer to "did the user set this?" is the kind's, whatever the detail says."""
    for word in TRAP_WORDS:
        for kind in (Kind.ENVIRONMENT, Kind.CONFIG_FILE, Kind.COMMAND_LINE_YAML, Kind.COMMAND_LINE):
            assert Source(kind, f"/x/{word}.yaml").user_chosen
        for kind in (Kind.TEMPLATE, Kind.BUILTIN, Kind.ROCMFT_DEFAULT, Kind.PLAN, Kind.RESTART):
            assert not Source(kind, word).user_chosen
        assert not Source(Kind.ROCMFT, word).user_chosen
        assert Source(Kind.ROCMFT, word, basis=Source.environment("DATASET_DIR")).user_chosen


# --- failure 1 of the issue: the fp32 restart after a NaN ------------------------------------------------------


BF16_WAYS = {
    "BF16=true": ({"BF16": "true"}, None),
    "bf16: true in ROCMFT_CONFIG": ({}, "bf16: true\n"),
    "ROCMFT_PRECISION=bf16": ({"ROCMFT_PRECISION": "bf16"}, None),
}


@pytest.mark.parametrize("way", list(BF16_WAYS))
def test_the_restart_renders_real_fp32_whoever_chose_bf16(tmp_path, cache_dir, tiny_model, way):
    """On an injected bf16 GPU, the first attempt is bf16 and the restart after a non-finite loss renders fp32,
    with the restart as the source. On 1c709cb the restart wrote ROCMFT_PRECISION=fp32 into os.environ, and with
    BF16=true the precision rule refused it: 'ROCMFT_PRECISION=fp32 (set in the environment) contradicts BF16=true
    (set in the environment)', exit 2, no fp32 run (seen on the H200)."""
    extra, yaml_text = BF16_WAYS[way]
    environ = {**_base(tmp_path, cache_dir, tiny_model), **extra}
    if yaml_text is not None:
        (tmp_path / "my.yaml").write_text(yaml_text)
        environ["ROCMFT_CONFIG"] = str(tmp_path / "my.yaml")
    first = _render(environ, tmp_path / "first", device=INJECTED_BF16_GPU)
    assert first.precision.policy == "bf16" and first.arguments["bf16"] is True

    restart = Restart(cause="non-finite loss", at_step=15, from_checkpoint=None, precision_from="bf16")
    again = _render(environ, tmp_path / "again", device=INJECTED_BF16_GPU, overrides=restart_overrides(restart))
    assert again.precision.policy == "fp32" and again.precision.compute_dtype == "float32"
    assert again.arguments["bf16"] is False and again.arguments["fp16"] is False
    assert again.precision.reason == "ROCMFT_PRECISION=fp32 (the restart after a non-finite loss at step 15)"
    assert again.settings.overridden["precision"].kind is Kind.RESTART
    assert "precision" not in again.settings.explicit_rocmft  # rocmft's decision is never said to be the user's
    assert again.settings.knob("precision") == again.precision.reason
    assert again.settings.redacted()["rocmft_overrides"] == {
        "precision": "the restart after a non-finite loss at step 15",
        "resume": "the restart after a non-finite loss at step 15",
    }


def test_a_restart_leaves_the_process_environment_alone(tmp_path, cache_dir, tiny_model, monkeypatch):
    """The overrides reach the settings only: nothing is written into os.environ (the worker and the parser child
    get the same environment as the first attempt)."""
    import os

    monkeypatch.delenv("ROCMFT_PRECISION", raising=False)
    monkeypatch.delenv("ROCMFT_RESUME", raising=False)
    before = dict(os.environ)
    restart = Restart(cause="loss spike", at_step=7, from_checkpoint=None, precision_from="bf16")
    environ = {**_base(tmp_path, cache_dir, tiny_model), "BF16": "true"}
    plan = _render(environ, tmp_path / "s", device=INJECTED_BF16_GPU, overrides=restart_overrides(restart))
    assert plan.precision.policy == "fp32" and plan.settings.rocmft.resume == "never"
    assert dict(os.environ) == before


# --- the property: the verdict does not depend on where a value was written ------------------------------------

# Conflicts whose settings are all training arguments (each can be written in any of the four places), from
# tests/test_refusals_complete.py's cases; the rule expected to refuse each, and the settings its message names.
CASES = [
    ("method_settings", {"FINETUNING_TYPE": "full", "LORA_RANK": "64"}),
    ("ranges", {"CUTOFF_LEN": "100000"}),
    ("more_values", {"WARMUP_STEPS": "10", "WARMUP_RATIO": "0.1"}),
    ("more_ranges", {"NUM_TRAIN_EPOCHS": "0"}),
    ("more_ranges", {"LORA_DROPOUT": "5"}),
    ("lora_target", {"LORA_TARGET": "q_proj,query_key_value"}),
    ("chat_template_fits", {"TEMPLATE": "llama3"}),
    ("output_not_input", {"OUTPUT_DIR": "{model}/out"}),
]
PLACES = ["environment", "ROCMFT_CONFIG", "the command line's YAML", "key=value"]
KINDS = {"environment": "environment", "ROCMFT_CONFIG": "rocmft_config", "the command line's YAML": "command_line_yaml",
         "key=value": "command_line"}  # fmt: skip
_names = st.lists(st.sampled_from([*TRAP_WORDS, "c", "my run", "x-1"]), min_size=1, max_size=3).map(" ".join)


def _where_said(place: str, key: str, value: str, config: Path) -> str:
    return {
        "environment": f"{key.upper()}={value} (set in the environment)",
        "ROCMFT_CONFIG": f"{key}: {value} (in ROCMFT_CONFIG ({config}))",
        "the command line's YAML": f"{key}: {value} (in the command line's CONFIG ({config}))",
        "key=value": f"{key}={value} (command line ({key}={value}))",
    }[place]


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory, tiny_model) -> Path:
    folder = tmp_path_factory.mktemp("model") / "model"
    shutil.copytree(tiny_model, folder)
    return folder


@pytest.mark.parametrize(("rule", "offending"), CASES, ids=[f"{r}-{'-'.join(c)}" for r, c in CASES])
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_the_verdict_and_the_settings_named_do_not_depend_on_where_a_value_was_written(
    rule, offending, data, tmp_path_factory, cache_dir, model_copy
):
    """For each rule and each offending value written in the environment, ROCMFT_CONFIG, the command line's YAML
    (under any file name, trap words included) or a key=value: the same rule refuses (its finding's code), and the
    finding names each setting with its value as written and the kind of place it was written in."""
    tmp = tmp_path_factory.mktemp("where")
    case = {k: v.replace("{model}", str(model_copy)) for k, v in offending.items()}
    places = {name: data.draw(st.sampled_from(PLACES), label=name) for name in case}
    stem = data.draw(_names, label="file name")
    config = tmp / stem / f"{stem}.yaml"
    config.parent.mkdir(parents=True)
    environ = {"ROCMFT_CACHE_DIR": str(cache_dir), "MODEL_NAME_OR_PATH": str(model_copy)}
    if "OUTPUT_DIR" not in case:  # the environment is above a YAML: set only what the case does not write elsewhere
        environ["OUTPUT_DIR"] = str(tmp / "out")
    yaml_lines, tokens = [], []
    for name, value in case.items():
        key = name.lower()
        if places[name] == "environment":
            environ[name] = value
        elif places[name] == "key=value":
            tokens.append(f"{key}={value}")
        else:
            yaml_lines.append(f"{key}: {value}")
    # one YAML for the keys written in a file: ROCMFT_CONFIG or the command line's (not both: they must be one file)
    in_yaml = [p for p in places.values() if p in ("ROCMFT_CONFIG", "the command line's YAML")]
    route = in_yaml[0] if in_yaml else None
    places = {n: (route if p in ("ROCMFT_CONFIG", "the command line's YAML") else p) for n, p in places.items()}
    arguments = []
    if route is not None:
        config.write_text("\n".join(yaml_lines) + "\n")
        if route == "ROCMFT_CONFIG":
            environ["ROCMFT_CONFIG"] = str(config)
        else:
            arguments.append(str(config))
    arguments += tokens
    with pytest.raises(ConfigError) as caught:
        _render(environ, tmp / "staging", arguments)
    findings = {f.code.rpartition(".")[2]: f for f in caught.value.findings}  # rocmft.findings, by rule
    assert rule in findings, (places, [f.code for f in caught.value.findings], caught.value.message)
    finding = findings[rule]
    named = {setting.name: setting for setting in finding.settings}
    for name, value in case.items():
        said = _where_said(places[name], name.lower(), value, config)
        assert said in finding.message, (said, finding.message)
        assert named[name.lower()].kind == KINDS[places[name]], (name, named[name.lower()])
        assert named[name.lower()].value == value
