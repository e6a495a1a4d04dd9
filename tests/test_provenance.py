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
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rocmft.cli.train import restart_overrides
from rocmft.config.cmdline import parse_command_line
from rocmft.config.provenance import Kind, Source
from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.outputs.manifest import Restart
from rocmft.validate.rules import render_checked
from support.conflicts import CONFLICTS, ONE_SETTING, USER_SET, Case, device

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

# Each rule's conflict comes from the one table tests/test_refusals_complete.py drives too (tests/support/conflicts.py).
# In it, every setting that is a LLaMA-Factory training argument (the case's own, and the model and output folder
# every case runs with) is written where hypothesis chooses; rocmft's own ROCMFT_* settings, the process variables
# torch, ROCm and the launcher read, and files' contents stay where only they can be.
PLACES = ["environment", "ROCMFT_CONFIG", "the command line's YAML", "key=value"]
KINDS = {"environment": "environment", "ROCMFT_CONFIG": "rocmft_config", "the command line's YAML": "command_line_yaml",
         "key=value": "command_line"}  # fmt: skip
YAML_PLACES = ("ROCMFT_CONFIG", "the command line's YAML")
# Rules whose every offending value only the environment can hold: no place to vary. Where else a user might write
# them, rocmft refuses and says to set them in the environment (test_settings_only_the_environment_holds_...).
ONLY_IN_THE_ENVIRONMENT = {
    "distributed": "ROCMFT_DISTRIBUTED and ROCMFT_ZERO_STAGE are rocmft's own settings",
    "allocator_variables": "PYTORCH_ALLOC_CONF and PYTORCH_HIP_ALLOC_CONF are read by torch from the process's "
    "environment",
    "gpu_visibility": "HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are read by ROCm's HIP runtime from the process's "
    "environment",
    "world_size": "WORLD_SIZE is the launcher's, read from the process's environment",
    "tunableop": "PYTORCH_TUNABLEOP_ENABLED is torch's process variable, ROCMFT_DISTRIBUTED rocmft's own setting",
    "offload_settings": "ROCMFT_OFFLOAD_DEVICE, ROCMFT_NVME_PATH and ROCMFT_ZERO_STAGE are rocmft's own settings",
}
# Rules that refuse a value for its own text or a file for its own contents: no conflict case to vary (ONE_SETTING
# of the table says what each reads).
NOT_VARIED = {
    "text_hygiene": "an empty value or one with stray spaces has no one spelling for every place: the command line's "
    "parser refuses a key=value with nothing after = before any rule, and YAML strips unquoted spaces",
    "quoted_values": "quotes around a value are characters in the environment and syntax in a YAML or a key=value "
    '(template: "qwen" is qwen)',
    "template": "refuses TEMPLATE's value against the installed LLaMA-Factory's names and reads no source",
    "model_shapes": "the model folder's files against themselves: no setting's value is in question",
    "duplicate_keys": "the DEEPSPEED file's text against itself: no setting's value is in question",
    "typed_values": "the DEEPSPEED file's values against their own JSON types: no setting's value is in question",
}
# (rule, case): each conflict whose offending values are not all the environment's, and the refusals that hold only
# for a value the user set (the verdict reads the source's kind there: where a text test once decided it).
PROPERTY = [(rule, case) for rule, case in CONFLICTS.items() if rule not in ONLY_IN_THE_ENVIRONMENT] + USER_SET
PROPERTY_IDS = [f"{rule}-{'-'.join(case.environ)}" for rule, case in PROPERTY]
_names = st.lists(st.sampled_from([*TRAP_WORDS, "c", "my run", "x-1"]), min_size=1, max_size=3).map(" ".join)


def _where_said(place: str, key: str, value: str, config: Path) -> str:
    return {
        "environment": f"{key.upper()}={value} (set in the environment)",
        "ROCMFT_CONFIG": f"{key}: {value} (in ROCMFT_CONFIG ({config}))",
        "the command line's YAML": f"{key}: {value} (in the command line's CONFIG ({config}))",
        "key=value": f"{key}={value} (command line ({key}={value}))",
    }[place]


def _variable(name: str) -> bool:
    """Whether a setting of a case is a training argument (so any of the four places can hold it)."""
    from rocmft.config.lfargs import lf_arguments

    return not name.upper().startswith("ROCMFT_") and name.lower() in lf_arguments()


def _settings_of(case: Case) -> dict[str, str]:
    """Every setting of a case by its variable: the model and output folder every case runs with, then the case's
    environment and its YAML's keys (``bf16: true`` as BF16=true)."""
    settings = {"MODEL_NAME_OR_PATH": "{model}", "OUTPUT_DIR": "{tmp}/out", **case.environ}
    for line in (case.yaml or "").splitlines():
        key, _, value = line.partition(":")
        settings[key.strip().upper()] = value.strip()
    return settings


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory, tiny_model) -> Path:
    folder = tmp_path_factory.mktemp("model") / "model"
    shutil.copytree(tiny_model, folder)
    return folder


@pytest.fixture(scope="module")
def fills(tmp_path_factory, model_copy, shared_data) -> dict[str, str]:
    """The table's ``{model}``, ``{data}`` and ``{bf16}`` (``{tmp}`` is each example's own folder)."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("fills")
    data = root / "data"
    data.mkdir()
    for name in ("alpaca_en_demo.json", "dpo_en_demo.json", "identity.json"):
        shutil.copy(shared_data / name, data / name)
    bf16 = root / "tiny-bf16"
    shutil.copytree(model_copy, bf16)
    AutoModelForCausalLM.from_pretrained(model_copy, dtype="bfloat16").save_pretrained(bf16)
    return {"{model}": str(model_copy), "{data}": str(data), "{bf16}": str(bf16)}


def _refused(case: Case, places: dict[str, str], tmp: Path, stem: str, cache_dir: Path, fills: dict[str, str]):
    """Render ``case`` in-process (and apply the launch rules, as prepare_launch does) with each varied setting
    written in its place; the ConfigError, and the YAML written (None without one)."""
    from rocmft.validate.rules import apply

    fill = {"{tmp}": str(tmp), **fills}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    for name, content in case.files.items():
        (tmp / name).write_text(content)
    settings = {name: filled(value) for name, value in _settings_of(case).items()}
    if any("{tmp}/model" in value for value in _settings_of(case).values()):
        shutil.copytree(fills["{model}"], tmp / "model")
    environ, yaml_lines, tokens = {"ROCMFT_CACHE_DIR": str(cache_dir)}, [], []
    for name, value in settings.items():
        place = places.get(name, "environment")
        if place == "environment":
            environ[name] = value
        elif place == "key=value":
            tokens.append(f"{name.lower()}={value}")
        else:
            yaml_lines.append(f"{name.lower()}: {value}")
    config, arguments = None, []
    if yaml_lines:  # one YAML for the keys written in a file: ROCMFT_CONFIG or the command line's (never both)
        config = tmp / stem / f"{stem}.yaml"
        config.parent.mkdir(parents=True)
        config.write_text("\n".join(yaml_lines) + "\n")
        if places[next(n for n in settings if places.get(n) in YAML_PLACES)] == "ROCMFT_CONFIG":
            environ["ROCMFT_CONFIG"] = str(config)
        else:
            arguments.append(str(config))
    arguments += tokens
    settings_read = load_settings({**environ, **case.process}, parse_command_line(arguments))

    def make_staging(output_dir: Path) -> Path:
        (tmp / "staging").mkdir(exist_ok=True)
        return tmp / "staging"

    with pytest.raises(ConfigError) as caught:
        apply("launch", render_checked(settings_read, device(case.gpus), make_staging))  # injected devices
    return caught.value, config, {name: filled(value) for name, value in settings.items()}


_BASELINE: dict[int, tuple[tuple[str, ...], list[str]]] = {}  # case -> the findings' codes, the rule's settings


@pytest.mark.parametrize(("rule", "case"), PROPERTY, ids=PROPERTY_IDS)
# no shrinking: each example is a render (about a second here), and the failing draws are printed as they are
@settings(max_examples=8, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(data=st.data())
def test_the_verdict_and_the_settings_named_do_not_depend_on_where_a_value_was_written(
    rule, case, data, tmp_path_factory, cache_dir, fills
):
    """For each rule of the table and its offending values, each training argument written in the environment,
    ROCMFT_CONFIG, the command line's YAML (under any file and folder name, trap words included) or a key=value:
    the same findings (by code) as with everything in the environment, the rule's among them, and its finding
    names each setting it names there with the value as written and the kind of place it was written in."""
    varied = [name for name in _settings_of(case) if _variable(name)]
    if id(case) not in _BASELINE:  # everything in the environment, as the table writes it
        err, _, _ = _refused(case, {}, tmp_path_factory.mktemp("baseline"), "c", cache_dir, fills)
        ours = next(f for f in err.findings if f.code.rpartition(".")[2] == rule)
        _BASELINE[id(case)] = tuple(f.code for f in err.findings), [setting.name for setting in ours.settings]
    places = {name: data.draw(st.sampled_from(PLACES), label=name) for name in varied}
    in_yaml = [p for p in places.values() if p in YAML_PLACES]  # one YAML: the first drawn decides which
    places = {n: (in_yaml[0] if p in YAML_PLACES else p) for n, p in places.items()}
    stem = data.draw(_names, label="file name")
    err, config, written = _refused(case, places, tmp_path_factory.mktemp("where"), stem, cache_dir, fills)
    codes = tuple(f.code for f in err.findings)
    assert codes == _BASELINE[id(case)][0], (places, codes, err.message)
    finding = next(f for f in err.findings if f.code.rpartition(".")[2] == rule)
    named = {setting.name: setting for setting in finding.settings}
    assert list(named) == _BASELINE[id(case)][1], (places, finding.message)
    for name in [n for n in varied if n.lower() in named]:
        said = _where_said(places[name], name.lower(), written[name], config)
        assert said in finding.message, (places, said, finding.message)
        assert named[name.lower()].kind == KINDS[places[name]], (places, name, named[name.lower()])
        assert named[name.lower()].value == written[name], (places, name, named[name.lower()])


def test_every_registered_rule_is_varied_or_says_why_not():
    """A rule of the registry is in the property (its conflict case has a training argument of its own to move),
    or listed with why its offending values have one place only (the environment), or why it has no conflict."""
    from rocmft.validate.rules import PHASES, registered

    names = {r.name for phase in PHASES for r in registered(phase)}
    conflicts = [rule for rule, case in PROPERTY if CONFLICTS.get(rule) is case]
    accounted = [*conflicts, *ONLY_IN_THE_ENVIRONMENT, *NOT_VARIED]
    assert sorted(accounted) == sorted(names), f"unaccounted: {sorted(names - set(accounted))}"
    assert set(NOT_VARIED) == set(ONE_SETTING)
    for rule, case in PROPERTY:
        assert case.yaml or any(_variable(name) for name in case.environ), rule
    for rule in ONLY_IN_THE_ENVIRONMENT:
        case = CONFLICTS[rule]
        assert not case.yaml and not any(_variable(name) for name in [*case.environ, *case.process]), rule


_ONLY_HERE = [(rule, name, value) for rule in ONLY_IN_THE_ENVIRONMENT
              for name, value in {**CONFLICTS[rule].environ, **CONFLICTS[rule].process}.items()]  # fmt: skip


@pytest.mark.parametrize("place", [p for p in PLACES if p != "environment"])
@pytest.mark.parametrize(("rule", "name", "value"), _ONLY_HERE, ids=[f"{r}-{n}" for r, n, _ in _ONLY_HERE])
def test_settings_only_the_environment_holds_are_refused_elsewhere_and_sent_there(
    tmp_path, cache_dir, rule, name, value, place
):
    """The other side of ONLY_IN_THE_ENVIRONMENT: each offending setting of those rules (rocmft's own ROCMFT_*, a
    variable torch, ROCm or the launcher reads), written in a YAML (under a trap-word name) or as a key=value, is
    refused (exit 2) with the message that says to set it in the environment, so every kind of source is accounted
    for per rule: the environment's verdict is the rule's, every other place's this refusal."""
    config = tmp_path / "default environment" / "command line.yaml"
    config.parent.mkdir()
    value = value.replace("{tmp}", str(tmp_path))  # the table's placeholder (ROCMFT_NVME_PATH={tmp})
    config.write_text(f"{name.lower()}: {value}\n")
    environ = {"ROCMFT_CACHE_DIR": str(cache_dir)}
    arguments = [f"{name.lower()}={value}"] if place == "key=value" else []
    if place == "ROCMFT_CONFIG":
        environ["ROCMFT_CONFIG"] = str(config)
    elif place == "the command line's YAML":
        arguments = [str(config)]
    with pytest.raises(ConfigError) as caught:
        load_settings(environ, parse_command_line(arguments))
    assert f"set {name}={value} in the environment" in caught.value.message, caught.value.message
    assert caught.value.code == 2
