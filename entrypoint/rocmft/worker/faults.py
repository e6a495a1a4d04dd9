"""TEST ONLY: the fault injections, which make real failures happen on purpose so that tests can prove rocmft's answer
to them: NaN weights (a low-precision overflow), a SIGKILL in the middle of writing a checkpoint, a slow final model
write on one rank, a gradient spike, a rank that stops taking part in collectives (a hang). A test sets them as
ROCMFT_FAULT_* for the tests' launcher (tests/support/rocmft_under_test.py), which installs them as
rocmft.testhooks; the rendering process writes them into run.json's ``fault_*``, the worker's only source. A
production ``rocmft`` installs none (and refuses those variables).

Not version-guarded like rocmft.worker.patches: a fault that cannot be applied raises (AttributeError) rather than
letting a test pass without its fault.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from rocmft.console import say
from rocmft.errors import ExitCode
from rocmft.records import RunPolicy


def nan_after_step(policy: RunPolicy, step: int, model) -> None:
    """ROCMFT_FAULT_NAN_AT_STEP: fill ``model``'s floating-point weights with NaN after optimizer step ``step``
    when it is the policy's fault step, so that the following loss is non-finite for real. Simulates a
    low-precision overflow: not under real fp32."""
    import torch

    fault = policy.fault_nan_at_step
    low_precision = policy.precision_policy != "fp32"
    if fault and low_precision and step == fault and model is not None:
        with torch.no_grad():
            for param in model.parameters():
                if param.is_floating_point():
                    param.fill_(float("nan"))
        say(f"TEST FAULT: weights set to NaN after step {step}", all_ranks=True)


GRAD_SPIKE_FACTOR = 1000.0  # far above ROCMFT_GRAD_NORM_SPIKE_FACTOR's default 10, like #7890's norms in the thousands


class GradSpike:
    """TEST ONLY (ROCMFT_FAULT_GRAD_SPIKE_AT_STEP): multiply every trainable parameter's gradient by
    :data:`GRAD_SPIKE_FACTOR` during the backward passes of optimizer step ``step`` (1-based, as logged), so the
    gradient norm the trainer computes and logs for that step is a real spike with no NaN in it (the gradients are
    then clipped by ``max_grad_norm`` as usual). Hooks on the parameters (``Tensor.register_hook``) run before
    gradient accumulation and DDP's all-reduce. The worker's callback calls :meth:`attach` at train start and
    :meth:`arm` at each step's start."""

    def __init__(self, step: int) -> None:
        self.step, self.on = step, False

    def _scale(self, grad):
        return grad * GRAD_SPIKE_FACTOR if self.on else grad

    def attach(self, model) -> None:
        """Hook every trainable parameter of ``model``; raises ValueError when it has none (no fault is no test)."""
        hooked = [p.register_hook(self._scale) for p in model.parameters() if p.requires_grad]
        if not hooked:
            raise ValueError("the grad_spike_at_step test fault: the model has no trainable parameter to hook")

    def arm(self, global_step: int, world_zero: bool) -> None:
        """Turn the multiplication on for the step after ``global_step`` (the trainer's count of finished steps)
        when it is the fault's step, off otherwise."""
        self.on = global_step + 1 == self.step
        if self.on and world_zero:
            say(f"TEST FAULT: gradients of step {self.step} multiplied by {GRAD_SPIKE_FACTOR:g}")


def hang_at_step(policy: RunPolicy, step: int, rank: int, world_size: int, stopped: Callable[[], bool]) -> None:
    """TEST ONLY (ROCMFT_FAULT_HANG_AT_STEP): at the start of optimizer step ``step`` (1-based, as logged) the last
    rank of a job of several stops taking part in collectives, as a rank stuck in a hung RCCL transfer does: the
    others wait in the step's gradient all-reduce until the process group's timeout (DDP_TIMEOUT) ends it for real
    (gloo: "Timed out waiting ...ms for recv operation to complete"). It waits until a stop signal arrives
    (``stopped``; torchrun sends one when another rank failed), then exits. Simulates a transport hang that RCCL's
    safe fallbacks avoid: not under ROCMFT_COLLECTIVES=safe (``policy.collectives``), as the NaN fault spares fp32."""
    fault = policy.fault_hang_at_step
    if not fault or step != fault or world_size < 2 or rank != world_size - 1 or policy.collectives == "safe":
        return
    say(f"TEST FAULT: rank {rank} stops taking part in collectives at step {step}", all_ranks=True)
    while not stopped():
        time.sleep(0.2)
    os._exit(ExitCode.INTERRUPTED)


def kill_in_save(step: int) -> None:
    """TEST ONLY (ROCMFT_FAULT_KILL_IN_SAVE_AT_STEP): SIGKILL this process in the middle of writing the checkpoint
    of ``step``: transformers' Trainer._save_checkpoint has written the weights and is about to write the
    optimizer state; trainer_state.json (written last) never comes."""
    from transformers import Trainer

    save = Trainer._save_optimizer_and_scheduler

    def save_or_die(self, output_dir):
        if self.state.global_step == step:
            say(f"TEST FAULT: SIGKILL while writing {output_dir}", all_ranks=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return save(self, output_dir)

    Trainer._save_optimizer_and_scheduler = save_or_die


def slow_final_save(seconds: float) -> None:
    """TEST ONLY (ROCMFT_FAULT_SLOW_FINAL_SAVE_S): the rank that writes the model (``should_save``) sleeps
    ``seconds`` before writing the final model (LLaMA-Factory's ``trainer.save_model()`` after training), as a
    large model's write takes, while the other ranks, which write nothing there, go on and exit."""
    from transformers import Trainer

    save = Trainer.save_model

    def slow_save(self, output_dir=None, _internal_call=False):
        if self.args.should_save and not _internal_call:
            say(f"TEST FAULT: writing the final model slowly ({seconds:g} s)", all_ranks=True)
            time.sleep(seconds)
        return save(self, output_dir, _internal_call)

    Trainer.save_model = slow_save
