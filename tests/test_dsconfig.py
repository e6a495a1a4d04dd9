"""Issue 30, item 1: each library judges its own configuration. A DeepSpeed config (a user's DEEPSPEED file or the one
rocmft renders) is refused before the model loads when DeepSpeed's own config classes refuse it, when its text says
something its readers read differently (a key written twice, a boolean or number in quotes), or when its scheduler's
warmup contradicts the trainer's; ROCMFT_ZERO_STAGE takes 0-3 and ROCMFT_OFFLOAD_DEVICE=nvme offloads to a folder.

The rules run in-process as `rocmft render` runs them (load_settings, render_checked); DeepSpeed's verdict runs in
the parser child, so its tests run `rocmft render --json` as a user would (docs/rules.md lists each kind with the
public report behind it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rocmft.config.cmdline import parse_command_line
from rocmft.config.settings import load_settings
from rocmft.errors import ConfigError, ExitCode
from rocmft.facts.device import DeviceFacts
from rocmft.validate.rules import render_checked

ENV = "set in the environment"


def _render(environ: dict[str, str], staging: Path):
    """render_checked as `rocmft render` runs it, in-process (tests/test_provenance.py's helper)."""
    settings = load_settings(environ, parse_command_line([]))

    def make_staging(output_dir: Path) -> Path:
        staging.mkdir(parents=True, exist_ok=True)
        return staging

    return render_checked(settings, DeviceFacts(backend="cpu"), make_staging)


@pytest.fixture
def base(tmp_path, cache_dir, tiny_model) -> dict[str, str]:
    return {"ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out"),
            "MODEL_NAME_OR_PATH": str(tiny_model)}  # fmt: skip


def _refused(environ: dict[str, str], tmp_path: Path, code: str) -> tuple[str, dict[str, str | None]]:
    """The refusal's message and the settings its finding of ``code`` names (name -> value)."""
    with pytest.raises(ConfigError) as caught:
        _render(environ, tmp_path / "staging")
    findings = [f for f in caught.value.reported() if f.code == code]
    assert findings, (code, [f.code for f in caught.value.reported()], str(caught.value))
    assert findings[0].fix.strip()
    return findings[0].message, {s.name: s.value for s in findings[0].settings}


def _ds_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "ds.json"
    path.write_text(text)
    return str(path)


# --- rocmft's settings: ZeRO 0-3, offload to CPU or NVMe ---------------------------------------------------------

DS = {"ROCMFT_DISTRIBUTED": "deepspeed"}
NVME3 = {**DS, "ROCMFT_ZERO_STAGE": "3", "ROCMFT_OFFLOAD": "optimizer", "ROCMFT_OFFLOAD_DEVICE": "nvme"}


@pytest.mark.parametrize("stage", ["0", "1", "2", "3"])
def test_every_zero_stage_renders(base, tmp_path, stage):
    plan = _render({**base, **DS, "ROCMFT_ZERO_STAGE": stage}, tmp_path / "staging")
    assert plan.ds_config["zero_optimization"]["stage"] == int(stage)


def test_nvme_offload_renders_deepspeeds_device_and_path(base, tmp_path):
    swap = tmp_path / "nvme"
    swap.mkdir()
    plan = _render({**base, **DS, "ROCMFT_ZERO_STAGE": "3", "ROCMFT_OFFLOAD": "optimizer+params",
                    "ROCMFT_OFFLOAD_DEVICE": "nvme", "ROCMFT_NVME_PATH": str(swap)}, tmp_path / "staging")  # fmt: skip
    zero = plan.ds_config["zero_optimization"]
    for block in ("offload_optimizer", "offload_param"):
        assert zero[block]["device"] == "nvme" and zero[block]["nvme_path"] == str(swap), zero


def test_cpu_offload_at_stage_1_renders(base, tmp_path):
    plan = _render({**base, **DS, "ROCMFT_ZERO_STAGE": "1", "ROCMFT_OFFLOAD": "optimizer"}, tmp_path / "staging")
    assert plan.ds_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "nvme_path" not in plan.ds_config["zero_optimization"]["offload_optimizer"]


OFFLOAD_CASES = {
    # name: (environment, settings the finding names, words of the message)
    "offload at stage 0": ({**DS, "ROCMFT_ZERO_STAGE": "0", "ROCMFT_OFFLOAD": "optimizer"},
                           ["ROCMFT_OFFLOAD", "ROCMFT_ZERO_STAGE"], ["no ZeRO optimizer at stage 0"]),
    "nvme below stage 3": ({**DS, "ROCMFT_ZERO_STAGE": "2", "ROCMFT_OFFLOAD": "optimizer",
                            "ROCMFT_OFFLOAD_DEVICE": "nvme", "ROCMFT_NVME_PATH": "{tmp}"},
                           ["ROCMFT_OFFLOAD_DEVICE", "ROCMFT_ZERO_STAGE"], ["only at stage 3", "CPU memory"]),
    "nvme without a path": (NVME3, ["ROCMFT_OFFLOAD_DEVICE"], ["ROCMFT_NVME_PATH is not set"]),
    "nvme path missing": ({**NVME3, "ROCMFT_NVME_PATH": "{tmp}/nope"}, ["ROCMFT_NVME_PATH"],
                          ["{tmp}/nope", "does not exist"]),
    "nvme path a file": ({**NVME3, "ROCMFT_NVME_PATH": "{tmp}/ds.json"}, ["ROCMFT_NVME_PATH"], ["is not a folder"]),
    "nvme path with cpu": ({**DS, "ROCMFT_OFFLOAD": "optimizer", "ROCMFT_NVME_PATH": "{tmp}"},
                           ["ROCMFT_NVME_PATH", "ROCMFT_OFFLOAD_DEVICE"], ["has no effect"]),
    "nvme without offload": ({**DS, "ROCMFT_ZERO_STAGE": "3", "ROCMFT_OFFLOAD_DEVICE": "nvme"},
                             ["ROCMFT_OFFLOAD_DEVICE", "ROCMFT_OFFLOAD"], ["has no effect"]),
    "device without deepspeed": ({"ROCMFT_OFFLOAD_DEVICE": "nvme"}, ["ROCMFT_OFFLOAD_DEVICE", "ROCMFT_DISTRIBUTED"],
                                 ["only DeepSpeed offloads"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(OFFLOAD_CASES))
def test_offload_settings_deepspeed_would_not_honour_are_refused(base, tmp_path, case):
    environ, names, words = OFFLOAD_CASES[case]
    (tmp_path / "ds.json").write_text("{}")
    environ = {k: v.replace("{tmp}", str(tmp_path)) for k, v in environ.items()}
    message, settings = _refused({**base, **environ}, tmp_path, "dsconfig.offload_settings")
    for name in names:
        assert name in settings, (name, settings, message)
    for word in words:
        assert word.replace("{tmp}", str(tmp_path)) in message, (word, message)


def test_an_nvme_path_with_a_name_too_long_is_refused_by_name(base, tmp_path):
    """ROCMFT_NVME_PATH is a path setting like ROCMFT_CACHE_DIR (settings.PATH_SETTINGS, the same list as
    knobs' empty-path check): a name over 255 bytes is refused naming it. Left out of that list, the offload rule's
    Path.exists() raised OSError ENAMETOOLONG (pathlib ignores ENOENT, not that) with NVMe offload set up."""
    with pytest.raises(ConfigError) as caught:
        _render({**base, **NVME3, "ROCMFT_NVME_PATH": str(tmp_path / ("x" * 300))}, tmp_path / "staging")
    assert "ROCMFT_NVME_PATH" in str(caught.value) and "longer than 255 bytes" in str(caught.value), caught.value


def test_an_nvme_path_that_cannot_be_written_is_refused(base, tmp_path, monkeypatch):
    """A folder that takes no file (read-only mount, no permission). As root a chmod does not stop a write, so there
    the write fails as a read-only mount's does (EROFS)."""
    import errno

    swap = tmp_path / "ro"
    swap.mkdir()
    swap.chmod(0o555)
    if os.geteuid() == 0:

        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr("rocmft.validate.rules.dsconfig.tempfile.mkstemp", read_only)
    try:
        message, settings = _refused({**base, **NVME3, "ROCMFT_NVME_PATH": str(swap)}, tmp_path,
                                     "dsconfig.offload_settings")  # fmt: skip
    finally:
        swap.chmod(0o755)
    assert settings["ROCMFT_NVME_PATH"] == str(swap) and "cannot be written" in message, message
    assert not list(swap.iterdir())  # no probe file left


# --- a user's ds_config: its own text ------------------------------------------------------------------------------


def test_a_key_written_twice_is_refused_naming_the_path_both_values_and_the_file(base, tmp_path):
    text = '{"zero_optimization": {"stage": 3, "overlap_comm": true, "stage": 2}, "gradient_clipping": 1.0}'
    ds = _ds_file(tmp_path, text)
    message, settings = _refused({**base, "DEEPSPEED": ds}, tmp_path, "dsconfig.duplicate_keys")
    assert settings == {"deepspeed": ds}, settings
    assert f"DEEPSPEED={ds} ({ENV})" in message and "zero_optimization.stage first 3, then 2" in message, message


def test_a_top_level_key_written_twice_is_refused(base, tmp_path):
    ds = _ds_file(tmp_path, '{"gradient_clipping": 1.0, "zero_optimization": {"stage": 2}, "gradient_clipping": 0.5}')
    message, _ = _refused({**base, "DEEPSPEED": ds}, tmp_path, "dsconfig.duplicate_keys")
    assert "gradient_clipping first 1.0, then 0.5" in message, message


def test_an_offload_block_written_as_a_boolean_is_refused(base, tmp_path):
    """An offload block as true (pytorch-lightning#17790): transformers' reading crashed LLaMA-Factory's parse with
    "AttributeError: 'bool' object has no attribute 'get'", naming no key."""
    ds = _ds_file(tmp_path, json.dumps({"zero_optimization": {"stage": 3, "offload_param": True}}))
    message, settings = _refused({**base, "DEEPSPEED": ds}, tmp_path, "dsconfig.typed_values")
    assert settings == {"deepspeed": ds} and "zero_optimization.offload_param=true where" in message, message


def test_booleans_and_numbers_in_quotes_are_refused_where_readers_differ(base, tmp_path):
    ds = _ds_file(tmp_path, json.dumps({"fp16": {"enabled": "false"}, "zero_optimization": {"stage": "3"},
                                        "zero_allow_untested_optimizer": "True",
                                        "tensorboard": {"job_name": "2024"}}))  # fmt: skip
    message, settings = _refused({**base, "DEEPSPEED": ds}, tmp_path, "dsconfig.typed_values")
    assert settings == {"deepspeed": ds}, settings
    for word in ('fp16.enabled="false" (a boolean', 'zero_optimization.stage="3" (a number',
                 'zero_allow_untested_optimizer="True"'):  # fmt: skip
        assert word in message, (word, message)
    assert "job_name" not in message  # a name that happens to be digits is no number transformers compares


# --- a user's ds_config against the trainer: the scheduler's warmup ------------------------------------------------

WARMUP_LR = {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}}


@pytest.mark.parametrize(
    ("environ", "params", "named"),
    [
        ({"WARMUP_RATIO": "0.1"}, {"warmup_num_steps": 100}, ("warmup_ratio", "WARMUP_RATIO=0.1 (" + ENV)),
        ({"WARMUP_STEPS": "20"}, {"warmup_num_steps": 100}, ("warmup_steps", "WARMUP_STEPS=20 (" + ENV)),
        ({}, {"warmup_num_steps": 50}, ("warmup_steps", "scheduler.params.warmup_num_steps=50 vs WARMUP_STEPS")),
        (
            {"MAX_STEPS": "30"},
            {"warmup_num_steps": "auto", "total_num_steps": 1000},
            ("max_steps", "scheduler.params.total_num_steps=1000 vs MAX_STEPS=30 (" + ENV),
        ),
    ],
    ids=["ratio", "steps", "none", "total"],
)
def test_a_scheduler_warmup_against_the_trainers_is_refused_naming_both(base, tmp_path, environ, params, named):
    scheduler = {**WARMUP_LR, "params": {**WARMUP_LR["params"], **params}}
    ds = _ds_file(tmp_path, json.dumps({"scheduler": scheduler, "zero_optimization": {"stage": 2}}))
    message, settings = _refused({**base, **environ, "DEEPSPEED": ds}, tmp_path, "distributed.user_ds_config")
    name, words = named
    assert "deepspeed" in settings and name in settings, (settings, message)
    assert words in message, (words, message)


def test_a_scheduler_warmup_equal_to_the_trainers_passes(base, tmp_path):
    scheduler = {**WARMUP_LR, "params": {**WARMUP_LR["params"], "warmup_num_steps": 20}}
    ds = _ds_file(tmp_path, json.dumps({"scheduler": scheduler, "zero_optimization": {"stage": 2}}))
    _render({**base, "WARMUP_STEPS": "20", "DEEPSPEED": ds}, tmp_path / "staging")


def test_nvme_optimizer_offload_below_stage_3_in_a_users_file_is_refused(base, tmp_path):
    ds = _ds_file(tmp_path, json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {
        "device": "nvme", "nvme_path": str(tmp_path)}}}))  # fmt: skip
    message, settings = _refused({**base, "DEEPSPEED": ds}, tmp_path, "distributed.user_ds_config")
    assert "deepspeed" in settings and "offload_optimizer.device is nvme at stage 2" in message, message


# --- DeepSpeed's own verdict, in the parser child ------------------------------------------------------------------


def _findings(result) -> list[dict]:
    last = [line for line in result.stdout.splitlines() if line.startswith('{"findings"')]
    assert last, result.stdout[-3000:]
    return json.loads(last[-1])["findings"]


def test_deepspeeds_config_classes_refuse_what_they_do_not_know(run_rocmft, tmp_path, tiny_model):
    """One file, three kinds DeepSpeed's pydantic models refuse and no rule of rocmft's knew: an offload device in
    capitals (accelerate#232), a fraction where a whole number goes (accelerate#2814), a misspelt option
    (DeepSpeed#2721). Nothing is written to OUTPUT_DIR. (``tiny_model``: built here first, as building it prints
    DeepSpeed's accelerator line in the process that builds it.)"""
    ds = _ds_file(tmp_path, json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                                        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "CPU"},
                                                              "reduce_bucket_size": 5.5,
                                                              "overlap_com": True}}))  # fmt: skip
    output = tmp_path / "out"
    result = run_rocmft("render", "--json", env={"OUTPUT_DIR": str(output), "DEEPSPEED": ds})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout[-3000:]
    findings = _findings(result)
    assert [f["code"] for f in findings] == ["dsconfig.deepspeed_model"], findings
    finding = findings[0]
    assert [s["name"] for s in finding["settings"]] == ["deepspeed"] and finding["settings"][0]["value"] == ds
    for word in (f"DEEPSPEED={ds}", "zero_optimization.offload_optimizer.device=\"CPU\": Input should be 'none', "
                 "'cpu' or 'nvme'", "zero_optimization.reduce_bucket_size=5.5: Input should be a valid integer",
                 "zero_optimization.overlap_com=true: Extra inputs are not permitted"):  # fmt: skip
        assert word in finding["message"], (word, finding["message"])
    print(finding["message"], finding["fix"], sep="\n")
    console = result.stdout + (result.stderr or "")
    assert "Traceback" not in console
    assert "Setting accelerator" not in console  # DeepSpeed's console line stays in the child
    assert not output.exists() or not any(output.iterdir())


def test_rocmfts_nvme_config_passes_deepspeeds_config_classes(run_rocmft, tmp_path):
    swap = tmp_path / "nvme"
    swap.mkdir()
    output = tmp_path / "out"
    result = run_rocmft("render", env={"OUTPUT_DIR": str(output), "ROCMFT_DISTRIBUTED": "deepspeed",
                                       "ROCMFT_ZERO_STAGE": "3", "ROCMFT_OFFLOAD": "optimizer+params",
                                       "ROCMFT_OFFLOAD_DEVICE": "nvme", "ROCMFT_NVME_PATH": str(swap)})  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    written = json.loads((output / "rocmft" / "ds_config.json").read_text())
    assert written["zero_optimization"]["offload_param"] == {"device": "nvme", "nvme_path": str(swap),
                                                             "pin_memory": True}  # fmt: skip
