"""Issue 29, "findings, all at once" within a rule: a rule that checks several independent things reports every one
it finds, each as its own finding with the rule's code and its own settings, in the order the rule checks them
(``with independent():``, rocmft.validate.rules); a rule whose later checks need the earlier ones stops at its
first; outside findings() a rule raises at its first problem as it always did. Exit 2 and nothing written hold."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from conftest import rocmft_in
from rocmft.config.provenance import Source
from rocmft.errors import ConfigError, ConfigErrors, ExitCode
from rocmft.findings import note
from rocmft.validate.rules import Rule, findings, independent
from rocmft.validate.rules.common import named
from support.conflicts import raised_in

# Independent mistakes, several in each of three rules of the rendered phase (ranges.py).
MANY = {"LORA_DROPOUT": "5", "WARMUP_RATIO": "2", "NUM_TRAIN_EPOCHS": "0", "LORA_RANK": "0", "CUTOFF_LEN": "999999",
        "LORA_ALPHA": "-1", "MAX_GRAD_NORM": "-1", "MAX_SAMPLES": "0"}  # fmt: skip
# (code, the settings of the finding), in rule order, then in the order each rule checks them.
MANY_FINDINGS = [
    ("ranges.more_ranges", [("lora_dropout", "5", "LORA_DROPOUT")]),
    ("ranges.more_ranges", [("warmup_ratio", "2", "WARMUP_RATIO")]),
    ("ranges.more_ranges", [("num_train_epochs", "0", "NUM_TRAIN_EPOCHS"), ("max_steps", None, None)]),
    ("ranges.ranges", [("lora_rank", "0", "LORA_RANK")]),
    ("ranges.ranges", [("cutoff_len", "999999", "CUTOFF_LEN")]),
    ("ranges.more_values", [("lora_alpha", "-1", "LORA_ALPHA")]),
    ("ranges.more_values", [("max_grad_norm", "-1", "MAX_GRAD_NORM")]),
    ("ranges.more_values", [("max_samples", "0", "MAX_SAMPLES")]),
]


def _refused(render_env, environ: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        render_env(environ)
    return caught.value


def _shape(found) -> list[tuple[str, list[tuple[str, str | None, str | None]]]]:
    return [(f.code, [(s.name, s.value, s.source) for s in f.settings]) for f in found if f.severity == "error"]


def test_several_mistakes_in_one_rule_are_each_a_finding_in_the_order_checked(render_env, tmp_path):
    first, second = _refused(render_env, MANY), _refused(render_env, MANY)
    assert isinstance(first, ConfigErrors) and first.code == ExitCode.CONFIG_ERROR == 2
    assert _shape(first.findings) == MANY_FINDINGS
    assert [f.to_json() for f in second.findings] == [f.to_json() for f in first.findings]  # stable
    assert len(first.errors) == len(MANY_FINDINGS) == str(first).count("\n  fix: ")
    messages = [f.message.split(" ")[0] for f in first.findings if f.severity == "error"]
    assert messages == ["LORA_DROPOUT=5", "WARMUP_RATIO=2", "NUM_TRAIN_EPOCHS=0", "LORA_RANK=0", "CUTOFF_LEN=999999",
                        "LORA_ALPHA=-1", "MAX_GRAD_NORM=-1", "MAX_SAMPLES=0"]  # fmt: skip
    # each recorded refusal keeps the traceback of its raise, through the rule that raised it
    for err, finding in zip(first.errors, first.findings, strict=True):
        assert finding.code.split(".")[1] in raised_in(err), finding.code
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_inputs_phase_reports_each_distributed_and_allocator_problem(render_env):
    err = _refused(render_env, {"ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_ZERO_STAGE": "3",
                                "ROCMFT_OFFLOAD": "optimizer+params",
                                "PYTORCH_ALLOC_CONF": "expandable_segments:true,max_split_size_mb:10"})  # fmt: skip
    assert isinstance(err, ConfigErrors)
    assert _shape(err.findings) == [
        ("distributed.distributed", [("ROCMFT_ZERO_STAGE", "3", "ROCMFT_ZERO_STAGE"),
                                     ("ROCMFT_DISTRIBUTED", "ddp", "ROCMFT_DISTRIBUTED")]),
        # an offload already refused for the strategy is not refused again for its ZeRO stage
        ("distributed.distributed", [("ROCMFT_OFFLOAD", "optimizer+params", "ROCMFT_OFFLOAD"),
                                     ("ROCMFT_DISTRIBUTED", "ddp", "ROCMFT_DISTRIBUTED")]),
        ("runtime.allocator_variables", [("PYTORCH_ALLOC_CONF", "expandable_segments:true,max_split_size_mb:10",
                                          "PYTORCH_ALLOC_CONF")]),
        ("runtime.allocator_variables", [("PYTORCH_ALLOC_CONF", "expandable_segments:true,max_split_size_mb:10",
                                          "PYTORCH_ALLOC_CONF")]),
    ]  # fmt: skip
    assert ": expandable_segments:true — " in err.findings[2].message
    assert ": max_split_size_mb:10 — " in err.findings[3].message


@pytest.mark.slow  # starts rocmft, LLaMA-Factory's parser or a trainer as a process (not the fast layer)
def test_the_cli_prints_a_block_for_each_problem_the_count_and_the_json(tmp_path, cache_dir, tiny_model):
    output = tmp_path / "out"
    mistakes = {"LORA_DROPOUT": "5", "NUM_TRAIN_EPOCHS": "0", "LORA_RANK": "0", "CUTOFF_LEN": "999999"}
    env = {"OUTPUT_DIR": str(output), "MODEL_NAME_OR_PATH": str(tiny_model), **mistakes}
    result = rocmft_in(tmp_path, cache_dir, "render", "--json", env=env, merge_stderr=False)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr[-3000:]
    blocks = re.findall(r"^\[rocmft\] CONFIGURATION ERROR: (.*)\n  fix: ", result.stderr, flags=re.M)
    assert [b.split(" ")[0] for b in blocks] == ["LORA_DROPOUT=5", "NUM_TRAIN_EPOCHS=0", "LORA_RANK=0",
                                                 "CUTOFF_LEN=999999"], result.stderr  # fmt: skip
    assert result.stderr.rstrip().endswith("[rocmft] 4 configuration errors; nothing was written.")
    assert not output.exists() or not any(output.iterdir())
    document = json.loads(result.stdout.strip().splitlines()[-1])
    assert document["exit_code"] == 2
    errors = [f for f in document["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == ["ranges.more_ranges"] * 2 + ["ranges.ranges"] * 2
    assert [[s["name"] for s in f["settings"]] for f in errors] == [["lora_dropout"], ["num_train_epochs", "max_steps"],
                                                                    ["lora_rank"], ["cutoff_len"]]  # fmt: skip
    assert all(f["message"] and f["fix"] for f in errors)


# --- the mechanism, on rules of its own --------------------------------------------------------------------------


def _run() -> SimpleNamespace:
    return SimpleNamespace(arguments={"template": '"qwen"', "cutoff_len": 9, "lora_rank": 0},
                           sources={"template": Source.environment("TEMPLATE"),
                                    "cutoff_len": Source.environment("CUTOFF_LEN"),
                                    "lora_rank": Source.environment("LORA_RANK")},
                           settings=SimpleNamespace(given={}))  # fmt: skip


def _rules(*fns, masks=()) -> list[Rule]:
    return [Rule(name=fn.__name__, phase="rendered", order=i, fn=fn, masks=fn in masks) for i, fn in enumerate(fns)]


def two_and_a_stop(run):
    with independent():
        raise ConfigError(f"{named(run, 'cutoff_len')} is too long.", "Shorter.")
    with independent():
        # a setting noted after the first refusal is no part of it, whatever its text
        note("template", '"qwen"', "TEMPLATE", "CUTOFF_LEN=9 (set in the environment)")
        raise ConfigError(f"{named(run, 'lora_rank')} must be positive.", "Positive.")
    raise ConfigError(f"{named(run, 'template')} is unknown.", "Another.")  # outside a block: ends the rule


def two_and_warnings(run):
    for name in ("cutoff_len", "lora_rank"):
        with independent():
            raise ConfigError(f"{named(run, name)} is wrong.", "Fix it.")
    return ["a warning"]


def test_findings_records_each_refusal_with_its_own_settings_and_the_rule_goes_on(monkeypatch):
    import rocmft.validate.rules as rules

    monkeypatch.setattr(rules, "registered", lambda phase: _rules(two_and_a_stop, two_and_warnings))
    found, raised = findings("rendered", _run())
    assert [(f.code, f.severity, f.message.split(" ")[0]) for f in found] == [
        ("test_findings_per_rule.two_and_a_stop", "error", "CUTOFF_LEN=9"),
        ("test_findings_per_rule.two_and_a_stop", "error", "LORA_RANK=0"),
        ("test_findings_per_rule.two_and_a_stop", "error", 'TEMPLATE="qwen"'),
        ("test_findings_per_rule.two_and_warnings", "error", "CUTOFF_LEN=9"),
        ("test_findings_per_rule.two_and_warnings", "error", "LORA_RANK=0"),
        ("test_findings_per_rule.two_and_warnings", "warning", "a"),  # a rule's errors, then its warnings
    ]
    assert [[s.name for s in f.settings] for f in found] == [["cutoff_len"], ["lora_rank"], ["template"],
                                                             ["cutoff_len"], ["lora_rank"], []]  # fmt: skip
    assert len(raised) == 5 and all(type(err) is ConfigError for err in raised)
    with pytest.raises(ConfigErrors) as caught:
        rules.apply("rendered", _run())
    assert caught.value.findings == tuple(found)


def test_outside_findings_a_rule_raises_at_its_first_problem_as_before():
    with pytest.raises(ConfigError, match=r"^CUTOFF_LEN=9 .* is too long"):
        two_and_a_stop(_run())
    with independent():
        pass  # a block without a refusal is nothing
    with pytest.raises(KeyError), independent():
        raise KeyError("not a refusal: never recorded")


def test_one_problem_through_independent_is_raised_as_it_was(monkeypatch):
    import rocmft.validate.rules as rules

    def one(run):
        with independent():
            raise ConfigError(f"{named(run, 'cutoff_len')} is too long.", "Shorter.")
        with independent():
            pass  # a check that passes

    monkeypatch.setattr(rules, "registered", lambda phase: _rules(one))
    with pytest.raises(ConfigError) as caught:
        rules.apply("rendered", _run())
    assert type(caught.value) is ConfigError and str(caught.value) == (
        "CUTOFF_LEN=9 (set in the environment) is too long.\n  fix: Shorter."
    )
    assert "one" in raised_in(caught.value)


def test_a_masking_rule_keeps_each_of_its_findings_and_masks_later_rules(monkeypatch):
    import rocmft.validate.rules as rules

    def text(run):
        with independent():
            raise ConfigError(f"quoted {named(run, 'template')}.", "Unquote.")
        with independent():
            raise ConfigError(f"also odd: {named(run, 'template')}.", "Fix the text.")

    def about_template(run):
        with independent():
            raise ConfigError(f"unknown {named(run, 'template')}.", "Pick another.")
        raise ConfigError(f"{named(run, 'cutoff_len')} is too long.", "Shorter.")

    monkeypatch.setattr(rules, "registered", lambda phase: _rules(text, about_template, masks=(text,)))
    found, _ = findings("rendered", _run())
    assert [f.message.split(" ")[0] for f in found] == ["quoted", "also", "CUTOFF_LEN=9"]


def test_a_crash_after_the_rules_own_refusal_keeps_the_refusal(monkeypatch):
    import rocmft.validate.rules as rules

    def refuses_then_crashes(run):
        with independent():
            raise ConfigError(f"{named(run, 'cutoff_len')} is too long.", "Shorter.")
        raise KeyError("input the refusal above is about")

    def crashes(run):
        raise KeyError("a bug")

    monkeypatch.setattr(rules, "registered", lambda phase: _rules(refuses_then_crashes))
    found, raised = findings("rendered", _run())
    assert [f.message.split(" ")[0] for f in found] == ["CUTOFF_LEN=9"] and len(raised) == 1
    monkeypatch.setattr(rules, "registered", lambda phase: _rules(crashes, refuses_then_crashes))
    with pytest.raises(KeyError):
        findings("rendered", _run())
