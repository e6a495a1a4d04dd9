"""Issue 33: the run report page, run_summary.html (rocmft.outputs.report_page), written from a run's records by
their own writers (the manifest, worker-result.json, checks.json) and the files transformers and LLaMA-Factory
leave; in-process. The page of a real training run, rendered by headless Chromium: tests/test_export.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocmft.checks import CheckResult, report
from rocmft.fsutil import atomic_write_json
from rocmft.outputs.report import write_summary
from rocmft.outputs.report_page import SUMMARY_HTML
from rocmft.records import LossRecord, Manifest, NonFinite, Restart, WorkerResult, write_worker_result
from rocmft.render.planner import Choice, PerfPlan
from support.htmldom import parse

HOSTILE = "<script>alert('x')</script>&amp;"  # a value that is markup: the page shows it as text


def _gpu_run(output_dir: Path) -> Path:
    """A run that diverged on a GPU and restarted in fp32, as its records say."""
    run_dir = output_dir / "rocmft"
    run_dir.mkdir(parents=True)
    losses = tuple(LossRecord(step, 2.0 - step / 100, 20.0 + step / 10, 31.2) for step in (5, 10, 15))
    worker = WorkerResult.start().updated(
        status="non-finite loss", losses=losses, max_steps=40, last_step=15, peak_gpu_memory_gib=31.2,
        non_finite=NonFinite(15, "loss", "nan"),
    )  # fmt: skip
    write_worker_result(run_dir, worker)
    plan = PerfPlan(True, "planned against 1 x gfx942, 191.5 GiB", [
        Choice("per_device_train_batch_size", 8, "the largest micro-batch that fits", True),
        Choice("neat_packing", False, "given by the user", False)], estimate_gib=30.0, usable_gib=185.7,
        breakdown_gib={"weights": 14.2, "activations": 12.0})  # fmt: skip
    Manifest(
        status="non-finite loss", exit_code=5, plan=plan.as_dict(), worker=worker.to_json(),
        arguments={"learning_rate": 2e-4, "dataset": HOSTILE, "lora_target": ["q_proj", "v_proj"]},
        argument_sources={"learning_rate": "LEARNING_RATE", "dataset": "/config/my.yaml", "lora_target": "?"},
        argument_source_kinds={"learning_rate": "environment", "dataset": "rocmft_config", "lora_target": "plan"},
        settings={"rocmft": {"precision": "fp32", "zero_stage": 2}, "explicit_rocmft": ["zero_stage"],
                  "rocmft_overrides": {"precision": "the restart after a non-finite loss at step 15"}},
        restarts=(Restart("non-finite loss", 15, "checkpoint-10", "bf16"),),
    ).write(run_dir / "manifest.json")  # fmt: skip
    results = [
        CheckResult("pass", "1 GPU", "gfx942 visible", id="gpus", seconds=0.4),
        CheckResult("warn", "2 CPU(s), need 3", "More work than CPUs", "Give the task more CPUs", id="cpus"),
    ]
    atomic_write_json(run_dir / "checks.json", report(results, 1.25))  # the checks' own writer
    history = [{"step": s, "loss": 2.0 - s / 100, "grad_norm": 0.5 + s / 10, "learning_rate": 1e-4,
                "num_input_tokens_seen": s * 1000, "train_runtime": s * 2.0} for s in (5, 10, 15)]  # fmt: skip
    (output_dir / "trainer_state.json").write_text(json.dumps({"global_step": 15, "log_history": history}))
    (output_dir / "trainer_log.jsonl").write_text(
        "".join(json.dumps({"current_steps": s, "loss": 2.0 - s / 100, "lr": 1e-4}) + "\n" for s in (5, 10, 15))
    )
    return output_dir


def test_page_holds_every_part_from_the_records(tmp_path):
    run = _gpu_run(tmp_path / "diverged")
    write_summary(run)
    html = (run / SUMMARY_HTML).read_text()
    page = parse(html)

    for chart in ("chart-loss", "chart-grad-norm", "chart-lr", "chart-throughput", "chart-memory"):
        figure = page.by_id(chart)
        assert figure is not None and list(figure.iter("svg")) and list(figure.iter("path")), chart
    memory = dict(row for row in page.by_id("memory").rows() if len(row) == 2)
    assert memory["measured peak, GiB (rank 0, torch.cuda.max_memory_allocated)"] == "31.20"
    assert memory["planner's estimate, GiB per GPU (rocmft.render.memfit)"] == "30.00"
    assert memory["measured / estimated"] == "1.04" and memory["estimate: weights"] == "14.2"
    assert "plan's estimate" in page.by_id("chart-memory").text()  # the estimate is a line on the memory chart

    ending = dict(page.by_id("ending").rows())
    assert ending["status"] == "non-finite loss" and ending["exit code"] == "5 (NON_FINITE_LOSS)"
    assert ending["stopped by"] == "non-finite loss: loss = nan at step 15" and ending["last step"] == "15 of 40"
    assert page.by_id("restarts").rows()[1] == ["1", "non-finite loss", "15", "checkpoint-10", "bf16 → fp32",
                                                "unchanged"]  # fmt: skip

    checks = page.by_id("checks").rows()[1:]
    assert [row[:3] for row in checks] == [["gpus", "pass", "1 GPU"], ["cpus", "warn", "2 CPU(s), need 3"]]
    assert "→ Give the task more CPUs" in checks[1][3]
    assert page.by_id("plan").rows()[1:] == [
        ["per_device_train_batch_size", "8", "planned", "the largest micro-batch that fits"],
        ["neat_packing", "False", "kept", "given by the user"],
    ]
    settings = {row[0]: row[1:] for row in page.by_id("settings").rows()[1:]}
    assert settings["learning_rate"] == ["0.0002", "environment variable", "LEARNING_RATE"]
    assert settings["dataset"] == [HOSTILE, "ROCMFT_CONFIG file", "/config/my.yaml"]  # shown as text, not markup
    assert settings["lora_target"][:2] == ['["q_proj", "v_proj"]', "planner"]
    knobs = {row[0]: row[1:] for row in page.by_id("knobs").rows()[1:]}
    assert knobs == {"ROCMFT_PRECISION": ["fp32", "the restart after a non-finite loss at step 15"],
                     "ROCMFT_ZERO_STAGE": ["2", "set by the user"]}  # fmt: skip

    # escaped, and nothing to fetch: no script, every reference inside the page, a policy that forbids the rest
    assert "<script" not in html and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;amp;" in html
    links = [v for e in page.iter() for k, v in e.attrs.items() if k in ("src", "href", "xlink:href")]
    assert links and all(link.startswith("#") for link in links), links
    policy = next(e for e in page.iter("meta") if e.attrs.get("http-equiv") == "Content-Security-Policy")
    assert policy.attrs["content"].startswith("default-src 'none'")


# A manifest the page cannot use, and one whose parts hold values of other types (a plan's estimate as text, ...)
ODD_MANIFESTS = ["[1]", json.dumps({
    "plan": {"estimate_gib": "30", "choices": []}, "argument_source_kinds": {"lr": []}, "arguments": {"lr": 1},
    "settings": {"rocmft": [1], "explicit_rocmft": 5, "rocmft_overrides": "x", "secrets_given": {"a": 1}},
})]  # fmt: skip
# A worker record that is not one (no loss: no series at all), and one of odd values beside a loss
ODD_WORKERS = ['{"losses": [{"step": 1}]}', json.dumps({"peak_gpu_memory_gib": "31", "non_finite": {
    "step": 3, "key": "loss", "value": "nan", "median": "x"}, "losses": [{"step": 1, "loss": 2.0,
    "gpu_memory_gib": "a", "peak_gpu_memory_gib": "b"}]})]  # fmt: skip


@pytest.mark.parametrize("case", [0, 1])
def test_page_of_a_run_with_damaged_records(tmp_path, case):
    """A run folder whose records are missing or damaged still gets its page, each part saying what is missing."""
    run = tmp_path / "broken"
    (run / "rocmft").mkdir(parents=True)
    (run / "rocmft" / "manifest.json").write_text(ODD_MANIFESTS[case])
    (run / "rocmft" / "worker-result.json").write_text(ODD_WORKERS[case])
    (run / "rocmft" / "checks.json").write_text('{"checks": [{"status": "pass"}]}')  # a row without an id
    write_summary(run)
    page = parse((run / SUMMARY_HTML).read_text())
    assert page.by_id("checks").text() == "No checks.json: the checks were not run for this run."
    assert page.by_id("plan-note").text() == "No plan recorded."
    assert dict(page.by_id("ending").rows())["status"] == "unknown"
    assert dict(page.by_id("memory").rows())["measured peak, GiB (rank 0, torch.cuda.max_memory_allocated)"] == (
        "not measured (a CPU run, or no step logged)"
    )
    if case == 0:
        assert page.by_id("chart-loss").text() == "Loss not recorded" and page.by_id("final-loss").text() == "–"
    else:  # the worker's own losses stand in for LLaMA-Factory's log
        assert list(page.by_id("chart-loss").iter("svg")) and page.by_id("final-loss").text() == "2"
        assert dict(page.by_id("ending").rows())["stopped by"] == "non-finite loss: loss = nan at step 3"
        assert page.by_id("knobs").rows() == [["rocmft setting", "value", "source"]]
        assert page.by_id("settings").rows()[1] == ["lr", "1", "–", "–"]


def test_a_worker_record_without_max_steps_reads_total_unknown(tmp_path):
    """No trainer_state.json and a worker record without max_steps (damaged, or cut short by another program): the
    summary said "steps: 1 of None"; it says the total is not recorded (a break-it trial, 2026-12-05)."""
    from rocmft.outputs.report import run_facts, summary_rows

    run = tmp_path / "cut"
    (run / "rocmft").mkdir(parents=True)
    Manifest(status="running").write(run / "rocmft" / "manifest.json")
    for record in ('{"last_step": 1, "losses": [{"step": 1, "loss": 2.0}]}', '{"last_step": 1, "max_steps": "x"}'):
        (run / "rocmft" / "worker-result.json").write_text(record)
        assert dict(summary_rows(run_facts(run)))["steps"] == "1 (total not recorded)"
    write_summary(run)
    assert "| steps | 1 (total not recorded) |" in (run / "run_summary.md").read_text()
    assert dict(parse((run / SUMMARY_HTML).read_text()).by_id("ending").rows())["last step"] == "1 (total not recorded)"
