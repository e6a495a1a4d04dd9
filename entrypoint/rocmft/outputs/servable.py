"""Check an export for the serving side, and write what older readers need, before it is renamed into place.

``rocmft export`` calls :func:`prepare_for_serving` on the staging folder: a folder that vLLM cannot load, or
would load wrongly, is refused there (exit 4, nothing left in EXPORT_DIR) instead of at the first request.

What is checked (the issue that asked for it: #19, "the export is validated for the serving side"):

* weights are safetensors only: vLLM loads ``*.bin`` with ``torch.load``, which a future PyTorch refuses by default
  (``weights_only``), and a folder with both is loaded twice over (vllm-project/vllm#19139: a merged checkpoint
  written one way did not load in another version);
* ``architectures`` and ``model_type`` are the base's: vLLM picks its model class from ``architectures[0]``;
* a tokenizer and a chat template: without a template vLLM refuses every chat request (measured with vLLM 0.32).

What is added to ``config.json``, for readers older than transformers 5 (the ROCm serve images' vLLM 0.11.2 needs
``transformers<5,>=4.56.0``, from its wheel's metadata), each only when missing:

* ``rope_theta`` (and ``rope_scaling`` for a scaled RoPE) from transformers 5's ``rope_parameters``: transformers
  4.57.1 does not read ``rope_parameters`` and falls back to ``rope_theta`` 10000 — measured with ``AutoConfig`` on
  a Qwen2 config with 1e6 (``tests/test_serve.py`` reads every export with 4.57.1) — so positions would be wrong,
  silently;
* ``torch_dtype``: transformers 5 writes ``dtype``; 4.57.1 reads ``torch_dtype``.

And in ``tokenizer_config.json`` (4.57.1 refused transformers 5.6's file: "Tokenizer class TokenizersBackend does
not exist", then "'list' object has no attribute 'keys'" — measured): ``tokenizer_class`` ``TokenizersBackend``
(transformers 5's generic fast tokenizer) becomes ``PreTrainedTokenizerFast``, its 4.x name, and a list-valued
``extra_special_tokens`` becomes ``additional_special_tokens`` (4.x's key for that list; 4.x reads
``extra_special_tokens`` as a dict). transformers 4.57.1, 5.6 and 5.19 then give the same ids and special tokens
(measured; ``tests/test_serve.py`` compares the chat tokenization of every demo prompt).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rocmft.errors import ExitCode, RocmftError
from rocmft.fsutil import atomic_write_json

TORCH_WEIGHTS = ("*.bin", "*.pt", "*.pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def _fail(message: str, fix: str) -> RocmftError:
    """The export's own failure (exit 4, as a failed merge): the staging folder is removed by the caller."""
    return RocmftError(message, fix, code=ExitCode.TRAINING_FAILED)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise _fail(f"The export's {path.name} cannot be read ({err}).", "Run `rocmft export` again.") from err
    if not isinstance(data, dict):
        raise _fail(f"The export's {path.name} is not a JSON object.", "Run `rocmft export` again.")
    return data


def chat_template_of(folder: Path) -> str | None:
    """Where the folder's chat template is: ``chat_template.jinja`` (transformers ≥ 4.43 writes it there) or the
    ``chat_template`` key of ``tokenizer_config.json`` (older writers); None when it has none."""
    if (folder / "chat_template.jinja").is_file():
        return "chat_template.jinja"
    config = folder / "tokenizer_config.json"
    if config.is_file():
        try:
            if json.loads(config.read_text(encoding="utf-8")).get("chat_template"):
                return "tokenizer_config.json"
        except (OSError, ValueError, AttributeError):
            return None
    return None


def legacy_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The keys transformers 4.x reads that a transformers 5 ``config`` lacks (see the module docstring).

    Args:
        config: a model's ``config.json`` as a dict.

    Returns:
        ``{key: value}`` to add, possibly empty: ``rope_theta`` (float), ``rope_scaling`` (dict, only for a RoPE
        type other than ``default``), ``torch_dtype`` (str).
    """
    added: dict[str, Any] = {}
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" not in config and isinstance(rope.get("rope_theta"), int | float):
            added["rope_theta"] = float(rope["rope_theta"])
        kind = rope.get("rope_type") or rope.get("type") or "default"
        if kind != "default" and config.get("rope_scaling") is None:
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
            added["rope_scaling"] = {**scaling, "rope_type": kind, "type": kind}
    if "torch_dtype" not in config and isinstance(config.get("dtype"), str):
        added["torch_dtype"] = config["dtype"]
    return added


def legacy_tokenizer_keys(config: dict[str, Any]) -> dict[str, Any] | None:
    """``tokenizer_config.json`` rewritten for transformers 4.x readers (see the module docstring), or None when
    it needs nothing.

    Args:
        config: a tokenizer_config.json as a dict.
    """
    changed = dict(config)
    if changed.get("tokenizer_class") == "TokenizersBackend":
        changed["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = changed.get("extra_special_tokens")
    if isinstance(extra, list):
        del changed["extra_special_tokens"]
        changed.setdefault("additional_special_tokens", extra)
    return changed if changed != config else None


def prepare_for_serving(folder: Path, base_config: dict[str, Any] | None, lora_rank: int | None) -> dict[str, Any]:
    """Check the export in ``folder`` for serving, add the legacy config keys, and return the ``serve`` record.

    Args:
        folder: the export's staging folder (config.json, weights, tokenizer as LLaMA-Factory wrote them).
        base_config: the run's base model's ``config.json`` (None when it cannot be read: not compared).
        lora_rank: the run's LoRA rank ``r`` (None for a full or freeze run): what the serve side's
            ``--max-lora-rank`` must allow for adapters of this run (docker/vllm-serve.py reads it).

    Returns:
        ``{"architecture", "model_type", "dtype", "max_model_len", "rope_theta", "lora_rank", "chat_template",
        "legacy_keys", "legacy_tokenizer_config"}``,
        stored under ``serve`` in the export manifest.

    Raises:
        RocmftError: exit 4, with the file at fault and what to do.
    """
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise _fail("The export has no config.json.", "Run `rocmft export` again; report it if it recurs.")
    config = _read_json(config_path)
    torch_files = sorted(p.name for pattern in TORCH_WEIGHTS for p in folder.glob(pattern))
    if torch_files:
        raise _fail(
            f"The export wrote PyTorch pickles ({', '.join(torch_files)}) instead of safetensors only.",
            "Remove export_legacy_format from your settings (rocmft exports safetensors, which vLLM loads).",
        )
    if not list(folder.glob("*.safetensors")):
        raise _fail("The export has no *.safetensors weights.", "Run `rocmft export` again.")
    if base_config is not None:
        for key in ("architectures", "model_type"):
            if base_config.get(key) and config.get(key) != base_config.get(key):
                raise _fail(
                    f"The export's config.json has {key}={config.get(key)!r}, its base {base_config.get(key)!r}: "
                    "vLLM picks its model class from it.",
                    "Export with the same transformers version the run trained with (rocmft env shows it).",
                )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise _fail(
            f"The export has no tokenizer ({' / '.join(TOKENIZER_FILES)}).",
            "Make sure the run's base has its tokenizer files, then export again.",
        )
    template = chat_template_of(folder)
    if template is None:
        raise _fail(
            "The export's tokenizer has no chat template: vLLM would refuse every chat request.",
            "Set TEMPLATE for the run (the LLaMA-Factory template it trained with) and export again.",
        )
    added = legacy_keys(config)
    if added:
        atomic_write_json(config_path, {**config, **added})
    tokenizer_path = folder / "tokenizer_config.json"
    tokenizer = legacy_tokenizer_keys(_read_json(tokenizer_path)) if tokenizer_path.is_file() else None
    if tokenizer is not None:
        atomic_write_json(tokenizer_path, tokenizer)
    rope = config.get("rope_parameters") or {}
    return {
        "architecture": (config.get("architectures") or [None])[0],
        "model_type": config.get("model_type"),
        "dtype": config.get("dtype") or config.get("torch_dtype"),
        "max_model_len": config.get("max_position_embeddings"),
        "rope_theta": config.get("rope_theta", rope.get("rope_theta") if isinstance(rope, dict) else None),
        "lora_rank": lora_rank,
        "chat_template": template,
        "legacy_keys": sorted(added),
        "legacy_tokenizer_config": tokenizer is not None,
    }


__all__ = ["chat_template_of", "legacy_keys", "legacy_tokenizer_keys", "prepare_for_serving"]
