"""``rocmft chat``: a quick look at what a run learned — prompts in, completions out.

Loads an exported model folder (``rocmft export``) or a run's LoRA adapter on its base (peft), formats each
prompt with the tokenizer's chat template (the run's template, which LLaMA-Factory saves with the tokenizer)
and generates greedily, so that the same model gives the same answer every time. Prompts come from
``--prompt`` (repeatable) or ``--file`` (one prompt per line; ``-`` reads standard input).

Which model, without an argument: the export of the run of the current settings when there is one
(EXPORT_DIR, default ``<OUTPUT_DIR>-merged``), else that run's own weights (adapter on base, or full model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rocmft.console import say
from rocmft.errors import ConfigError
from rocmft.outputs.export import EXPORT_MANIFEST, Run, default_export_dir, find_run, model_config, quantization_of


def read_prompts(prompts: list[str] | None, file: str | None) -> list[str]:
    """The prompts from ``--prompt`` values and ``--file`` (one per line, blank lines skipped; ``-`` is stdin).

    Raises:
        ConfigError: no prompt given, or the file cannot be read.
    """
    found = [p for p in prompts or [] if p.strip()]
    if file:
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(
                f"rocmft chat --file {file}: {err.strerror or err}.",
                "Give a readable text file with one prompt per line.",
            ) from err
        found += [line.strip() for line in text.splitlines() if line.strip()]
    if not found:
        raise ConfigError("rocmft chat: no prompt given.", 'Pass --prompt "..." (repeatable) or --file prompts.txt.')
    return found


def resolve_model(given: str | None, settings) -> tuple[Path, Run | None]:
    """The folder to chat with and, when it is a run's own weights, the run (see the module docstring).

    Raises:
        ConfigError: neither an export nor a run there.
    """
    if given:
        folder = Path(given).expanduser().absolute()
        if not folder.is_dir():
            raise ConfigError(
                f"rocmft chat {given}: {'a file, not a folder' if folder.exists() else 'no such folder'}.",
                "Give an export folder (a Hugging Face model folder) or a run's OUTPUT_DIR.",
            )
        if (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
            return folder, None  # an exported (or any Hugging Face) model folder
        run = find_run(given, settings)
        return run.weights, run  # given as OUTPUT_DIR/rocmft too: the weights are the run's, not that folder
    run = find_run(None, settings)
    export_dir = default_export_dir(run, settings)
    if (export_dir / EXPORT_MANIFEST).is_file():
        return export_dir, None
    return run.weights, run


def load(folder: Path, run: Run | None, export_base: str | None = None) -> tuple[Any, Any, str]:
    """Load (model, tokenizer, description) for generation: fp32 on the CPU, the checkpoint's dtype on a GPU.

    A LoRA run's adapter is applied with peft on its base (ROCMFT_EXPORT_BASE when the base is quantized).

    Raises:
        ConfigError: a quantized base without ROCMFT_EXPORT_BASE; any file transformers, peft or safetensors
            cannot load (damaged, cut short, of another format), naming the folder and the library's reason.
    """
    try:
        return _load(folder, run, export_base)
    except ConfigError:
        raise
    except Exception as err:  # transformers, peft and safetensors raise many kinds for damaged or foreign files
        raise ConfigError(
            f"The model to chat with in {folder} cannot be loaded ({type(err).__name__}: {str(err)[:300]}).",
            "Give a complete export (`rocmft export` writes one) or a run folder `rocmft train` finished; if one "
            "of its files was changed or cut short, export or train again.",
        ) from err


def _load(folder: Path, run: Run | None, export_base: str | None) -> tuple[Any, Any, str]:
    """:func:`load`'s work, its errors unexplained."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "auto" if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    if run is not None and run.is_adapter:
        from peft import PeftModel

        base = str(run.arguments.get("model_name_or_path"))
        if quantization_of(model_config(base)):
            if not export_base:
                raise ConfigError(
                    f"The run's base {base} is quantized ({quantization_of(model_config(base))}).",
                    "Set ROCMFT_EXPORT_BASE to the unquantized model, as for `rocmft export`.",
                )
            base = export_base
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, trust_remote_code=True)
        model = PeftModel.from_pretrained(model, str(folder))
        what = f"the adapter in {folder} on {base}"
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=True)
        what = f"the model in {folder}"
    model.to(device).eval()
    return model, tokenizer, what


def generate(model, tokenizer, prompts: list[str], max_new_tokens: int = 128, system: str | None = None) -> list[str]:
    """Greedy completions of ``prompts``, each formatted as one user turn with the tokenizer's chat template
    (plus a ``system`` turn when given), without the prompt and without special tokens.

    Raises:
        ConfigError: the tokenizer has no chat template.
    """
    import torch

    if not tokenizer.chat_template:
        raise ConfigError(
            "The model's tokenizer has no chat template (chat_template.jinja / tokenizer_config.json).",
            "Export the run with `rocmft export` (it saves the run's template), or chat with the run.",
        )
    answers = []
    for prompt in prompts:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = {k: v.to(model.device) for k, v in ids.items()}
        with torch.no_grad():
            output = model.generate(
                **ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
        answers.append(tokenizer.decode(output[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip())
    return answers


def main(
    given: str | None, prompts: list[str], max_new_tokens: int, system: str | None, as_json: bool, settings
) -> None:
    """``rocmft chat``: resolve, load, answer, print (Markdown-ish blocks, or one JSON line per prompt)."""
    folder, run = resolve_model(given, settings)
    model, tokenizer, what = load(folder, run, settings.rocmft.export_base)
    say(f"chatting with {what}", stream=sys.stderr, all_ranks=True)  # stderr: stdout is the answers
    from jinja2 import TemplateError

    try:
        answers = generate(model, tokenizer, prompts, max_new_tokens, system)
    except TemplateError as err:  # the chat template of the folder (chat_template.jinja / tokenizer_config.json)
        raise ConfigError(
            f"The chat template in {folder} cannot format a prompt ({type(err).__name__}: {err}).",
            "Export the run again (`rocmft export` saves the run's template), or restore chat_template.jinja.",
        ) from err
    for prompt, answer in zip(prompts, answers, strict=True):
        if as_json:
            print(json.dumps({"prompt": prompt, "completion": answer}, ensure_ascii=False), flush=True)
        else:
            print(f"\n>>> {prompt}\n{answer or '(no text: only whitespace or special tokens)'}", flush=True)
