"""`rocmft train [CONFIG.yaml] [key=value ...]`: the command line over the environment over the YAML, read as
`llamafactory-cli train my.yaml key=value` reads it (OmegaConf), refused with exit 2 and nothing written when bad.
render, check and plan run in the pytest process (conftest's rocmft_here); `rocmft train` in a real child process."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import all_text_under, logged_losses
from rocmft.config.cmdline import parse_command_line
from rocmft.config.provenance import Kind, texts
from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError, ExitCode

SECRET = "hf_rocmftCliSecret987"


def _yaml(tmp_path, text: str, name: str = "my.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_command_line_over_environment_over_yaml(tmp_path):
    config = _yaml(tmp_path, "learning_rate: 1.0e-4\ncutoff_len: 1024\nlora_rank: 32\nnum_train_epochs: 2\n")
    settings = load_settings({"LORA_RANK": "8", "CUTOFF_LEN": "512"},
                             parse_command_line([str(config), "learning_rate=5e-5", "cutoff_len=256"]))  # fmt: skip
    assert settings.arguments == {"learning_rate": 5e-5, "cutoff_len": 256, "lora_rank": 8, "num_train_epochs": 2.0}
    assert {name: source.kind for name, source in settings.sources.items()} == {
        "learning_rate": Kind.COMMAND_LINE,
        "cutoff_len": Kind.COMMAND_LINE,
        "lora_rank": Kind.ENVIRONMENT,
        "num_train_epochs": Kind.COMMAND_LINE_YAML,
    }
    assert texts(settings.sources) == {
        "learning_rate": "command line (learning_rate=5e-5)",
        "cutoff_len": "command line (cutoff_len=256)",
        "lora_rank": "LORA_RANK",
        "num_train_epochs": f"the command line's CONFIG ({config})",
    }
    assert settings.rocmft.config == config and "config" in settings.explicit_rocmft
    assert settings.redacted()["sources"]["learning_rate"] == "command line (learning_rate=5e-5)"  # the manifest's


def test_a_list_where_llamafactory_splits_commas_is_its_comma_list(tmp_path):
    """LLaMA-Factory takes ``dataset: [a, b]`` as it takes ``dataset: a,b`` (``split_arg`` keeps a list as it is);
    rocmft refused the list as "expected str" (a break-it trial, 2026-12-05). Read from a YAML or the command line,
    it is the comma list; a mapping or a list of lists is still the wrong type."""
    config = _yaml(tmp_path, "dataset: [alpaca_en_demo, identity]\ninterleave_probs: [0.7, 0.3]\n")
    settings = load_settings({}, parse_command_line([str(config), "lora_target=[q_proj, v_proj]"]))
    assert settings.arguments == {"dataset": "alpaca_en_demo,identity", "interleave_probs": "0.7,0.3",
                                  "lora_target": "q_proj,v_proj"}  # fmt: skip
    assert settings.sources["dataset"].kind is Kind.COMMAND_LINE_YAML
    with pytest.raises(ConfigError, match="wrong type"):
        load_settings({}, parse_command_line(["dataset=[[a], b]"]))
    with pytest.raises(ConfigError, match="wrong type"):
        load_settings({}, parse_command_line(["report_to=wandb", "template=[qwen, llama3]"]))  # not a comma list


def test_values_are_read_as_llamafactory_cli_reads_them_then_typed():
    """OmegaConf's reading (LLaMA-Factory 0.9.5 read_args: OmegaConf.from_cli) and then the argument's type."""
    settings = load_settings({}, parse_command_line([
        "learning_rate=5e-5", "bf16=true", "max_steps=3", "report_to=[wandb,tensorboard]",
        "lora_target=q_proj,v_proj", "run_name='001'", "lr_scheduler_kwargs={min_lr: 1.0e-6}", "max_steps=4",
    ]))  # fmt: skip
    args = settings.arguments
    assert args["learning_rate"] == 5e-5 and args["bf16"] is True and args["max_steps"] == 4  # a later token wins
    assert args["report_to"] == ["wandb", "tensorboard"] and args["lora_target"] == "q_proj,v_proj"
    assert args["run_name"] == "001" and args["lr_scheduler_kwargs"] == {"min_lr": 1e-6}
    assert str(settings.sources["max_steps"]) == "command line (max_steps=3 max_steps=4)"


def test_a_dotted_key_merges_into_the_yamls_mapping_as_omegaconf_merge_does(tmp_path):
    config = _yaml(tmp_path, "lr_scheduler_kwargs:\n  min_lr: 1.0e-6\n  power: 2\n")
    settings = load_settings({}, parse_command_line([str(config), "lr_scheduler_kwargs.power=3"]))
    assert settings.arguments["lr_scheduler_kwargs"] == {"min_lr": 1e-6, "power": 3}
    assert str(settings.sources["lr_scheduler_kwargs"]) == (
        f"command line (lr_scheduler_kwargs.power=3), merged into the command line's CONFIG ({config})"
    )


def test_the_yaml_is_composed_once_for_its_shape_and_its_text(tmp_path, monkeypatch):
    """The user's YAML is read twice, and must be (rocmft.config.userconfig's comment): OmegaConf's load, as
    LLaMA-Factory reads it, and one PyYAML compose for what OmegaConf's container loses, the document's kind and
    each value's text as written. The compose ran twice, once for each (the file read and parsed three times)."""
    from rocmft.config.userconfig import load_user_config

    composed = []
    real = yaml.compose
    monkeypatch.setattr(yaml, "compose", lambda *args, **kwargs: composed.append(args) or real(*args, **kwargs))
    raw: dict = {}
    values = load_user_config(_yaml(tmp_path, "learning_rate: 1e-4\ncutoff_len: 64\nrun_name: r${cutoff_len}\n"),
                              raw=raw)  # fmt: skip
    assert values == {"learning_rate": 1e-4, "cutoff_len": 64, "run_name": "r64"} and len(composed) == 1
    assert raw == {"learning_rate": "1e-4", "cutoff_len": "64", "run_name": "r64"}  # as written; ${...} resolved
    with pytest.raises(ConfigError, match="holds a list of 2 items"):
        load_user_config(_yaml(tmp_path, "- a\n- b\n", "list.yaml"))


def test_the_yaml_on_the_command_line_and_rocmft_config_must_be_one_file(tmp_path, monkeypatch):
    config, other = _yaml(tmp_path, "cutoff_len: 64\n"), _yaml(tmp_path, "cutoff_len: 32\n", "other.yaml")
    monkeypatch.chdir(tmp_path)
    same = load_settings({"ROCMFT_CONFIG": str(config)}, parse_command_line(["my.yaml"]))  # relative, same file
    assert same.arguments == {"cutoff_len": 64}
    with pytest.raises(ConfigError) as caught:
        load_settings({"ROCMFT_CONFIG": str(other)}, parse_command_line(["my.yaml"]))
    assert f"{config} on the command line and ROCMFT_CONFIG={other}" in str(caught.value)
    assert caught.value.code == ExitCode.CONFIG_ERROR


YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null"}  # YAML 1.1 words a bare string may not be


def _typed_text(value) -> str:
    """A value as a user types it after `key=`: a plain word bare, any other string in YAML's single quotes, the
    rest as PyYAML's flow-style dump (``5e-05``, ``true``, ``[1, abc]``)."""
    if isinstance(value, str):
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) and value.lower() not in YAML_WORDS:
            return value
        return "'" + value.replace("'", "''") + "'"
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).removesuffix("\n...\n").strip()


_words = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
                   st.text(alphabet="abcxyzE0123456789_-./:=,'\" []{}#", max_size=12))  # fmt: skip
_values = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    _words,
    st.lists(st.one_of(st.integers(min_value=-1000, max_value=1000), st.from_regex(r"[a-d_]{1,6}", fullmatch=True)),
             max_size=4),
)  # fmt: skip
_keys = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_keys, _values), min_size=1, max_size=6))
def test_tokens_round_trip_typed_values_and_the_last_token_wins(pairs):
    """Property: a value written as YAML after `key=` comes back as the same value; with a key given twice the later
    token wins, and the sources list each key's tokens in order."""
    tokens = [f"{key}={_typed_text(value)}" for key, value in pairs]
    parsed = parse_command_line(tokens)
    expected, seen = {}, {}
    for (key, value), token in zip(pairs, tokens, strict=True):
        expected[key] = value
        seen.setdefault(key, []).append(token)
    assert parsed.config is None
    assert dict(parsed.overrides) == expected
    assert {key: list(value) for key, value in parsed.tokens.items()} == seen


@settings(max_examples=50, deadline=None)
@given(learning_rate=st.floats(min_value=1e-12, max_value=10.0), max_steps=st.integers(1, 10**9),
       bf16=st.booleans(), run_name=_words)  # fmt: skip
def test_typed_arguments_round_trip_through_the_settings(learning_rate, max_steps, bf16, run_name):
    command = parse_command_line([f"learning_rate={_typed_text(learning_rate)}", f"max_steps={max_steps}",
                                  f"bf16={_typed_text(bf16)}", f"run_name={_typed_text(run_name)}"])  # fmt: skip
    arguments = load_settings({}, command).arguments
    assert arguments == {"learning_rate": learning_rate, "max_steps": max_steps, "bf16": bf16, "run_name": run_name}


@pytest.mark.slow  # starts rocmft's parser child (python -m rocmft.validate.child)
def test_render_puts_the_command_line_over_the_yaml_and_the_environment(rocmft_here, tmp_path):
    """A real `rocmft render my.yaml key=value`: the rendered train.yaml holds the command line's values where the
    YAML and the environment also set them, the environment's over the YAML's, and the YAML's alone."""
    config = _yaml(tmp_path, "learning_rate: 1.0e-4\ncutoff_len: 64\nsave_steps: 3\nmax_steps: 7\n")
    output = tmp_path / "run"
    result = rocmft_here("render", "my.yaml", "learning_rate=5e-5", "cutoff_len=16",
                         env={"CUTOFF_LEN": "32", "SAVE_STEPS": "4", "OUTPUT_DIR": str(output)})  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout
    rendered = yaml.safe_load((output / "rocmft" / "train.yaml").read_text())
    assert rendered["learning_rate"] == 5e-5 and rendered["cutoff_len"] == 16  # command line > environment > YAML
    assert rendered["save_steps"] == 4 and rendered["max_steps"] == 7  # environment > YAML; the YAML alone
    assert config.is_file()


@pytest.mark.train
def test_train_with_a_yaml_and_overrides_trains_and_records_the_command_line(run_rocmft, tmp_path, tiny_model):
    """`rocmft train my.yaml max_steps=2 ...` trains (the built-in tiny model) for the command line's 2 steps, not
    the environment's 30 or the YAML's 50; the manifest's sources say so; the worker is still the parser's process
    (the overrides travel in the rendered arguments, not the environment, which stays the worker's).

    ``tiny_model`` builds the cache first: building it inside `rocmft train` sets TORCHINDUCTOR_CACHE_DIR in that
    process (torch's inductor cache_dir() writes os.environ), and the parser's process is then not reused."""
    config = _yaml(tmp_path, "max_steps: 50\nlogging_steps: 1\nlearning_rate: 1.0e-3\n")
    output = tmp_path / "run"
    result = run_rocmft("train", str(config), "max_steps=2", f"output_dir={output}",
                        env={"MAX_STEPS": "30", "HF_TOKEN": SECRET})  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    assert len(logged_losses(output)) == 2
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["worker"]["last_step"] == 2
    assert manifest["settings"]["sources"]["max_steps"] == "command line (max_steps=2)"
    assert manifest["argument_sources"]["max_steps"] == "command line (max_steps=2)"
    assert manifest["argument_sources"]["output_dir"] == f"command line (output_dir={output})"
    assert manifest["argument_sources"]["learning_rate"] == f"the command line's CONFIG ({config})"
    assert manifest["settings"]["rocmft"]["config"] == str(config)
    launch = [line for line in result.stdout.splitlines() if "worker" in line]
    assert "the worker is the process that validated the configuration" in result.stdout, launch
    assert SECRET not in all_text_under(output) and SECRET not in result.stdout


@pytest.mark.train
def test_the_fp32_restart_keeps_the_command_lines_overrides(run_rocmft, tmp_path):
    """ROCMFT_ON_NAN=fp32 runs the whole flow again (cli/train.py `_attempt`): the restart must read the command
    line again. The fault (NaN weights after step 12, bf16 only) stops the bf16 attempt at logging step 15; the fp32
    restart resumes from checkpoint-10 and ends at the command line's max_steps=20 (not the environment's 40)."""
    output = tmp_path / "nan"
    result = run_rocmft(
        "train", "max_steps=20", "save_steps=5", "save_strategy=steps", "use_cpu=true", f"output_dir={output}",
        env={"ROCMFT_PRECISION": "bf16", "ROCMFT_FAULT_NAN_AT_STEP": "12", "ROCMFT_ON_NAN": "fp32", "MAX_STEPS": "40"},
    )  # fmt: skip
    assert result.returncode == ExitCode.OK, result.stdout[-3000:]
    assert "restarting in real fp32" in result.stdout
    manifest = json.loads((output / "rocmft" / "manifest.json").read_text())
    assert [r["from_checkpoint"] for r in manifest["restarts"]] == [str(output / "checkpoint-10")]
    assert manifest["precision"]["policy"] == "fp32" and manifest["worker"]["last_step"] == 20
    assert manifest["argument_sources"]["max_steps"] == "command line (max_steps=20)"


@pytest.mark.parametrize(("arguments", "expected"), [
    (["learning_rte=5e-5"], ["learning_rte=5e-5", "Did you mean learning_rate?"]),
    (["lora_r=8"], ["lora_r=8", "use lora_rank=8 instead"]),
    (["evaluation_strategy=steps"], ["use eval_strategy=steps instead"]),
    (["precision=fp32"], ["a rocmft setting", "ROCMFT_PRECISION=fp32"]),
    (["learning_rate=abc"], ["learning_rate=abc", "valid number", "expected float"]),
    (["num_train_epochs=[1,2]"], ["num_train_epochs=[1,2]", "expected float"]),
    (["max_steps=2", "bf16"], ["'bf16': no `=`", "bf16=true"]),
    (["=5e-5"], ["'=5e-5': the key before `=` is empty"]),
    (["learning_rate="], ["no value after `=`", "learning_rate=null"]),
    (["lora_target=[q_proj,"], ["'lora_target=[q_proj,': OmegaConf cannot read it"]),
    ([f"hf_hub_token={SECRET}"], ["`hf_hub_token` on the command line is a secret", "`ps`", "HF_TOKEN"]),
    ([f"hf_token={SECRET}"], ["`hf_token` on the command line is a secret", "environment variable"]),
    (["missing.yaml"], ["missing.yaml (on the command line): no such file"]),
    (["notes.txt", "max_steps=2"], ["'notes.txt' on the command line is not a YAML file name"]),
    (["bad.yaml"], ["bad.yaml (on the command line) is not valid YAML"]),
    (["list.yaml"], ["list.yaml (on the command line) holds a list of 1 item: it must be a mapping"]),
    (["typo.yaml"], ["typo.yaml (on the command line) has keys that are not arguments", "learning_rate"]),
    (["max_steps=2", "my.yaml"], ["'my.yaml': no `=` (the YAML file goes first)"]),
])  # fmt: skip
def test_bad_command_lines_exit_2_name_the_problem_and_leave_output_dir_untouched(run_rocmft, tmp_path, arguments,
                                                                                   expected):  # fmt: skip
    for name, text in [("bad.yaml", "cutoff_len: [1\n"), ("list.yaml", "- a\n"), ("typo.yaml", "learning_rte: 1\n"),
                       ("my.yaml", "cutoff_len: 64\n"), ("notes.txt", "cutoff_len: 64\n")]:  # fmt: skip
        _yaml(tmp_path, text, name)
    output = tmp_path / "run"
    output.mkdir()
    (output / "keep.txt").write_text("an earlier file")
    result = run_rocmft("train", *arguments, env={"OUTPUT_DIR": str(output)})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout
    assert "CONFIGURATION ERROR" in result.stdout and "Traceback" not in result.stdout
    for text in expected:
        assert text in result.stdout, result.stdout
    assert SECRET not in result.stdout  # a secret's value is never echoed
    assert sorted(p.name for p in output.iterdir()) == ["keep.txt"]


def test_two_different_yamls_exit_2_naming_both(rocmft_here, tmp_path):
    _yaml(tmp_path, "cutoff_len: 64\n")
    other = _yaml(tmp_path, "cutoff_len: 32\n", "other.yaml")
    output = tmp_path / "run"
    result = rocmft_here("render", "my.yaml", env={"ROCMFT_CONFIG": str(other), "OUTPUT_DIR": str(output)})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout
    assert f"{tmp_path / 'my.yaml'} on the command line and ROCMFT_CONFIG={other}" in result.stdout
    assert not output.exists()


@pytest.mark.parametrize("command", [pytest.param("train", marks=pytest.mark.slow), "render", "check", "plan"])
def test_help_shows_the_usage(request, rocmft_here, command):
    rocmft = request.getfixturevalue("run_rocmft") if command == "train" else rocmft_here  # train: a child process
    result = rocmft(command, "--help")
    assert result.returncode == 0
    assert f"usage: rocmft {command} [-h] [--json] [CONFIG.yaml] [key=value ...]" in result.stdout
    assert "key=value on the command line > environment variables" in result.stdout
