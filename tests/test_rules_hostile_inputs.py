"""A break-it trial of the command line as a hostile but realistic user (2026-12-06): odd YAML values, paths that
cannot be followed or written, names that are not UTF-8. Each case runs `rocmft render` in the pytest process
(conftest's rocmft_here) and checks the exit code, the words of the message, that no traceback was printed and
that nothing was left in OUTPUT_DIR. docs/rules.md's rows 91-93 are these refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rocmft.errors import ExitCode


@pytest.fixture
def base(tmp_path, shared_data, tiny_model) -> dict[str, str]:
    """A LoRA run on the tiny model and LLaMA-Factory's alpaca demo (its own data folder), OUTPUT_DIR in tmp_path."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(shared_data / "alpaca_en_demo.json", data / "alpaca_en_demo.json")
    return {"MODEL_NAME_OR_PATH": str(tiny_model), "DATASET": "alpaca_en_demo", "DATASET_DIR": str(data),
            "TEMPLATE": "qwen", "FINETUNING_TYPE": "lora", "OUTPUT_DIR": str(tmp_path / "out")}  # fmt: skip


def refused(result, output: Path, *words: str) -> None:
    """Exit 2, each of ``words`` in the output, no traceback, nothing in ``output`` and no staging folder beside it."""
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-3000:]
    assert "Traceback" not in result.stdout, result.stdout[-3000:]
    for word in words:
        assert word in result.stdout, (word, result.stdout[-3000:])
    assert not output.exists() or not any(output.iterdir())
    assert not list(output.parent.glob(".rocmft-staging-*"))


# --- a null for an argument that takes none ------------------------------------------------------------------
@pytest.mark.parametrize("how", ["YAML", "key=value"])
def test_a_null_for_an_argument_without_none_is_refused_naming_the_default(rocmft_here, tmp_path, base, how):
    """``cutoff_len: null`` / ``learning_rate: ~`` in a YAML, or ``cutoff_len=null`` on the command line:
    LLaMA-Factory's parse took them (HfArgumentParser passes None on unchecked) and the run died after loading the
    model (torch's AdamW compares lr with 0.0). The old code rendered them with exit 0 (``cutoff_len: null`` in
    train.yaml)."""
    if how == "YAML":
        config = tmp_path / "my.yaml"
        config.write_text("cutoff_len: null\nlearning_rate: ~\nmax_samples: null\n")
        args = [str(config)]
        words = ["cutoff_len: null: cutoff_len takes no null (expected int)", "default (2048)",
                 "learning_rate: null: learning_rate takes no null (expected float)"]  # fmt: skip
    else:
        args = ["cutoff_len=null", "max_samples=null"]
        words = ["cutoff_len=null: cutoff_len takes no null (expected int)", "default (2048)"]
    result = rocmft_here("render", *args, env=base)
    refused(result, tmp_path / "out", *words)
    assert "max_samples" not in result.stdout  # Optional[int]: a null is its own default, and stays allowed


# --- a loop of symbolic links ----------------------------------------------------------------------------------
@pytest.mark.parametrize("variable", ["OUTPUT_DIR", "DATASET_DIR"])
def test_a_path_through_a_loop_of_symbolic_links_is_refused_naming_the_variable(rocmft_here, tmp_path, base,
                                                                                 variable):  # fmt: skip
    """a -> b -> a: pathlib's resolve() raised RuntimeError ("Symlink loop") inside the output_not_input rule, so
    OUTPUT_DIR=a/out ended `rocmft render` in a traceback with exit 1 on the old code; DATASET_DIR=a rendered."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    value = str(tmp_path / "a" / "out") if variable == "OUTPUT_DIR" else str(tmp_path / "a")
    result = rocmft_here("render", env={**base, variable: value})
    refused(result, tmp_path / "out", f"{variable}={value} (set in the environment) goes through a loop of symbolic "
            "links", f"Set {variable} to a real folder")  # fmt: skip


# --- bytes that are not UTF-8 ------------------------------------------------------------------------------------
LATIN1 = b"caf\xe9".decode("utf-8", "surrogateescape")  # a folder named in Latin-1, as os.environ reads it


@pytest.mark.parametrize(("variable", "value", "shown"), [
    ("OUTPUT_DIR", "{tmp}/" + LATIN1, "OUTPUT_DIR={tmp}/caf\\xe9 (set in the environment)"),
    ("RUN_NAME", LATIN1, "RUN_NAME=caf\\xe9 (set in the environment)"),
    ("ROCMFT_SAVES_DIR", "{tmp}/" + LATIN1, "ROCMFT_SAVES_DIR={tmp}/caf\\xe9 (set in the environment)"),
    ("ROCMFT_CACHE_DIR", "{tmp}/" + LATIN1, "ROCMFT_CACHE_DIR={tmp}/caf\\xe9 (set in the environment)"),
], ids=["OUTPUT_DIR", "RUN_NAME", "ROCMFT_SAVES_DIR", "ROCMFT_CACHE_DIR"])  # fmt: skip
def test_a_value_that_is_not_utf8_is_refused_naming_the_variable(rocmft_here, tmp_path, base, variable, value, shown):
    """The old code ended in "The rendered train.yaml is not valid YAML ... fix: Fix the template" (exit 2, naming
    no variable) for the first three, and in tokenizers' UnicodeEncodeError (a traceback, exit 1) for a cache folder
    of the built-in model, which the cache case runs (no model, no OUTPUT_DIR: the demo's defaults)."""
    env = {**base, variable: value.format(tmp=tmp_path)}
    if variable.startswith("ROCMFT_"):
        env = {variable: value.format(tmp=tmp_path)}
        if variable == "ROCMFT_SAVES_DIR":
            env.update({k: base[k] for k in ("MODEL_NAME_OR_PATH", "DATASET", "DATASET_DIR", "TEMPLATE")})
    result = rocmft_here("render", env=env)
    refused(result, tmp_path / "out", "hold bytes that are not UTF-8", shown.format(tmp=tmp_path), "UTF-8 name")
    assert not (tmp_path / "saves").exists() and not (tmp_path / LATIN1 / "rocmft").exists()


# --- a secret with its quotes still on -------------------------------------------------------------------------
SECRET = "hf_notARealTokenButSecret0123456789"


@pytest.mark.parametrize("variable", ["HF_TOKEN", "HUB_TOKEN", "WANDB_API_KEY"])
@pytest.mark.parametrize("quote", ['"', "'"])
def test_a_secret_with_its_quotes_on_is_refused_without_showing_it(rocmft_here, tmp_path, base, variable, quote):
    """``docker --env-file`` keeps the quotes of HF_TOKEN="hf_..."; row 24's rule named every other quoted value,
    but secrets are kept apart from the arguments, so the old code rendered (exit 0) and the quotes went to the hub
    with the token. The value is never printed, in the message or the --json findings."""
    result = rocmft_here("render", "--json", env={**base, variable: f"{quote}{SECRET}{quote}"})
    refused(result, tmp_path / "out", "Values with their quotes still on", f"{variable} (set in the environment; a "
            "secret, its value is not shown)", "Remove the quotes")  # fmt: skip
    assert SECRET not in result.stdout + (result.stderr or "")


# --- messages that named the wrong thing -------------------------------------------------------------------------
def test_a_device_as_the_yaml_is_not_called_missing(rocmft_here, tmp_path, base):
    """ROCMFT_CONFIG=/dev/null exists: the old code said "no such file"."""
    result = rocmft_here("render", env={**base, "ROCMFT_CONFIG": "/dev/null"})
    refused(result, tmp_path / "out", "ROCMFT_CONFIG=/dev/null: not a regular file")
    assert "no such file" not in result.stdout


def test_rocmft_report_on_a_folder_without_a_run_does_not_send_you_to_export(tmp_path):
    """`rocmft report <empty folder>` told the user to run `rocmft export saves/<run>`: find_run's fix, shared by
    report, export, chat and serve, named export. (In-process: find_run is what each command calls.)"""
    from rocmft.config.settings import load_settings
    from rocmft.errors import ConfigError
    from rocmft.outputs.export import find_run

    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as caught:
        find_run(str(tmp_path / "empty"), load_settings({"ROCMFT_SAVES_DIR": str(tmp_path / "saves")}))
    assert "No rocmft run in" in caught.value.message and "its OUTPUT_DIR: saves/<run>" in caught.value.remedy
    assert "rocmft export" not in str(caught.value)


@pytest.mark.parametrize("root", ["/", "//", "/tmp/.."])
def test_output_dir_at_the_file_system_root_is_refused(render_env, base, root):
    """``OUTPUT_DIR=$SAVES/$RUN`` with both unset is ``/``: the old code rendered (exit 0) and wrote /rocmft/
    (training would have saved the weights and checkpoints into /). Rendered here into the test's staging folder
    (conftest's render_env), so that a regression writes nothing into /."""
    from rocmft.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        render_env({**base, "OUTPUT_DIR": root})
    assert f"OUTPUT_DIR={root} (set in the environment) is the file system's root" in str(caught.value)
    assert "OUTPUT_DIR=$SAVES/$RUN" in str(caught.value)


# --- a boolean for a number ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["YAML", "key=value"])
def test_a_boolean_for_a_number_is_refused(rocmft_here, tmp_path, base, how):
    """``lora_rank: true`` became lora_rank 1 and ``num_train_epochs: false`` 0 on the old code (pydantic's lax
    mode; the environment's LORA_RANK=true was refused): the YAML was refused only for what 0 epochs meant, and
    ``lora_rank: true`` rendered as a rank-1 adapter."""
    if how == "YAML":
        config = tmp_path / "my.yaml"
        config.write_text("lora_rank: true\nnum_train_epochs: false\n")
        args, words = (
            [str(config)],
            [
                "lora_rank: true: a boolean where lora_rank takes a number (expected int)",
                "num_train_epochs: false: a boolean where num_train_epochs takes a number",
            ],
        )
    else:
        args, words = ["lora_rank=true"], ["lora_rank=true: a boolean where lora_rank takes a number (expected int)"]
    refused(rocmft_here("render", *args, env=base), tmp_path / "out", *words)


# --- the home folder of a user there is none of ----------------------------------------------------------------------
@pytest.mark.parametrize("variable", ["OUTPUT_DIR", "MODEL_NAME_OR_PATH", "DATASET_DIR", "ROCMFT_SAVES_DIR"])
def test_a_home_folder_of_an_unknown_user_is_refused_naming_it(rocmft_here, tmp_path, base, variable):
    """``MODEL_NAME_OR_PATH=~alice/models/qwen`` from the host's .env, in a container without alice: pathlib's
    expanduser() raised RuntimeError ("Could not determine home directory") and the old code ended in a traceback
    with exit 1 for the first three."""
    user = "rocmft-no-such-user"
    env = {**base, variable: f"~{user}/x"}
    if variable == "ROCMFT_SAVES_DIR":
        del env["OUTPUT_DIR"]
    result = rocmft_here("render", env=env)
    refused(result, tmp_path / "out", f"{variable}=~{user}/x (set in the environment): no user '{user}' here",
            "Write the full path")  # fmt: skip


# --- an adapter that is not one ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["empty folder", "file", "pipe"])
def test_an_adapter_path_that_is_not_an_adapter_folder_is_refused(rocmft_here, tmp_path, base, kind):
    """ADAPTER_NAME_OR_PATH naming an existing folder without adapter_config.json, a file or a pipe: the old code's
    render (and check) exited 0; peft's from_pretrained would have failed after the model loaded."""
    import os

    path = tmp_path / "adapter"
    if kind == "empty folder":
        path.mkdir()
    elif kind == "file":
        path.write_text("not an adapter\n")
    else:
        os.mkfifo(path)
    result = rocmft_here("render", env={**base, "ADAPTER_NAME_OR_PATH": str(path)})
    refused(
        result,
        tmp_path / "out",
        f"ADAPTER_NAME_OR_PATH={path} (set in the environment): {path} is not an "
        "adapter folder (no adapter_config.json",
        "Point ADAPTER_NAME_OR_PATH at the folder a LoRA run saved",
    )


# --- a fix that names where the value was set ----------------------------------------------------------------------
@pytest.mark.parametrize("how", ["YAML", "key=value", "environment"])
def test_a_value_out_of_range_is_fixed_where_it_was_set(rocmft_here, tmp_path, base, how):
    """``rocmft render lora_rank=0`` with LORA_RANK=8 already set said "fix: Set LORA_RANK to a positive number.",
    a variable the command line overrides (a break-it trial, 2026-12-06); a YAML's ``lora_rank: 0`` was sent to the
    variable too. The fix now names the setting where the user wrote it."""
    config = tmp_path / "my.yaml"
    config.write_text("lora_rank: 0\n")
    args, env, fix = {
        "YAML": ([str(config)], base, f"fix: Set lora_rank in the command line's CONFIG ({config}) to a positive"),
        "key=value": (["lora_rank=0"], {**base, "LORA_RANK": "8"}, "fix: Set lora_rank on the command line to a"),
        "environment": ([], {**base, "LORA_RANK": "0"}, "fix: Set LORA_RANK to a positive number."),
    }[how]
    refused(rocmft_here("render", *args, env=env), tmp_path / "out", "must be positive.", fix)
