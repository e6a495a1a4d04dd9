"""Issue 21, item 2: every refusal is complete. Each conflict rule of the registry (rocmft.validate.rules) is driven
with a configuration that breaks it (the table tests/support/conflicts.py, shared with the provenance property of
tests/test_provenance.py), through the real path (load_settings, render_checked, and the launch rules as
prepare_launch applies them), and its message must name every setting involved, with the value as the user wrote it
and where each came from, and come with a fix.

The list of rules is the registry's, not a hand-made one: a new rule with neither a case in :data:`CONFLICTS` nor a
reason in :data:`ONE_SETTING` fails :func:`test_every_registered_rule_has_a_case`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rocmft.errors import ConfigError
from rocmft.validate.rules import PHASES, registered
from support.conflicts import CONFLICTS, ONE_SETTING, PROCESS_VARIABLES, device, raised_in


def test_every_registered_rule_has_a_case():
    """A rule added to the registry without a conflict case (or a reason it refuses one setting) fails here."""
    names = [r.name for phase in PHASES for r in registered(phase)]
    assert len(names) == len(set(names))
    assert not set(CONFLICTS) & set(ONE_SETTING)
    assert set(names) == set(CONFLICTS) | set(ONE_SETTING), (
        f"without a case: {sorted(set(names) - set(CONFLICTS) - set(ONE_SETTING))}; "
        f"cases of no rule: {sorted(set(CONFLICTS) | set(ONE_SETTING) - set(names))}"
    )


@pytest.mark.parametrize("rule", list(CONFLICTS))
def test_each_conflict_names_both_settings_their_values_sources_and_a_fix(
    rule, tmp_path, cache_dir, tiny_model, shared_data, bf16_checkpoint, monkeypatch
):
    from rocmft.config.settings import load_settings
    from rocmft.validate.rules import apply, render_checked

    case = CONFLICTS[rule]
    data = tmp_path / "data"
    data.mkdir()
    for name in ("alpaca_en_demo.json", "dpo_en_demo.json", "identity.json"):
        shutil.copy(shared_data / name, data / name)
    shutil.copytree(tiny_model, tmp_path / "model")
    fill = {"{tmp}": str(tmp_path), "{model}": str(tiny_model), "{data}": str(data), "{bf16}": str(bf16_checkpoint)}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    for name, content in case.files.items():
        (tmp_path / name).write_text(content)
    environ = {"ROCMFT_CACHE_DIR": str(cache_dir), "OUTPUT_DIR": str(tmp_path / "out"),
               "MODEL_NAME_OR_PATH": str(tiny_model)}  # fmt: skip
    if case.yaml is not None:
        (tmp_path / "my.yaml").write_text(case.yaml)
        environ["ROCMFT_CONFIG"] = str(tmp_path / "my.yaml")
    environ.update({k: filled(v) for k, v in case.environ.items()})
    for name in PROCESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in case.process.items():
        monkeypatch.setenv(name, value)

    def make_staging(output_dir: Path) -> Path:
        (tmp_path / "staging").mkdir(exist_ok=True)
        return tmp_path / "staging"

    with pytest.raises(ConfigError) as caught:
        plan = render_checked(load_settings({**environ, **case.process}), device(case.gpus), make_staging)
        apply("launch", plan)  # as rocmft.launch.prepare_launch does
    err = caught.value
    assert rule in raised_in(err), (rule, str(err))
    message = err.message
    for named, source in case.involved:
        assert filled(named) in message, (filled(named), message)
        assert filled(source) in message, (filled(source), message)
    assert err.remedy.strip(), message  # a fix
