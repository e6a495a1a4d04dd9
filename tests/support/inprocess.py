"""TEST ONLY: `rocmft render|plan|check|status` run in the pytest process instead of a child process.

A child `rocmft` costs ~10 s wall and ~13 CPU-seconds on our 2-core machine, nearly all of it imports (issue 29);
in the pytest process those imports are paid once. :func:`run_in_process` gives the test what
tests/conftest.py's ``rocmft_in`` gives (a CompletedProcess: returncode, stdout with stderr merged in order or
apart), running :func:`support.rocmft_under_test.run_with_hooks` (the same hook handling as the child launcher)
with:

* ``os.environ`` replaced by exactly the environment the child would get, and restored after (names the command
  added itself removed too); ``tempfile``'s cached folder reset, so that TMPDIR is read from it;
* the working folder changed to the test's folder; ``sys.stdout``/``sys.stderr`` captured (both into one buffer
  when merged: rocmft.console.say looks the stream up at each call);
* the process-wide state a command leaves behind forgotten after it (:func:`_forget_process_state`): the parser
  child (rocmft.validate), the device probes (rocmft.facts.device, "once per process"), the data files' token
  counts (rocmft.render.datasets, cached by path). LLaMA-Factory's vocabulary and the models built from it
  (rocmft.config.lfargs, envargs) stay cached: they depend on the installed packages only. The DeepSpeed notice
  filter (rocmft.cli.quiet_deepspeed_cpu_notice) stays: it is idempotent and drops one line only.

Two differences from the child, on purpose. The device probe (``python -m rocmft.facts.probe devices``, a torch
import) runs once per pytest process for each value of the variables it can read (:data:`PROBE_PREFIXES`: device
visibility, HSA/HIP settings, torch's BLAS preference; rocmft/facts/probe.py ``_devices``), and later commands
get its recorded answer, as a second probe in the same environment would give it; a probe that failed is not
kept. And the parser child is not started first thing
(rocmft.validate.start_validator is a no-op here) but when the parse is reached (rocmft.validate.take_validator
starts it then), so a configuration refused before the parse starts no LLaMA-Factory import. The verdict is
the same; only the parse's "its import N s" figure differs. So a command that is refused before the parse and
injects or reuses the device probe starts no process at all (a fast-layer test, tests/conftest.py).

Commands that train, export, chat or serve start workers and stay child processes: asking for one fails the test.
"""

from __future__ import annotations

import atexit
import copy
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

IN_PROCESS_COMMANDS = frozenset({"render", "plan", "check", "status"})
# the environment variables the device probe's answer can depend on (rocmft/facts/probe.py reads the *_VISIBLE_DEVICES
# and TORCH_BLAS_PREFER_* ones itself; torch and the HIP/CUDA runtimes read HIP_, HSA_, ROCR_, CUDA_, GPU_, PYTORCH_)
PROBE_PREFIXES = ("HIP_", "HSA_", "ROCR_", "CUDA_", "GPU_", "AMD_", "NVIDIA_", "TORCH_", "PYTORCH_")
_answers: dict[tuple, dict] = {}  # the device probe's answers, by the probe variables' values


class _Answered:
    """A device probe that already answered (stands in a ProbeProcess in rocmft.facts.device._probes)."""

    def __init__(self, answer: dict) -> None:
        self.answer = answer

    def result(self) -> dict:
        return copy.deepcopy(self.answer)

    def cancel(self) -> None:
        pass


def _probe_key(environ: Mapping[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in environ.items() if k.upper().startswith(PROBE_PREFIXES)))


def _command(args: Sequence[str]) -> str | None:
    return next((a for a in args if not a.startswith("-")), None)


def _forget_process_state(probe_key: tuple) -> None:
    """Stop and forget what a command left in this process for its own later use (see the module's docstring);
    keep the device probe's answer under ``probe_key`` when it finished without an error."""
    from rocmft import validate
    from rocmft.facts import device
    from rocmft.render import datasets

    for name in ("_validator", "_kept"):
        child = getattr(validate, name)
        if child is not None:
            child.cancel()
            atexit.unregister(child.cancel)
            setattr(validate, name, None)
    for name, probe in device._probes.items():
        if isinstance(probe, _Answered):
            continue
        if name == "devices" and probe.proc.poll() is not None and "error" not in probe.result():
            _answers[probe_key] = probe.result()
        probe.cancel()
        probe.proc.wait()
        probe._out.close()
        probe._err.close()
        atexit.unregister(probe.cancel)
    device._probes.clear()
    datasets._file_token_lengths.cache_clear()
    datasets._counter.cache_clear()


def probe_ahead(environ: Mapping[str, str]) -> None:
    """Run the device probe for ``environ`` now unless its answer is kept: in a fixture's set-up, so that the
    test's own call starts no process (tests/conftest.py's fast-layer guard watches the call only)."""
    from rocmft.facts.device import PROBE_TIMEOUT_S, run_probe

    key = _probe_key(environ)
    if key not in _answers:
        answer = run_probe(["devices"], PROBE_TIMEOUT_S, env=dict(environ))
        if "error" not in answer:
            _answers[key] = answer


def run_in_process(folder: Path, environ: Mapping[str, str], args: Sequence[str],
                   merge_stderr: bool = True) -> subprocess.CompletedProcess:  # fmt: skip
    """``rocmft *args`` in this process, in ``folder`` with exactly ``environ`` as the environment.

    Returns a CompletedProcess as ``subprocess.run`` would (``args`` = ["rocmft", *args]; stdout with stderr
    merged unless ``merge_stderr`` is False, then ``stderr`` apart); an argparse exit (SystemExit) becomes the
    return code. Fails the test (pytest.fail) for a command outside :data:`IN_PROCESS_COMMANDS` (train, export,
    chat, serve start workers: run them with run_rocmft)."""
    from rocmft.cli import build_parser
    from support.rocmft_under_test import run_with_hooks

    command = _command(args)
    commands = build_parser()._subparsers._group_actions[0].choices
    if command in commands and command not in IN_PROCESS_COMMANDS:
        pytest.fail(f"`rocmft {command}` starts a worker or a server: run it in a child process (run_rocmft); "
                    f"in-process: {', '.join(sorted(IN_PROCESS_COMMANDS))}", pytrace=False)  # fmt: skip
    from rocmft import validate
    from rocmft.facts import device

    before = dict(os.environ)
    out = io.StringIO()
    err = out if merge_stderr else io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            patch.delenv(name)
        for name, value in environ.items():
            patch.setenv(name, value)
        patch.chdir(folder)
        patch.setattr(tempfile, "tempdir", None)
        patch.setattr(sys, "stdout", out)
        patch.setattr(sys, "stderr", err)
        patch.setattr(validate, "start_validator", lambda: None)
        key = _probe_key(environ)
        if key in _answers:
            device._probes["devices"] = _Answered(_answers[key])
        try:
            code = run_with_hooks(list(args), os.environ)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        finally:
            _forget_process_state(key)
            for name in set(os.environ) - set(environ):
                del os.environ[name]  # added by the command itself: not monkeypatch's to restore
    assert dict(os.environ) == before, "the environment was not restored"
    return subprocess.CompletedProcess(["rocmft", *args], code, out.getvalue(),
                                       None if merge_stderr else err.getvalue())  # fmt: skip
