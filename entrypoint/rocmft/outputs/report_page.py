"""The run report page, ``run_summary.html``: one self-contained HTML page of a finished (or stopped) run, written
beside run_summary.md/.png by ``rocmft report`` and at the end of ``rocmft train`` (rocmft.outputs.report).

What it shows, and where each part is read from (the run's own records, through their typed readers):

* loss (train and eval), gradient norm, learning rate and tokens/s over the steps, and GPU memory: the series of
  :func:`rocmft.outputs.report.run_facts` (trainer_log.jsonl, trainer_state.json's ``log_history``,
  worker-result.json), each drawn by matplotlib as an inline SVG;
* peak GPU memory against the planner's estimate: rocmft.records.WorkerResult ``peak_gpu_memory_gib`` and the
  manifest's plan (rocmft.render.planner.PerfPlan ``estimate_gib``, ``usable_gib``, ``breakdown_gib``);
* the health checks' table: checks.json (rocmft.records.ChecksReport);
* the planner's choices with their reasons: PerfPlan ``choices``;
* every setting with its source: the manifest's ``arguments`` with ``argument_sources`` /
  ``argument_source_kinds`` (rocmft.config.provenance), and rocmft's knobs (``settings``) with whether the user set
  them or a restart did;
* the restarts (rocmft.records.Restart) and how the run ended (the manifest's status and exit code, the worker's
  error, non-finite value or graceful stop).

The page needs no network to be read: the CSS is in the page, the charts are inline SVG, and there is no script;
its Content-Security-Policy (``default-src 'none'``) keeps a browser from fetching anything. Every value is
escaped by Jinja2's autoescape. No secret can appear: the manifest holds secret names only and redacted values
(rocmft.outputs.manifest), and nothing here reads the environment.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmft.errors import ConfigError, ExitCode
from rocmft.fsutil import atomic_write_text
from rocmft.records import (
    MANIFEST_FILE,
    Manifest,
    WorkerResult,
    json_number,
    read_checks_report,
    read_manifest,
    read_worker_result,
)

SUMMARY_HTML = "run_summary.html"
PAGE_TEMPLATE = "run_summary.html.j2"  # in rocmft's templates (rocmft.config.layers.builtin_templates)
CHART_SIZE_IN = (6.0, 3.2)  # inches at 96 px per inch in a browser (SVG's pt is 1/72 in): about 576 x 307 px
# Fixed margins (fractions of CHART_SIZE_IN: 0.8 in left for 7-character tick labels and the axis label at 9 pt,
# 0.5 in below, 0.15 in right and above), not matplotlib's constrained layout: that measured every label's box and
# took 0.75 of the report's 1.5 s per run (write_summary on a 10-step run, 3 repeats, this machine).
CHART_MARGINS = {"left": 0.8 / 6.0, "right": 1 - 0.15 / 6.0, "bottom": 0.5 / 3.2, "top": 1 - 0.15 / 3.2}
# Words for the manifest's argument_source_kinds (rocmft.config.provenance.Kind values).
SOURCE_KINDS = {
    "environment": "environment variable",
    "rocmft_config": "ROCMFT_CONFIG file",
    "command_line_yaml": "command-line YAML",
    "command_line": "command line",
    "template": "template default",
    "builtin": "built-in recipe",
    "rocmft_default": "rocmft default",
    "rocmft": "derived by rocmft",
    "plan": "planner",
    "restart": "automatic restart",
}


@dataclass(frozen=True)
class Chart:
    """One chart of the page: its element id, title, and the inline SVG (None: nothing recorded, ``note`` says
    why)."""

    id: str
    title: str
    svg: str | None
    note: str = ""


def _display(value: Any) -> str:
    """A setting's value as text: strings as they are, everything else as JSON (lists, objects, null, true)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _svg(ylabel: str, lines: list[tuple[str, list, list, str]],
         levels: tuple[tuple[str, float], ...] = ()) -> str:  # fmt: skip
    """``lines`` (label, steps, values, matplotlib format) and horizontal ``levels`` (label, value) drawn as one SVG
    element (text kept as text: ``svg.fonttype`` none; ids fixed by ``svg.hashsalt``). Raises ValueError or
    OverflowError on values matplotlib cannot scale an axis to."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "rocmft-report", "font.size": 9}):
        figure = Figure(figsize=CHART_SIZE_IN)
        figure.subplots_adjust(**CHART_MARGINS)
        axis = figure.subplots()
        for label, steps, values, style in lines:
            axis.plot(steps, values, style, label=label, markersize=3)
        for index, (label, value) in enumerate(levels):
            axis.axhline(value, linestyle=("--", ":")[index % 2], color=("C3", "C7")[index % 2], label=label)
        axis.set(xlabel="optimizer step", ylabel=ylabel)  # the title is the page's figcaption
        axis.grid(alpha=0.3)
        if len(lines) + len(levels) > 1:
            axis.legend()
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})  # the same run, the same page
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # the element alone: no XML declaration or DOCTYPE inside HTML


def _chart(chart_id: str, title: str, ylabel: str, lines: list[tuple[str, list, list, str]],
           levels: tuple[tuple[str, float], ...] = (), empty: str = "not recorded") -> Chart:  # fmt: skip
    """A :class:`Chart` of ``lines`` (those without points left out); without points, its ``empty`` note."""
    lines = [line for line in lines if line[1]]
    if not lines:
        return Chart(chart_id, title, None, empty)
    try:
        return Chart(chart_id, title, _svg(ylabel, lines, levels))
    except (ValueError, OverflowError, TypeError) as err:  # a loss of 1e308, a damaged record: the page stays
        return Chart(chart_id, title, None, f"matplotlib could not draw the logged values ({err})")


def _points(rows: list[dict[str, Any]], key: str) -> tuple[list, list]:
    """The (steps, values) of ``rows`` where ``key`` holds a value."""
    kept = [row for row in rows if row.get(key) is not None]
    return [row["step"] for row in kept], [row[key] for row in kept]


def charts(facts: dict[str, Any], plan) -> list[Chart]:
    """The page's charts from :func:`rocmft.outputs.report.run_facts`'s ``facts`` and the run's PerfPlan (or None):
    loss, gradient norm, learning rate, tokens/s, and GPU memory with the plan's estimate and usable memory."""
    series = facts["series"]
    memory_levels = tuple(
        (label, value)
        for label, value in (("plan's estimate", plan and plan.estimate_gib), ("usable", plan and plan.usable_gib))
        if value is not None
    )
    cpu = "not measured: torch.cuda.max_memory_allocated is recorded on GPUs only"
    return [
        _chart("chart-loss", "Loss", "loss (nats per token)", [
            ("train", *_points(series["train"], "loss"), "-"), ("eval", *_points(series["eval"], "eval_loss"), "o-")]),
        _chart("chart-grad-norm", "Gradient norm", "norm before clipping",
               [("grad norm", *_points(series["grad_norm"], "grad_norm"), "-")]),
        _chart("chart-lr", "Learning rate", "learning rate", [("lr", *_points(series["train"], "lr"), "-")]),
        _chart("chart-throughput", "Tokens per second", "tokens/s (per logging interval)",
               [("tokens/s", *_points(series["throughput"], "tokens_per_s"), "-")]),
        _chart("chart-memory", "GPU memory, rank 0", "GiB", [
            ("allocated", *_points(series["memory"], "allocated_gib"), "-"),
            ("peak", *_points(series["memory"], "peak_gib"), "--")], memory_levels, cpu),
    ]  # fmt: skip


def _read_plan(manifest: Manifest):
    """The manifest's plan as rocmft.render.planner.PerfPlan; None without one or when it is not a plan."""
    if manifest.plan is None:
        return None
    from rocmft.render.planner import PerfPlan

    try:
        return PerfPlan.from_json(dict(manifest.plan))
    except ValueError:
        return None


def settings_rows(manifest: Manifest) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str, str]]]:
    """The training arguments as (name, value, source kind in words, source) and rocmft's knobs as
    (ROCMFT_<NAME>, value, source), from the manifest's ``arguments``, ``argument_sources``,
    ``argument_source_kinds`` and ``settings`` (rocmft.config.settings.Settings.redacted)."""
    from rocmft.config.knobs import PREFIX

    arguments = [
        (name, _display(value), SOURCE_KINDS.get(str(manifest.argument_source_kinds.get(name)), "–"),
         str(manifest.argument_sources.get(name, "–")))
        for name, value in manifest.arguments.items()
    ]  # fmt: skip
    knobs = _settings_part(manifest, "rocmft", dict)
    explicit = _settings_part(manifest, "explicit_rocmft", list)
    overrides = _settings_part(manifest, "rocmft_overrides", dict)
    rows = []
    for name, value in knobs.items():
        source = overrides.get(name) or ("set by the user" if name in explicit else "rocmft default")
        rows.append((f"{PREFIX}{name.upper()}", _display(value), str(source)))
    return arguments, rows


def _settings_part(manifest: Manifest, key: str, kind: type) -> Any:
    """The manifest's ``settings[key]`` when it is a ``kind`` (dict or list), else an empty one (a damaged record)."""
    value = manifest.settings.get(key)
    return value if isinstance(value, kind) else kind()


def steps_text(steps: Any, max_steps: Any) -> str | None:
    """``"15 of 40"``; ``"1 (total not recorded)"`` when no record holds a planned number of steps (a damaged
    worker-result.json read "1 of None": a break-it trial, 2026-12-05); None without a step."""
    if json_number(steps) is None:
        return None
    return f"{steps} of {max_steps}" if json_number(max_steps) else f"{steps} (total not recorded)"


def ending(manifest: Manifest, worker: WorkerResult) -> list[tuple[str, str]]:
    """How the run ended, as (what, value) rows: status and exit code (rocmft.errors.ExitCode's name), the last
    step reached of those planned, and the worker's error, non-finite value or graceful stop when there was one."""
    code = manifest.exit_code
    try:
        code_text = f"{code} ({ExitCode(code).name})" if code is not None else "– (still running, or killed)"
    except ValueError:
        code_text = str(code)
    rows = [("status", manifest.status or "unknown"), ("exit code", code_text)]
    if worker.last_step is not None:
        rows.append(("last step", steps_text(worker.last_step, worker.max_steps) or f"{worker.last_step!r}"))
    if worker.non_finite is not None:
        stop = worker.non_finite
        median = f" (recent median {json_number(stop.median):.4g})" if json_number(stop.median) is not None else ""
        rows.append(("stopped by", f"{stop.cause}: {stop.key} = {stop.value} at step {stop.step}{median}"))
    if worker.stopped_at_step is not None:
        rows.append(("graceful stop", f"checkpoint saved at step {worker.stopped_at_step}"))
    if worker.error:
        rows.append(("error", worker.error))
    if manifest.started_at:
        rows.append(("started / last updated (UTC)", f"{manifest.started_at} / {manifest.updated_at or '–'}"))
    return rows


def page_html(output_dir: Path, facts: dict[str, Any], headline: list[tuple[str, str]]) -> str:
    """The page of the run in ``output_dir`` (its ``facts`` from :func:`rocmft.outputs.report.run_facts` and its
    ``headline`` rows from :func:`rocmft.outputs.report.summary_rows`, passed in so that this module does not import
    the one that writes it), from
    templates/run_summary.html.j2 with Jinja2's autoescape on. Missing or damaged records leave their parts empty
    ("not recorded"), never an error."""
    import jinja2
    from markupsafe import Markup

    from rocmft.config.layers import builtin_templates
    from rocmft.render import RUN_SUBDIR

    run_dir = Path(output_dir) / RUN_SUBDIR
    try:
        manifest = read_manifest(run_dir / MANIFEST_FILE)
    except ConfigError:
        manifest = Manifest()
    worker = read_worker_result(run_dir) or WorkerResult()
    plan = _read_plan(manifest)
    arguments, knobs = settings_rows(manifest)
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(builtin_templates()), autoescape=True,
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)  # fmt: skip
    return environment.get_template(PAGE_TEMPLATE).render(
        name=Path(output_dir).name,
        facts=facts,
        headline=headline,
        cards=dict(headline),
        # matplotlib's own SVG, markup to keep: every text in it is this module's (axis labels, legend), escaped by
        # matplotlib; every other value goes through autoescape
        charts=[(c, Markup(c.svg) if c.svg else None) for c in charts(facts, plan)],
        ending=ending(manifest, worker),
        restarts=manifest.restarts,
        checks=read_checks_report(run_dir),
        plan=plan,
        peak=json_number(worker.peak_gpu_memory_gib),
        arguments=arguments,
        knobs=knobs,
        secrets_given=[str(name) for name in _settings_part(manifest, "secrets_given", list)],
    )


def write_page(output_dir: Path, facts: dict[str, Any], headline: list[tuple[str, str]]) -> Path:
    """Write ``run_summary.html`` (see :func:`page_html`) into ``output_dir`` atomically (a reader never sees half a
    page); returns its path. Raises OSError when ``output_dir`` cannot be written."""
    return atomic_write_text(Path(output_dir) / SUMMARY_HTML, page_html(output_dir, facts, headline))


__all__ = ["SUMMARY_HTML", "Chart", "charts", "ending", "page_html", "settings_rows", "write_page"]
