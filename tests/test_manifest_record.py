"""The run manifest as a typed, versioned record (rocmft.records.Manifest): its one writer and its one reader.

Fast: no settings, no render. What `rocmft train` writes into it end to end is tested in test_train.py and the
commands that read it in test_cli.py, test_export.py and test_serve_command.py."""

from __future__ import annotations

import json

import pytest

from rocmft.errors import ConfigError
from rocmft.records import SCHEMA_VERSION, Manifest, Restart, read_manifest


def test_a_written_manifest_reads_back_equal_with_its_schema_version_first(tmp_path):
    restart = Restart(cause="non-finite loss", at_step=7, from_checkpoint=None, precision_from="bf16")
    written = Manifest(status="finished", exit_code=0, started_at="2026-01-02T03:04:05+00:00", command=("rocmft",),
                       arguments={"stage": "sft"}, worker={"world_size": 2}, restarts=(restart,))  # fmt: skip
    path = written.write(tmp_path / "manifest.json")
    data = json.loads(path.read_text())
    assert next(iter(data)) == "schema_version" and data["schema_version"] == SCHEMA_VERSION
    assert data["restarts"] == [restart.as_dict()] and data["command"] == ["rocmft"]
    assert read_manifest(path) == written


def test_an_older_manifest_without_a_schema_version_reads_as_version_1(tmp_path):
    """A manifest of rocmft before the field, and one that has only some keys (missing ones take defaults)."""
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"status": "finished", "arguments": {"finetuning_type": "full"}, "versions": None,
                                "unknown-later-key": 1}))  # fmt: skip
    manifest = read_manifest(path)
    assert manifest.schema_version == 1 and manifest.status == "finished" and manifest.exit_code is None
    assert manifest.arguments == {"finetuning_type": "full"} and manifest.versions == {}  # null reads as empty
    assert manifest.worker is None and manifest.restarts == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "Expecting property name"),
        ("[]", "it is not a JSON object"),
        ('{"worker": []}', "its 'worker' is list"),
        ('{"started_at": 3}', "its 'started_at' is int"),
        ('{"exit_code": true}', "its 'exit_code' is bool"),
        ('{"schema_version": 0}', "'schema_version' is 0"),
        ('{"restarts": [{"cause": "x"}]}', "'restarts' holds an entry that is not a restart"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_file_and_the_fix(tmp_path, text, words):
    path = tmp_path / "manifest.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as raised:
        read_manifest(path, how="given as run")
    assert f"The run record {path} (given as run) cannot be read" in raised.value.message
    assert words in raised.value.message and "rocmft train" in raised.value.remedy


def test_a_missing_or_undecodable_manifest_is_refused_too(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        read_manifest(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_bytes(b'{"status": "caf\xe9"}')
    with pytest.raises(ConfigError, match="cannot be read"):
        read_manifest(tmp_path / "manifest.json")
