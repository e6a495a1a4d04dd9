"""The training worker: LLaMA-Factory's ``run_exp`` with rocmft's callbacks, one per rank.

Started as ``python -m rocmft.worker RUN_DIR`` for one process, or by torchrun (``torchrun ... -m
rocmft.worker RUN_DIR``) once per rank; it reads only the rendered files in RUN_DIR (train.yaml and
run.json), so a run can be repeated from its output folder alone. Secret arguments (HF_HUB_TOKEN, ...)
are never in those files: they are taken from the worker's environment.

Exit codes (rocmft.errors.ExitCode): 0 done, 4 training raised, 5 non-finite loss or gradient norm,
143 SIGTERM/SIGINT. Under torchrun a stop at a step boundary exits 0 and is recorded in worker-result.json
(``stopped_at_step``), from which the launcher makes rocmft's 143 (see the end of :func:`main`).
"""

from rocmft.worker.callbacks import (
    SPIKE_MIN_HISTORY,
    SPIKE_MIN_JUMP,
    SPIKE_WINDOW,
    Interrupted,
    NonFiniteLoss,
    grad_norm_spike,
    loss_spike,
    rocmft_callback,
)

__all__ = ["SPIKE_MIN_HISTORY", "SPIKE_MIN_JUMP", "SPIKE_WINDOW", "Interrupted", "NonFiniteLoss", "grad_norm_spike",
           "loss_spike", "rocmft_callback"]  # fmt: skip
