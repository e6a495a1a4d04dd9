"""Settings: every LLaMA-Factory argument from its UPPER_SNAKE_CASE variable, typed; ROCMFT_ knobs; typos."""

from __future__ import annotations

import pytest

from rocmft.config.lfargs import env_arguments, is_secret_name, lf_arguments
from rocmft.config.provenance import Kind, Source
from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError, ExitCode


def test_arguments_come_from_the_installed_llamafactory():
    names = lf_arguments()
    # one from each of the five dataclasses get_train_args parses
    for name, owner in [("model_name_or_path", "ModelArguments"), ("cutoff_len", "DataArguments"),
                        ("learning_rate", "TrainingArguments"), ("lora_rank", "FinetuningArguments"),
                        ("max_new_tokens", "GeneratingArguments")]:  # fmt: skip
        assert names[name].owner == owner
    # transformers 5 removed include_tokens_per_second: the vocabulary follows the installed version
    assert "include_tokens_per_second" not in names
    assert "LOCAL_RANK" not in env_arguments()  # owned by torchrun


def test_values_are_typed_as_users_expect():
    settings = load_settings({
        "LEARNING_RATE": "1e-4", "BF16": "true", "NUM_TRAIN_EPOCHS": "2", "LORA_RANK": "16",
        "REPORT_TO": "wandb,tensorboard", "LR_SCHEDULER_KWARGS": '{"min_lr": 1e-6}', "DATASET": "a,b",
        "GRADIENT_CHECKPOINTING": "false",
    })  # fmt: skip
    args = settings.arguments
    assert args["learning_rate"] == pytest.approx(1e-4) and isinstance(args["learning_rate"], float)
    assert args["bf16"] is True and args["gradient_checkpointing"] is False
    assert args["num_train_epochs"] == 2.0 and args["lora_rank"] == 16
    assert args["report_to"] == ["wandb", "tensorboard"]
    assert args["lr_scheduler_kwargs"] == {"min_lr": 1e-6}
    assert args["dataset"] == "a,b"  # LLaMA-Factory splits data set names itself
    assert settings.sources["learning_rate"] == Source.environment("LEARNING_RATE")


def test_a_bad_value_names_the_variable_and_the_type():
    with pytest.raises(ConfigError) as caught:
        load_settings({"LEARNING_RATE": "abc"})
    assert caught.value.code == ExitCode.CONFIG_ERROR
    assert "LEARNING_RATE='abc'" in str(caught.value) and "float" in str(caught.value)


def test_misspelled_rocmft_variable_gets_a_did_you_mean():
    with pytest.raises(ConfigError) as caught:
        load_settings({"ROCMFT_PRECISON": "fp32"})
    assert "ROCMFT_PRECISON" in str(caught.value) and "ROCMFT_PRECISION" in str(caught.value)


@pytest.mark.parametrize(("variable", "suggestion"), [
    ("INCLUDE_TOKENS_PER_SECOND", "INCLUDE_EFFECTIVE_TOKENS_PER_SECOND"),  # removed in transformers 5
    ("EVALUATION_STRATEGY", "EVAL_STRATEGY"),  # renamed in transformers 4.46
    ("LEARNING_RTE", "LEARNING_RATE"),
])  # fmt: skip
def test_removed_or_misspelled_arguments_are_errors(variable, suggestion):
    with pytest.raises(ConfigError) as caught:
        load_settings({variable: "true"})
    assert variable in str(caught.value) and suggestion in str(caught.value)


@pytest.mark.parametrize("first", ["upper", "lower"])
def test_one_setting_given_twice_in_two_cases_is_refused_whatever_the_order(first):
    """LEARNING_RATE=1e-4 with learning_rate=-1: names are read in any case, and the value (and the name messages
    gave it) used to be whichever came last; now both orders are refused, naming both, a secret without its value.
    The same value twice is one setting, accepted."""
    pairs = [("LEARNING_RATE", "1e-4"), ("learning_rate", "-1")]
    environ = dict(pairs if first == "upper" else pairs[::-1])
    with pytest.raises(ConfigError) as caught:
        load_settings(environ)
    assert caught.value.code == ExitCode.CONFIG_ERROR
    assert "LEARNING_RATE=1e-4 and learning_rate=-1" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_settings({"HUB_TOKEN": "hf_one", "hub_token": "hf_two"})
    assert "HUB_TOKEN and hub_token" in str(caught.value) and "hf_" not in str(caught.value)
    assert load_settings({"LEARNING_RATE": "1e-4", "learning_rate": "1e-4"}).arguments["learning_rate"] == 1e-4


def test_other_softwares_variables_are_left_alone():
    environ = {
        "PATH": "/usr/bin", "HOME": "/root", "HOSTNAME": "node-1", "NODE_RANK": "0", "NNODES": "2",
        "MASTER_ADDR": "10.0.0.1", "LOCAL_RANK": "0", "HF_HOME": "/hf", "NCCL_DEBUG": "WARN",
        "HSA_OVERRIDE_GFX_VERSION": "11.0.0", "HIP_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "8",
        "PYTORCH_ROCM_ARCH": "gfx942", "WANDB_API_KEY": "x", "DEBUG": "1", "LANG": "C.UTF-8",
    }  # fmt: skip
    settings = load_settings(environ)
    assert settings.arguments == {}


def test_secrets_are_kept_out_of_arguments():
    assert is_secret_name("HF_HUB_TOKEN") and is_secret_name("swanlab_api_key") and not is_secret_name("add_tokens")
    settings = load_settings({"HF_HUB_TOKEN": "hf_abcdefgh", "LEARNING_RATE": "1e-4"})
    assert "hf_hub_token" not in settings.arguments
    assert settings.secrets == {"HF_HUB_TOKEN": "hf_abcdefgh"}
    assert "hf_abcdefgh" not in str(settings.redacted())


def test_rocmft_knobs(tmp_path):
    settings = load_settings({"ROCMFT_DISTRIBUTED": "deepspeed", "ROCMFT_ZERO_STAGE": "3",
                              "ROCMFT_SKIP_CHECKS": "disk, lengths"})  # fmt: skip
    assert settings.rocmft.zero_stage == 3 and settings.rocmft.skip_checks == ["disk", "lengths"]
    assert settings.explicit_rocmft == {"distributed", "zero_stage", "skip_checks"}
    with pytest.raises(ConfigError) as caught:
        load_settings({"ROCMFT_OFFLOAD": "everything"})
    assert "ROCMFT_OFFLOAD" in str(caught.value)


def test_user_yaml_is_a_starting_point_and_environment_wins(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("learning_rate: 5.0e-5\ncutoff_len: 1024\nlora_rank: 32\n")
    settings = load_settings({"ROCMFT_CONFIG": str(config), "LORA_RANK": "8"})
    assert settings.arguments == {"learning_rate": 5e-5, "cutoff_len": 1024, "lora_rank": 8}
    assert settings.sources["cutoff_len"].kind is Kind.CONFIG_FILE
    assert settings.sources["lora_rank"] == Source.environment("LORA_RANK")


@pytest.mark.parametrize(("text", "expected"), [
    ("cutoff_len: 1\ncutoff_len: 2\n", "not valid YAML"),  # OmegaConf rejects duplicate keys, as LLaMA-Factory does
    ("learning_rte: 1.0e-4\n", "learning_rate"),  # did-you-mean for a key of the installed parser
    ("- a\n- b\n", "holds a list of 2 items: it must be a mapping of LLaMA-Factory arguments"),
    # a lone word: OmegaConf reads it as the key `hello` (was "has keys that are not arguments ... hello")
    ("hello\n", "holds only the text 'hello': it must be a mapping of LLaMA-Factory arguments"),
    ('"hello"\n', "holds only the text 'hello': it must be a mapping"),
    ("42\n", "holds only the number '42': it must be a mapping"),  # was "not valid YAML: Invalid loaded object"
    ("hf_hub_token: hf_x\n", "secret"),
    ("FP8: true\n", "spelled fp8 here"),  # an argument in the environment's case (a newcomer's trial)
])  # fmt: skip
def test_bad_user_yaml_is_refused(tmp_path, text, expected):
    config = tmp_path / "my.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings({"ROCMFT_CONFIG": str(config)})
    assert str(config) in str(caught.value) and expected in str(caught.value)


def test_a_lone_word_on_the_command_line_is_refused_naming_the_file(tmp_path):
    from rocmft.config.cmdline import parse_command_line

    config = tmp_path / "my.yaml"
    config.write_text("hello\n")
    with pytest.raises(ConfigError) as caught:
        load_settings({}, parse_command_line([str(config)]))
    assert f"The config file {config} (on the command line) holds only the text 'hello'" in str(caught.value)
    assert "has keys" not in str(caught.value) and "learning_rate: 1.0e-4" in str(caught.value)


@pytest.mark.parametrize("text", ["", "\n", "# nothing yet\n", "---\n", "null\n", "~\n"])
def test_an_empty_user_yaml_sets_nothing(tmp_path, text):
    """An empty YAML (or one of comments, a lone `---` or `null`) is no settings, as LLaMA-Factory reads it
    (OmegaConf.load gives an empty mapping): the environment's values stand."""
    config = tmp_path / "my.yaml"
    config.write_text(text)
    settings = load_settings({"ROCMFT_CONFIG": str(config), "LORA_RANK": "8"})
    assert settings.arguments == {"lora_rank": 8}


def test_unknown_check_ids_are_refused():
    from rocmft.checks import check_ids, validate_skip

    assert {"output", "dataset", "model", "lengths", "disk"} <= set(check_ids())
    with pytest.raises(ConfigError, match="did you mean dataset"):
        validate_skip(["datset"])


def test_user_yaml_values_are_typed_like_variables(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("learning_rate: abc\nnum_train_epochs: 2\n")
    with pytest.raises(ConfigError) as caught:
        load_settings({"ROCMFT_CONFIG": str(config)})
    assert "learning_rate: 'abc'" in str(caught.value) and "float" in str(caught.value)


def test_the_cached_vocabulary_types_values_as_the_live_dataclasses_do():
    """The JSON vocabulary (what rocmft's own process reads instead of importing LLaMA-Factory) must type every
    argument's value as LLaMA-Factory's own annotation does: same accepted values, same results (enums compared
    by value, which is what YAML holds)."""
    import dataclasses
    import enum

    from pydantic import TypeAdapter

    from rocmft.config.lfargs import _annotation, _live_vocabulary, _train_dataclasses
    from rocmft.config.settings import _field_type

    live = {f.name: f.type for cls in _train_dataclasses() for f in dataclasses.fields(cls) if f.init}
    plain = {a["name"]: a["type"] for a in _live_vocabulary()["arguments"]}
    samples = ["1", "0.5", "true", "False", "a,b", "cosine", "auto", "fa2", "bnb", '{"k": 1}', "[1, 2]", "x"]

    def outcome(adapter, value):
        try:
            result = adapter.validate_python(value)
        except Exception:
            return "rejected"
        return result.value if isinstance(result, enum.Enum) else result

    opaque = {name for name, kind in plain.items() if "opaque" in str(kind)}
    assert opaque == {"parallelism_config"}  # typed as text by us, by LLaMA-Factory's parser in the validator
    compared = 0
    for name, annotation in live.items():
        if name in opaque:
            continue
        ours, theirs = TypeAdapter(_field_type(_annotation(plain[name]))), TypeAdapter(_field_type(annotation))
        for value in samples:
            assert outcome(ours, value) == outcome(theirs, value), (name, value)
            compared += 1
    assert compared > 3000  # every argument (346 in LLaMA-Factory 0.9.5) with every sample


@pytest.mark.slow  # starts rocmft, LLaMA-Factory's parser or a trainer as a process (not the fast layer)
def test_settings_do_not_import_llamafactory_once_the_vocabulary_is_cached(tmp_path):
    """`rocmft check` spent 14 s of its 20 s on the H200 host importing LLaMA-Factory for the settings."""
    import subprocess
    import sys

    probe = ("import sys; from rocmft.config.settings import load_settings; "
             "s = load_settings({'LEARNING_RATE': '1e-4', "
             "'TEMPLATE': 'qwen'}); print(s.arguments['learning_rate'], 'llamafactory' in sys.modules)")  # fmt: skip
    env = {"ROCMFT_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["0.0001", "True"]  # built from the live dataclasses, then saved
    assert len(list(tmp_path.glob("lf-vocabulary-*.json"))) == 1
    again = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert again.stdout.split() == ["0.0001", "False"]
    next(tmp_path.glob("lf-vocabulary-*.json")).write_text("{not json")  # a torn file is rebuilt, not trusted
    torn = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert torn.stdout.split() == ["0.0001", "True"]


@pytest.mark.slow  # starts rocmft, LLaMA-Factory's parser or a trainer as a process (not the fast layer)
def test_rocmft_vocabulary_is_a_setting_and_live_reads_the_same_arguments(tmp_path):
    """ROCMFT_VOCABULARY, named in rocmft.config.lfargs, is a setting (it was refused as unknown), and a live read
    of LLaMA-Factory's dataclasses gives the arguments the cached file gives."""
    import json
    import os
    import subprocess
    import sys

    assert load_settings({"ROCMFT_VOCABULARY": "live"}).rocmft.vocabulary == "live"
    with pytest.raises(ConfigError, match="ROCMFT_VOCABULARY"):
        load_settings({"ROCMFT_VOCABULARY": "fresh"})
    code = ("import json; from rocmft.config.lfargs import vocabulary; "
            "print(json.dumps(sorted(a['name'] for a in vocabulary()['arguments'])))")  # fmt: skip
    names = {}
    for step, mode in (("first", "cached"), ("from the file", "cached"), ("live", "live")):  # the first writes it
        env = {**os.environ, "ROCMFT_VOCABULARY": mode, "ROCMFT_CACHE_DIR": str(tmp_path)}
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        names[step] = json.loads(run.stdout.splitlines()[-1])
        if step == "first":
            assert list(tmp_path.glob("lf-vocabulary-*.json"))
    assert len(names["live"]) > 100 and names["live"] == names["from the file"]


def test_an_unwritable_cache_folder_is_a_configuration_error_naming_rocmft_cache_dir(tmp_path):
    """A read-only image without a bound cache (Apptainer) or a file in the path: exit 2, not a traceback."""
    from rocmft.config.demo import ensure_tiny_model
    from rocmft.errors import ConfigError

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="ROCMFT_CACHE_DIR") as caught:
        ensure_tiny_model(blocker / "cache")
    assert "cannot be written" in str(caught.value) and "NotADirectoryError" in str(caught.value)


# The credentials among LLaMA-Factory 0.9.5's arguments (src/llamafactory/hparams/model_args.py: "Auth token to log
# in with Hugging Face/ModelScope/Modelers Hub"; transformers' TrainingArguments.hub_token; finetuning_args.py's
# SwanLabArguments: api_key, lark_webhook_url, lark_secret). Every other argument whose name has one of the words
# below is a setting (ignore_pad_token_for_loss, add_special_tokens, max_new_tokens, tokenized_path, ...).
LF_CREDENTIALS = {"hf_hub_token", "ms_hub_token", "om_hub_token", "hub_token", "swanlab_api_key",
                  "swanlab_lark_webhook_url", "swanlab_lark_secret"}  # fmt: skip
CREDENTIAL_VARIABLES = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_TOKEN", "WANDB_API_KEY", "SWANLAB_API_KEY",
                        "OPENAI_API_KEY", "COMET_API_KEY", "NEPTUNE_API_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY",
                        "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "AUTH_TOKEN_HF", "hf-token"]  # fmt: skip
NOT_CREDENTIALS = ["IGNORE_PAD_TOKEN_FOR_LOSS", "MAX_NEW_TOKENS", "ADD_SPECIAL_TOKENS", "SPLIT_SPECIAL_TOKENS",
                   "TOKENIZED_PATH", "USE_FAST_TOKENIZER", "HF_TOKEN_PATH", "TOKENIZERS_PARALLELISM", "PAD_TOKEN",
                   "EOS_TOKEN", "INCLUDE_NUM_INPUT_TOKENS_SEEN", "AVERAGE_TOKENS_ACROSS_DEVICES"]  # fmt: skip


def test_every_credential_argument_of_llamafactory_is_a_secret_and_no_other_is():
    """Both directions over the installed LLaMA-Factory's own argument names: a name with token/key/secret/password/
    webhook/credential in it is a secret exactly when it is one of LF_CREDENTIALS. A new LLaMA-Factory argument with
    such a word fails here until someone decides which it is."""
    import re

    named = {n for n in lf_arguments() if re.search(r"token|key|secret|password|webhook|credential", n)}
    assert named >= LF_CREDENTIALS  # the list is of real arguments
    assert {n for n in named if is_secret_name(n)} == LF_CREDENTIALS
    assert {n for n, a in lf_arguments().items() if a.secret} == LF_CREDENTIALS


@pytest.mark.parametrize("name", CREDENTIAL_VARIABLES)
def test_credential_variables_are_secrets(name):
    assert is_secret_name(name) and is_secret_name(name.lower())


@pytest.mark.parametrize("name", NOT_CREDENTIALS)
def test_settings_named_after_tokens_are_not_secrets(name):
    assert not is_secret_name(name) and not is_secret_name(name.lower())


def test_ignore_pad_token_for_loss_is_a_setting_that_is_rendered_and_recorded():
    """It was read as a secret (its name has "token"): kept out of the arguments, so IGNORE_PAD_TOKEN_FOR_LOSS=false
    never reached train.yaml (found by tests/test_fuzz_inputs.py)."""
    from rocmft.outputs.manifest import redact_env

    settings = load_settings({"IGNORE_PAD_TOKEN_FOR_LOSS": "false", "HF_TOKEN": "hf_abcdefgh"})
    assert settings.arguments["ignore_pad_token_for_loss"] is False
    assert settings.sources["ignore_pad_token_for_loss"] == Source.environment("IGNORE_PAD_TOKEN_FOR_LOSS")
    assert not settings.secrets
    # the manifest records the HF_ variables: the token's value is redacted, the path of its file is not
    recorded = redact_env({"HF_TOKEN_PATH": "/run/secrets/hf", "HF_TOKEN": "hf_abcdefgh"})
    assert recorded == {"HF_TOKEN": "<redacted>", "HF_TOKEN_PATH": "/run/secrets/hf"}


def test_an_invalid_rocmft_setting_is_answered_with_what_it_takes():
    """The fix names the range or the choices of each variable refused, read from the field (the tester found
    "Use one of the values listed" with no values listed)."""
    from rocmft.config.settings import load_settings

    for environ, fix in (
        ({"ROCMFT_NET_TIMEOUT_S": "-1"}, "Set ROCMFT_NET_TIMEOUT_S to a number from 2 to 540"),
        ({"ROCMFT_EXPECTED_NICS": "abc"}, "Set ROCMFT_EXPECTED_NICS to a whole number, at least 0 (or unset it)"),
        ({"ROCMFT_ON_NAN": "bogus"}, "Set ROCMFT_ON_NAN to one of stop, fp32"),
    ):
        with pytest.raises(ConfigError) as caught:
            load_settings(environ)
        assert fix in caught.value.remedy, caught.value.remedy


@pytest.mark.parametrize("variable", ["ROCMFT_CONFIG", "ROCMFT_TEMPLATES", "ROCMFT_CACHE_DIR", "ROCMFT_SAVES_DIR",
                                      "ROCMFT_NVME_PATH"])  # fmt: skip
def test_an_empty_path_setting_is_refused_naming_it_and_nothing_lands_in_the_working_folder(
    rocmft_here, tmp_path, variable
):
    """pathlib reads "" as ".": ROCMFT_CACHE_DIR= built the default model into the working folder, ROCMFT_CONFIG= was
    refused as "ROCMFT_CONFIG=.: a folder" (tried as a new user, 2026-12-05). The command runs in ``tmp_path``."""
    output = tmp_path / "out"
    result = rocmft_here("render", env={variable: "", "OUTPUT_DIR": str(output)})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-2000:]
    assert "Traceback" not in result.stdout
    assert f"{variable}='': Value error, empty" in result.stdout, result.stdout[-2000:]
    assert f"Set {variable} to a path" in result.stdout
    assert not output.exists()
    assert not any(p.name.startswith(("demo-data", "tiny-qwen2", "rocmft-demo")) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("variable", ["ROCMFT_CONFIG", "ROCMFT_TEMPLATES", "ROCMFT_CACHE_DIR", "ROCMFT_SAVES_DIR",
                                      "ROCMFT_NVME_PATH", "ROCMFT_RESUME"])  # fmt: skip
def test_a_path_setting_with_a_name_too_long_is_refused_naming_it(tmp_path, variable):
    """Every path knob, the same list as the empty-path check above (knobs.PATH_KNOBS): a name over 255 bytes is
    refused as the settings are read. ROCMFT_NVME_PATH was missing from settings.PATH_SETTINGS and passed."""
    with pytest.raises(ConfigError) as caught:
        load_settings({variable: str(tmp_path / ("x" * 300))})
    assert f"longer than 255 bytes (the file system's limit for one name in a path): {variable}." in str(caught.value)


@pytest.mark.parametrize("name", ["../escape", "/abs/run", "a\nb", ".", "..", ""])
def test_a_run_name_that_is_not_one_folder_name_is_refused(rocmft_here, tmp_path, name):
    """The run goes to ROCMFT_SAVES_DIR/<run name>: ``../escape`` rendered into a folder beside the saves folder,
    ``.`` into the saves folder itself (tried as a new user, 2026-12-05). The command runs in ``tmp_path``."""
    saves = tmp_path / "work" / "saves"
    result = rocmft_here("render", env={"ROCMFT_RUN_NAME": name, "ROCMFT_SAVES_DIR": str(saves)})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-2000:]
    assert "Traceback" not in result.stdout
    assert f"ROCMFT_RUN_NAME={name!r}: Value error, not one folder name" in result.stdout, result.stdout[-2000:]
    assert not (tmp_path / "work").exists() and not (tmp_path / "escape").exists()
