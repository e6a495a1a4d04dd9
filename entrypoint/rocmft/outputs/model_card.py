"""The exported model's card, ``README.md`` in the export folder: Hugging Face card metadata (base_model,
library_name, tags, datasets) and a table of what the run did (base, data sets, method, steps, losses, dtype,
versions), all from the run's own record (:func:`rocmft.outputs.report.run_facts`) and the export's plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rocmft import __version__

if TYPE_CHECKING:
    from rocmft.outputs.export_plan import ExportPlan


def model_card(plan: ExportPlan, facts: dict[str, Any], versions: dict[str, str]) -> str:
    """The exported model's ``README.md``: Hugging Face card metadata (base_model, library_name, tags) and
    what the run did. Holds no secrets: every value comes from the run's record (secrets are never in it)."""
    args = plan.run.arguments
    method = str(args.get("finetuning_type") or "lora")
    base = str(args.get("model_name_or_path") or plan.base)
    meta: dict[str, Any] = {"library_name": "transformers", "tags": ["rocmft", "llama-factory", method]}
    chosen_base = plan.base if method == "lora" else base
    # the card's base_model is a hub id; a local folder (a host path, meaningless elsewhere) is named in the text
    if not Path(chosen_base).expanduser().is_absolute() and not chosen_base.startswith("."):
        meta["base_model"] = chosen_base
    if facts["data_sets"]:
        meta["datasets"] = facts["data_sets"]
    how = f"{method} fine-tuning"
    if method == "lora":
        rank = int(args.get("lora_rank") or 8)
        name = "LoRA"
        if args.get("quantization_bit"):
            name = f"QLoRA ({args['quantization_bit']}-bit {args.get('quantization_method') or 'bnb'})"
        alpha = args.get("lora_alpha") or 2 * rank  # LLaMA-Factory's default alpha is twice the rank
        how = f"{name}, rank {rank}, alpha {alpha}, target {args.get('lora_target', 'all')}; merged into the base"

    def num(value: Any) -> str:
        return "–" if value is None else f"{value:.5g}" if isinstance(value, float) else str(value)

    rows = [
        (
            "base model",
            f"`{base}`" + (f" (merged into `{plan.base}`)" if method == "lora" and plan.base != base else ""),
        ),
        ("data sets", ", ".join(f"`{d}`" for d in facts["data_sets"]) or "–"),
        ("method", f"{args.get('stage', 'sft')}, {how}"),
        ("template", f"`{args.get('template', 'default')}`"),
        ("steps", f"{num(facts['steps'])} of {num(facts['max_steps'])}"),
        ("final train loss", num(facts["final_loss"])),
        ("final eval loss", num(facts["final_eval_loss"])),
        ("learning rate", num(args.get("learning_rate"))),
        ("cutoff length", num(args.get("cutoff_len"))),
        ("exported dtype", plan.dtype),
        ("exported from", f"`{plan.run.weights}`"),
        (
            "versions",
            f"rocmft {__version__}, LLaMA-Factory {versions.get('llamafactory')}, transformers "
            f"{versions.get('transformers')}, peft {versions.get('peft')}, torch {versions.get('torch')}",
        ),
    ]
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()
    lines = [
        f"---\n{front}\n---",
        "",
        f"# {plan.served_name}",
        "",
        "Fine-tuned with rocmft (LLaMA-Factory on ROCm) and exported by `rocmft export`.",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += [
        "",
        "Load it with `AutoModelForCausalLM.from_pretrained(<this folder>)`; the tokenizer carries the chat "
        "template it was trained with. The run's full record (settings, data, checks, versions) is in its "
        "`rocmft/manifest.json`.",
        "",
    ]
    return "\n".join(lines)
