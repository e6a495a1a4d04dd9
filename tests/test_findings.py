"""Issue 29: a configuration with several mistakes is refused with all of them at once (rocmft.findings), each with a
stable code and the settings it names, in rule order; ``--json`` prints them as one JSON line; a single refusal
reads exactly as before; exit 2 and nothing written hold."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import rocmft_in
from rocmft.config.provenance import Source
from rocmft.errors import ConfigError, ConfigErrors, ExitCode
from rocmft.findings import Finding, Setting
from rocmft.validate.rules import PHASES, Rule, findings, registered

# Three independent mistakes, each refused by its own rule of the rendered phase.
THREE = {"LORA_DROPOUT": "5", "TEMPLATE": '"qwen"', "CUTOFF_LEN": "999999"}
THREE_CODES = ["hygiene.quoted_values", "ranges.more_ranges", "ranges.ranges"]
THREE_SETTINGS = [("template", '"qwen"', "TEMPLATE"), ("lora_dropout", "5", "LORA_DROPOUT"),
                  ("cutoff_len", "999999", "CUTOFF_LEN")]  # fmt: skip
# The golden single refusal: printed exactly as before findings existed.
DROPOUT = ("LORA_DROPOUT=5 (set in the environment) must be in [0, 1).\n"
           "  fix: A fraction: LORA_DROPOUT=0.05 if you meant 5 %.")  # fmt: skip


def _refused(render_env, environ: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        render_env(environ)
    return caught.value


def test_three_independent_mistakes_are_all_reported_in_one_run_in_rule_order(render_env, tmp_path):
    first, second = _refused(render_env, THREE), _refused(render_env, THREE)
    assert isinstance(first, ConfigErrors) and first.code == ExitCode.CONFIG_ERROR == 2
    codes = [f.code for f in first.findings if f.severity == "error"]
    assert codes == THREE_CODES
    assert [f.to_json() for f in second.findings] == [f.to_json() for f in first.findings]  # stable
    assert [(s.name, s.value, s.source) for f in first.findings for s in f.settings] == THREE_SETTINGS
    # TEMPLATE="qwen" is refused for its quotes only, not again as an unknown template (masked)
    assert "template.template" not in codes
    assert str(first).count("\n  fix: ") == 3 and str(first).startswith("Values with their quotes still on")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_inputs_phase_reports_its_refusals_together_with_rocmfts_own_settings(render_env):
    err = _refused(render_env, {"FP16": "1", "BF16": "1", "ROCMFT_DISTRIBUTED": "ddp", "ROCMFT_ZERO_STAGE": "3"})
    assert isinstance(err, ConfigErrors)
    assert [f.code for f in err.findings] == ["precision.precision", "distributed.distributed"]
    assert [(s.name, s.value, s.source) for s in err.findings[1].settings] == [
        ("ROCMFT_ZERO_STAGE", "3", "ROCMFT_ZERO_STAGE"),
        ("ROCMFT_DISTRIBUTED", "ddp", "ROCMFT_DISTRIBUTED"),
    ]


def test_an_unknown_variable_is_reported_with_the_rules_findings_not_alone(render_env, tmp_path):
    """A misspelled name and three bad values: all four in one run, the unknown variable first (a newcomer's trial,
    2026-12-05: it was refused alone while the settings were read, the rules' findings only after a second run)."""
    err = _refused(render_env, {"LERANING_RATE": "1e-4", **THREE})
    assert isinstance(err, ConfigErrors) and err.code == ExitCode.CONFIG_ERROR
    assert [f.code for f in err.findings if f.severity == "error"] == ["config", *THREE_CODES]
    unknown = err.findings[0]
    assert unknown.message.startswith("Unknown settings:") and "Did you mean LEARNING_RATE?" in unknown.message
    assert [(s.name, s.value, s.source, s.kind) for s in unknown.settings] == [
        ("LERANING_RATE", None, "LERANING_RATE", "environment")]  # fmt: skip
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_unknown_variable_and_a_value_of_the_wrong_type_are_read_together(render_env):
    err = _refused(render_env, {"ROCMFT_PRECISSION": "bf16", "CUTOFF_LEN": "2k"})
    assert isinstance(err, ConfigErrors)
    assert [f.message.split(":")[0] for f in err.findings] == ["Unknown settings", "Invalid training arguments"]
    assert "ROCMFT_PRECISSION is not a rocmft setting" in str(err) and "CUTOFF_LEN='2k'" in str(err)


def test_an_unknown_variable_alone_reads_as_before_and_never_shows_its_value(render_env, tmp_path):
    from rocmft.config.settings import load_settings

    err = _refused(render_env, {"ROCMFT_HF_TOKEN": "hf_rocmftUnknownSecret1"})
    assert type(err) is ConfigError and str(err).startswith("Unknown settings:\n  ROCMFT_HF_TOKEN is not a rocmft")
    assert "hf_rocmftUnknownSecret1" not in str(err) + json.dumps([f.to_json() for f in err.reported()])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    # the commands that run no rules (report, export, serve, chat) still refuse while reading the settings
    with pytest.raises(ConfigError, match="ROCMFT_HF_TOKEN is not a rocmft setting"):
        load_settings({"ROCMFT_HF_TOKEN": "x"})


@pytest.mark.slow  # starts rocmft, LLaMA-Factory's parser or a trainer as a process (not the fast layer)
def test_the_cli_prints_every_refusal_and_the_json_holds_the_same_codes_and_settings(tmp_path, cache_dir, tiny_model):
    output = tmp_path / "out"
    env = {"OUTPUT_DIR": str(output), "MODEL_NAME_OR_PATH": str(tiny_model), **THREE}
    result = rocmft_in(tmp_path, cache_dir, "render", "--json", env=env, merge_stderr=False)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr[-3000:]
    blocks = re.findall(r"^\[rocmft\] CONFIGURATION ERROR: (.*)\n  fix: ", result.stderr, flags=re.M)
    assert [b.split(" ")[0] for b in blocks] == ["Values", "LORA_DROPOUT=5", "CUTOFF_LEN=999999"], result.stderr
    assert result.stderr.rstrip().endswith("[rocmft] 3 configuration errors; nothing was written.")
    assert not output.exists() or not any(output.iterdir())
    document = json.loads(result.stdout.strip().splitlines()[-1])
    assert document["exit_code"] == 2
    assert [f["code"] for f in document["findings"] if f["severity"] == "error"] == THREE_CODES
    assert [(s["name"], s["value"], s["source"]) for f in document["findings"] for s in f["settings"]] == THREE_SETTINGS
    assert all(f["message"] and f["fix"] for f in document["findings"])


@pytest.mark.slow  # rocmft check as a process
def test_a_single_refusal_reads_exactly_as_before(render_env, tmp_path, cache_dir, tiny_model):
    err = _refused(render_env, {"LORA_DROPOUT": "5"})
    assert type(err) is ConfigError and str(err) == DROPOUT  # the rule's own error, as it raised it
    # the phase's warnings come along: the template's CUTOFF_LEN=2048 is beyond the tiny model's context
    assert [(f.code, f.severity) for f in err.findings] == [("ranges.more_ranges", "error"), ("ranges.ranges",
                                                                                               "warning")]  # fmt: skip
    output = tmp_path / "cli-out"
    env = {"OUTPUT_DIR": str(output), "MODEL_NAME_OR_PATH": str(tiny_model), "LORA_DROPOUT": "5"}
    result = rocmft_in(tmp_path, cache_dir, "check", "--json", env=env, merge_stderr=False)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr[-3000:]
    assert f"[rocmft] CONFIGURATION ERROR: {DROPOUT}\n" in result.stderr
    assert "configuration errors" not in result.stderr and result.stderr.count("CONFIGURATION ERROR") == 1
    assert "WARNING: CUTOFF_LEN=2048 (the default in train.yaml.j2) is beyond" in result.stdout
    document = json.loads(result.stdout.strip().splitlines()[-1])
    assert document["findings"][1]["severity"] == "warning" and document["findings"][1]["code"] == "ranges.ranges"
    assert document["findings"][1]["settings"] == [
        {"name": "cutoff_len", "value": "2048", "source": "the default in train.yaml.j2", "kind": "template"}
    ]
    message, fix = DROPOUT.split("\n  fix: ")
    golden = {"code": "ranges.more_ranges", "severity": "error", "message": message, "fix": fix,
              "settings": [{"name": "lora_dropout", "value": "5", "source": "LORA_DROPOUT",
                            "kind": "environment"}]}  # fmt: skip
    assert document == {"exit_code": 2, "findings": [golden, document["findings"][1]]}
    assert not output.exists() or not any(output.iterdir())


def test_a_refusal_outside_the_rules_is_one_finding_of_code_config_and_json_may_stand_anywhere(capsys):
    from rocmft.cli import main

    # `--json` between the YAML and the overrides: the overrides after it are still read (HF_TOKEN is refused)
    assert main(["render", "my.yaml", "--json", "HF_TOKEN=hf_x"]) == ExitCode.CONFIG_ERROR
    printed = capsys.readouterr()
    assert "CONFIGURATION ERROR: `HF_TOKEN` on the command line is a secret" in printed.err
    (finding,) = json.loads(printed.out.strip().splitlines()[-1])["findings"]
    assert finding["code"] == "config" and finding["severity"] == "error" and finding["settings"] == []
    assert "hf_x" not in printed.out + printed.err


def _rules(*fns, masks=()) -> list[Rule]:
    return [Rule(name=fn.__name__, phase="rendered", order=i, fn=fn, masks=fn in masks) for i, fn in enumerate(fns)]


def test_findings_collects_warnings_passes_over_a_crash_after_a_refusal_and_masks(monkeypatch):
    import rocmft.validate.rules as rules

    def warns(run):
        return ["careful"]

    def quoted(run):
        raise ConfigError(f"quoted {rules_named(run, 'template')}.", "Unquote it.")

    def about_template(run):
        raise ConfigError(f"unknown {rules_named(run, 'template')}.", "Pick another.")

    def crashes(run):
        raise KeyError("a value the refusal above is about")

    def independent(run):
        raise ConfigError("CUTOFF_LEN=9 (set in the environment) is too long.", "Shorter.")

    from rocmft.validate.rules.common import named as rules_named

    def Run():
        return SimpleNamespace(arguments={"template": '"qwen"', "cutoff_len": 9},
                               sources={"template": Source.environment("TEMPLATE"),
                                        "cutoff_len": Source.environment("CUTOFF_LEN")},
                               settings=SimpleNamespace(given={}))  # fmt: skip

    monkeypatch.setattr(rules, "registered", lambda phase: _rules(warns, quoted, about_template, crashes, independent,
                                                                   masks=(quoted,)))  # fmt: skip
    found, raised = findings("rendered", Run())
    assert [(f.code, f.severity) for f in found] == [("test_findings.warns", "warning"),
                                                     ("test_findings.quoted", "error"),
                                                     ("test_findings.independent", "error")]  # fmt: skip
    assert found[1].settings == (Setting("template", '"qwen"', "TEMPLATE", 'TEMPLATE="qwen" (set in the environment)',
                                         kind="environment"),)  # fmt: skip
    assert [(s.name, s.value, s.source) for s in found[2].settings] == [("cutoff_len", "9", "CUTOFF_LEN")]
    assert len(raised) == 2
    with pytest.raises(ConfigErrors) as caught:
        rules.apply("rendered", Run())
    assert caught.value.findings == tuple(found)
    # without a refusal before it, a rule's crash is a bug and is not hidden
    monkeypatch.setattr(rules, "registered", lambda phase: _rules(crashes, independent))
    with pytest.raises(KeyError):
        findings("rendered", Run())


def test_every_rule_code_is_documented():
    documented = Path(__file__).resolve().parents[1].joinpath("docs", "rules.md").read_text(encoding="utf-8")
    missing = [r.code for phase in PHASES for r in registered(phase) if f"`{r.code}`" not in documented]
    assert missing == []
    assert "`config`" in documented


def test_a_finding_prints_as_a_config_error_does():
    finding = Finding("ranges.more_ranges", "error", "X=1 is wrong.", "Set X=0.")
    assert str(finding) == str(ConfigError("X=1 is wrong.", "Set X=0.")) == "X=1 is wrong.\n  fix: Set X=0."
