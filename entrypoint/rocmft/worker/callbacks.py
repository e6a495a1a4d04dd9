"""rocmft's TrainerCallback: progress lines, the non-finite-loss and loss-spike watchdog, the graceful stop at a
step boundary (SIGTERM/SIGINT, agreed across ranks), the parameters' dtypes, GPU memory; and the worker's record
(rocmft.records.WorkerResult) it keeps up to date. Its lines are rank 0's (guarded by ``is_world_process_zero``
and rocmft.console's rank filter)."""

from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

from rocmft.console import say, warn
from rocmft.records import LossRecord, NonFinite, RunPolicy, RunStatus, WorkerResult, WorkerResultWriter, with_reason
from rocmft.worker.faults import GradSpike, hang_at_step, nan_after_step


def under_torchrun() -> bool:
    """Whether torchrun started this process (it sets TORCHELASTIC_RUN_ID for every rank: torch.distributed.run)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


class NonFiniteLoss(RuntimeError):
    """Training diverged at ``step``: the logged loss or gradient norm is NaN/Inf (``cause`` "non-finite loss"),
    the loss jumped above ROCMFT_LOSS_SPIKE_FACTOR × its recent median (``cause`` "loss spike"), or, with
    ROCMFT_ON_GRAD_NORM_SPIKE=stop, the gradient norm spiked (``cause`` "grad-norm spike"; ``median`` is the recent
    median, or ROCMFT_GRAD_NORM_LIMIT when ``detail`` says so)."""

    def __init__(self, step: int, key: str, value: float, median: float | None = None, detail: str = "") -> None:
        spike = RunStatus.GRAD_NORM_SPIKE if key == "grad_norm" else RunStatus.LOSS_SPIKE
        self.cause = spike if median is not None else RunStatus.NON_FINITE_LOSS
        if median and not detail:
            detail = f" ({value / median:.1f}x the median {median:.4g} of the last logged values)"
        super().__init__(f"{key} is {value} at step {step}{detail}")
        self.step, self.key, self.value, self.median = step, key, value, median


SPIKE_WINDOW = 20  # logged losses the median is taken over


SPIKE_MIN_HISTORY = 5  # no spike judgement before this many logged losses (the first steps fall fast)


# A spike must also be 1 nat (cross-entropy units) above the median: near-zero losses of a memorizing run
# (0.01 -> 0.15) are relatively large jumps but harmless, while divergence adds whole nats.
SPIKE_MIN_JUMP = 1.0


GRAD_NORM_WARN_EVERY = 100  # optimizer steps between two gradient-norm warnings (a warning per log would drown the log)


def grad_norm_spike(recent: list[float], norm: float, factor: float, limit: float) -> tuple[float, str] | None:
    """``(reference, why)`` when the logged gradient norm ``norm`` is a spike, else None.

    A spike is a norm above ``limit`` (when > 0; no history needed: norms in the thousands from the first step with
    no NaN ever were broken GEMMs on MI300, hiyouga/LlamaFactory#7890), or above ``factor`` × the median of the
    last logged norms ``recent`` (when > 0, after SPIKE_MIN_HISTORY of them). ``reference`` is the limit or the
    median; ``why`` says which, in words.
    """
    import statistics

    if limit > 0 and norm > limit:
        return limit, f"above ROCMFT_GRAD_NORM_LIMIT={limit:g}"
    if factor <= 0 or len(recent) < SPIKE_MIN_HISTORY:
        return None
    median = statistics.median(recent[-SPIKE_WINDOW:])
    if median > 0 and norm > factor * median:
        return median, f"{norm / median:.1f}x the median {median:.4g} of the last logged norms"
    return None


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


# A signal within this many seconds of the stop request (or after another rank's) is the same request, not "stop
# now": a scheduler signals every process of the step (Slurm's scancel/preemption: proctrack delivers to the whole
# process tree), so a rank gets the scheduler's copy and the one rocmft forwards, milliseconds apart (seen on CI's
# Slurm cluster: the second copy stopped job 8 at once, with no checkpoint).
SAME_STOP_S = 5.0


class _StopRequest:
    """SIGTERM/SIGINT during training: stop at the next step boundary with a checkpoint (see :func:`main`)."""

    def __init__(self) -> None:
        self.requested: str | None = None  # the signal's name
        self.requested_at: float | None = None  # time.monotonic() of a signal here; None: another rank's request
        self.training = False  # set at train begin: before it, a signal stops at once
        self.at_step: int | None = None

    def is_repeat(self, now: float) -> bool:
        """Whether a signal arriving at ``now`` (monotonic s) repeats the request already made: the stop came
        from another rank, or a signal here came less than :data:`SAME_STOP_S` ago."""
        return self.requested is not None and (self.requested_at is None or now - self.requested_at < SAME_STOP_S)


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


def quantization_record(model) -> dict | None:
    """What a QLoRA base really holds: bitsandbytes' 4-bit (``Linear4bit``) or 8-bit (``Linear8bitLt``) layers.

    ``parameter_dtypes`` cannot show it: LLaMA-Factory 0.9.5 stores 4-bit weights in a ``bnb_4bit_quant_storage``
    of the compute dtype (``model/model_utils/quantization.py``), so the packed nibbles count as bfloat16 tensors.
    Returns None for a model without such layers (or without bitsandbytes), else ``bits``, ``layers`` (count),
    ``quant_type`` (``nf4``/``fp4``), ``storage_dtype``, ``weights`` (the layers' weight elements before
    quantization), ``stored_bytes`` and ``bytes_per_weight`` (0.5 for 4-bit, 1 for 8-bit; a bf16 weight is 2).
    """
    # A model holding bitsandbytes' layers was built by an imported bitsandbytes; importing it only to find none
    # cost 2.8 s of each run's start (its ops compile with torch.compile at import; cProfile of a 10-step worker)
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None or not hasattr(bnb, "nn"):
        return None
    four = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    eight = [m for m in model.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    layers = four or eight
    if not layers:
        return None
    stored = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    weights = 0
    for m in layers:
        state = getattr(m.weight, "quant_state", None)
        shape = getattr(state, "shape", None) if four else m.weight.shape
        weights += int(math.prod(shape)) if shape is not None else 0
    first = layers[0].weight
    return {"bits": 4 if four else 8, "layers": len(layers), "quant_type": getattr(first, "quant_type", None),
            "storage_dtype": str(first.dtype).replace("torch.", ""), "weights": weights, "stored_bytes": stored,
            "bytes_per_weight": round(stored / weights, 4) if weights else None}  # fmt: skip


class _RocmftHooks:
    """The hooks of rocmft's TrainerCallback, on a plain class (transformers, its base class, is imported only
    when :func:`rocmft_callback` builds the callback): progress lines, the non-finite watchdog, the dtype record
    and the test-only NaN fault.

    * one line per logging step on rank 0: step, loss, learning rate, grad norm, tokens/s (from the
      trainer's non-padding token count), elapsed, ETA;
    * a NaN/Inf loss or grad norm in a log raises :class:`NonFiniteLoss` (exit 5) — the template
      turns off transformers' ``logging_nan_inf_filter``, which would otherwise hide NaN losses;
    * at train start, the dtypes of the parameters are recorded, and a ``fp32`` policy whose
      parameters are not all float32 stops the run (the policy must never silently not apply);
    * ``fault_nan_at_step`` (tests only: rocmft.testhooks, rocmft.worker.faults) fills the weights
      with NaN after that optimizer step, so the following loss is non-finite for real;
    * ``fault_grad_spike_at_step`` (tests only, the same way) multiplies that step's
      gradients by 1000, so its logged gradient norm is a real spike (rocmft.worker.faults.GradSpike);
    * ``fault_hang_at_step`` (tests only, the same way) makes the last rank stop taking part in collectives
      at that step, so the others' all-reduce times out for real (rocmft.worker.faults.hang_at_step);
    * on a GPU, ``peak_gpu_memory_gib`` (``torch.cuda.max_memory_allocated()`` of this rank, GiB) is
      recorded at each log and at the end, and printed in the final line (rank 0's in the result
      file); it is what :mod:`rocmft.render.memfit` estimates.
    """

    def __init__(self, policy: RunPolicy, run_dir: Path) -> None:
        self.policy, self.run_dir = policy, run_dir
        self.result = WorkerResult.start()
        self.record = WorkerResultWriter(run_dir)  # its first write starts losses.jsonl afresh (a resumed run too)
        self.recent: list[float] = []  # the last logged losses, on every rank, for the spike watchdog
        self.recent_norms: list[float] = []  # the last logged gradient norms, for the gradient-norm watchdog
        self.norm_warned_at: int | None = None  # the step of the last gradient-norm warning
        self.started = time.monotonic()
        self.last_time = self.started
        self.last_tokens = 0
        spike_step = policy.fault_grad_spike_at_step
        self.grad_spike = GradSpike(spike_step) if spike_step else None  # TEST ONLY fault
        self.steps_done = 0  # optimizer steps finished when the last one began (rocmft.worker.main: a hang's step)

    def _save(self, state) -> None:
        # each node's local rank 0 writes its node's record (RUN_DIR is per node: rocmft-node<N>), so a node
        # that stopped because another rank was signalled can say so (rocmft.launch.run_worker reads it);
        # without torchrun (one process, or one scheduler task: RUN_DIR rocmft-rank<R>) the process always does
        if state.is_local_process_zero or not under_torchrun():
            self.write_record()

    def write_record(self) -> None:
        """Write :attr:`result` to RUN_DIR (the new losses appended, the record rewritten: O(1) per logged step);
        for the process that writes the node's record only (:meth:`_save`). Raises OSError as the writer does."""
        self.record.write(self.result)

    def _record_peak(self) -> None:
        import torch

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
        if self.grad_spike is not None and model is not None:
            self.grad_spike.attach(model)
        quantized = quantization_record(model) if model is not None else None
        if quantized:
            self.result = self.result.updated(quantization=quantized)
        self._watch_nodes(args)
        if self.policy.precision_policy == "fp32" and set(dtypes) - {"float32"}:
            raise RuntimeError(
                f"precision policy fp32 is not in effect: parameters are {dict(dtypes)}. "
                "This is a rocmft bug (LLaMA-Factory changed how it picks the dtype); please report it."
            )
        self._save(state)

    def on_step_begin(self, args, state, control, **kwargs):
        self.steps_done = state.global_step  # the step in progress is the next one (a hang names it)
        # TEST ONLY fault: the last rank stops taking part in collectives (until torchrun's stop signal)
        hang_at_step(self.policy, state.global_step + 1, args.process_index, args.world_size,
                     lambda: STOP.requested is not None)  # fmt: skip
        if self.grad_spike is not None:
            self.grad_spike.arm(state.global_step, state.is_world_process_zero)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if _stop_everywhere(STOP.requested, args):
            # graceful stop: every rank saves this step's checkpoint, then training ends (rocmft exits 143)
            control.should_save = True
            control.should_training_stop = True
            STOP.at_step = state.global_step
            self.result = self.result.updated(status=with_reason(RunStatus.STOPPING, STOP.requested),
                                              stopped_at_step=state.global_step)  # fmt: skip
            if state.is_world_process_zero:
                say(f"{STOP.requested}: saving checkpoint-{state.global_step} and stopping")
        nan_after_step(self.policy, state.global_step, model)

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
            median = loss_spike(self.recent, loss, self.policy.loss_spike_factor or 0)
            if median is not None:
                self.result = self.result.updated(status=RunStatus.LOSS_SPIKE, non_finite=NonFinite(
                    state.global_step, "loss", str(loss), median, RunStatus.LOSS_SPIKE.value))  # fmt: skip
                self._save(state)
                raise NonFiniteLoss(state.global_step, "loss", loss, median)
            self.recent = [*self.recent, loss][-SPIKE_WINDOW:]
        norm = logs.get("grad_norm")
        if isinstance(norm, (int, float)):
            self._watch_grad_norm(state, float(norm))
        if "loss" not in logs or not state.is_world_process_zero:
            return
        import torch

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
        say(
            f"step {state.global_step}/{state.max_steps} ({done:.0%}) loss {logs['loss']:.4f} "
            f"lr {logs.get('learning_rate', float('nan')):.2e} grad_norm {logs.get('grad_norm', float('nan')):.3g} "
            f"tok/s {rate:,.0f} elapsed {_fmt_duration(elapsed)} "
            f"eta {_fmt_duration(eta) if math.isfinite(eta) else '?'}"
        )

    def _watch_nodes(self, args) -> None:
        """Multi-node runs: the lost-node watch (rocmft.worker.peers) on this node's local rank 0."""
        from rocmft.worker import peers

        def on_lost(message: str) -> None:
            if not message.startswith("LOST"):
                warn(message, all_ranks=True)
                return
            message = f"{message}. {peers.resume_hint(Path(args.output_dir))}."
            say(message, stream=sys.stderr, all_ranks=True)
            self.result = self.result.updated(status=RunStatus.FAILED, error=message)
            self.write_record()

        peers.start(self.policy.peer_timeout_s or 0, on_lost)

    def _watch_grad_norm(self, state, norm: float) -> None:
        spike = grad_norm_spike(self.recent_norms, norm, self.policy.grad_norm_spike_factor or 0,
                                self.policy.grad_norm_limit or 0)  # fmt: skip
        self.recent_norms = [*self.recent_norms, norm][-SPIKE_WINDOW:]
        if spike is None:
            return
        reference, why = spike
        fix = ("run `rocmft check` (its GEMM probe compares the GPU's matrix products with the CPU's), lower "
               "LEARNING_RATE, or ROCMFT_PRECISION=fp32 to rule out mixed precision")  # fmt: skip
        if self.policy.on_grad_norm_spike == "stop":
            self.result = self.result.updated(status=RunStatus.GRAD_NORM_SPIKE, non_finite=NonFinite(
                state.global_step, "grad_norm", str(norm), reference, RunStatus.GRAD_NORM_SPIKE.value))  # fmt: skip
            self._save(state)
            raise NonFiniteLoss(state.global_step, "grad_norm", norm, reference, f" ({why})")
        step = state.global_step
        if self.norm_warned_at is None or step - self.norm_warned_at >= GRAD_NORM_WARN_EVERY:
            self.norm_warned_at = step
            warn(f"gradient norm {norm:.4g} at step {step} ({why}); gradient clipping (MAX_GRAD_NORM) keeps a "
                 f"single spike harmless, but norms that stay this high mean broken numerics: {fix}. "
                 "ROCMFT_ON_GRAD_NORM_SPIKE=stop stops the run instead (next warning at the earliest "
                 f"{GRAD_NORM_WARN_EVERY} steps later).")  # fmt: skip

    def on_train_end(self, args, state, control, **kwargs):
        if self.result.attention:  # how many attention calls took each path (layers × forwards, this rank)
            from rocmft.worker.attention import CALLS

            self.result = self.result.updated(attention={**self.result.attention, "calls": dict(CALLS)})
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
            say(f"training loop done: {state.global_step} steps in {elapsed}{memory}")


def rocmft_callback(policy: RunPolicy, run_dir: Path):
    """Build the TrainerCallback (imported lazily: transformers takes seconds to import) for the run in
    ``run_dir`` under ``policy``; its ``result`` is the node's :class:`~rocmft.records.WorkerResult`."""
    from transformers import TrainerCallback

    class RocmftCallback(_RocmftHooks, TrainerCallback):
        """rocmft's TrainerCallback: :class:`_RocmftHooks` on transformers' base class."""

    return RocmftCallback(policy, run_dir)
