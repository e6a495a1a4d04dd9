"""TEMPLATE against the model's family (issue 30, item 3), judged by the model's own chat template and its weights.

Two model families are built here, in-process and tiny: rocmft's built-in Qwen2 model (ChatML markers) with
Qwen2-Instruct's chat template, and a Llama-3-shaped model (``<|start_header_id|>``, ``<|eot_id|>``) with
Meta-Llama-3-Instruct's chat template, whose vocabulary also holds ChatML's tokens (as Llama 3 fine-tunes such as
Hermes 3 do: unslothai/unsloth#1024), so that the tokens alone cannot tell the family. Its base variant has no chat
template and the chat markers' embedding rows left at zero, as Llama 3 base ships them (unslothai/unsloth#915,
#658; hiyouga/LlamaFactory#5834, #3813: a base model trained with TEMPLATE=llama3 never stops).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rocmft.errors import ConfigError

# Meta-Llama-3-8B-Instruct's chat template (tokenizer_config.json), and Qwen2-7B-Instruct's.
LLAMA3_CHAT = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN2_CHAT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}"
)
LLAMA3_MARKERS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", *LLAMA3_MARKERS, "<|im_start|>", "<|im_end|>"]


def build_llama3_like(folder: Path, chat_template: str | None, untrained: bool, dtype: str = "float32") -> Path:
    """A tiny Llama-3-shaped model folder (tokenizer with Llama 3's and ChatML's special tokens, random weights,
    seed 0). ``untrained``: the Llama 3 chat markers' input and output embedding rows set to zero, as a base model
    leaves them."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(["the user asks and the assistant answers"] * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1, "max_position_embeddings": 256, "tie_word_embeddings": False}  # fmt: skip
    config = LlamaConfig(vocab_size=len(fast), bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, **shape)
    model = LlamaForCausalLM(config)
    if untrained:
        ids = fast.convert_tokens_to_ids(LLAMA3_MARKERS)
        with torch.no_grad():
            model.model.embed_tokens.weight[ids] = 0
            model.lm_head.weight[ids] = 0
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama3_instruct(tmp_path_factory) -> Path:
    return build_llama3_like(tmp_path_factory.mktemp("llama3-instruct"), LLAMA3_CHAT, untrained=False)


@pytest.fixture(scope="module")
def llama3_base(tmp_path_factory) -> Path:
    return build_llama3_like(tmp_path_factory.mktemp("llama3-base"), None, untrained=True, dtype="bfloat16")


@pytest.fixture
def qwen_instruct(tmp_path, tiny_model) -> Path:
    """The built-in tiny Qwen2 model with Qwen2-Instruct's chat template in its tokenizer_config.json."""
    folder = tmp_path / "qwen-instruct"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN2_CHAT}))
    return folder


def refusal(render_env, environ: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        render_env(environ)
    assert caught.value.code == 2
    return caught.value


@pytest.mark.parametrize("template", ["qwen", "mistral"])
def test_another_familys_template_is_refused_by_the_models_own_chat_template(render_env, llama3_instruct, template):
    """TEMPLATE=qwen on a Llama-3 model whose vocabulary has ChatML's tokens, and TEMPLATE=mistral ([INST], plain
    text) on it, both passed the tokens-only judgment. The model's chat template writes Llama 3's markers only, so
    either is another family's (hiyouga/LlamaFactory#6736: Qwen2.5-Instruct trained with TEMPLATE=llama3 repeats
    without end): refused, naming TEMPLATE and the family's LLaMA-Factory template."""
    err = refusal(render_env, {"MODEL_NAME_OR_PATH": str(llama3_instruct), "TEMPLATE": template})
    assert f"TEMPLATE={template}" in err.message and "another family's template" in err.message
    assert "<|start_header_id|>" in err.message and err.remedy.startswith("Set TEMPLATE=llama3 ")


def test_the_familys_own_template_passes_without_a_word(render_env, llama3_instruct, capsys):
    render_env({"MODEL_NAME_OR_PATH": str(llama3_instruct), "TEMPLATE": "llama3"})
    assert "TEMPLATE" not in capsys.readouterr().out


def test_the_qwen_family_is_told_apart_the_same_way(render_env, qwen_instruct, capsys):
    """The second family: Qwen2's chat template. TEMPLATE=llama3 is refused naming qwen; TEMPLATE=qwen passes; a
    template without markers (alpaca) is a warning naming qwen (a legitimate choice, not the model's format)."""
    err = refusal(render_env, {"MODEL_NAME_OR_PATH": str(qwen_instruct), "TEMPLATE": "llama3"})
    assert "<|start_header_id|>" in err.message and err.remedy.startswith("Set TEMPLATE=qwen ")
    render_env({"MODEL_NAME_OR_PATH": str(qwen_instruct), "TEMPLATE": "qwen"})
    assert "TEMPLATE" not in capsys.readouterr().out
    render_env({"MODEL_NAME_OR_PATH": str(qwen_instruct), "TEMPLATE": "alpaca"})
    out = capsys.readouterr().out
    assert "TEMPLATE=alpaca" in out and "writes no chat markers" in out and "TEMPLATE=qwen trains it" in out


def test_a_base_models_untrained_chat_markers_are_refused_with_lora(render_env, llama3_base):
    """Llama 3 base with TEMPLATE=llama3 and LoRA: the markers' rows are zero (read from the bf16 safetensors
    without loading the model) and frozen embeddings never learn them. Refused with the fixes: TEMPLATE=default
    (LLaMA-Factory's maintainer's advice, hiyouga/LlamaFactory#5834), or train the rows."""
    err = refusal(render_env, {"MODEL_NAME_OR_PATH": str(llama3_base), "TEMPLATE": "llama3",
                               "FINETUNING_TYPE": "lora"})  # fmt: skip
    assert "TEMPLATE=llama3" in err.message and "<|eot_id|>" in err.message and "never trained" in err.message
    assert "TEMPLATE=default" in err.remedy and "ADDITIONAL_TARGET=embed_tokens,lm_head" in err.remedy


TRAINS_THE_ROWS = [
    {"FINETUNING_TYPE": "full"},
    {"FINETUNING_TYPE": "lora", "ADDITIONAL_TARGET": "embed_tokens,lm_head"},
]


@pytest.mark.parametrize("environ", TRAINS_THE_ROWS)
def test_untrained_markers_that_this_run_trains_are_a_warning(render_env, llama3_base, environ, capsys):
    render_env({"MODEL_NAME_OR_PATH": str(llama3_base), "TEMPLATE": "llama3", **environ})
    assert "never trained" in capsys.readouterr().out


def test_trained_markers_pass(render_env, tmp_path):
    """The same base model with its rows as initialised (random, distinct): nothing to say."""
    folder = build_llama3_like(tmp_path / "llama3-trained", None, untrained=False)
    render_env({"MODEL_NAME_OR_PATH": str(folder), "TEMPLATE": "llama3"})


def test_the_rows_read_from_the_file_are_the_models(llama3_base):
    """ModelDir.embedding_rows reads the very values transformers loads (bf16 decoded by hand)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rocmft.facts.modeldir import ModelDir

    model_dir = ModelDir(llama3_base)
    ids = [model_dir.token_ids()[t] for t in ("<|im_start|>", "<|eot_id|>")]
    rows = model_dir.embedding_rows(ids)
    loaded = AutoModelForCausalLM.from_pretrained(llama3_base, dtype=torch.bfloat16)
    expected = loaded.model.embed_tokens.weight[ids].float().tolist()
    assert rows["model.embed_tokens.weight"] == expected and rows["lm_head.weight"][1] == [0.0] * 32
