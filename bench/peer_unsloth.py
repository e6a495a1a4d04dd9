"""Run (e) of bench/throughput.py: Unsloth, the fastest peer on one GPU, on the expert's own packed rows.

Child process, started by throughput.py with Unsloth's wheels first on ``PYTHONPATH`` (unsloth and unsloth_zoo
2026.10.9, datasets 4.3.0 — Unsloth refuses ``datasets`` 4.0.*, its METADATA's Requires-Dist —, torchao 0.17.0,
cut_cross_entropy) before the stack's (transformers 5.6.0, peft 0.18.1, trl 0.24.0, accelerate 1.11.0).

The data are the rows LLaMA-Factory's run (c) tokenized and packed (its ``tokenized_path``: plain packing, rows of at
most ``cutoff`` tokens, samples attending to the ones packed before them, labels -100 on prompts), so (e) and (c)
train on the same tokens in the same order (transformers' Trainer, seed 42, RandomSampler): the loss of each step
compares one to one. The model is Unsloth's ``FastLanguageModel`` (its own RoPE, RMSNorm, SwiGLU, LoRA MLP/QKV/O
kernels and chunked cross-entropy) with LoRA r=8 on the seven Linears, alpha 16 and dropout 0 (LLaMA-Factory's
defaults: ``lora_alpha`` = 2 x rank), micro-batch 4 x accumulation 1, no gradient checkpointing (the memory is
there; Unsloth's offloaded checkpointing trades speed for memory), bf16, the same learning-rate schedule as (c).
Writes the trainer's ``trainer_state.json`` into ``--output`` and ``{"peak_gpu_memory_gib", ...}`` to ``--result``.
Exit 0 on success; any exception ends the child with its traceback in the run's log (a benchmark, not the product).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rows", type=Path, required=True, help="run (c)'s tokenized_path (datasets save_to_disk)")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cutoff", type=int, default=2048)
    args = parser.parse_args(argv)

    import torch
    import unsloth  # before transformers and peft: it patches them when imported
    from datasets import load_from_disk
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments
    from unsloth import FastLanguageModel

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(args.model), max_seq_length=args.cutoff, dtype=torch.bfloat16, load_in_4bit=False,
    )  # fmt: skip
    model = FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS, bias="none",
        use_gradient_checkpointing=False, random_state=42,
    )  # fmt: skip
    rows = load_from_disk(str(args.rows))
    rows = rows["train"] if hasattr(rows, "keys") and "train" in rows else rows
    rows = rows.select_columns(["input_ids", "attention_mask", "labels"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    training = TrainingArguments(
        output_dir=str(args.output), per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_steps=args.steps, learning_rate=1e-4, lr_scheduler_type="cosine", warmup_steps=0.1, logging_steps=1,
        save_strategy="no", report_to="none", seed=42, bf16=True, dataloader_num_workers=2,
        include_num_input_tokens_seen="non_padding", disable_tqdm=True, remove_unused_columns=False,
    )  # fmt: skip
    collator = DataCollatorForSeq2Seq(tokenizer, pad_to_multiple_of=8, label_pad_token_id=-100)
    trainer = Trainer(model=model, args=training, train_dataset=rows, data_collator=collator)
    trainer.train()
    trainer.save_state()
    args.result.write_text(json.dumps({
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
        "unsloth": unsloth.__version__, "rows": len(rows),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
