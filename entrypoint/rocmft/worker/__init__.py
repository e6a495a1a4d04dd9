"""The training worker: LLaMA-Factory's ``run_exp`` with rocmft's callbacks, one per rank.

Started as ``python -m rocmft.worker RUN_DIR`` for one process, or by torchrun (``torchrun ... -m
rocmft.worker RUN_DIR``) once per rank; it reads only the rendered files in RUN_DIR (train.yaml and
run.json), so a run can be repeated from its output folder alone. Secret arguments (HF_HUB_TOKEN, ...)
are never in those files: they are taken from the worker's environment.

Exit codes (rocmft.errors.ExitCode): 0 done, 4 training raised, 5 non-finite loss or gradient norm,
143 SIGTERM/SIGINT. Under torchrun a stop at a step boundary exits 0 and is recorded in worker-result.json
(``stopped_at_step``), from which the launcher makes rocmft's 143 (see the end of :func:`main`).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from rocmft.errors import ExitCode
from rocmft.records import (
    LossRecord,
    NonFinite,
    RunPolicy,
    RunStatus,
    WorkerResult,
    read_run_policy,
    with_reason,
    write_worker_result,
)


class NonFiniteLoss(RuntimeError):
    """Training diverged at ``step``: the logged loss or gradient norm is NaN/Inf (``cause`` "non-finite loss"),
    or the loss jumped above ROCMFT_LOSS_SPIKE_FACTOR × its recent median (``cause`` "loss spike")."""

    def __init__(self, step: int, key: str, value: float, median: float | None = None) -> None:
        self.cause = RunStatus.LOSS_SPIKE if median is not None else RunStatus.NON_FINITE_LOSS
        detail = f" ({value / median:.1f}x the median {median:.4g} of the last logged losses)" if median else ""
        super().__init__(f"{key} is {value} at step {step}{detail}")
        self.step, self.key, self.value, self.median = step, key, value, median


SPIKE_WINDOW = 20  # logged losses the median is taken over
SPIKE_MIN_HISTORY = 5  # no spike judgement before this many logged losses (the first steps fall fast)
# A spike must also be 1 nat (cross-entropy units) above the median: near-zero losses of a memorizing run
# (0.01 -> 0.15) are relatively large jumps but harmless, while divergence adds whole nats.
SPIKE_MIN_JUMP = 1.0


def loss_spike(recent: list[float], loss: float, factor: float) -> float | None:
    """The median of ``recent`` when ``loss`` is above ``factor`` × that median (a spike), else None.

    ``recent``: the last logged losses (up to SPIKE_WINDOW); fewer than SPIKE_MIN_HISTORY, a factor of 0 or a
    non-positive median never count, and the loss must also exceed the median by SPIKE_MIN_JUMP. A diverging
    run's loss jumps by whole nats within a few steps; ordinary noise stays within a small factor of the median.
    """
    import statistics

    if factor <= 0 or len(recent) < SPIKE_MIN_HISTORY:
        return None
    median = statistics.median(recent[-SPIKE_WINDOW:])
    spike = median > 0 and loss > factor * median and loss - median >= SPIKE_MIN_JUMP
    return median if spike else None


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived (BaseException, so library code catching Exception lets it through)."""


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _StopRequest:
    """SIGTERM/SIGINT during training: stop at the next step boundary with a checkpoint (see :func:`main`)."""

    def __init__(self) -> None:
        self.requested: str | None = None  # the signal's name
        self.training = False  # set at train begin: before it, a signal stops at once
        self.at_step: int | None = None


STOP = _StopRequest()


def _stop_everywhere(requested: str | None, args) -> bool:
    """Whether any rank was asked to stop: one all-reduce (MAX) of a flag per optimizer step, so that every
    rank stops at the same step and saves the same checkpoint (a rank that stops alone hangs the others)."""
    import torch.distributed as dist

    flag = 1.0 if requested else 0.0
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        import torch

        tensor = torch.tensor([flag], device=args.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        flag = float(tensor.item())
        if flag and not STOP.requested:
            STOP.requested = "SIGTERM on another rank"
    return flag > 0


def _rocmft_callback(policy: RunPolicy, run_dir: Path):
    """Build the TrainerCallback (imported lazily: transformers takes seconds to import)."""
    import torch
    from transformers import TrainerCallback

    class RocmftCallback(TrainerCallback):
        """Progress lines, the non-finite watchdog, the dtype record and the test-only NaN fault.

        * one line per logging step on rank 0: step, loss, learning rate, grad norm, tokens/s (from the
          trainer's non-padding token count), elapsed, ETA;
        * a NaN/Inf loss or grad norm in a log raises :class:`NonFiniteLoss` (exit 5) — the template
          turns off transformers' ``logging_nan_inf_filter``, which would otherwise hide NaN losses;
        * at train start, the dtypes of the parameters are recorded, and a ``fp32`` policy whose
          parameters are not all float32 stops the run (the policy must never silently not apply);
        * ``fault_nan_at_step`` (ROCMFT_FAULT_NAN_AT_STEP, tests only) fills the weights with NaN after
          that optimizer step, so the following loss is non-finite for real;
        * on a GPU, ``peak_gpu_memory_gib`` (``torch.cuda.max_memory_allocated()`` of this rank, GiB) is
          recorded at each log and at the end, and printed in the final line (rank 0's in the result
          file); it is what :mod:`rocmft.render.memfit` estimates.
        """

        def __init__(self) -> None:
            self.result = WorkerResult.start()
            self.recent: list[float] = []  # the last logged losses, on every rank, for the spike watchdog
            self.started = time.monotonic()
            self.last_time = self.started
            self.last_tokens = 0

        def _save(self, state) -> None:
            # each node's local rank 0 writes its node's record (RUN_DIR is per node: rocmft-node<N>), so a node
            # that stopped because another rank was signalled can say so (rocmft.launch.run_worker reads it)
            if state.is_local_process_zero:
                write_worker_result(run_dir, self.result)

        def _record_peak(self) -> None:
            if torch.cuda.is_available():
                peak = round(torch.cuda.max_memory_allocated() / 2**30, 3)
                self.result = self.result.updated(peak_gpu_memory_gib=peak)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            STOP.training = True
            dtypes = Counter(str(p.dtype).replace("torch.", "") for p in model.parameters()) if model else Counter()
            trainable = Counter(
                str(p.dtype).replace("torch.", "") for p in model.parameters() if p.requires_grad
            ) if model else Counter()  # fmt: skip
            self.result = self.result.updated(
                parameter_dtypes=dict(dtypes), trainable_dtypes=dict(trainable), max_steps=state.max_steps,
                world_size=args.world_size,
            )  # fmt: skip
            if policy.precision_policy == "fp32" and set(dtypes) - {"float32"}:
                raise RuntimeError(
                    f"precision policy fp32 is not in effect: parameters are {dict(dtypes)}. "
                    "This is a rocmft bug (LLaMA-Factory changed how it picks the dtype); please report it."
                )
            self._save(state)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if _stop_everywhere(STOP.requested, args):
                # graceful stop: every rank saves this step's checkpoint, then training ends (rocmft exits 143)
                control.should_save = True
                control.should_training_stop = True
                STOP.at_step = state.global_step
                self.result = self.result.updated(status=with_reason(RunStatus.STOPPING, STOP.requested),
                                                  stopped_at_step=state.global_step)  # fmt: skip
                if state.is_world_process_zero:
                    print(f"[rocmft] {STOP.requested}: saving checkpoint-{state.global_step} and stopping",
                          flush=True)  # fmt: skip
            fault = policy.fault_nan_at_step  # simulates a low-precision overflow: not under real fp32
            low_precision = policy.precision_policy != "fp32"
            if fault and low_precision and state.global_step == fault and model is not None:
                with torch.no_grad():
                    for param in model.parameters():
                        if param.is_floating_point():
                            param.fill_(float("nan"))
                print(f"[rocmft] TEST FAULT: weights set to NaN after step {state.global_step}", flush=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            for key in ("loss", "grad_norm"):
                value = logs.get(key)
                if isinstance(value, (int, float)) and not math.isfinite(value):
                    self.result = self.result.updated(
                        status=RunStatus.NON_FINITE_LOSS, non_finite=NonFinite(state.global_step, key, str(value))
                    )
                    self._save(state)
                    raise NonFiniteLoss(state.global_step, key, value)
            loss = logs.get("loss")
            if isinstance(loss, (int, float)):
                median = loss_spike(self.recent, loss, policy.loss_spike_factor or 0)
                if median is not None:
                    self.result = self.result.updated(status=RunStatus.LOSS_SPIKE, non_finite=NonFinite(
                        state.global_step, "loss", str(loss), median, RunStatus.LOSS_SPIKE.value))  # fmt: skip
                    self._save(state)
                    raise NonFiniteLoss(state.global_step, "loss", loss, median)
                self.recent = [*self.recent, loss][-SPIKE_WINDOW:]
            if "loss" not in logs or not state.is_world_process_zero:
                return
            now = time.monotonic()
            tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
            rate = (tokens - self.last_tokens) / max(now - self.last_time, 1e-9) if tokens else float("nan")
            self.last_time, self.last_tokens = now, tokens
            elapsed = now - self.started
            done = state.global_step / max(state.max_steps, 1)
            eta = elapsed / done - elapsed if done > 0 else float("nan")
            self._record_peak()
            entry = LossRecord(state.global_step, logs["loss"])
            if torch.cuda.is_available():  # for the run summary's memory curve (rocmft.outputs.report)
                entry = LossRecord(state.global_step, logs["loss"], round(torch.cuda.memory_allocated() / 2**30, 3),
                                   self.result.peak_gpu_memory_gib)  # fmt: skip
            self.result = self.result.with_loss(entry).updated(last_step=state.global_step, tokens_seen=tokens,
                                                               elapsed_s=round(elapsed, 2))  # fmt: skip
            self._save(state)
            print(
                f"[rocmft] step {state.global_step}/{state.max_steps} ({done:.0%}) loss {logs['loss']:.4f} "
                f"lr {logs.get('learning_rate', float('nan')):.2e} grad_norm {logs.get('grad_norm', float('nan')):.3g} "
                f"tok/s {rate:,.0f} elapsed {_fmt_duration(elapsed)} "
                f"eta {_fmt_duration(eta) if math.isfinite(eta) else '?'}",
                flush=True,
            )

        def on_train_end(self, args, state, control, **kwargs):
            stopped = STOP.at_step is not None
            status = with_reason(RunStatus.INTERRUPTED, STOP.requested) if stopped else RunStatus.FINISHED
            self.result = self.result.updated(status=status, last_step=state.global_step,
                                              elapsed_s=round(time.monotonic() - self.started, 2))  # fmt: skip
            self._record_peak()
            self._save(state)
            if state.is_world_process_zero:
                peak = self.result.peak_gpu_memory_gib
                memory = f", peak GPU memory {peak:.2f} GiB (max_memory_allocated, rank 0)" if peak is not None else ""
                elapsed = _fmt_duration(self.result.elapsed_s)
                print(f"[rocmft] training loop done: {state.global_step} steps in {elapsed}{memory}", flush=True)

    return RocmftCallback()


def _force_compute_dtype(dtype_name: str) -> None:
    """Make LLaMA-Factory load and train the weights in ``dtype_name`` (used for the fp32 policy).

    LLaMA-Factory 0.9.5 has no training argument for the weights' dtype (DESIGN.md): ``get_train_args``
    sets ``model_args.compute_dtype`` only for bf16/fp16, and its loader calls ``from_pretrained`` with
    ``torch_dtype="auto"``, which transformers 5 resolves from the config, i.e. the checkpoint's own
    dtype — a bf16 checkpoint loads in bf16 whatever the flags say (measured: a LoRA run of a bf16
    checkpoint with bf16 and fp16 off had 26 bf16 base tensors). So two names are wrapped, both bound
    at module level where LLaMA-Factory calls them:

    * ``llamafactory.train.tuner.get_train_args``: set ``model_args.compute_dtype`` after parsing
      (autocast, upcasting and quantization read it);
    * ``llamafactory.model.loader.patch_config``: set ``config.dtype`` so that ``"auto"`` resolves to it.

    The dtypes actually used are verified by the worker's callback at train start, so a future
    LLaMA-Factory that bypasses these cannot make "fp32" silently not fp32.
    """
    import torch
    from llamafactory.model import loader
    from llamafactory.train import tuner

    dtype = getattr(torch, dtype_name)
    parse, patch_config = tuner.get_train_args, loader.patch_config

    def get_train_args_with_dtype(args=None):
        model_args, data_args, training_args, finetuning_args, generating_args = parse(args)
        model_args.compute_dtype = dtype
        return model_args, data_args, training_args, finetuning_args, generating_args

    def patch_config_with_dtype(config, *args, **kwargs):
        patch_config(config, *args, **kwargs)
        config.dtype = dtype

    tuner.get_train_args = get_train_args_with_dtype
    loader.patch_config = patch_config_with_dtype


def _count_tokens_under_4d_masks() -> None:
    """Count non-padding tokens right when the attention mask is 4-D (LLaMA-Factory's neat packing under SDPA or
    eager attention: ``prepare_4d_attention_mask`` in llamafactory/data/collator.py).

    transformers 5.6's ``Trainer._track_num_input_tokens`` counts ``attention_mask.sum()`` for
    ``include_num_input_tokens_seen: non_padding``; a 4-D mask holds 0 where attention is allowed and the dtype's
    minimum elsewhere, so that sum is 0 or negative (measured on an H200: ``num_input_tokens_seen`` stayed 0 for a
    whole neat-packed run, and tokens/s read nan). A position is a real token exactly when it may attend to itself,
    so the count is the number of zeros on the mask's diagonal. Other masks are left to transformers.
    """
    import torch
    from transformers import Trainer

    track = Trainer._track_num_input_tokens

    def track_with_4d_masks(self, inputs):
        mask = inputs.get("attention_mask") if hasattr(inputs, "get") else None
        if self.args.include_num_input_tokens_seen != "non_padding" or mask is None or mask.dim() != 4:
            return track(self, inputs)
        tokens = (mask.diagonal(dim1=-2, dim2=-1) == 0).sum().to(device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += self.accelerator.gather(tokens).sum().item()

    Trainer._track_num_input_tokens = track_with_4d_masks


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
            print(f"[rocmft] removed the incomplete {folder}", file=sys.stderr, flush=True)
    free = shutil.disk_usage(output_dir).free / 2**20
    good = newest_complete(output_dir).checkpoint
    print(
        f"[rocmft] DISK FULL while saving into {output_dir} ({free:.1f} MiB free there): {err}. "
        + (f"The previous checkpoint {good} is intact; " if good else "No complete checkpoint was saved; ")
        + "free space, lower SAVE_TOTAL_LIMIT or raise SAVE_STEPS, or point OUTPUT_DIR at a larger volume, then "
        "run `rocmft train` again to resume.",
        file=sys.stderr,
        flush=True,
    )


def _fault_kill_in_save(step: int) -> None:
    """TEST ONLY (ROCMFT_FAULT_KILL_IN_SAVE_AT_STEP): SIGKILL this process in the middle of writing the checkpoint
    of ``step``: transformers' Trainer._save_checkpoint has written the weights and is about to write the
    optimizer state; trainer_state.json (written last) never comes."""
    from transformers import Trainer

    save = Trainer._save_optimizer_and_scheduler

    def save_or_die(self, output_dir):
        if self.state.global_step == step:
            print(f"[rocmft] TEST FAULT: SIGKILL while writing {output_dir}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return save(self, output_dir)

    Trainer._save_optimizer_and_scheduler = save_or_die


def _fault_slow_final_save(seconds: float) -> None:
    """TEST ONLY (ROCMFT_FAULT_SLOW_FINAL_SAVE_S): the rank that writes the model (``should_save``) sleeps
    ``seconds`` before writing the final model (LLaMA-Factory's ``trainer.save_model()`` after training), as a
    large model's write takes, while the other ranks, which write nothing there, go on and exit."""
    from transformers import Trainer

    save = Trainer.save_model

    def slow_save(self, output_dir=None, _internal_call=False):
        if self.args.should_save and not _internal_call:
            print(f"[rocmft] TEST FAULT: writing the final model slowly ({seconds:g} s)", flush=True)
            time.sleep(seconds)
        return save(self, output_dir, _internal_call)

    Trainer.save_model = slow_save


def _secret_arguments() -> dict[str, str]:
    from rocmft.config.lfargs import env_arguments

    return {a.name: os.environ[env] for env, a in env_arguments().items() if a.secret and env in os.environ}


def main(run_dir: str) -> int:
    """Train from RUN_DIR/train.yaml and RUN_DIR/run.json; return the exit code."""
    run_path = Path(run_dir)
    policy = read_run_policy(run_path)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # local rank 0 writes this node's RUN_DIR record

    def on_signal(signum, _frame):
        name = signal.Signals(signum).name
        if not STOP.training or STOP.requested:  # before training, or a second signal: stop now
            raise Interrupted(name)
        STOP.requested = name
        print(f"[rocmft] {name}: stopping at the end of this step with a checkpoint (again to stop now)",
              file=sys.stderr, flush=True)  # fmt: skip

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    from omegaconf import OmegaConf

    arguments = OmegaConf.to_container(OmegaConf.load(run_path / "train.yaml"), resolve=True)
    arguments.update(_secret_arguments())
    if policy.precision_policy == "fp32":
        _force_compute_dtype("float32")
    if policy.fault_kill_in_save_at_step:
        _fault_kill_in_save(policy.fault_kill_in_save_at_step)
    if policy.fault_slow_final_save_s:
        _fault_slow_final_save(policy.fault_slow_final_save_s)
    _count_tokens_under_4d_masks()

    from llamafactory.train.tuner import run_exp

    callback = _rocmft_callback(policy, run_path)
    try:
        run_exp(args=arguments, callbacks=[callback])
    except NonFiniteLoss as err:
        from rocmft.render.resume import last_good_checkpoint

        good = last_good_checkpoint(Path(arguments["output_dir"]), callback.result.loss_dicts())
        where = f"the last good checkpoint is {good}" if good else "there is no checkpoint from before it"
        print(
            f"[rocmft] STOPPED ({err.cause}): {err}. The weights or the optimizer state diverged; nothing after step "
            f"{err.step} is trustworthy; {where}. Try: a lower LEARNING_RATE, MAX_GRAD_NORM=1.0, or "
            "ROCMFT_PRECISION=fp32 to rule out mixed precision (ROCMFT_ON_NAN=fp32 does that by itself).",
            file=sys.stderr,
            flush=True,
        )
        return ExitCode.NON_FINITE_LOSS
    except Interrupted as err:
        callback.result = callback.result.updated(status=with_reason(RunStatus.INTERRUPTED, str(err)))
        if local_rank == 0:
            write_worker_result(run_path, callback.result)
        print(f"[rocmft] interrupted by {err}", file=sys.stderr, flush=True)  # rocmft.launch says what it means
        return ExitCode.INTERRUPTED
    except Exception as err:
        traceback.print_exc()
        if _disk_full(err, Path(arguments["output_dir"])):
            _report_disk_full(Path(arguments["output_dir"]), err)
        callback.result = callback.result.updated(status=RunStatus.FAILED, error=f"{type(err).__name__}: {err}")
        if local_rank == 0:
            write_worker_result(run_path, callback.result)
        return ExitCode.TRAINING_FAILED
    if STOP.at_step is not None:
        print(f"[rocmft] stopped by {STOP.requested} after step {STOP.at_step} with checkpoint-{STOP.at_step} "
              "saved; `rocmft train` with the same settings resumes from it", file=sys.stderr, flush=True)  # fmt: skip
        # Under torchrun every rank exits 0 and the launcher reads the stop from the result file: torchrun SIGTERMs
        # the ranks still running as soon as one exits non-zero, and the other ranks skip the final model write
        # (LLaMA-Factory's save_model after training), so rank 0 was cut off while writing it (torch 2.11;
        # tests/test_resilience.py reproduces it with ROCMFT_FAULT_SLOW_FINAL_SAVE_S).
        return ExitCode.OK if "TORCHELASTIC_RUN_ID" in os.environ else ExitCode.INTERRUPTED
    return ExitCode.OK
