"""Values by meaning: ranges, fractions, and settings that silently cancel each other."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from rocmft.config.provenance import changed_where, origin
from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.validate.rules import independent, rule
from rocmft.validate.rules.common import named
from rocmft.validate.rules.common import user_set as _user_set

# Learning rates outside this range are almost always a typo (1e4 for 1e-4) or a units mistake: a warning.
# Fine-tuning recipes use 1e-6 (full) to 5e-4 (LoRA) (LLaMA-Factory's examples/, the PEFT docs).
SANE_LEARNING_RATE = (1e-7, 1e-2)
# Fields that are probabilities or fractions: a value of 1 or more is a percent typed as a number (5 for 5%).
FRACTIONS = ("lora_dropout", "hidden_dropout", "attention_dropout", "val_size", "warmup_ratio", "weight_decay")


@rule("rendered", 80)
def more_ranges(run: Rendered) -> None:
    """Dropouts and fractions in [0, 1); a run with no epochs and no max steps trains nothing. Each fraction and
    the length of the run are checked on their own: every one out of range is reported.

    Raises:
        ConfigError: naming the variable and its value.
    """
    arguments, sources = run.arguments, run.sources
    for name in FRACTIONS:
        value = arguments.get(name)
        if isinstance(value, (int, float)) and not 0 <= value < 1 and _user_set(name, sources):
            fix = (f"A fraction: {name.upper()}={value / 100:g} if you meant {value:g} %." if value >= 1
                   else f"A fraction between 0 and 1 (e.g. {name.upper()}=0.05), or 0 for none.")  # fmt: skip
            with independent():
                raise ConfigError(f"{named(run, name)} must be in [0, 1).", fix)
    epochs, steps = arguments.get("num_train_epochs"), arguments.get("max_steps")
    if isinstance(epochs, (int, float)) and epochs <= 0 and not (isinstance(steps, int) and steps > 0):
        raise ConfigError(f"{named(run, 'num_train_epochs')} and {named(run, 'max_steps')}: the run would train "
                          "nothing and save the base model as its result.",
                          "Set NUM_TRAIN_EPOCHS to the number of passes over the data (e.g. 3).")  # fmt: skip


@rule("rendered", 130)
def ranges(run: Rendered) -> list[str]:
    """Values by meaning: LORA_RANK and CUTOFF_LEN positive, CUTOFF_LEN within the model's context length
    (max_position_embeddings of config.json; a warning when the value is the template's default, not the
    user's); a learning rate outside :data:`SANE_LEARNING_RATE` is a warning. Each value is checked on its own:
    every one out of range is reported.

    Returns:
        Warnings (one line each).

    Raises:
        ConfigError: naming the variable, its value and where it came from.
    """
    arguments, sources = run.arguments, run.sources

    for name in ("lora_rank", "cutoff_len", "per_device_train_batch_size", "gradient_accumulation_steps"):
        value = arguments.get(name)
        if isinstance(value, (int, float)) and value <= 0:
            with independent():
                raise ConfigError(f"{named(run, name)} must be positive.",
                                  f"Set {changed_where(name, sources.get(name))} to a positive number.")  # fmt: skip
    rate = arguments.get("learning_rate")
    warnings = []
    if isinstance(rate, (int, float)) and not (math.isfinite(rate) and rate > 0):  # NaN and inf are no rates
        with independent():
            raise ConfigError(f"{named(run, 'learning_rate')} must be a positive number.",
                              "Set LEARNING_RATE, e.g. 1e-4 for LoRA, 1e-5 for full fine-tuning.")  # fmt: skip
    elif isinstance(rate, (int, float)) and not SANE_LEARNING_RATE[0] <= rate <= SANE_LEARNING_RATE[1]:
        warnings.append(f"{named(run, 'learning_rate')} is outside {SANE_LEARNING_RATE[0]:g}.."
                        f"{SANE_LEARNING_RATE[1]:g}, where fine-tuning recipes live: a typo?")  # fmt: skip
    model = run.model
    config = model.config_path
    cutoff = arguments.get("cutoff_len")
    if config.is_file() and isinstance(cutoff, int):
        context = model.max_position_embeddings()
        if isinstance(context, int) and cutoff > context and not arguments.get("rope_scaling"):
            message = (f"{named(run, 'cutoff_len')} is beyond the model's context length "
                       f"({context}, max_position_embeddings in {config})")  # fmt: skip
            if _user_set("cutoff_len", sources):
                fix = f"Set CUTOFF_LEN to at most {context}, or extend the context with ROPE_SCALING."
                with independent():  # the learning rate's warning above is still reported
                    raise ConfigError(message + ".", fix)
            else:  # a template default the user never chose: only samples longer than the context are affected
                warnings.append(message + f": set CUTOFF_LEN to at most {context}.")
    return warnings


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@rule("rendered", 140)
def more_values(run: Rendered) -> list[str]:
    """Values that are legal types but mean nothing useful, or settings that silently cancel each other.

    Errors: a NaN or infinite value (:func:`_not_a_number`); LORA_ALPHA ≤ 0 (the adapter's scale alpha/rank is
    then 0 or negative, peft's LoRA formula); LORA_RANK above the model's hidden size; MAX_STEPS=0;
    WARMUP_STEPS < 0; MAX_GRAD_NORM < 0 (transformers clips only when > 0, so a negative value turns clipping
    off without a word); LOGGING_STEPS < 0 (nothing logged); SAVE_STEPS < 0 and EVAL_STEPS < 0 (no checkpoint
    during the run, evaluation only at its end); DATALOADER_NUM_WORKERS < 0 (torch refuses it late);
    MAX_SAMPLES ≤ 0; QUANTIZATION_BIT other than 4 or 8 with bitsandbytes (its only
    widths, LLaMA-Factory's quantization docs); WARMUP_STEPS and WARMUP_RATIO both set (transformers uses the
    steps and ignores the ratio); INTERLEAVE_PROBS with MIX_STRATEGY=concat, of another length than the data
    sets, or not summing to 1 (datasets' interleave_datasets samples with these probabilities and fails at
    load time otherwise); STREAMING with a fractional VAL_SIZE (a stream has no length: LLaMA-Factory wants a
    count of records); EVAL_STEPS with EVAL_STRATEGY=no (evaluation would never run).

    Returns:
        Warnings: eval data that is never evaluated, SAVE_TOTAL_LIMIT=0 (keeps every checkpoint, transformers
        reads ≤ 0 as no limit), SAVE_STEPS beyond MAX_STEPS (no checkpoint before the end), an EVAL_DATASET
        that is also in DATASET.

    Raises:
        ConfigError: naming the variables and the fix.
    """
    for check in _VALUE_CHECKS:
        with independent():  # each check is about settings of its own: every one that fails is reported
            check(run)
    return _value_warnings(run)


def _user_number(run: Rendered, name: str) -> float | None:
    """Argument ``name`` as a number, when the user set it (None otherwise, or when it is not a number)."""
    return _number(run.arguments.get(name)) if _user_set(name, run.sources) else None


# Where an infinite value means something: transformers clips only to a finite norm, so MAX_GRAD_NORM=inf logs the
# gradient norm and never clips (torch.nn.utils.clip_grad_norm_'s coefficient, clamped to 1).
INFINITY_MEANS_OFF = frozenset({"max_grad_norm"})
# Checked for NaN and inf by a rule of their own, with a fix of their own (:func:`ranges`).
FINITE_ELSEWHERE = frozenset({"learning_rate"})


def _not_a_number(run: Rendered) -> None:
    """A NaN (``nan``) in any argument the user set, or an infinity (``inf``) outside :data:`INFINITY_MEANS_OFF`
    (the learning rate's own rule says so for LEARNING_RATE): every comparison with NaN is false, so the range
    rules let it through (``LEARNING_RATE=nan`` rendered and exited 0: tried as a new user, 2026-12-05). Every
    such argument is named at once."""
    bad = sorted(
        name
        for name, value in run.arguments.items()
        if (number := _number(value)) is not None
        and not math.isfinite(number)
        and not (math.isinf(number) and name in INFINITY_MEANS_OFF)
        and name not in FINITE_ELSEWHERE
        and _user_set(name, run.sources)
    )
    if bad:
        raise ConfigError(f"{', '.join(named(run, name) for name in bad)}: not a finite number.",
                          f"Set {', '.join(name.upper() for name in bad)} to a finite number, or unset it "
                          "for its default.")  # fmt: skip


def _lora_alpha(run: Rendered) -> None:
    """LORA_ALPHA ≤ 0 with LoRA."""
    alpha = _user_number(run, "lora_alpha")
    if run.arguments.get("finetuning_type", "lora") == "lora" and alpha is not None and alpha <= 0:
        raise ConfigError(f"{named(run, 'lora_alpha')} must be positive: the "
                          "adapter's output is scaled by alpha / rank, so the fine-tune would change nothing.",
                          "Set LORA_ALPHA to a positive number (commonly 2 x LORA_RANK), or leave it unset "
                          "(LLaMA-Factory then uses 2 x LORA_RANK).")  # fmt: skip


def _not_negative(run: Rendered, name: str, fix: str) -> None:
    """A negative WARMUP_STEPS, MAX_GRAD_NORM, LOGGING_STEPS, SAVE_STEPS, EVAL_STEPS or DATALOADER_NUM_WORKERS
    (``name``)."""
    value = _user_number(run, name)
    if value is not None and value < 0:
        raise ConfigError(f"{named(run, name)} is negative.", fix)


def _max_samples(run: Rendered) -> None:
    """MAX_SAMPLES ≤ 0."""
    samples = _user_number(run, "max_samples")
    if samples is not None and samples <= 0:
        raise ConfigError(f"{named(run, 'max_samples')} leaves no records to "
                          "train on.", "Remove MAX_SAMPLES (all records) or set it to a positive count.")  # fmt: skip


def _lora_rank_beyond_width(run: Rendered) -> None:
    """LORA_RANK above the model's hidden size (config.json's ``hidden_size``) with LoRA. Every linear layer of a
    decoder that LoRA adapts has the hidden size as its input or output width, and the adapter's update B·A (B:
    out x r, A: r x in) has a rank of at most min(in, out) (Hu et al., "LoRA", 2021, section 4.1), so a larger rank
    adds parameters and memory and nothing the adapter can express. LORA_RANK=100000 on the built-in model rendered
    and exited 0 (a newcomer's trial, 2026-12-05); peft builds the matrices only when the model loads."""
    rank = run.arguments.get("lora_rank")
    if run.arguments.get("finetuning_type", "lora") != "lora" or not isinstance(rank, int) or isinstance(rank, bool):
        return
    hidden = (run.model.config() or {}).get("hidden_size")
    if isinstance(hidden, int) and not isinstance(hidden, bool) and 0 < hidden < rank:
        raise ConfigError(f"{named(run, 'lora_rank')} is above the model's hidden size ({hidden}, hidden_size in "
                          f"{run.model.config_path}): an adapter's update has a rank of at most the smaller width "
                          "of the layer it adapts, so the extra rank is memory that learns nothing.",
                          f"Set LORA_RANK to at most {hidden} (ranks of 8 to 128 are usual for 7B-class models), "
                          "or FINETUNING_TYPE=full to train every weight.")  # fmt: skip


def _max_steps_zero(run: Rendered) -> None:
    """MAX_STEPS=0: transformers 5.6 trains by epochs only for a negative max_steps (``trainer.py``,
    ``set_initial_training_values``: ``epoch_based = max_steps < 0``), so 0 is neither a count nor the default,
    and a run of the built-in default trained one step and exited 0 (a newcomer's trial, 2026-12-05)."""
    if _user_number(run, "max_steps") == 0:
        raise ConfigError(f"{named(run, 'max_steps')} is neither a number of steps nor 'train by epochs' "
                          "(transformers counts epochs only for a negative max_steps): the run would stop after "
                          "one step.", "Set MAX_STEPS to a positive count of optimizer steps, or to -1 (the "
                          "default) to train NUM_TRAIN_EPOCHS.")  # fmt: skip


def _bnb_width(run: Rendered) -> None:
    """A bitsandbytes QUANTIZATION_BIT other than 4 or 8."""
    bits = _number(run.arguments.get("quantization_bit"))
    method = str(run.arguments.get("quantization_method") or "bnb").lower()
    if bits is not None and method in ("bnb", "bitsandbytes") and bits not in (4, 8):
        raise ConfigError(f"{named(run, 'quantization_bit')} with bitsandbytes (QUANTIZATION_METHOD={method}), "
                          "which quantizes to 4 or 8 bits only.",
                          "Set QUANTIZATION_BIT=4 (QLoRA) or 8, or choose another QUANTIZATION_METHOD that has "
                          "this width (hqq).")  # fmt: skip


def _warmup_twice(run: Rendered) -> None:
    """WARMUP_STEPS with WARMUP_RATIO."""
    if _user_number(run, "warmup_steps") and _user_number(run, "warmup_ratio"):
        raise ConfigError(f"{named(run, 'warmup_steps')} and {named(run, 'warmup_ratio')} are both set: "
                          "transformers uses the steps and ignores the ratio.",
                          f"Remove WARMUP_RATIO ({origin('warmup_ratio', run.sources.get('warmup_ratio'))}) if "
                          f"{run.arguments['warmup_steps']} warmup steps is what you want.")  # fmt: skip


def _streamed_fraction(run: Rendered) -> None:
    """STREAMING with a fractional VAL_SIZE."""
    val_size = _number(run.arguments.get("val_size")) or 0.0
    if run.arguments.get("streaming") and 0 < val_size < 1:
        raise ConfigError(f"{named(run, 'streaming')} with {named(run, 'val_size')}: a streamed data set has no "
                          "known length, so a fraction of it cannot be held out.",
                          "Give VAL_SIZE as a count of records (VAL_SIZE=500).")  # fmt: skip


def _eval_never_runs(run: Rendered) -> None:
    """EVAL_STEPS with EVAL_STRATEGY=no."""
    strategy = str(run.arguments.get("eval_strategy") or "no").lower()
    if strategy == "no" and _user_set("eval_steps", run.sources):
        raise ConfigError(f"{named(run, 'eval_steps')} with {named(run, 'eval_strategy', 'no')}: evaluation would "
                          "never run.",
                          "Set EVAL_STRATEGY=steps (and VAL_SIZE or EVAL_DATASET for the data).")  # fmt: skip


def _value_warnings(run: Rendered) -> list[str]:
    """The warnings of :func:`more_values`: eval data never evaluated, SAVE_TOTAL_LIMIT=0, SAVE_STEPS beyond
    MAX_STEPS or 0, NUM_TRAIN_EPOCHS ignored for MAX_STEPS, an EVAL_DATASET that is also in DATASET."""
    arguments, sources = run.arguments, run.sources
    val_size = _number(arguments.get("val_size")) or 0.0
    strategy = str(arguments.get("eval_strategy") or "no").lower()
    has_eval = val_size > 0 or bool(arguments.get("eval_dataset"))
    warnings = []
    if strategy == "no" and has_eval:
        given = "VAL_SIZE" if val_size > 0 else "EVAL_DATASET"
        warnings.append(f"{given} is set but EVAL_STRATEGY=no: the evaluation data is never evaluated; set "
                        "EVAL_STRATEGY=steps (or epoch) to see an eval loss.")  # fmt: skip
    if _user_set("save_total_limit", sources) and _number(arguments.get("save_total_limit")) == 0:
        warnings.append("SAVE_TOTAL_LIMIT=0 keeps every checkpoint (transformers reads 0 as no limit); to save "
                        "none, set SAVE_STRATEGY=no; to keep the last N, SAVE_TOTAL_LIMIT=N.")  # fmt: skip
    max_steps, save_steps = _number(arguments.get("max_steps")), _number(arguments.get("save_steps"))
    if (max_steps and max_steps > 0 and save_steps and save_steps > max_steps
            and str(arguments.get("save_strategy") or "steps") == "steps"):  # fmt: skip
        warnings.append(
            f"SAVE_STEPS={arguments['save_steps']:g} is beyond MAX_STEPS={arguments['max_steps']}: no "
            "checkpoint is saved before the end, so an interrupted run starts over; lower SAVE_STEPS."
        )
    if (_user_set("save_steps", sources) and save_steps == 0
            and str(arguments.get("save_strategy") or "steps") == "steps"):  # fmt: skip
        warnings.append("SAVE_STEPS=0 with SAVE_STRATEGY=steps saves no checkpoint during the run (an interrupted "
                        "run starts over); set SAVE_STEPS to a number of steps, or SAVE_STRATEGY=no.")  # fmt: skip
    if _user_set("num_train_epochs", sources) and _user_set("max_steps", sources) and max_steps and max_steps > 0:
        warnings.append(f"NUM_TRAIN_EPOCHS={arguments['num_train_epochs']:g} is ignored: MAX_STEPS={max_steps:g} "
                        "decides the length of the run (transformers); unset one of them.")  # fmt: skip
    from rocmft.render.datasets import split_names

    both = set(split_names(arguments.get("dataset"))) & set(split_names(arguments.get("eval_dataset")))
    if both:
        warnings.append(
            f"EVAL_DATASET and DATASET share {', '.join(sorted(both))}: the eval loss is measured on "
            "training data and says nothing about generalisation; use VAL_SIZE or a held-out set."
        )
    return warnings


def _interleave(run: Rendered) -> None:
    """INTERLEAVE_PROBS: only with an interleave MIX_STRATEGY, one number per data set, summing to 1. One check:
    each step needs the one before it to pass (probabilities MIX_STRATEGY=concat ignores are not worth counting)."""
    from rocmft.render.datasets import split_names

    arguments = run.arguments
    value = arguments.get("interleave_probs")
    if value in (None, ""):
        return
    probs_named = named(run, "interleave_probs")
    if str(arguments.get("mix_strategy") or "concat") == "concat":
        raise ConfigError(f"{probs_named} with {named(run, 'mix_strategy', 'concat')}, which ignores it.",
                          "Set MIX_STRATEGY=interleave_under (sample the data sets with these probabilities, stop "
                          "at the shortest).")  # fmt: skip
    try:
        probs = [float(p) for p in split_names(value)]
    except ValueError as err:
        raise ConfigError(
            f"{probs_named} is not a list of numbers.",
            "Give one probability per data set, comma-separated: INTERLEAVE_PROBS=0.7,0.3.",
        ) from err
    for variable in ("dataset", "eval_dataset"):
        names = split_names(arguments.get(variable))
        if names and len(names) != len(probs):
            raise ConfigError(
                f"{probs_named} has {len(probs)} probabilities for the {len(names)} data sets of "
                f"{named(run, variable)}.",
                f"Give exactly one probability per data set, in the order of {variable.upper()}.",
            )
    if any(p < 0 for p in probs) or abs(sum(probs) - 1) > 1e-6:
        raise ConfigError(
            f"{probs_named} sums to {sum(probs):g}; sampling probabilities must be 0 or more and sum to 1.",
            f"Scale them: INTERLEAVE_PROBS={','.join(f'{p / sum(probs):.3g}' for p in probs)}"
            if sum(probs) > 0 and all(p >= 0 for p in probs)
            else "Give probabilities that sum to 1.",
        )


# The errors of more_values, in the order they are reported; each raises at its problem.
_VALUE_CHECKS: tuple[Callable[[Rendered], None], ...] = (
    _not_a_number,
    _lora_alpha,
    _lora_rank_beyond_width,
    _max_steps_zero,
    partial(_not_negative, name="warmup_steps",
            fix="Set WARMUP_STEPS to 0 or more (a count of steps, or a fraction below 1)."),
    partial(_not_negative, name="max_grad_norm",
            fix="Set MAX_GRAD_NORM to a positive number (1.0 is usual), or 0 for no clipping."),
    # transformers logs only when logging_steps > 0: a negative value trained without one logged loss, so the NaN
    # and spike watchdogs, which read the logged losses, never saw one (LOGGING_STEPS=-3, exit 0, 2026-12-05)
    partial(_not_negative, name="logging_steps",
            fix="Set LOGGING_STEPS to a number of steps (e.g. LOGGING_STEPS=10), or a fraction below 1 of "
                "the run's steps."),
    # SAVE_STEPS and EVAL_STEPS: transformers 5.6 reads a value below 1 as a fraction of the run's steps
    # (TrainerState.compute_steps: ceil(max_steps * value)), so a negative SAVE_STEPS saved no checkpoint during the
    # run (DefaultFlowCallback saves only for save_steps > 0) and EVAL_STEPS=-1 evaluated only at the end (step %
    # -max_steps); its own validation (TrainingArguments.__post_init__, run by the parse) refuses neither
    # (SAVE_STEPS=-5, EVAL_STEPS=-1: exit 0, 2026-12-05). A fraction in (0, 1) stays allowed; 0 is SAVE_STEPS's
    # warning (_value_warnings) and, for EVAL_STEPS, transformers' documented fall-back to LOGGING_STEPS.
    partial(_not_negative, name="save_steps",
            fix="Set SAVE_STEPS to a number of steps between checkpoints (e.g. SAVE_STEPS=500), a fraction below 1 "
                "of the run's steps, or SAVE_STRATEGY=no for no checkpoints."),
    partial(_not_negative, name="eval_steps",
            fix="Set EVAL_STEPS to a number of steps between evaluations (e.g. EVAL_STEPS=100), a fraction below 1 "
                "of the run's steps, or unset it (transformers then evaluates every LOGGING_STEPS)."),
    # torch's DataLoader raises "num_workers option should be non-negative" once the model has loaded (exit 4)
    partial(_not_negative, name="dataloader_num_workers",
            fix="Set DATALOADER_NUM_WORKERS to 0 (load data in the training process) or a number of processes."),
    _max_samples,
    _bnb_width,
    _warmup_twice,
    _interleave,
    _streamed_fraction,
    _eval_never_runs,
)  # fmt: skip
