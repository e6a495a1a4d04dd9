"""The staging workspace under stop signals, in this process with real signals (rocmft.cli.workspace).

On Slurm, srun --kill-on-bad-exit sends SIGTERM to every other task when one refuses its configuration, and the
others are often refusing it themselves at that moment. CI (stop 48) and a clean-clone rehearsal (2026-12-06) each
found a rank's staging folder left in saves/<run>/ by tests/test_slurm.py: a KeyboardInterrupt raised by the signal
inside the clean-up cut it short. These tests put the signal exactly inside each step that must not be cut."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest

from rocmft.cli import workspace as workspace_module
from rocmft.cli.workspace import Workspace
from rocmft.errors import ConfigError


@pytest.fixture(autouse=True)
def default_handlers():
    """SIGTERM and SIGINT as an interactive shell's foreground command has them (a background job of a
    non-interactive shell, such as a CI script started with `&`, inherits SIGINT ignored, which rocmft keeps)."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def _signal_self(signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to this process and give its Python handler the bytecodes to run on."""
    os.kill(os.getpid(), signum)
    time.sleep(0.05)


def _staged(workspace: Workspace, output_dir):
    staging = workspace.make_staging(output_dir)
    for name in ("train.yaml", "run.json", "data/dataset_info.json"):
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_text("x")
    return staging


def test_a_sigterm_during_the_cleanup_of_a_refusal_waits_for_it_and_the_refusal_stands(tmp_path, monkeypatch):
    """The CI failure: the rank refused the configuration itself (exit 2) and was removing its staging folder when
    the SIGTERM for another rank's refusal came. The removal finishes, the folder and the OUTPUT_DIR the run made
    are gone, and the refusal, not an interrupt (143), is what the run ends with."""
    real_rmtree = workspace_module.shutil.rmtree

    def rmtree_with_a_signal_inside(path, *args, **kwargs):
        _signal_self()
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(workspace_module.shutil, "rmtree", rmtree_with_a_signal_inside)
    output = tmp_path / "saves" / "refused"
    with pytest.raises(ConfigError, match="refused"), Workspace() as workspace:
        _staged(workspace, output)
        raise ConfigError("refused", "fix it")
    assert not (tmp_path / "saves").exists(), sorted(str(p) for p in tmp_path.rglob("*"))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler before the block is back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigterm_while_the_staging_folder_is_made_stops_after_it_is_recorded(tmp_path, monkeypatch):
    """A signal between mkdtemp's mkdir and the workspace noting the folder would leave an empty staging folder that
    no clean-up knows of. The stop waits until it is noted, then removes it."""
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp_with_a_signal_after(*args, **kwargs):
        made = real_mkdtemp(*args, **kwargs)
        _signal_self()
        return made

    monkeypatch.setattr(workspace_module.tempfile, "mkdtemp", mkdtemp_with_a_signal_after)
    output = tmp_path / "saves" / "stopped"
    with pytest.raises(KeyboardInterrupt), Workspace() as workspace:
        workspace.make_staging(output)
        pytest.fail("make_staging returned although a SIGTERM came while it ran")
    assert not (tmp_path / "saves").exists(), sorted(str(p) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_first_stop_signal_ends_the_preparation_and_later_ones_cannot_cut_the_cleanup(tmp_path, signum):
    """The first SIGTERM or SIGINT (scancel, Ctrl-C) while preparing raises KeyboardInterrupt (exit 143); the ones
    after it (srun signals the step as each bad task ends; a second Ctrl-C) are ignored until the block ends, so
    the clean-up runs whole; then the handlers from before the block are back."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    output = tmp_path / "saves" / "stopped"
    with pytest.raises(KeyboardInterrupt, match=f"signal {int(signum)}"), Workspace() as workspace:
        _staged(workspace, output)
        os.kill(os.getpid(), signum)
        time.sleep(5)  # cut short by the handler at its next bytecode
        pytest.fail("the stop signal did not stop the preparation")
    assert not (tmp_path / "saves").exists()
    with Workspace() as workspace:
        _staged(workspace, output)
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signum)
        for later in (signal.SIGTERM, signal.SIGINT):
            assert signal.getsignal(later) is signal.SIG_IGN
            _signal_self(later)  # ignored: no KeyboardInterrupt here
        workspace.discard()
    assert not (tmp_path / "saves").exists()
    assert {s: signal.getsignal(s) for s in before} == before


def test_an_ignored_sigterm_stays_ignored(tmp_path):
    """A parent that ignores SIGTERM (nohup-like) keeps it ignored through the preparation."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with Workspace() as workspace:
            _staged(workspace, tmp_path / "out")
            _signal_self()  # nothing happens
            workspace.promote(tmp_path / "out" / "rocmft")
        assert (tmp_path / "out" / "rocmft" / "run.json").is_file()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stop_during_a_failed_exports_cleanup_leaves_none_of_its_staging_folder(tmp_path, monkeypatch):
    """The export's staging folder holds a merged model (GBs for a 7B): a SIGTERM or a second Ctrl-C while it is
    removed after a failure used to cut the removal short (a KeyboardInterrupt inside rmtree, or the default
    SIGTERM restored before it), leaving ``.<name>-staging-*`` beside EXPORT_DIR. The merge fails here, the signal
    comes inside the removal, and the merge's own error stands."""
    from types import SimpleNamespace

    from rocmft.errors import RocmftError
    from rocmft.outputs import export as export_module

    def failing_merge(plan, staging):
        (staging / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1024)
        raise RocmftError("LLaMA-Factory's export raised: stand-in", "fix it")

    real_rmtree = export_module.shutil.rmtree

    def rmtree_with_a_signal_inside(path, *args, **kwargs):
        _signal_self()
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(export_module, "check_disk", lambda plan, dtype: None)
    monkeypatch.setattr(export_module, "_announce", lambda plan: None)
    monkeypatch.setattr(export_module, "model_config", lambda base: {})
    monkeypatch.setattr(export_module, "_merge", failing_merge)
    monkeypatch.setattr(export_module.shutil, "rmtree", rmtree_with_a_signal_inside)
    plan = SimpleNamespace(base=tmp_path / "base", export_dir=tmp_path / "exports" / "merged")
    with pytest.raises(RocmftError, match="stand-in"):
        export_module.export(plan)
    assert list((tmp_path / "exports").iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_ctrl_c_while_the_command_line_is_read_ends_as_a_stop_not_a_traceback(monkeypatch, capsys):
    """A break-it trial (2026-12-06): SIGINT 0.14 s after `rocmft render` started came while argparse read the
    command line, outside main's ``try``: Python printed a KeyboardInterrupt traceback and died by SIGINT. The stop
    is said as every other one and exits 143."""
    from rocmft import cli

    def parser_cut_by_ctrl_c():
        _signal_self(signal.SIGINT)
        pytest.fail("SIGINT raised no KeyboardInterrupt")

    monkeypatch.setattr(cli, "build_parser", parser_cut_by_ctrl_c)
    assert cli.main(["render"]) == 143
    assert capsys.readouterr().err == "[rocmft] interrupted\n"


def test_a_stop_while_the_worker_imports_llamafactory_is_one_line_and_143(tmp_path, monkeypatch, capsys):
    """A break-it trial (2026-12-06): SIGINT to `rocmft train` 36 s in reached the worker while it applied its
    patches, before LLaMA-Factory's run_exp: the Interrupted its handler raised was outside main's ``try``, and a
    40-line traceback filled train.log and the console (exit 143 all the same). Now it is one line and 143."""
    from rocmft.worker import main as worker_main

    def patches_cut_by_a_stop(policy, arguments):
        _signal_self(signal.SIGINT)
        pytest.fail("SIGINT raised nothing in the worker")

    (tmp_path / "train.yaml").write_text("output_dir: out\n")
    monkeypatch.setattr(worker_main, "read_run_policy", lambda run_path: None)
    monkeypatch.setattr(worker_main, "_patch_and_arm", patches_cut_by_a_stop)
    assert worker_main.main(str(tmp_path)) == 143
    assert capsys.readouterr().err == "[rocmft] interrupted by SIGINT before training began\n"


def _aged(folder, seconds: float):
    """Set ``folder``'s and its files' change times ``seconds`` in the past."""
    then = time.time() - seconds
    for path in (folder, *folder.rglob("*")):
        os.utime(path, (then, then))


def test_a_killed_runs_staging_folder_is_named_with_its_size_and_the_command_that_removes_it(tmp_path, capsys):
    """A break-it trial (2026-12-06): `rocmft render` killed with SIGKILL (the OOM killer, a lost node) left
    ``OUTPUT_DIR/.rocmft-staging-*`` and the next run said nothing of it. The next run names an old one with its
    size and a pasteable removal, and leaves it there; a fresh one (another rank preparing now) is not named."""
    output = tmp_path / "saves" / "run"
    old = output / ".rocmft-staging-killed1"
    (old / "data").mkdir(parents=True)
    (old / "data" / "train.json").write_bytes(b"x" * (3 * 2**20))
    _aged(old, 2 * 3600)
    fresh = output / ".rocmft-staging-otherrank"
    fresh.mkdir()
    with Workspace() as workspace:
        staging = workspace.make_staging(output)
    out = capsys.readouterr().out
    assert f"WARNING: {old} (3.0 MiB, last changed " in out and f"rm -rf {old}\n" in out
    assert "otherrank" not in out and staging.name not in out
    assert old.is_dir() and fresh.is_dir()  # never deleted by rocmft: it may be someone else's


def test_an_exports_killed_staging_folder_is_named_before_the_export_starts(tmp_path, monkeypatch, capsys):
    """An export's staging folder beside EXPORT_DIR is a hidden merged model (GBs): an export killed before its
    clean-up left it with no word. The next export to that folder names it; one to another folder does not."""
    from types import SimpleNamespace

    from rocmft.errors import RocmftError
    from rocmft.outputs import export as export_module

    def failing_merge(plan, staging):
        raise RocmftError("stand-in merge", "fix it")

    exports = tmp_path / "exports"
    old = exports / ".merged-staging-k1ll3d"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"\0" * 1024)
    _aged(old, 5 * 3600)
    monkeypatch.setattr(export_module, "check_disk", lambda plan, dtype: None)
    monkeypatch.setattr(export_module, "_announce", lambda plan: None)
    monkeypatch.setattr(export_module, "model_config", lambda base: {})
    monkeypatch.setattr(export_module, "_merge", failing_merge)
    for name, named in (("other", False), ("merged", True)):
        with pytest.raises(RocmftError, match="stand-in"):
            export_module.export(SimpleNamespace(base=tmp_path / "base", export_dir=exports / name))
        out = capsys.readouterr().out
        assert (f"{old} (0.0 MiB" in out and f"an export to {exports / name}" in out) is named, out
    assert old.is_dir()


def test_a_stop_between_the_two_renames_of_the_promotion_waits_for_the_run_folder(tmp_path, monkeypatch):
    """``replace_dir`` moves the earlier run folder aside and then the staged one into place: a SIGTERM between the
    two renames left no run folder (the earlier one under ``.rocmft-old-<pid>``). It now waits for both, then stops
    the preparation with the new folder in place."""
    from rocmft import fsutil

    real_replace_dir = fsutil.replace_dir

    def replace_dir_with_a_signal_inside(staging, final, keep_old_as=None):
        _signal_self()
        real_replace_dir(staging, final, keep_old_as=keep_old_as)

    monkeypatch.setattr(fsutil, "replace_dir", replace_dir_with_a_signal_inside)
    output = tmp_path / "saves" / "run"
    (output / "rocmft").mkdir(parents=True)
    (output / "rocmft" / "train.yaml").write_text("old")
    with pytest.raises(KeyboardInterrupt), Workspace() as workspace:
        _staged(workspace, output)
        workspace.promote(output / "rocmft")
    assert (output / "rocmft" / "run.json").is_file()
    assert [p.name for p in output.iterdir()] == ["rocmft"]
