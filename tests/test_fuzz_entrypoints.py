"""Issue 30: every entry point beyond train/render/check under the property test. `rocmft report`, `status`,
`export`, `chat`, `serve --load` and docker/vllm-serve.py get generated values for the variables they read and
damaged run records; the only outcomes allowed are each command's documented exit codes with rocmft's own message,
no traceback, no secret printed, and nothing half-written (no staging folder, nothing new on a refusal).

In-process, as tests/test_fuzz_inputs.py drives render and check: :func:`rocmft.cli.main` (through the tests'
launcher) and docker/vllm-serve.py's ``main(["--print"])`` (imported; it runs in vLLM's image without rocmft, so
``--print`` is its whole logic but the final exec). The run they act on is made here, not trained: the tiny model
with a real peft LoRA adapter on it (peft's own ``save_pretrained``) and the run record `rocmft train` writes
(status, arguments). ``serve --load`` talks to a stand-in for vLLM's OpenAI server in a thread whose answers are
injected, each the status and JSON vLLM's own code gives (vllm/entrypoints/openai/serving_models.py,
vllm/lora/worker_manager.py; FastAPI's 404 for a route vLLM did not register). A few cases run the console script
and the serve script as processes (marked slow) for the issue's exact inputs.

Budget: ROCMFT_FUZZ_ENTRY_EXAMPLES examples per property (default 25; export and chat load the tiny model, ~1 s an
example once LLaMA-Factory is imported), seeded as in tests/test_fuzz_inputs.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import threading
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from conftest import rocmft_in
from rocmft.errors import ExitCode
from test_fuzz_inputs import (
    ALPHABET,
    CPU_PROBES,
    FUZZ,
    NON_UTF8,
    ODD_JSON,
    SECRET,
    SEED,
    VARIABLES,
    base_environment,
    cut,
    environment,
    new_folder,
    run_main,
    tree,
    values_for,
)

EXAMPLES = int(os.environ.get("ROCMFT_FUZZ_ENTRY_EXAMPLES", "25"))
ENTRY = settings(FUZZ, max_examples=EXAMPLES)
# The documented exit codes of each command (README "Exit codes", rocmft.errors.ExitCode): status answers 0 or 1
# (the healthcheck); export's check of the export for serving fails with 4; serve --load without a server or with
# runtime loading off is 3
ALLOWED = {
    "report": {ExitCode.OK, ExitCode.CONFIG_ERROR},
    "status": {ExitCode.OK, ExitCode.UNHEALTHY, ExitCode.CONFIG_ERROR},
    "export": {ExitCode.OK, ExitCode.CONFIG_ERROR, ExitCode.CHECK_FAILED, ExitCode.TRAINING_FAILED},
    "chat": {ExitCode.OK, ExitCode.CONFIG_ERROR},
    "serve": {ExitCode.OK, ExitCode.CONFIG_ERROR, ExitCode.CHECK_FAILED},
}
# What each may write on success: the summary; the export (EXPORT_DIR, wherever a value put it: "" matches any file)
WRITES = {"report": ("run_summary",), "export": ("",)}
# Beyond the settings every command reads (rocmft.config.settings.load_settings), the variables each one uses
FOCUS = {
    "report": ["OUTPUT_DIR", "ROCMFT_RUN_NAME", "ROCMFT_SAVES_DIR"],
    "status": [],
    "export": [
        "EXPORT_DIR",
        "EXPORT_SIZE",
        "EXPORT_DEVICE",
        "INFER_DTYPE",
        "ROCMFT_EXPORT_BASE",
        "EXPORT_LEGACY_FORMAT",
        "ROCMFT_SERVE_NAME",
        "ROCMFT_SAVES_DIR",
        "TEMPLATE",
    ],
    "chat": ["INFER_DTYPE", "TEMPLATE", "ROCMFT_SAVES_DIR", "EXPORT_DIR"],
    "serve": ["ROCMFT_SERVE_URL", "VLLM_API_KEY", "ROCMFT_SAVES_DIR"],
}
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ---- the run the commands act on ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def adapter_source(tmp_path_factory, tiny_model) -> Path:
    """A real LoRA adapter on the tiny model (peft's save_pretrained), with the tokenizer and a chat template, as
    LLaMA-Factory leaves them in OUTPUT_DIR."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("adapter") / "run"
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


def make_run(work: Path, adapter_source: Path, tiny_model: Path) -> Path:
    """``work/saves/run``: the adapter plus the records `rocmft train` leaves (manifest, worker result, logs)."""
    run = work / "saves" / "run"
    shutil.copytree(adapter_source, run)
    arguments = {
        "model_name_or_path": str(tiny_model),
        "finetuning_type": "lora",
        "template": "qwen",
        "dataset": "rocmft_demo",
        "output_dir": str(run),
        "stage": "sft",
        "do_train": True,
    }
    (run / "rocmft").mkdir()
    (run / "rocmft" / "manifest.json").write_text(
        json.dumps({"schema_version": 1, "status": "finished", "exit_code": 0, "arguments": arguments})
    )
    (run / "trainer_log.jsonl").write_text(
        "".join(
            json.dumps({"current_steps": s, "loss": 2.0 / s, "lr": 1e-4, "throughput": 900.0}) + "\n" for s in (1, 2, 3)
        )
    )
    (run / "trainer_state.json").write_text(
        json.dumps(
            {
                "global_step": 3,
                "max_steps": 3,
                "log_history": [{"step": 3, "loss": 0.7, "num_input_tokens_seen": 300, "train_runtime": 1.5}],
            }
        )
    )
    return run


# ---- a stand-in for vLLM's server (injected answers) ---------------------------------------------------------------

NO_ROUTE = (404, {"detail": "Not Found"})  # FastAPI, the route not registered without runtime LoRA updating
LOAD_ANSWERS = [
    (200, "Success: LoRA adapter 'run' added successfully."),
    NO_ROUTE,
    (
        404,
        {
            "error": {
                "message": "Loading lora run failed: No adapter found for /saves/run",
                "type": "NotFoundError",
                "code": 404,
            }
        },
    ),
    (
        400,
        {
            "error": {
                "message": "[Errno 13] Permission denied: '/saves/run/adapter_config.json'",
                "type": "BadRequestError",
                "code": 400,
            }
        },
    ),
    (400, {"error": {"message": "LoRA rank 8 is greater than max_lora_rank 1.", "code": 400}}),
    (500, "Internal Server Error"),
]
ODD_ANSWERS = [
    (200, []),
    (200, {"data": "x"}),
    (200, {"choices": []}),
    (200, {"choices": [{"message": None}]}),
    (500, "<html>"),
    (200, {"tokens": "x"}),
    (401, {}),
]


class Stand:
    """What the stand-in answers: per path (status, JSON or text); set by each example."""

    answers: typing.ClassVar[dict[str, tuple[int, object]]] = {}


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, data = Stand.answers.get(self.path, NO_ROUTE)
        body = (data if isinstance(data, str) else json.dumps(data)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(data, str) else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def answers(draw, tiny_model: Path) -> dict[str, tuple[int, object]]:
    """vLLM's answers for one example: a model list serving the tiny model (or odd), a load answer, tokenize and
    chat answers (or odd ones)."""
    models = (
        200,
        {
            "object": "list",
            "data": [
                {
                    "id": "base",
                    "root": str(tiny_model),
                    "parent": None,
                    "max_model_len": draw(st.sampled_from([4096, 8, None])),
                }
            ],
        },
    )
    return {
        "/v1/models": draw(st.sampled_from([models, models, *ODD_ANSWERS])),
        "/v1/load_lora_adapter": draw(st.sampled_from(LOAD_ANSWERS)),
        "/v1/unload_lora_adapter": (200, "Success"),
        "/tokenize": draw(st.sampled_from([(200, {"tokens": [1, 2, 3]}), *ODD_ANSWERS])),
        "/v1/chat/completions": draw(
            st.sampled_from([(200, {"choices": [{"message": {"content": "ok"}}]}), *ODD_ANSWERS])
        ),
    }


# ---- the outcome ---------------------------------------------------------------------------------------------------


def assert_entry_outcome(command: str, code: int, printed: str, work: Path, before: set[str]) -> None:
    """The command's documented exit code, rocmft's own message, no traceback or secret; no staging folder left;
    nothing new on a refusal, and on success only what the command writes."""
    assert code in ALLOWED[command], (command, code, printed[-3000:])
    assert "Traceback" not in printed and SECRET not in printed, printed[-3000:]
    if code == ExitCode.CONFIG_ERROR:
        assert "CONFIGURATION ERROR: " in printed or "usage: " in printed, printed[-3000:]
    new = {p for p in tree(work) - before if not p.startswith(".cache")}  # HOME's caches (matplotlib's fonts)
    assert not [p for p in new if "-staging-" in p or p.endswith(".tmp")], (new, printed[-3000:])
    written = [p for p in new if (work / p).is_file()]
    allowed = WRITES.get(command, ()) if code == ExitCode.OK else ()
    assert all(any(part in p for part in allowed) for p in written), (command, code, written, printed[-3000:])


def command_line(command: str, draw, run: Path, url: str) -> list[str]:
    """The command's arguments: the run (or, sometimes, none: the run of these settings, or a folder that cannot
    be one: a file, nothing, a name over 255 bytes, an unknown ~user, a checkpoint that is not there) and its
    options."""
    odd = [
        str(run.parent / "a_file.txt"),
        str(run / "no" / "such"),
        "x" * 300,
        "~no-such-user-here/run",
        str(run / "checkpoint-9"),
        "",
    ]
    target = draw(st.sampled_from([str(run), str(run), str(run / "rocmft"), None]) | st.sampled_from(odd))
    if command == "chat":
        return [
            *([target] if target else []),
            "-p",
            draw(st.sampled_from(["hi", " ", "x" * 300])),
            "--max-new-tokens",
            "2",
        ]
    if command == "serve":
        return ["--load", target or str(run), "--url", url, "-p", "hi", "--max-tokens", "2"]
    return [target] if target else []


def entry_environment(draw, command: str, work: Path, fixtures) -> dict[str, str]:
    """The base environment of tests/test_fuzz_inputs.py (the tiny model, the demo data, a CPU, the secret in
    HF_TOKEN) with the saves folder in ``work``, then 1-3 variables set to generated values: those the command
    uses, or any setting."""
    cache_dir, tiny_model, demo_data = fixtures
    environ = {
        **base_environment(work, cache_dir, tiny_model, demo_data, CPU_PROBES),
        "ROCMFT_SAVES_DIR": str(work / "saves"),
        "HF_HUB_OFFLINE": "1",
    }
    names = draw(
        st.lists(
            st.sampled_from(FOCUS[command] or list(VARIABLES)) | st.sampled_from(list(VARIABLES)),
            min_size=0,
            max_size=3,
            unique=True,
        )
    )
    for name in names:
        value = draw(values_for(name) if name in VARIABLES else st.text(ALPHABET, max_size=20))
        environ[name] = value.replace("{work}", str(work))
    return environ


# ---- the properties ------------------------------------------------------------------------------------------------


@ENTRY
@seed(SEED)
@given(data=st.data(), command=st.sampled_from(list(ALLOWED)))
def test_any_value_for_the_entry_points_exits_as_documented_and_leaves_nothing_half_written(
    fuzz_root, cache_dir, tiny_model, demo_data, adapter_source, stand_in, data, command
):
    work = new_folder(fuzz_root)
    run = make_run(work, adapter_source, tiny_model)
    environ = entry_environment(data.draw, command, work, (cache_dir, tiny_model, demo_data))
    Stand.answers = answers(data.draw, tiny_model)
    tokens = command_line(command, data.draw, run, stand_in)
    before = tree(work)
    code, printed = run_main(command, environ, work, tokens)
    assert_entry_outcome(command, code, printed, work, before)
    shutil.rmtree(work, ignore_errors=True)


# the run's files, damaged: each cut short, not UTF-8, or odd JSON (a list where an object goes...)
RUN_FILES = [
    "rocmft/manifest.json",
    "adapter_config.json",
    "trainer_state.json",
    "trainer_log.jsonl",
    "rocmft/worker-result.json",
    "rocmft/train.yaml",
    "config.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "adapter_model.safetensors",
]
ODD_MANIFESTS = [
    '{"status": "finished", "arguments": [1]}',
    '{"status": 7}',
    '{"restarts": [1]}',
    '{"status": "finished", "arguments": {"model_name_or_path": 5, "finetuning_type": []}}',
    '{"status": "running"}',
    '{"schema_version": 0}',
    '{"status": "finished", "exit_code": true}',
    '{"status": "finished", "arguments": {"template": "no-such-template", "dataset": [1]}}',
]


def damage(path: Path, draw) -> None:
    """``path`` cut short, not UTF-8, odd JSON, or (the manifest) a manifest of odd values."""
    odd = ODD_JSON + (ODD_MANIFESTS if path.name == "manifest.json" else [])
    original = path.read_bytes() if path.is_file() else b""
    kind = draw(st.sampled_from(["cut", "non-utf8", "odd", "odd", "folder"] if original else ["odd", "folder"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder":  # a folder where the file goes
        path.unlink(missing_ok=True)
        path.mkdir()
    elif kind == "cut":
        path.write_bytes(cut(original, draw))
    elif kind == "non-utf8":
        path.write_bytes(NON_UTF8)
    else:
        path.write_text(draw(st.sampled_from(odd)), encoding="utf-8")


@ENTRY
@seed(SEED)
@given(data=st.data(), command=st.sampled_from(list(ALLOWED)), name=st.sampled_from(RUN_FILES))
def test_damaged_run_records_exit_as_documented_and_leave_nothing_half_written(
    fuzz_root, cache_dir, tiny_model, demo_data, adapter_source, stand_in, data, command, name
):
    work = new_folder(fuzz_root)
    run = make_run(work, adapter_source, tiny_model)
    damage(run / name, data.draw)
    environ = {
        **base_environment(work, cache_dir, tiny_model, demo_data, CPU_PROBES),
        "ROCMFT_SAVES_DIR": str(work / "saves"),
    }
    Stand.answers = answers(data.draw, tiny_model)
    tokens = command_line(command, data.draw, run, stand_in)
    before = tree(work)
    code, printed = run_main(command, environ, work, tokens)
    assert_entry_outcome(command, code, printed, work, before)
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize(
    "name", ["trainer_state.json", "rocmft/manifest.json", "trainer_log.jsonl", "rocmft/checks.json"]
)
def test_report_on_records_of_the_wrong_shape(fuzz_root, cache_dir, tiny_model, demo_data, adapter_source, name):
    """The issue's case: a record of valid JSON and the wrong shape (``[1]``): the manifest is refused naming the
    file (rocmft.records.read_manifest); the trainer's own records and the checks' report read as missing (the
    summary and its page are written)."""
    work = new_folder(fuzz_root)
    run = make_run(work, adapter_source, tiny_model)
    (run / name).write_text("[1]\n")
    environ = base_environment(work, cache_dir, tiny_model, demo_data, CPU_PROBES)
    before = tree(work)
    code, printed = run_main("report", environ, work, [str(run)])
    assert_entry_outcome("report", code, printed, work, before)
    if name == "rocmft/manifest.json":
        assert code == ExitCode.CONFIG_ERROR and f"{run / name}" in printed and "not a JSON object" in printed
    else:
        assert code == ExitCode.OK and (run / "run_summary.md").is_file(), printed
        assert (run / "run_summary.html").is_file(), printed
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("name", ["run_summary.md", "run_summary.html"])
def test_report_names_a_folder_in_the_place_of_its_summary(
    fuzz_root, cache_dir, tiny_model, demo_data, adapter_source, name
):
    """A folder where a summary file goes: exit 2 naming that folder (the atomic write's error named its temporary
    file, ``.run_summary.md.<random>.tmp``, and the fix asked for a writable run folder: tried as a new user,
    2026-12-05); no temporary file is left."""
    work = new_folder(fuzz_root)
    run = make_run(work, adapter_source, tiny_model)
    (run / name).mkdir()
    environ = base_environment(work, cache_dir, tiny_model, demo_data, CPU_PROBES)
    code, printed = run_main("report", environ, work, [str(run)])
    assert code == ExitCode.CONFIG_ERROR, printed
    assert f"{run / name}: a folder where `rocmft report` writes a file." in printed, printed
    assert "Move or remove that folder" in printed and "Traceback" not in printed
    assert not list(run.glob(".*.tmp"))
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-entry")


# ---- docker/vllm-serve.py ------------------------------------------------------------------------------------------

SERVE_VARIABLES = [
    "ROCMFT_SERVE_MODEL",
    "ROCMFT_SERVE_NAME",
    "ROCMFT_SERVE_PORT",
    "ROCMFT_SERVE_ARGS",
    "ROCMFT_SERVE_MAX_LORA_RANK",
    "ROCMFT_SAVES_DIR",
    "HF_HOME",
    "HF_HUB_CACHE",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
]
SERVE_VALUES = [
    "",
    " ",
    "²",
    "٨٠٠٠",
    "8000",
    "0",
    "65536",
    "-1",
    "16",
    "512",
    "7",
    "1e3",
    "x" * 300,
    "~",
    "~nobody-x/y",
    "{run}",
    "{run}/",
    "{model}",
    "{work}/a_file.txt",
    "{work}/no/such",
    "/dev/null",
    "{work}/saves",
    "--max-model-len 99999",
    "--max-model-len lots",
    "--max-lora-rank 3",
    "--no-enable-lora",
    "--model {model}",
    "'unclosed",
    "--port=²",
    "--served-model-name a=b,c",
    "true",
    "1",
    "ünï",
    "a\nb",
    "--max-model-len=1K --dtype float16",
    "--",
]
SERVE_FILES = [
    "saves/rocmft-latest-export.json",
    "saves/run/adapter_config.json",
    "saves/run/rocmft/manifest.json",
    "saves/run/tokenizer_config.json",
    "model/config.json",
]


@pytest.fixture(scope="module")
def serve_script():
    from test_serve_command import _module

    return _module()


def serve_print(module, environ: dict[str, str]) -> tuple[int, str]:
    """docker/vllm-serve.py's ``main(["--print"])`` with exactly ``environ``: (exit code, printed)."""
    out = io.StringIO()
    with environment(environ), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            module.main(["--print"])
            code = 0
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue()


@ENTRY
@seed(SEED)
@given(data=st.data())
def test_the_serve_script_takes_any_value_and_damaged_records_with_exit_0_or_2(
    fuzz_root, tiny_model, adapter_source, serve_script, data
):
    work = new_folder(fuzz_root)
    run = make_run(work, adapter_source, tiny_model)
    model = shutil.copytree(tiny_model, work / "model")
    (work / "saves" / "rocmft-latest-export.json").write_text(
        json.dumps({"model_path": str(model), "model_path_in_saves": "run"})
    )
    environ = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(work),
        "ROCMFT_SAVES_DIR": str(work / "saves"),
    }
    for name in data.draw(st.lists(st.sampled_from(SERVE_VARIABLES), max_size=4, unique=True)):
        value = data.draw(st.sampled_from(SERVE_VALUES) | st.text(ALPHABET, max_size=12))
        environ[name] = value.replace("{run}", str(run)).replace("{model}", str(model)).replace("{work}", str(work))
    if data.draw(st.booleans()):
        damage(work / data.draw(st.sampled_from(SERVE_FILES)), data.draw)
    code, printed = serve_print(serve_script, environ)
    assert code in (0, 2), (code, printed[-3000:])
    if code == 2:
        assert printed.startswith("[rocmft serve] ") and "\n  fix: " in printed, printed[-3000:]
    else:
        assert json.loads(printed.splitlines()[-1])["argv"][:3] == [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
        ]
    shutil.rmtree(work, ignore_errors=True)


# ---- the issue's inputs through the processes users start -----------------------------------------------------------


@pytest.mark.slow  # starts the console script and the serve script as processes
def test_the_issues_inputs_through_the_console_script_and_the_serve_script(
    tmp_path, cache_dir, tiny_model, adapter_source
):
    """`python -m rocmft report` on a manifest holding ``[1]`` and on a trainer_state.json holding ``[1]``, and
    docker/vllm-serve.py with ROCMFT_SERVE_PORT=²: exit 2 (or 0 for the trainer's record) with the file or the
    variable named, never a traceback."""
    import subprocess

    from test_serve_command import SERVE

    run = make_run(tmp_path, adapter_source, tiny_model)
    (run / "trainer_state.json").write_text("[1]")
    result = rocmft_in(tmp_path, cache_dir, "report", str(run))
    assert result.returncode == ExitCode.OK and "Traceback" not in result.stdout, result.stdout
    (run / "rocmft" / "manifest.json").write_text("[1]")
    result = rocmft_in(tmp_path, cache_dir, "report", str(run))
    assert result.returncode == ExitCode.CONFIG_ERROR and "Traceback" not in result.stdout, result.stdout
    assert str(run / "rocmft" / "manifest.json") in result.stdout and "not a JSON object" in result.stdout
    served = subprocess.run(
        [sys.executable, str(SERVE), "--print"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "ROCMFT_SERVE_MODEL": str(tiny_model), "ROCMFT_SERVE_PORT": "²"},
    )
    assert served.returncode == 2 and "Traceback" not in served.stderr, served.stderr
    assert "ROCMFT_SERVE_PORT='²'" in served.stderr and "fix: " in served.stderr


def test_chat_loads_the_runs_weights_and_names_a_folder_it_cannot_load(
    fuzz_root, cache_dir, tiny_model, demo_data, adapter_source
):
    """Found by the property above: `rocmft chat OUTPUT_DIR/rocmft` loaded the tokenizer from the record folder
    (a ValueError traceback from transformers), and a damaged tokenizer.json did the same (as
    huggingface/transformers#26897 shows it). The run's weights are loaded now, and a folder transformers cannot
    load is exit 2 naming it."""
    work = new_folder(fuzz_root)
    run = make_run(work, adapter_source, tiny_model)
    environ = base_environment(work, cache_dir, tiny_model, demo_data, CPU_PROBES)
    options = ["-p", "What is LoRA?", "--max-new-tokens", "2", "--json"]
    code, printed = run_main("chat", environ, work, [str(run / "rocmft"), *options])
    assert code == ExitCode.OK and f"the adapter in {run} on {tiny_model}" in printed, printed[-3000:]
    assert json.loads(printed.strip().splitlines()[-1])["prompt"] == "What is LoRA?"
    (run / "tokenizer.json").write_text('{"model": ')
    before = tree(work)
    code, printed = run_main("chat", environ, work, [str(run), *options])
    assert_entry_outcome("chat", code, printed, work, before)
    assert code == ExitCode.CONFIG_ERROR and f"The model to chat with in {run} cannot be loaded" in printed, printed
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("command", list(ALLOWED))
def test_a_folder_that_cannot_be_looked_at_is_refused_naming_it(fuzz_root, cache_dir, tiny_model, demo_data, command):
    """Found while writing this file: a run folder given with a name over 255 bytes (ENAMETOOLONG) or an unknown
    ``~user`` made pathlib raise in each of the five commands (an OSError or RuntimeError traceback). Exit 2 naming
    the command's argument (rocmft.cli.common.given_path)."""
    work = new_folder(fuzz_root)
    environ = base_environment(work, cache_dir, tiny_model, demo_data, CPU_PROBES)
    for folder in ("x" * 300, "~no-such-user-here/run"):
        tokens = {"chat": [folder, "-p", "hi"], "serve": ["--load", folder]}.get(command, [folder])
        code, printed = run_main(command, environ, work, tokens)
        assert code == ExitCode.CONFIG_ERROR and "Traceback" not in printed, printed[-2000:]
        assert f"rocmft {command}" in printed and "cannot be looked at here" in printed, printed[-2000:]
    shutil.rmtree(work, ignore_errors=True)
