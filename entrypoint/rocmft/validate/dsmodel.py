"""DeepSpeed judges its own configuration: the ds_config goes through DeepSpeed's config classes
(``deepspeed.runtime.config.DeepSpeedConfig``: the pydantic models ``DeepSpeedZeroConfig``, the offload configs,
fp16/bf16, activation checkpointing, ... and its own assertions) before the model loads.

Run in the parser child (:mod:`rocmft.validate.child`), after LLaMA-Factory's ``get_train_args`` accepted the
arguments: that process has torch and transformers imported already, and with DEEPSPEED set accelerate has imported
DeepSpeed too (``accelerate.state`` calls ``deepspeed.comm.init_distributed``), so the check costs no import of its
own there, and DeepSpeed's console line ("Setting accelerator to CPU ...") goes to the child's log, not the user's
console. Importing ``deepspeed.runtime.config`` in the entrypoint instead would cost ~10 s (it imports torch,
transformers and DeepSpeed's engine; measured with ``python -X importtime``).

The config judged is transformers' own reading of the file (``TrainingArguments.hf_deepspeed_config.config``, after
``HfTrainerDeepSpeedConfig.trainer_config_process`` filled the trainer's ``"auto"`` values: batch sizes,
clipping, learning rate, fp16/bf16). The ``"auto"`` values it fills later, once the model is loaded (bucket sizes
from the hidden size, the scheduler's step counts), are skipped by DeepSpeed's models themselves
(``DeepSpeedConfigModel.__init__`` drops ``"auto"`` unless ``strict``). DeepSpeedConfig is built without a
process group of its own: ``deepspeed.comm.get_rank`` fails or answers the child's one rank, and DeepSpeed then
takes world size 1, the same world size transformers filled the batch with in the child.

This module imports nothing of rocmft's settings stack: the child reaches it right after its parse.
"""

from __future__ import annotations

import json
import time
from typing import Any

# DeepSpeed's models by the ds_config key they are built from, for a model-level error (pydantic's loc is then
# empty); a field's error is located by walking its loc (:func:`locate`).
MODEL_KEYS = {"DeepSpeedZeroConfig": "zero_optimization", "DeepSpeedFP16Config": "fp16", "DeepSpeedBF16Config": "bf16",
              "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
              "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param"}  # fmt: skip


def _resolve(node: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    for part in loc:
        listed = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if listed or (isinstance(node, dict) and part in node):
            node = node[part]
        else:
            return False, None
    return True, node


def locate(config: Any, loc: tuple[Any, ...], value: Any, title: str = "") -> str:
    """The dotted key path in ``config`` of a pydantic error at ``loc`` (relative to the DeepSpeed model that was
    built from some sub-object of the config) whose input is ``value``: the first object, breadth first, from which
    ``loc`` leads to ``value``. A model-level error (empty ``loc``) is placed by the model's name
    (:data:`MODEL_KEYS`); "" when nothing fits."""
    loc = tuple(part for part in loc if part != "__root__")
    if not loc:
        return MODEL_KEYS.get(title, "")
    queue: list[tuple[str, Any]] = [("", config)]
    while queue:
        prefix, node = queue.pop(0)
        found, there = _resolve(node, loc)
        if found and (there == value or there is value):
            return prefix + ".".join(str(part) for part in loc)
        if isinstance(node, dict):
            queue.extend((f"{prefix}{key}.", child) for key, child in node.items() if isinstance(child, dict))
    return ".".join(str(part) for part in loc)


def _shown(value: Any) -> Any:
    """``value`` as JSON can carry it (a model instance or an enum as its text)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)[:200]


def judge(config: dict[str, Any]) -> tuple[list[dict[str, Any]], float]:
    """DeepSpeed's verdict on ``config`` (a ds_config as transformers read and filled it): every problem DeepSpeed's
    config classes raise, each ``{"path": dotted key or "", "value": the input, "reason": DeepSpeed's words}``,
    and the seconds it took (the import included, when DeepSpeed was not imported yet). Never raises."""
    started = time.monotonic()
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
        from pydantic import ValidationError
    except Exception as err:  # not installed, or its import fails: the worker would fail the same way, say so
        return [{"path": "", "value": None, "reason": f"DeepSpeed cannot be imported ({type(err).__name__}: {err})"}], (
            time.monotonic() - started
        )
    problems: list[dict[str, Any]] = []
    try:
        DeepSpeedConfig(json.loads(json.dumps(config)))  # a copy: DeepSpeed writes into what it is given
    except ValidationError as err:
        for error in err.errors(include_url=False):
            value = error.get("input")
            problems.append({"path": locate(config, tuple(error.get("loc") or ()), value, err.title),
                             "value": _shown(value) if error.get("loc") else None,
                             "reason": str(error.get("msg"))})  # fmt: skip
    except Exception as err:  # DeepSpeed's own assertions (fp16 and bf16 both on, ...) and reads of odd values
        problems.append({"path": "", "value": None, "reason": f"{type(err).__name__}: {err}".strip()})
    return problems, time.monotonic() - started


__all__ = ["MODEL_KEYS", "judge", "locate"]
