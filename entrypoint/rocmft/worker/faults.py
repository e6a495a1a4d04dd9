"""TEST ONLY: the fault injections of ROCMFT_FAULT_* (run.json's ``fault_*``), which make real failures happen on
purpose so that tests can prove rocmft's answer to them: NaN weights (a low-precision overflow), a SIGKILL in the
middle of writing a checkpoint, a slow final model write on one rank.

Not version-guarded like rocmft.worker.patches: a fault that cannot be applied raises (AttributeError) rather than
letting a test pass without its fault.
"""

from __future__ import annotations

import os
import signal
import time

from rocmft.console import say
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
