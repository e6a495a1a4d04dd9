"""TEST ONLY: the ``rocmft`` command with test hooks, ``python tests/support/rocmft_under_test.py <rocmft args>``.

It reads the test hooks from its own environment, takes them out of ``os.environ`` (so that rocmft's settings, which
refuse them, and every child process never see them), installs them (:mod:`rocmft.testhooks`) and calls rocmft's
ordinary entry point, :func:`rocmft.cli.main`:

* ``ROCMFT_TEST_PROBES``: a JSON file of probe results used instead of probing this machine (keys: devices,
  allreduce, libs, image, shm_bytes, host, device_nodes, shaped as rocmft.facts.probe and the checks record them),
  so that the GPU checks' failures can be tested end to end without a GPU.
* ``ROCMFT_FAULT_NAN_AT_STEP``: after optimizer step N, poison the weights with NaN so the loss becomes non-finite
  for real, as a bf16/fp16 overflow would (so only under those precisions); proves the non-finite-loss stop (exit 5)
  and ROCMFT_ON_NAN=fp32.
* ``ROCMFT_FAULT_KILL_IN_SAVE_AT_STEP``: SIGKILL the worker while it writes the checkpoint of step N (after the
  weights, before the optimizer state and trainer_state.json), as a pre-emption mid-save would.
* ``ROCMFT_FAULT_SLOW_FINAL_SAVE_S``: the rank that writes the model waits N seconds before writing the final model.
* ``ROCMFT_FAULT_GRAD_SPIKE_AT_STEP``: multiply the gradients of optimizer step N by 1000 (no NaN).
* ``ROCMFT_FAULT_HANG_AT_STEP``: at optimizer step N the last rank stops taking part in collectives, so the others'
  all-reduce times out for real after DDP_TIMEOUT (not under ROCMFT_COLLECTIVES=safe); proves ROCMFT_ON_HANG=retry.

The faults reach the worker (a separate process, started by torchrun or directly) in run.json's ``fault_*``, written
by this process. This file lives in tests/, which neither the wheel nor the image ships; the production ``rocmft``
(the console script, ``python -m rocmft``) installs no hooks and refuses these variables as unknown settings (exit 2).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

PROBES_VARIABLE = "ROCMFT_TEST_PROBES"
FAULT_PREFIX = "ROCMFT_FAULT_"


def take_hooks(environ: MutableMapping[str, str]):
    """Remove the test hooks' variables from ``environ`` (in any case, as rocmft's settings read names) and return
    them as :class:`rocmft.testhooks.TestHooks`; None when none is set (an empty value counts as unset).

    Raises:
        ConfigError: the probe file cannot be read as JSON or is not an object; a ROCMFT_FAULT_ variable that is
            not a fault; a fault value that is not a positive number of its type.
    """
    from rocmft.errors import ConfigError
    from rocmft.testhooks import FAULTS, TestHooks
    from rocmft.values import whole_number

    probes: dict = {}
    faults: dict[str, int | float] = {}
    found = False
    for name in [n for n in environ if n.upper() == PROBES_VARIABLE or n.upper().startswith(FAULT_PREFIX)]:
        text = environ.pop(name).strip()
        found = True
        if not text:
            continue
        if name.upper() == PROBES_VARIABLE:
            try:
                probes = json.loads(Path(text).read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                raise ConfigError(f"{name}={text} cannot be read as JSON: {err}.",
                                  f"Unset {name} (a test hook), or point it at a JSON object.") from err  # fmt: skip
            if not isinstance(probes, dict):
                raise ConfigError(f"{name}={text} is not a JSON object.", "Give probe id: result pairs.")
            continue
        fault = name.upper().removeprefix(FAULT_PREFIX).lower()
        if fault not in FAULTS:
            known = ", ".join(FAULT_PREFIX + f.upper() for f in FAULTS)
            raise ConfigError(f"{name} is not a test fault.", f"Use one of {known}.")
        if FAULTS[fault] is int:
            value: int | float | None = whole_number(text)
        else:
            try:
                value = float(text)
            except ValueError:
                value = None
        if value is None or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name}={text} is not a positive {FAULTS[fault].__name__}.",
                              f"Give {name} a number above 0.")  # fmt: skip
        faults[fault] = value
    return TestHooks(probes=probes, faults=faults) if found else None


def run_with_hooks(argv: list[str] | None, environ: MutableMapping[str, str]) -> int:
    """``rocmft ARGV`` with the hooks of ``environ`` taken out of it (:func:`take_hooks`) and installed for the
    call, then none again; returns the exit code. A hook that cannot be read ends it with exit 2 and rocmft's own
    CONFIGURATION ERROR message, as a bad setting would. Used by :func:`main` (this launcher's process) and by
    tests/support/inprocess.py (the pytest process, ``environ`` being its replaced ``os.environ``)."""
    from rocmft import testhooks
    from rocmft.cli import main as rocmft_main
    from rocmft.console import say
    from rocmft.errors import ConfigError

    try:
        hooks = take_hooks(environ)
    except ConfigError as err:
        say(f"CONFIGURATION ERROR: {err}", stream=sys.stderr, all_ranks=True)
        return int(err.code)
    testhooks.install(hooks)
    try:
        return rocmft_main(argv)
    finally:
        testhooks.install(None)


def main(argv: list[str] | None = None) -> int:
    """``rocmft ARGV`` (default: this process's arguments) with the hooks of this process's environment
    (:func:`run_with_hooks`); returns the exit code."""
    return run_with_hooks(argv, os.environ)


if __name__ == "__main__":
    raise SystemExit(main())
