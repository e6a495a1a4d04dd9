"""A trained model's parameters listed once, not found again by walking its module tree at every optimizer step.

transformers 5.6's Trainer clips with ``accelerator.clip_grad_norm_(model.parameters(), ...)`` and calls
``model.zero_grad()`` at every optimizer step; each walks every module (2,333 for the 7B Qwen2 shape with LoRA on its
seven Linears) and hashes each of its 731 parameters, on the host while the GPU waits: on an H100, the profiled
steps' GPU sat idle 42 ms in torch's ``clip_grad_norm_`` and 40 ms in the epoch loop's own lines (``zero_grad``)
against 8 ms and 1 ms for Unsloth, whose ``unsloth_zoo/fast_grad_params.py`` (2026.10.9) lists them once too
(``bench/steady_probe.py --gaps``; BENCHMARKS.md, issue 32).

:func:`listed` is ``tuple(root.parameters())``, in that order, kept until a module of the tree registers a parameter
or a submodule (torch's global registration hooks, ``torch.nn.modules.module``); then every list is made again
(:func:`changes` counts those changes: rocmft.worker.patches.train_mode_set_once's module lists go with them).
Filtering it by ``p.grad is not None`` at call time is what torch's ``clip_grad_norm_`` and ``Module.zero_grad`` do
over ``parameters()``, so the gradients found, and their order, are the same, a frozen parameter holding a
gradient and one unfrozen mid-run included. Not seen: a parameter set to None or deleted with ``del`` (neither runs
a hook; it stays listed: deleting a trained adapter between micro-steps gave a norm of 1.680 against torch's 1.643
in a review's test), new Parameter objects made by a conversion under
``torch.__future__.set_overwrite_module_params_on_conversion(True)`` (``model.double()`` mid-run: the optimizer keeps
the old ones too), and ``_parameters`` edited directly (FSDP, DeepSpeed ZeRO-3: rocmft.worker.patches leaves those
runs to transformers). None of these happens in a run rocmft starts.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_LISTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # root module -> tuple of its parameters
_TRACKED: weakref.WeakSet = weakref.WeakSet()  # every module of a listed tree (or one given to track)
_HOOKS: list[Any] = []
_changes = 0  # how many times a tracked tree changed (patches.train_mode_set_once's lists are current while it holds)


def _registered(module, _name, _value) -> None:
    """torch's global hook on every parameter and submodule registration: a change in a listed tree drops every
    list (a ModuleList sliced in a forward, ``layers[:n]``, registers into a new, untracked list: no change)."""
    if torch.compiler.is_compiling():
        # Dynamo traces this hook where a compiled forward slices a ModuleList, and tracing the WeakSet's weak
        # references to the compiled model itself fails ("already tracked for mutation": a Trainer with
        # torch_compile crashed at its first forward after the first clip); what it traces is a new list anyway
        return
    try:
        changed = module in _TRACKED
    except TypeError:  # a class with __eq__ and no __hash__: never tracked (modules() hashes every module it yields),
        return  # and torch builds one without hashing it, so a hook that hashed it raised where torch did not
    if changed:
        global _changes
        _changes += 1
        _LISTED.clear()
        _TRACKED.clear()


def listed(root) -> tuple:
    """``tuple(root.parameters())``, made once while ``root``'s tree is unchanged (module docstring)."""
    params = _LISTED.get(root)
    if params is None:
        params = tuple(root.parameters())
        track(root.modules())
        _LISTED[root] = params
    return params


def track(modules) -> int:
    """Count a parameter or submodule registered into any of ``modules`` as a change of a listed tree (every list is
    dropped); returns :func:`changes` (patches.train_mode_set_once: its module lists, made after a walk, are the
    tree's while that count holds)."""
    if not _HOOKS:
        from torch.nn.modules import module

        _HOOKS.append(module.register_module_parameter_registration_hook(_registered))
        _HOOKS.append(module.register_module_module_registration_hook(_registered))
    _TRACKED.update(modules)
    return _changes


def changes() -> int:
    """How many times a tracked module registered a parameter or submodule (:func:`track`)."""
    return _changes


def is_listed(root) -> bool:
    """Whether ``root`` has a list (:func:`listed` was called for it and its tree has not changed since)."""
    return root in _LISTED


def with_grad(root) -> list:
    """The parameters of ``root`` that hold a gradient, in ``root.parameters()`` order."""
    return [p for p in listed(root) if p.grad is not None]
