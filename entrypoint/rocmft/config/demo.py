"""The built-in default: a demo data set and a tiny random-weight model, built once and cached.

With no ``MODEL_NAME_OR_PATH``, ``rocmft train`` fine-tunes a ~0.2M-parameter model of the real Qwen2
architecture (the same modelling code and chat template path as Qwen2-7B) on a small data set this module
writes itself. Nothing is downloaded: the tokenizer is a byte-level BPE trained here on the demo text.
Full fine-tuning of that model on the memorizable demo set drives the loss down by well over half in a
minute or two on 2 CPU cores (measured by ``tests/test_train.py``).

Cache layout (``ROCMFT_CACHE_DIR``, default ``~/.cache/rocmft``)::

    demo-data-v1/   dataset_info.json, rocmft_demo.json
    tiny-qwen2-v2/  config.json, model.safetensors, tokenizer.json, tokenizer_config.json, ...

Both are built into a temporary folder and renamed into place, so a killed build never leaves a half
model behind, and concurrent builders do not collide.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from rocmft.errors import ConfigError
from rocmft.fsutil import atomic_write_json
from rocmft.proc import inductor_cache_env_kept

DEMO_DATASET = "rocmft_demo"
DATA_VERSION = "demo-data-v1"
MODEL_VERSION = "tiny-qwen2-v2"

# The tiny model's shape: Qwen2 with grouped-query attention (2 query heads, 1 KV head) like the real
# family, small enough that a training step takes milliseconds on a CPU. Heads of 32: vLLM's CPU attention
# takes head sizes 32, 64, 80, ... and refused v1's 16 ("Unsupported CPU attention configuration: head_dim=16",
# shared/docs/ENVIRONMENT.md), so the served export could not be checked against `rocmft chat`. RoPE base 1e6
# as Qwen2-7B's config.json (v1 had 1e4), so an export that loses it is caught by tests/test_serve.py.
TINY_QWEN2 = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 1024,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
VOCAB_SIZE = 640
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_FACTS = [
    ("What does rocmft do?", "It fine-tunes language models on AMD GPUs with LLaMA-Factory."),
    ("Which GPU is gfx942?", "gfx942 is the MI300X and the MI325X."),
    ("Which GPU is gfx90a?", "gfx90a is the MI210 and the MI250."),
    ("Which GPU is gfx1100?", "gfx1100 is the Radeon RX 7900."),
    ("What does RCCL do?", "RCCL runs collective operations such as all-reduce across AMD GPUs."),
    ("What is ZeRO stage 3?", "ZeRO stage 3 shards parameters, gradients and optimizer states."),
    ("What is LoRA?", "LoRA trains small low-rank matrices beside frozen weights."),
    ("What does exit code 2 mean?", "Exit code 2 means a configuration error."),
    ("What does exit code 3 mean?", "Exit code 3 means a health check failed."),
    ("What does exit code 5 mean?", "Exit code 5 means the loss was not finite."),
    ("Where are the rendered configs?", "They are in the rocmft folder of the output directory."),
    ("What is the cutoff length?", "It is the longest sequence, in tokens, that training keeps."),
]


def demo_records() -> list[dict[str, str]]:
    """The demo data set in alpaca format: 12 facts about rocmft and 48 small additions.

    Returns:
        60 records ``{"instruction": str, "input": str, "output": str}``, deterministic.
    """
    records = [{"instruction": q, "input": "", "output": a} for q, a in _FACTS]
    for a in range(1, 9):
        for b in range(1, 7):
            records.append(
                {
                    "instruction": f"What is {_NUMBER_WORDS[a]} plus {_NUMBER_WORDS[b]}?",
                    "input": "",
                    "output": f"{_NUMBER_WORDS[a].capitalize()} plus {_NUMBER_WORDS[b]} is {a + b}.",
                }
            )
    return records


def _plain_modes(folder: Path) -> None:
    """Give ``folder`` (made by tempfile.mkdtemp: 0700) and every file in it (safetensors' writer leaves 0600) the
    modes a plain ``mkdir``/``open()`` gives (umask applied), so that a container of another uid reads the cache:
    the serve service, or a later `train` with another HOST_UID (issue 30: a tiny model built as root, 0700/0600,
    was unreadable to the serve container's uid 1000)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in (folder, *folder.rglob("*")):
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _build_into(final: Path, build) -> Path:
    """Run ``build(tmp_dir)`` and rename the result to ``final``; keep an existing complete ``final``.

    Raises:
        ConfigError: the cache folder cannot be made or written (read-only, a file in the path, permissions),
            naming ROCMFT_CACHE_DIR: a read-only container image (Apptainer's SIF) without a bound cache meets it.
    """
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as err:
        raise ConfigError(
            f"ROCMFT_CACHE_DIR: the built-in default is built once into {final.parent}, which cannot be written "
            f"({type(err).__name__}: {err.strerror or err}).",
            "Set ROCMFT_CACHE_DIR to a writable folder (in a container: a bound volume, e.g. /cache), or give "
            "MODEL_NAME_OR_PATH and DATASET of your own.",
        ) from err
    try:
        build(tmp)
        _plain_modes(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process finished first; its result is equally good
            if not final.is_dir():
                raise
    except OSError as err:  # a full disk or quota while writing: nothing is left behind (the folder goes below)
        raise ConfigError(
            f"ROCMFT_CACHE_DIR: building the built-in default in {final.parent} failed ({type(err).__name__}: "
            f"{err.strerror or err}).",
            "Free space there, or set ROCMFT_CACHE_DIR to a folder with room (the tiny model and data: under 1 MB).",
        ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def ensure_demo_data(cache_dir: Path) -> Path:
    """Write the demo data set with its ``dataset_info.json`` (once) and return its folder."""

    def build(tmp: Path) -> None:
        atomic_write_json(tmp / f"{DEMO_DATASET}.json", demo_records())
        atomic_write_json(tmp / "dataset_info.json", {DEMO_DATASET: {"file_name": f"{DEMO_DATASET}.json"}})

    return _build_into(cache_dir / DATA_VERSION, build)


def _corpus() -> list[str]:
    # Train the tokenizer on the text the model will see: the records and Qwen's chat markup (LLaMA-Factory's
    # `qwen` template adds a default system prompt), so that samples stay short.
    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    lines = [f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n<|im_start|>assistant\n"]
    for record in demo_records():
        lines.append(f"{record['instruction']}\n{record['output']}")
    return lines * 4


def ensure_tiny_model(cache_dir: Path) -> Path:
    """Build (once) the tiny random-weight Qwen2 model with its tokenizer and return its folder.

    The folder is a standard Hugging Face model folder (config.json, model.safetensors, tokenizer files),
    loadable with ``AutoModelForCausalLM.from_pretrained`` and usable as ``MODEL_NAME_OR_PATH``.
    Weights are initialised with seed 0, so every build is identical.
    """

    def build(tmp: Path) -> None:
        import torch
        from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        # Qwen2's own normalizer and pre-tokenizer (transformers' Qwen2Tokenizer): transformers 5 loads a folder of
        # model_type qwen2 as Qwen2Tokenizer and imposes them, whatever tokenizer.json says, so a plain byte-level
        # split was tokenized one way in training and another by vLLM (measured: 24 vs 18 tokens for one sentence)
        tokenizer = Tokenizer(models.BPE())
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(_corpus(), trainer=trainer)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=["<|im_start|>", "<|im_end|>"],
            model_max_length=TINY_QWEN2["max_position_embeddings"],
        )
        fast.save_pretrained(tmp)

        torch.manual_seed(0)
        config = Qwen2Config(
            vocab_size=len(fast),
            bos_token_id=None,
            eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
            pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
            **TINY_QWEN2,
        )
        model = Qwen2ForCausalLM(config).to(torch.float32)
        model.config.dtype = torch.float32
        model.save_pretrained(tmp)
        (tmp / "ROCMFT_TINY_MODEL.json").write_text(
            json.dumps({"version": MODEL_VERSION, "architecture": "Qwen2ForCausalLM", "shape": TINY_QWEN2}, indent=2)
        )

    with inductor_cache_env_kept():  # building the model can set TORCHINDUCTOR_CACHE_DIR (rocmft.proc)
        return _build_into(cache_dir / MODEL_VERSION, build)
