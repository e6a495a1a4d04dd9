"""The tests' in-process `rocmft` (conftest's rocmft_here, tests/support/inprocess.py): what the command sees and
what it leaves in the pytest process. Each runs a real command that is refused before any process starts."""

from __future__ import annotations

import os

import pytest

from rocmft.errors import ExitCode


def test_worker_commands_are_refused_in_process(rocmft_here):
    for command in ("train", "export", "chat", "serve"):
        with pytest.raises(pytest.fail.Exception, match="run it in a child process"):
            rocmft_here(command)


def test_an_argparse_error_is_a_return_code_and_the_environment_and_folder_come_back(rocmft_here, monkeypatch):
    monkeypatch.setenv("LEARNING_RATE", "abc")  # the test process's own: os.environ is replaced, so unseen
    before, folder = dict(os.environ), os.getcwd()
    result = rocmft_here("render", "--no-such-option")
    assert result.returncode == 2 and "unrecognized arguments: --no-such-option" in result.stdout, result.stdout
    assert dict(os.environ) == before and os.getcwd() == folder
    seen = rocmft_here("render", env={"OUTPUT_DIR": "out", "FP16": "true", "BF16": "true"})
    assert seen.returncode == ExitCode.CONFIG_ERROR and "LEARNING_RATE" not in seen.stdout, seen.stdout
    assert dict(os.environ) == before and os.getcwd() == folder


def test_stderr_apart_and_a_bad_test_hook_refused_and_uninstalled(rocmft_here, tmp_path):
    from rocmft import testhooks

    result = rocmft_here("render", env={"ROCMFT_TEST_PROBES": str(tmp_path / "none.json")}, merge_stderr=False)
    assert result.returncode == ExitCode.CONFIG_ERROR and result.stdout == ""
    assert "CONFIGURATION ERROR: ROCMFT_TEST_PROBES=" in result.stderr and "cannot be read as JSON" in result.stderr
    assert testhooks.installed() is None


def test_a_refused_command_leaves_no_parser_child_or_probe_behind(rocmft_here, tmp_path):
    from rocmft import validate
    from rocmft.facts import device

    result = rocmft_here("check", env={"FP16": "true", "BF16": "true", "OUTPUT_DIR": str(tmp_path / "out")})
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stdout
    assert "BF16" in result.stdout and not (tmp_path / "out").exists()
    assert validate._validator is None and validate._kept is None and not device._probes
