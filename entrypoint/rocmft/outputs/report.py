"""The run summary: what a finished run did, read back from the files it left in OUTPUT_DIR.

:func:`run_facts` gathers the time series and the headline numbers from

* ``trainer_log.jsonl`` (LLaMA-Factory's LogCallback: loss, eval_loss, lr, total_tokens per logging step),
* ``trainer_state.json`` (transformers' ``log_history``: ``num_input_tokens_seen`` and ``train_runtime`` in
  seconds at each log, from which tokens/s per logging interval is computed),
* ``rocmft/worker-result.json`` and ``rocmft/losses.jsonl`` (rocmft's worker: GPU memory per log on GPUs, peak
  memory, steps),
* ``rocmft/manifest.json`` (model, data sets, method, versions),

and :func:`write_summary` turns them into ``run_summary.md`` and ``run_summary.png`` (loss train/eval,
learning rate, tokens/s, GPU memory; drawn with matplotlib, which LLaMA-Factory itself uses for
``training_loss.png``) and the self-contained report page ``run_summary.html`` (rocmft.outputs.report_page).
``rocmft export`` puts the same headline numbers in the exported model's card.
Nothing here is a secret: the manifest holds none (rocmft.outputs.manifest), and no environment is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rocmft.console import warn
from rocmft.errors import ConfigError
from rocmft.fsutil import atomic_write_text
from rocmft.outputs.report_page import steps_text
from rocmft.records import MANIFEST_FILE, Manifest, WorkerResult, json_number, read_manifest, read_worker_result

SUMMARY_MD = "run_summary.md"
SUMMARY_PNG = "run_summary.png"
# The training arguments the summary shows as the run's method (those the run set).
METHOD_KEYS = (
    "stage",
    "finetuning_type",
    "lora_rank",
    "lora_alpha",
    "lora_target",
    "quantization_bit",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "cutoff_len",
    "packing",
    "template",
)


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, damaged or another JSON value (``[1]``)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _num(value: Any) -> int | float | None:
    """``value`` when it is a JSON number a series can hold (not a bool; an int within 64 bits, so that arithmetic
    with floats cannot overflow), else None: a damaged record's value reads as missing."""
    value = json_number(value)
    return value if value is None or isinstance(value, float) or abs(value) < 2**63 else None


def _numbers(row: Any, *keys: str) -> bool:
    """Whether ``row`` is an object whose ``keys`` all hold numbers (:func:`_num`)."""
    return isinstance(row, dict) and all(_num(row.get(key)) is not None for key in keys)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):  # ValueError: not UTF-8
        return rows
    for line in lines:
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line cut short by a crash
        if isinstance(item, dict):
            rows.append(item)
    return rows


def run_facts(output_dir: Path) -> dict[str, Any]:
    """Everything the summary and the model card show, from the files of the run in ``output_dir``.

    Returns a dict with ``series`` (``train``: step, loss, lr; ``eval``: step, eval_loss; ``throughput``: step,
    tokens/s over the logging interval; ``grad_norm``: step, the gradient norm transformers logged before clipping
    (``log_history``); ``memory``: step, GiB allocated and peak — GPU runs only) and the
    headline values ``model``, ``data_sets``, ``method``, ``steps``, ``max_steps``, ``final_loss``,
    ``final_eval_loss``, ``tokens``, ``train_seconds``, ``peak_gpu_memory_gib``, ``status``, ``versions``.
    Missing files give missing values (None or empty series), never an error.
    """
    output_dir = Path(output_dir)
    log = _read_jsonl(output_dir / "trainer_log.jsonl")
    state = _read_json(output_dir / "trainer_state.json") or {}
    worker = read_worker_result(output_dir / "rocmft") or WorkerResult()
    try:  # missing or damaged: its values are missing, as the docstring says
        manifest = read_manifest(output_dir / "rocmft" / MANIFEST_FILE)
    except ConfigError:
        manifest = Manifest()
    arguments = manifest.arguments

    train, evals = _loss_series(log, worker)
    final_train = [h for h in _history(state) if _numbers(h, "train_runtime", "train_loss")]
    method = {key: arguments.get(key) for key in METHOD_KEYS if arguments.get(key) is not None}
    return {
        "output_dir": str(output_dir),
        "status": manifest.status,
        "model": arguments.get("model_name_or_path"),
        "data_sets": [n.strip() for n in str(arguments.get("dataset") or "").split(",") if n.strip()],
        "eval_data_sets": [n.strip() for n in str(arguments.get("eval_dataset") or "").split(",") if n.strip()],
        "method": method,
        "precision": {k: manifest.precision.get(k) for k in ("policy", "compute_dtype")},
        "steps": _num(state.get("global_step")) or _num(worker.last_step),
        "max_steps": _num(state.get("max_steps")) or _num(worker.max_steps),
        "final_loss": train[-1]["loss"] if train else None,
        "final_eval_loss": evals[-1]["eval_loss"] if evals else None,
        "tokens": _num(state.get("num_input_tokens_seen")) or worker.tokens_seen,
        "train_seconds": final_train[-1]["train_runtime"] if final_train else worker.elapsed_s,
        "peak_gpu_memory_gib": worker.peak_gpu_memory_gib,
        "world_size": worker.world_size,
        "versions": {
            k: manifest.versions.get(k) for k in ("llamafactory", "transformers", "peft", "torch", "deepspeed")
        }
        | {"rocmft": manifest.rocmft_version},
        "series": {
            "train": train,
            "eval": evals,
            "throughput": _throughput_series(state, log),
            "grad_norm": _grad_norm_series(state),
            "memory": _memory_series(worker),
        },
    }


def _loss_series(log: list[dict[str, Any]], worker: WorkerResult) -> tuple[list[dict], list[dict]]:
    """The train series (step, loss, lr) and the eval series (step, eval_loss) from LLaMA-Factory's
    ``trainer_log.jsonl`` rows; without train rows there, the worker's own record of the losses (lr None)."""
    train = [{"step": r["current_steps"], "loss": r["loss"], "lr": _num(r.get("lr"))}
             for r in log if _numbers(r, "current_steps", "loss")]  # fmt: skip
    evals = [
        {"step": r["current_steps"], "eval_loss": r["eval_loss"]}
        for r in log
        if _numbers(r, "current_steps", "eval_loss")
    ]
    if not train:  # no LLaMA-Factory log: the worker's own record of the losses
        train = [{"step": e.step, "loss": e.loss, "lr": None} for e in worker.losses]
    return train, evals


def _grad_norm_series(state: dict[str, Any]) -> list[dict]:
    """The gradient norm per log (step, grad_norm): transformers' ``log_history`` ``grad_norm``, the total norm
    before clipping (what torch.nn.utils.clip_grad_norm_ returns, logged by transformers' Trainer)."""
    return [
        {"step": h["step"], "grad_norm": h["grad_norm"]} for h in _history(state) if _numbers(h, "step", "grad_norm")
    ]


def _history(state: dict[str, Any]) -> list[dict[str, Any]]:
    """transformers' ``log_history`` in trainer_state.json: its objects (none when it is not a list)."""
    history = state.get("log_history")
    return [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []


def _throughput_series(state: dict[str, Any], log: list[dict[str, Any]]) -> list[dict]:
    """Tokens/s per logging interval (step, tokens_per_s): the difference of transformers' ``log_history``
    ``num_input_tokens_seen`` over that of ``train_runtime`` (seconds) between consecutive logs; where the history
    has no such entries (older transformers), LLaMA-Factory's running average ``throughput`` from its log."""
    throughput = []
    history = [h for h in _history(state) if _numbers(h, "loss", "num_input_tokens_seen", "step")]
    previous = (0, 0.0)
    for entry in history:
        tokens, seconds = entry["num_input_tokens_seen"], _num(entry.get("train_runtime"))
        if seconds is None:
            continue
        if seconds > previous[1]:
            throughput.append({"step": entry["step"], "tokens_per_s": (tokens - previous[0]) / (seconds - previous[1])})
        previous = (tokens, seconds)
    if not throughput:  # older transformers: LLaMA-Factory's running average
        throughput = [
            {"step": r["current_steps"], "tokens_per_s": r["throughput"]}
            for r in log
            if _numbers(r, "current_steps", "loss", "throughput") and r["throughput"]
        ]
    return throughput


def _memory_series(worker: WorkerResult) -> list[dict]:
    """GPU memory per log (step, allocated_gib, peak_gib in GiB) from the worker's record; empty for a CPU run."""
    return [
        {"step": e.step, "allocated_gib": e.gpu_memory_gib, "peak_gib": e.peak_gpu_memory_gib}
        for e in worker.losses
        if e.peak_gpu_memory_gib is not None
    ]


def _plot(facts: dict[str, Any], path: Path) -> bool:
    """Draw the four panels into ``path`` (PNG). False when there is nothing to draw."""
    series = facts["series"]
    if not series["train"]:
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display in a container
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))  # fixed margins: report_page.CHART_MARGINS says why
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.91, wspace=0.18, hspace=0.32)
    ax = axes[0][0]
    ax.plot([r["step"] for r in series["train"]], [r["loss"] for r in series["train"]], label="train")
    if series["eval"]:
        ax.plot([r["step"] for r in series["eval"]], [r["eval_loss"] for r in series["eval"]], "o-", label="eval")
    ax.set(title="loss", xlabel="step")
    ax.legend()
    panels = [
        (axes[0][1], "learning rate", [(r["step"], r["lr"]) for r in series["train"] if r["lr"] is not None]),
        (axes[1][0], "tokens/s (per logging interval)", [(r["step"], r["tokens_per_s"]) for r in series["throughput"]]),
        (
            axes[1][1],
            "GPU memory allocated, GiB (rank 0)",
            [(r["step"], r["allocated_gib"]) for r in series["memory"] if r["allocated_gib"] is not None],
        ),
    ]
    for axis, title, points in panels:
        axis.set(title=title, xlabel="step")
        if points:
            axis.plot([p[0] for p in points], [p[1] for p in points])
        else:
            axis.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=axis.transAxes)
    if series["memory"]:
        peaks = [(r["step"], r["peak_gib"]) for r in series["memory"]]
        axes[1][1].plot([p[0] for p in peaks], [p[1] for p in peaks], "--", label="peak")
        axes[1][1].legend()
    fig.suptitle(Path(facts["output_dir"]).name)
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return True


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 10**digits else f"{value:.{digits}g}"
    return str(value)


def summary_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline table of the summary and the report page: (what, value as text) rows from ``facts``
    (:func:`run_facts`); ``–`` where a value was not recorded."""
    rates = [r["tokens_per_s"] for r in facts["series"]["throughput"]]
    rows = [
        ("status", facts["status"]),
        ("model", facts["model"]),
        ("data sets", ", ".join(facts["data_sets"]) or None),
        ("method", ", ".join(f"{k} {v}" for k, v in facts["method"].items()) or None),
        ("precision", facts["precision"].get("policy")),
        ("steps", steps_text(facts["steps"], facts["max_steps"])),
        ("final train loss", _number(facts["final_loss"])),
        ("final eval loss", _number(facts["final_eval_loss"])),
        ("tokens trained on", facts["tokens"]),
        ("training time, s", _number(facts["train_seconds"], 5)),
        ("tokens/s (median of the logging intervals)", _number(sorted(rates)[len(rates) // 2], 5) if rates else None),
        ("peak GPU memory, GiB (rank 0, max_memory_allocated)", _number(facts["peak_gpu_memory_gib"])),
        ("world size", facts["world_size"]),
        ("versions", ", ".join(f"{k} {v}" for k, v in facts["versions"].items() if v)),
    ]
    return [(name, _number(value)) for name, value in rows]


def summary_markdown(facts: dict[str, Any], image: str | None) -> str:
    """The Markdown of ``run_summary.md`` for ``facts`` (from :func:`run_facts`); ``image`` is the plot's file
    name next to it, or None."""
    series = facts["series"]
    lines = [f"# Run summary: {Path(facts['output_dir']).name}", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {f'`{text}`' if name == 'model' and facts['model'] else text} |"
              for name, text in summary_rows(facts)]  # fmt: skip
    if image:
        lines += ["", f"![loss, learning rate, tokens/s and GPU memory by step]({image})"]
    lines += [
        "",
        "## Logged steps",
        "",
        "| step | train loss | eval loss | learning rate | tokens/s | GPU GiB |",
        "|---|---|---|---|---|---|",
    ]
    by_step: dict[int, dict[str, Any]] = {}
    for name, key in (
        ("train", "loss"),
        ("train", "lr"),
        ("eval", "eval_loss"),
        ("throughput", "tokens_per_s"),
        ("memory", "allocated_gib"),
    ):
        for row in series[name]:
            by_step.setdefault(row["step"], {})[key] = row.get(key)
    for step in sorted(by_step):
        row = by_step[step]
        cells = [_number(row.get(k)) for k in ("loss", "eval_loss", "lr", "tokens_per_s", "allocated_gib")]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Sources: trainer_log.jsonl and trainer_state.json (LLaMA-Factory, transformers), "
        "rocmft/worker-result.json, rocmft/losses.jsonl and rocmft/manifest.json (rocmft). Written by `rocmft report`.",
        "",
    ]
    return "\n".join(lines)


def write_summary(output_dir: Path) -> Path:
    """Write ``run_summary.md`` (and ``run_summary.png`` when any step was logged) and the report page
    ``run_summary.html`` (rocmft.outputs.report_page) into ``output_dir``.

    Returns the Markdown file's path. Raises OSError when ``output_dir`` cannot be written.
    """
    output_dir = Path(output_dir)
    facts = run_facts(output_dir)
    drawing = output_dir / f".{SUMMARY_PNG}.tmp"
    try:
        image = SUMMARY_PNG if _plot(facts, drawing) else None
        if image:
            drawing.replace(output_dir / SUMMARY_PNG)
    except (ValueError, OverflowError) as err:  # values matplotlib cannot scale an axis to (a loss of 1e308)
        warn(f"run summary without its plot: matplotlib could not draw the logged values ({err})", all_ranks=True)
        image = None
    finally:  # a plot that failed half-way leaves nothing behind
        drawing.unlink(missing_ok=True)
    from rocmft.outputs.report_page import write_page

    written = atomic_write_text(output_dir / SUMMARY_MD, summary_markdown(facts, image))
    write_page(output_dir, facts, summary_rows(facts))
    return written
