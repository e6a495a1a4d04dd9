"""The worker's main: signals, the run's files, the patches and faults, LLaMA-Factory's ``run_exp`` with rocmft's
callback, and what each way of ending means (exit code, record, message). See rocmft.worker."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

from rocmft.console import say
from rocmft.errors import ExitCode
from rocmft.records import RunPolicy, RunStatus, read_run_policy, with_reason
from rocmft.values import truthy
from rocmft.worker import faults, patches
from rocmft.worker.callbacks import SAME_STOP_S, STOP, Interrupted, NonFiniteLoss, rocmft_callback, under_torchrun


def _disk_full(err: BaseException, output_dir: Path) -> bool:
    """Whether ``err`` came from the output file system filling up.

    Direct evidence: an OSError ENOSPC in the exception chain (safetensors, json) or "No space left" in a message.
    torch.save reports a full disk only as a C++ stream error ("basic_ios::clear: iostream error", "unexpected
    pos", seen on a full tmpfs), so the file system is also asked: less free space left there than the newest
    complete checkpoint takes (or under 16 MiB without one) means the save could not fit.
    """
    import errno
    import shutil

    from rocmft.render.resume import newest_complete

    seen, cause = 0, err
    while cause is not None and seen < 10:
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            return True
        if "No space left" in str(cause):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    if not isinstance(err, (OSError, RuntimeError)) or not output_dir.is_dir():
        return False
    free = shutil.disk_usage(output_dir).free
    good = newest_complete(output_dir).checkpoint
    needed = sum(f.stat().st_size for f in good.rglob("*") if f.is_file()) if good else 16 * 2**20
    return free < needed


def _report_disk_full(output_dir: Path, err: BaseException) -> None:
    """The storage message: what filled up, which checkpoint is intact, what to do. The checkpoint being written
    (no trainer_state.json yet) is removed: it can never be loaded, and it holds the space the next try needs."""
    import shutil

    from rocmft.render.resume import checkpoint_problem, newest_complete

    for folder in output_dir.glob("checkpoint-*"):
        if folder.is_dir() and checkpoint_problem(folder):
            shutil.rmtree(folder, ignore_errors=True)
            say(f"removed the incomplete {folder}", stream=sys.stderr, all_ranks=True)
    free = shutil.disk_usage(output_dir).free / 2**20
    good = newest_complete(output_dir).checkpoint
    say(
        f"DISK FULL while saving into {output_dir} ({free:.1f} MiB free there): {err}. "
        + (f"The previous checkpoint {good} is intact; " if good else "No complete checkpoint was saved; ")
        + "free space, lower SAVE_TOTAL_LIMIT or raise SAVE_STEPS, or point OUTPUT_DIR at a larger volume, then "
        "run `rocmft train` again to resume.",
        stream=sys.stderr,
        all_ranks=True,
    )


def _secret_arguments() -> dict[str, str]:
    from rocmft.config.lfargs import env_arguments

    return {a.name: os.environ[env] for env, a in env_arguments().items() if a.secret and env in os.environ}


def main(run_dir: str) -> int:
    """Train from RUN_DIR/train.yaml and RUN_DIR/run.json; return the exit code."""
    run_path = Path(run_dir)
    policy = read_run_policy(run_path)
    # torchrun's local rank 0 writes this node's RUN_DIR record; without torchrun the process writes its own
    writes_record = int(os.environ.get("LOCAL_RANK", "0")) == 0 or not under_torchrun()
    _take_stop_signals()
    try:
        arguments, run_exp, callback = _set_up(policy, run_path)
    except Interrupted as err:  # before training began: LLaMA-Factory's import, the patches (seconds)
        say(f"interrupted by {err} before training began", stream=sys.stderr, all_ranks=True)
        return ExitCode.INTERRUPTED
    try:
        run_exp(args=arguments, callbacks=[callback])
    except NonFiniteLoss as err:
        _say_diverged(err, Path(arguments["output_dir"]), callback)
        return ExitCode.NON_FINITE_LOSS
    except Interrupted as err:
        callback.result = callback.result.updated(status=with_reason(RunStatus.INTERRUPTED, str(err)))
        if writes_record:
            callback.write_record()
        say(f"interrupted by {err}", stream=sys.stderr, all_ranks=True)  # rocmft.launch says what it means
        return ExitCode.INTERRUPTED
    except Exception as err:
        traceback.print_exc()
        from rocmft.worker.peers import collective_timeout, resume_hint, verdict_after_error

        verdict_after_error(err)  # a lost node named by the watch ends the process there (exit 4)
        if _disk_full(err, Path(arguments["output_dir"])):
            _report_disk_full(Path(arguments["output_dir"]), err)
        callback.result = callback.result.updated(status=RunStatus.FAILED, error=f"{type(err).__name__}: {err}")
        if collective_timeout(f"{err}"):  # rocmft train reads it (ROCMFT_ON_HANG)
            callback.result = callback.result.updated(status=RunStatus.COLLECTIVES_HANG, last_step=callback.steps_done)
            say(f"COLLECTIVES HANG: a collective of step {callback.steps_done + 1} timed out after DDP_TIMEOUT "
                f"({err}); {resume_hint(Path(arguments['output_dir']))}, and ROCMFT_COLLECTIVES=safe uses RCCL's "
                "safe fallbacks (ROCMFT_ON_HANG=retry does both by itself)",
                stream=sys.stderr, all_ranks=True)  # fmt: skip
        if writes_record:
            callback.write_record()
        return ExitCode.TRAINING_FAILED
    return _exit_after_training()


def _set_up(policy: RunPolicy, run_path: Path):
    """The run's arguments (the secrets added), LLaMA-Factory's ``run_exp`` and rocmft's callback, the patches
    applied. A stop signal here raises Interrupted, which :func:`main` turns into exit 143 with one line: it printed a
    traceback through the worker's log and the console when SIGINT came during ``import llamafactory``'s seconds (a
    break-it trial, 2026-12-06)."""
    from omegaconf import OmegaConf

    arguments = OmegaConf.to_container(OmegaConf.load(run_path / "train.yaml"), resolve=True)
    arguments.update(_secret_arguments())
    attention_choice = _patch_and_arm(policy, arguments)

    from llamafactory.train.tuner import run_exp

    callback = rocmft_callback(policy, run_path)
    if attention_choice:
        callback.result = callback.result.updated(attention=attention_choice)
    return arguments, run_exp, callback


def _take_stop_signals() -> None:
    """SIGTERM/SIGINT during training stop at the next step boundary with a checkpoint (a second one, or one
    before training, stops at once): install the handler, and take the signals torchrun blocked."""

    def on_signal(signum, _frame):
        name, now = signal.Signals(signum).name, time.monotonic()
        if STOP.training and STOP.is_repeat(now):  # the scheduler's copy and rocmft's of one stop
            return
        if not STOP.training or STOP.requested:  # before training, or a second signal: stop now
            raise Interrupted(name)
        STOP.requested, STOP.requested_at = name, now
        say(f"{name}: stopping at the end of this step with a checkpoint (again, {SAME_STOP_S:.0f} s later or more, "
            "to stop now)", stream=sys.stderr, all_ranks=True)  # fmt: skip

    # torchrun starts the ranks with SIGTERM/SIGINT blocked (rocmft.launch.run: so that a scheduler's signal to the
    # whole step does not make torchrun kill them): a rank takes them again
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _patch_and_arm(policy: RunPolicy, arguments: dict) -> dict | None:
    """Apply the run policy's patches to LLaMA-Factory and transformers, and arm its test-only faults.

    Returns:
        The attention choice for neat-packed rows (rocmft.worker.attention.decide), or None when not asked.
    """
    patches.wandb_unimported_unless_reported(arguments)  # first: the patches below may import trl
    if policy.precision_policy == "fp32":
        patches.force_compute_dtype("float32")
    if policy.fault_kill_in_save_at_step:
        faults.kill_in_save(policy.fault_kill_in_save_at_step)
    if policy.fault_slow_final_save_s:
        faults.slow_final_save(policy.fault_slow_final_save_s)
    attention_choice = None
    if policy.packed_attention == "varlen" and truthy(arguments.get("neat_packing")):
        from rocmft.worker import attention

        attention_choice = attention.decide(arguments, policy.sample_tokens)
        why = attention_choice.get("reason") or attention_choice.get("error")
        say(f"attention on packed rows: {attention_choice['chosen']} ({why})")
        if attention_choice["chosen"] == attention.NAME:
            patches.packed_varlen_attention()
    patches.lora_inputs_uncast_under_autocast()
    patches.lora_product_in_the_gemm()
    patches.train_mode_set_once()
    patches.gradients_found_without_walking()
    patches.count_tokens_under_4d_masks()
    patches.step_logs_said_once()
    patches.deepspeed_accelerator_without_gpu(os.environ)
    patches.deepspeed_unimported_unless_configured(arguments)
    patches.model_kind_asked_without_importing_every_config()
    patches.resume_optimizer_on_cpu_ranks()
    patches.dataloader_workers_ignore_stop_signals()
    return attention_choice


def _say_diverged(err: NonFiniteLoss, output_dir: Path, callback) -> None:
    """The message for a diverged run: what diverged at which step, the last good checkpoint, what to try."""
    from rocmft.render.resume import last_good_checkpoint

    good = last_good_checkpoint(output_dir, callback.result.loss_dicts())
    where = f"the last good checkpoint is {good}" if good else "there is no checkpoint from before it"
    say(
        f"STOPPED ({err.cause}): {err}. The weights or the optimizer state diverged; nothing after step "
        f"{err.step} is trustworthy; {where}. Try: a lower LEARNING_RATE, MAX_GRAD_NORM=1.0, or "
        "ROCMFT_PRECISION=fp32 to rule out mixed precision (ROCMFT_ON_NAN=fp32 does that by itself).",
        stream=sys.stderr,
        all_ranks=True,
    )


def _exit_after_training() -> int:
    """The exit code of a training loop that ended: OK, or after a graceful stop INTERRUPTED (OK when distributed,
    the launcher reads the stop from the result file), with the message that says how to resume."""
    if STOP.at_step is not None:
        say(f"stopped by {STOP.requested} after step {STOP.at_step} with checkpoint-{STOP.at_step} saved; "
            "`rocmft train` with the same settings resumes from it", stream=sys.stderr, all_ranks=True)  # fmt: skip
        # Under torchrun every rank exits 0 and the launcher reads the stop from the result file: torchrun SIGTERMs
        # the ranks still running as soon as one exits non-zero, and the other ranks skip the final model write
        # (LLaMA-Factory's save_model after training), so rank 0 was cut off while writing it (torch 2.11;
        # tests/test_resilience.py reproduces it with the slow_final_save_s test fault).
        # The same holds for a scheduler's tasks (srun --kill-on-bad-exit ends the step on a non-zero exit).
        distributed = under_torchrun() or int(os.environ.get("WORLD_SIZE") or 1) > 1
        return ExitCode.OK if distributed else ExitCode.INTERRUPTED
    return ExitCode.OK
