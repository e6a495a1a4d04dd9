"""What the GPU benchmarks share: a clean environment for `rocmft train` children, the tokenizer files of
rocmft's tiny model that random-weight models of real shapes borrow. Imported as ``common`` (the scripts run
as ``python bench/<name>.py``, so bench/ is on sys.path)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoint"))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


# Qwen2's published shapes (config.json on the Hugging Face hub, Qwen/Qwen2-7B, -1.5B, -0.5B): the random-weight
# models the GPU benchmarks build (:func:`random_qwen2`).
_QWEN2_COMMON = {"max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}
QWEN2_SHAPES = {
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False, **_QWEN2_COMMON},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, **_QWEN2_COMMON},
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, **_QWEN2_COMMON},
}  # fmt: skip
# Meta-Llama-3-8B's published shape (config.json of meta-llama/Meta-Llama-3-8B on the hub): GQA with 8 KV heads,
# a 128k vocabulary; the model of the seeds' second recipe.
LLAMA3_SHAPES = {
    "llama3-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                  "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                  "hidden_act": "silu", "tie_word_embeddings": False},
}  # fmt: skip
SHAPES = {**QWEN2_SHAPES, **LLAMA3_SHAPES}


def clean_environment() -> dict[str, str]:
    """This process's environment without ROCMFT_* and training-argument variables (like the tests)."""
    from rocmft.config.lfargs import env_arguments

    arguments = env_arguments()
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("ROCMFT_") and k.upper() not in arguments}


def random_qwen2(folder: Path, shape: dict, cache: Path, device: str):
    """Build a random-weight bf16 Qwen2 (with ``model_type: llama``, Llama) model of ``shape`` (config.json values) on
    ``device`` (seed 0) with the eos/pad tokens of rocmft's tiny model, and save it into ``folder`` with the tiny
    model's tokenizer files (through ``<folder>.tmp`` and a rename, so an interrupted save never looks complete; an
    earlier folder is replaced). Returns the model (the caller may count or free it)."""
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from rocmft.config.demo import ensure_tiny_model

    tiny = ensure_tiny_model(cache)
    tiny_config = json.loads((tiny / "config.json").read_text())
    shape = dict(shape)
    config_class = LlamaConfig if shape.pop("model_type", "qwen2") == "llama" else Qwen2Config
    config = config_class(**shape, bos_token_id=None, eos_token_id=tiny_config.get("eos_token_id"),
                          pad_token_id=tiny_config.get("pad_token_id"))  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (tiny / name).is_file():
            shutil.copy2(tiny / name, tmp / name)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return model
