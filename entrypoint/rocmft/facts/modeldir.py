"""One reader of a local model folder's facts: config.json, the safetensors headers, the weight index, the
quantization method, the tokenizer's special tokens, the linear module names, the weight bytes.

Nothing here loads a weight or imports transformers. Each fact is read at most once per :class:`ModelDir`
(a successful read is cached on the instance; a failed one raises again on the next ask, so each caller keeps
its own error handling). The formats: config.json and tokenizer files are Hugging Face's ``save_pretrained``
output; a safetensors file starts with an 8-byte little-endian header length and the JSON header (the
safetensors format spec); ``model.safetensors.index.json`` maps tensor names to shards (``weight_map``).
"""

from __future__ import annotations

import re
import struct
from functools import cached_property
from pathlib import Path
from typing import Any

from rocmft.nesting import loads_json

# Weight files of a whole (merged or full fine-tuned) model folder, as save_pretrained writes them.
MODEL_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "pytorch_model.bin.index.json")  # fmt: skip
# Weight files a trainer checkpoint holds (an adapter or the whole model; transformers' Trainer._save).
CHECKPOINT_WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json",
                           "adapter_model.bin", "pytorch_model.bin")  # fmt: skip
# Files whose suffix marks weights, for the folder's weight bytes.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# Any one of these makes a folder's tokenizer loadable.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")

# Chat-template markers: the special tokens a template writes around turns (<|im_start|>, <|start_header_id|>,
# <｜User｜>, <start_of_turn>).
MARKER = r"<[|｜][^<>\s]{1,40}?[|｜]>|<(?:start|end)_of_turn>"


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file (tensor name -> {dtype, shape, data_offsets}, and
    ``__metadata__``).

    Raises:
        OSError, ValueError, struct.error: the file cannot be read, or its header is cut short or not JSON.
    """
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > path.stat().st_size - 8:  # read() of a damaged length (2**62) was a MemoryError
            raise ValueError(f"{path}: the safetensors header says {length} bytes, more than the file holds")
        header = loads_json(handle.read(length))
    if not isinstance(header, dict) or not all(isinstance(v, dict) for v in header.values()):  # a list: a traceback
        raise ValueError(f"{path}: the safetensors header is not an object of tensor name: {{dtype, shape, ...}}")
    return header


def looks_like_path(value: str, nested: bool = False) -> bool:
    """Whether a value names a path (``/``, ``./``, ``../`` or ``~`` first) rather than a hub id or a name.

    ``nested``: also a relative name with more than one ``/`` (a hub id has one: ``owner/name``); the model
    check reads MODEL_NAME_OR_PATH so, the rules read adapter and checkpoint paths without it.
    """
    import os

    return value.startswith(("/", "./", "../", "~")) or (nested and os.sep in value and value.count("/") > 1)


def quantization_label(config: dict[str, Any] | None) -> str | None:
    """The quantization of a checkpoint for messages (``gptq, 4-bit``, ``bitsandbytes, 8-bit``, ``awq``) from a
    config.json's ``quantization_config`` (where transformers records it), or None for an unquantized one."""
    quant = (config or {}).get("quantization_config") or {}
    if not quant:
        return None
    method = str(quant.get("quant_method") or "unknown method")
    if quant.get("load_in_4bit") or quant.get("load_in_8bit"):
        bits = 4 if quant.get("load_in_4bit") else 8
    else:
        bits = quant.get("bits")
    return f"{method}, {bits}-bit" if bits else method


class ModelDir:
    """A model folder (or what MODEL_NAME_OR_PATH names: it may be a hub id, then nothing here is local).

    Args:
        path: the folder; ``~`` is expanded.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(str(path)).expanduser()

    @property
    def is_local(self) -> bool:
        """Whether the path is a folder here."""
        return self.path.is_dir()

    @property
    def config_path(self) -> Path:
        """``<path>/config.json``."""
        return self.path / "config.json"

    @cached_property
    def _config(self) -> dict[str, Any]:
        loaded = loads_json(self.config_path.read_text(encoding="utf-8"))
        if not isinstance(loaded, dict):  # every reader treats it as unreadable (a list here was a traceback)
            raise ValueError(f"{self.config_path} holds a JSON {type(loaded).__name__}, not an object")
        return loaded

    def config_json(self) -> dict[str, Any]:
        """config.json as parsed: a JSON object.

        Raises:
            OSError: no such file or unreadable; ValueError: not JSON (json.JSONDecodeError, UnicodeDecodeError),
                or JSON that is not an object.
        """
        return self._config

    def config(self) -> dict[str, Any] | None:
        """config.json as a dict, or None when it is missing, unreadable, not JSON or not an object."""
        try:
            loaded = self.config_json()
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def quantization_method(self) -> str | None:
        """``quantization_config.quant_method`` of config.json (``gptq``, ``awq``...: a checkpoint quantized after
        training, where transformers records it); None when unquantized, missing or unreadable."""
        try:
            loaded = self.config_json()
        except (OSError, ValueError):
            return None
        return (loaded.get("quantization_config") or {}).get("quant_method")

    def max_position_embeddings(self) -> int | None:
        """The context length in config.json (``max_position_embeddings``), None when absent or unreadable."""
        try:
            value = self.config_json().get("max_position_embeddings")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, int) else None

    def safetensors_files(self) -> list[Path]:
        """The folder's .safetensors files, sorted by name."""
        return sorted(self.path.glob("*.safetensors"))

    @cached_property
    def _shapes(self) -> dict[str, list[int]] | None:
        files = self.safetensors_files()
        if not files:
            return None
        shapes: dict[str, list[int]] = {}
        for file in files:
            header = read_safetensors_header(file)
            shapes.update({k: v.get("shape") for k, v in header.items() if k != "__metadata__"})
        return shapes

    def safetensors_shapes(self) -> dict[str, list[int]] | None:
        """Tensor name -> shape from the headers of the folder's .safetensors files, never reading a weight; None
        when there are none.

        Raises:
            OSError, ValueError, struct.error: a header is unreadable, cut short or not JSON.
        """
        return self._shapes

    def index_names(self) -> list[str] | None:
        """Tensor names of ``model.safetensors.index.json`` (its ``weight_map``), None when there is no index.

        Raises:
            OSError, ValueError: the index is unreadable or not JSON.
        """
        index = self.path / "model.safetensors.index.json"
        if not index.is_file():
            return None
        return list(loads_json(index.read_text()).get("weight_map", {}))

    def linear_names(self) -> set[str] | None:
        """Names of the model's 2-D weight modules (``q_proj``, ``down_proj``, …), from the weight index or the
        safetensors headers; None when the folder has neither. Embeddings, norms and lm_head are left out (not
        LoRA targets; the index gives no shapes, so they are dropped by name).

        Raises:
            OSError, ValueError, struct.error: an index or header that cannot be read.
        """
        keys = self.index_names()
        shapes = None
        if keys is None:
            shapes = self.safetensors_shapes()
            if shapes is None:
                return None
            keys = list(shapes)
        names = set()
        for key in keys:
            if not key.endswith(".weight"):
                continue
            if shapes is not None and len(shapes.get(key) or []) != 2:
                continue
            names.add(key[: -len(".weight")].split(".")[-1])
        return {n for n in names if "norm" not in n and "embed" not in n and n != "lm_head"}

    def tokenizer_tokens(self) -> set[str] | None:
        """The special and added tokens of the folder's tokenizer, and the markers (:data:`MARKER`) its
        chat_template writes, from tokenizer.json and tokenizer_config.json (no tokenizer is loaded); None when
        neither file is there. Unreadable files are skipped."""
        tokens: set[str] = set()
        found = False
        for name in ("tokenizer.json", "tokenizer_config.json"):
            path = self.path / name
            if not path.is_file():
                continue
            try:
                data = loads_json(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            found = True
            listed = data.get("added_tokens")
            decoder = data.get("added_tokens_decoder")
            # a key of another type (added_tokens_decoder: "x") is read as absent, as an unreadable file is
            for entry in [*(listed if isinstance(listed, list) else []),
                          *(decoder.values() if isinstance(decoder, dict) else [])]:  # fmt: skip
                if isinstance(entry, dict) and isinstance(entry.get("content"), str):
                    tokens.add(entry["content"])
            for key in ("extra_special_tokens", "additional_special_tokens"):
                extra = data.get(key) or []
                extra = list(extra.values()) if isinstance(extra, dict) else extra if isinstance(extra, list) else []
                tokens.update(t for t in extra if isinstance(t, str))
            for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
                if isinstance(data.get(key), str):
                    tokens.add(data[key])
            vocab = data["model"].get("vocab") if isinstance(data.get("model"), dict) else None
            if isinstance(vocab, dict):
                tokens.update(k for k in vocab if re.fullmatch(MARKER, k))
            template = data.get("chat_template")
            if isinstance(template, str):
                tokens.update(re.findall(MARKER, template))
        return tokens if found else None

    def chat_template(self) -> str | None:
        """The tokenizer's own chat template (Jinja text): ``chat_template.jinja`` (where transformers 5's
        save_pretrained writes it), else tokenizer_config.json's ``chat_template`` (a string, or a list of
        ``{name, template}`` of which the ``default`` one, else the first); None when the folder has none or the
        files are unreadable."""
        jinja = self.path / "chat_template.jinja"
        try:
            if jinja.is_file():
                return jinja.read_text(encoding="utf-8")
            config = loads_json((self.path / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        template = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default", next(iter(named.values()), None))
        return template if isinstance(template, str) and template.strip() else None

    def token_ids(self) -> dict[str, int]:
        """Added and special tokens' ids (content -> id) from tokenizer.json's ``added_tokens`` and
        tokenizer_config.json's ``added_tokens_decoder``; empty when neither is readable."""
        ids: dict[str, int] = {}
        for name in ("tokenizer.json", "tokenizer_config.json"):
            try:
                data = loads_json((self.path / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            listed = data.get("added_tokens") if isinstance(data.get("added_tokens"), list) else []
            decoder = data.get("added_tokens_decoder") if isinstance(data.get("added_tokens_decoder"), dict) else {}
            for entry in listed:
                if (
                    isinstance(entry, dict)
                    and isinstance(entry.get("content"), str)
                    and isinstance(entry.get("id"), int)
                ):
                    ids.setdefault(entry["content"], entry["id"])
            for key, entry in decoder.items():
                if isinstance(entry, dict) and isinstance(entry.get("content"), str) and str(key).isdigit():
                    ids.setdefault(entry["content"], int(key))
        return ids

    def embedding_rows(self, ids: list[int]) -> dict[str, list[list[float]]]:
        """Rows ``ids`` of the input embedding (``embed_tokens``/``wte``/``word_embeddings``) and of an untied
        ``lm_head``, read from the safetensors files without loading the model (float32, float16 or bfloat16 tensors
        only; others, quantized ones among them, are left out): tensor name -> rows in the order of ``ids``.

        Raises:
            OSError, ValueError, struct.error: a header or the data cannot be read.
        """
        import numpy as np

        wanted = re.compile(r"(embed_tokens|wte|word_embeddings)\.weight$|(^|\.)lm_head\.weight$")
        dtypes = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
        rows: dict[str, list[list[float]]] = {}
        for file in self.safetensors_files():
            header = read_safetensors_header(file)
            with file.open("rb") as handle:
                start = 8 + struct.unpack("<Q", handle.read(8))[0]
                for name, info in header.items():
                    shape, dtype = info.get("shape") or [], info.get("dtype")
                    if name == "__metadata__" or not wanted.search(name) or dtype not in dtypes or len(shape) != 2:
                        continue
                    width = shape[1] * np.dtype(dtypes[dtype]).itemsize
                    found = []
                    for index in ids:
                        if not 0 <= index < shape[0]:
                            raise ValueError(f"{file}: token id {index} is outside {name} ({shape[0]} rows)")
                        handle.seek(start + info["data_offsets"][0] + index * width)
                        row = np.frombuffer(handle.read(width), dtype=dtypes[dtype])
                        if dtype == "BF16":  # bfloat16 is the upper half of a float32
                            row = (row.astype(np.uint32) << 16).view(np.float32)
                        found.append(row.astype(np.float32).tolist())
                    rows[name] = found
        return rows

    def has_tokenizer(self) -> bool:
        """Whether one of :data:`TOKENIZER_FILES` is in the folder."""
        return any((self.path / name).is_file() for name in TOKENIZER_FILES)

    def weight_bytes(self) -> int:
        """Bytes of the folder's weight files (suffix in :data:`WEIGHT_SUFFIXES`), headers included."""
        return sum(p.stat().st_size for p in self.path.iterdir() if p.suffix in WEIGHT_SUFFIXES)

    def stored_parameters(self) -> int:
        """Parameters as the weight bytes over the bytes per parameter of config.json's dtype (4 for a 32-bit
        dtype, else 2). A rough count (headers are counted as weights; int8/int4 checkpoints are undercounted):
        the disk check's, whose numbers are estimates; the exact count from the shapes is
        :attr:`rocmft.render.memfit.ModelShape.num_params`.

        Raises:
            OSError, ValueError: config.json missing, unreadable or not JSON.
        """
        config = self.config_json()
        stored = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        return self.weight_bytes() // (4 if "32" in stored else 2)


__all__ = [
    "CHECKPOINT_WEIGHT_FILES",
    "MARKER",
    "MODEL_WEIGHT_FILES",
    "TOKENIZER_FILES",
    "WEIGHT_SUFFIXES",
    "ModelDir",
    "looks_like_path",
    "quantization_label",
    "read_safetensors_header",
]
