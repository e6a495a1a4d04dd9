"""A DeepSpeed config judged as its readers will read it: rocmft's offload settings (ZeRO stage, CPU or NVMe, the
NVMe folder), a user's ds_config file's own text (a key written twice, a boolean or number written as a string),
and DeepSpeed's verdict on the config (:func:`deepspeed_refusal`, from :mod:`rocmft.validate.dsmodel` in the parser
child). The trainer-against-ds_config comparisons are :func:`rocmft.validate.rules.distributed.user_ds_config`."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rocmft.container import mount
from rocmft.errors import ConfigError
from rocmft.findings import ERROR, Finding, noting
from rocmft.nesting import loads_json
from rocmft.validate.rules import Inputs, rule
from rocmft.validate.rules.common import named
from rocmft.validate.rules.distributed import AUTO_FILLED

# The finding code of DeepSpeed's own refusal (not a registered rule: it runs in the parser child, after the
# rendered phase; docs/rules.md lists it with the rules).
DEEPSPEED_MODEL = "dsconfig.deepspeed_model"
# Keys whose value transformers compares or tests as a number (HfTrainerDeepSpeedConfig.fill_match compares with
# !=, accelerate's HfDeepSpeedConfig.is_zero3 tests ``stage == 3``): a number written as a string there is read as
# a string by transformers and as a number by DeepSpeed's pydantic models.
NUMERIC_KEYS = (AUTO_FILLED - {"fp16.enabled", "bf16.enabled"}) | {"zero_optimization.stage"}
# Sections transformers and accelerate walk with .get (HfDeepSpeedConfig.find_config_node): anything but an object
# there crashes LLaMA-Factory's parse with "'bool' object has no attribute 'get'" before DeepSpeed sees it.
SECTIONS = ("zero_optimization", "zero_optimization.offload_optimizer", "zero_optimization.offload_param",
            "optimizer", "optimizer.params", "scheduler", "scheduler.params", "fp16", "bf16")  # fmt: skip


def _writable(folder: Path) -> str | None:
    """Why ``folder`` cannot take DeepSpeed's swap files, or None: it must exist, be a folder, and take a file (a
    real write: a read-only mount passes os.access for root)."""
    if not folder.exists():
        return "does not exist here"
    if not folder.is_dir():
        return "is not a folder"
    try:
        handle, name = tempfile.mkstemp(prefix=".rocmft-nvme-", dir=folder)
        os.close(handle)
        os.unlink(name)
    except OSError as err:
        return f"cannot be written ({err.strerror or type(err).__name__})"
    return None


@rule("inputs", 25)
def offload_settings(run: Inputs) -> None:
    """ROCMFT_OFFLOAD, ROCMFT_OFFLOAD_DEVICE and ROCMFT_NVME_PATH against ROCMFT_ZERO_STAGE, as DeepSpeed 0.18.4
    reads the rendered config:

    * offload at ZeRO stage 0: no ZeRO optimizer is built (deepspeed/runtime/engine.py:1436, ``zero_enabled``), so
      nothing reads ``offload_optimizer`` (huggingface/accelerate#232: offload settings DeepSpeed does not honour);
    * ``nvme`` below stage 3: stages 1 and 2 take any device but ``none`` as CPU offload
      (deepspeed/runtime/zero/stage_1_and_2.py:176-177); only stage 3 swaps to NVMe
      (deepspeed/runtime/zero/stage3.py:685-692);
    * ``nvme`` with no ROCMFT_NVME_PATH, or a path that does not exist, is not a folder or cannot be written
      (DeepSpeed makes ``<nvme_path>/zero_stage_3`` at the first swap: stage3.py:699-700; huggingface/accelerate#1463:
      NVMe offload with no path);
    * ROCMFT_OFFLOAD_DEVICE or ROCMFT_NVME_PATH that change nothing (no offload, or the device is cpu).

    Raises:
        ConfigError: naming the settings.
    """
    settings = run.settings
    rocmft, explicit = settings.rocmft, settings.explicit_rocmft
    knob = settings.knob
    if rocmft.distributed != "deepspeed":
        for name in ("offload_device", "nvme_path"):
            if name in explicit:
                raise ConfigError(f"{knob(name)} has no effect with {knob('distributed')}: only DeepSpeed offloads.",
                                  f"Set ROCMFT_DISTRIBUTED=deepspeed, or remove ROCMFT_{name.upper()}.")  # fmt: skip
        return
    if rocmft.offload != "none" and rocmft.zero_stage == 0:
        raise ConfigError(
            f"{knob('offload')} with {knob('zero_stage')}: DeepSpeed builds no ZeRO optimizer at stage 0, so "
            "nothing would be offloaded.",
            "Set ROCMFT_ZERO_STAGE=1 or more for optimizer offload (3 to offload the parameters too).",
        )
    nvme = rocmft.offload_device == "nvme"
    if "offload_device" in explicit and nvme and rocmft.offload == "none":
        raise ConfigError(f"{knob('offload_device')} has no effect with {knob('offload')}.",
                          "Set ROCMFT_OFFLOAD=optimizer or optimizer+params, or remove "
                          "ROCMFT_OFFLOAD_DEVICE.")  # fmt: skip
    if "nvme_path" in explicit and not (nvme and rocmft.offload != "none"):
        raise ConfigError(f"{knob('nvme_path')} has no effect with {knob('offload_device')} and {knob('offload')}.",
                          "Set ROCMFT_OFFLOAD_DEVICE=nvme (with ROCMFT_OFFLOAD) to offload there, or remove "
                          "ROCMFT_NVME_PATH.")  # fmt: skip
    if not nvme or rocmft.offload == "none":
        return
    if rocmft.zero_stage != 3:
        raise ConfigError(
            f"{knob('offload_device')} with {knob('zero_stage')}: DeepSpeed offloads to NVMe only at stage 3; at "
            "stages 1 and 2 it keeps the 'nvme' optimizer state in CPU memory.",
            "Set ROCMFT_ZERO_STAGE=3 for NVMe offload, or ROCMFT_OFFLOAD_DEVICE=cpu.",
        )
    if rocmft.nvme_path is None:
        raise ConfigError(f"{knob('offload_device')} needs a folder for DeepSpeed's swap files: ROCMFT_NVME_PATH is "
                          "not set.", "Set ROCMFT_NVME_PATH=/nvme with a writable folder on a fast local disk "
                          f"mounted there: {mount('/mnt/nvme/rocmft', '/nvme')}.")  # fmt: skip
    problem = _writable(Path(rocmft.nvme_path).expanduser())
    if problem:
        raise ConfigError(f"{knob('nvme_path')} {problem}; DeepSpeed writes its NVMe swap files there.",
                          "Point ROCMFT_NVME_PATH at a writable folder on a fast local disk, mounted at that path: "
                          f"{mount('<a folder on the NVMe disk>', str(rocmft.nvme_path))}; or set "
                          "ROCMFT_OFFLOAD_DEVICE=cpu.")  # fmt: skip


class _Pairs(dict):
    """A JSON object that remembers the keys written more than once: ``(key, first value, last value)``."""

    twice: list[tuple[str, Any, Any]]


def _pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    node, twice = _Pairs(), []
    for key, value in pairs:
        if key in node:
            twice.append((key, node[key], value))
        node[key] = value
    node.twice = twice
    return node


def _walk(tree: Any, prefix: str = ""):
    """Every (dotted path, value) of ``tree``, objects and lists included, depth first in file order."""
    stack = [(prefix, tree)]
    while stack:
        path, node = stack.pop()
        yield path, node
        children = (list(node.items()) if isinstance(node, dict) else
                    [(str(i), v) for i, v in enumerate(node)] if isinstance(node, list) else [])  # fmt: skip
        stack.extend((f"{path}.{key}" if path else key, child) for key, child in reversed(children))


def _user_file(run: Any) -> tuple[Path, str] | None:
    """The user's DEEPSPEED file and its text, or None (no such file, rocmft rendered the config, or unreadable:
    user_ds_config reports that)."""
    if not run.arguments.get("deepspeed") or run.ds_config is not None:
        return None
    path = Path(str(run.arguments["deepspeed"])).expanduser()
    try:
        return path, path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


@rule("rendered", 25)
def duplicate_keys(run: Any) -> None:
    """A key written twice in one object of a user's ds_config (DEEPSPEED=path): transformers reads the file with
    ``json.load``, where the last one silently wins, so the first is a setting that looks set and is not
    (DeepSpeed itself refuses duplicates only when it opens the file, which it does not under the trainer:
    deepspeed/runtime/config.py:658 ``dict_raise_error_on_duplicate_keys``, while transformers hands it a dict:
    accelerate/utils/deepspeed.py, ``HfDeepSpeedConfig.__init__``; deepspeedai/DeepSpeed#238 is DeepSpeed's reader
    that rejects them).

    Raises:
        ConfigError: naming each key path, both values and the file.
    """
    found = _user_file(run)
    if found is None:
        return
    path, text = found
    try:
        tree = loads_json(text, object_pairs_hook=_pairs)
    except ValueError:
        return  # not JSON: user_ds_config says so
    twice = [(f"{where}.{key}" if where else key, first, last) for where, node in _walk(tree)
             if isinstance(node, _Pairs) for key, first, last in node.twice]  # fmt: skip
    if twice:
        listed = "; ".join(f"{key} first {_short(first)}, then {_short(last)}" for key, first, last in twice)
        raise ConfigError(
            f"{named(run, 'deepspeed')} writes a key twice: {listed}. transformers reads the file with the last "
            "value of each and drops the first without a word.",
            f"Keep one of each in {path} (the value you mean).",
        )


def _spelled(value: str) -> str | None:
    """What a JSON string spells that JSON has its own type for: ``boolean``, ``number`` or None."""
    text = value.strip()
    if text.lower() in ("true", "false"):
        return "boolean"
    try:
        float(text)
    except ValueError:
        return None
    return "number" if text.lower() not in ("nan", "inf", "-inf", "infinity", "-infinity", "+inf") else None


@rule("rendered", 27)
def typed_values(run: Any) -> None:
    """A boolean written as a string anywhere in a user's ds_config (``"enabled": "false"``), or a number written
    as a string in a key transformers compares (:data:`NUMERIC_KEYS`: ``"stage": "3"``). DeepSpeed's pydantic
    models coerce both ("false" to False, "3" to 3), but the other readers of the same file do not:
    accelerate's ``HfDeepSpeedConfig.is_true`` is ``bool(value)``, so ``"fp16": {"enabled": "false"}`` makes
    transformers train in fp16; ``is_zero3`` compares ``stage == 3``, so ``"stage": "3"`` loads the whole model on
    every GPU before DeepSpeed partitions it; DeepSpeed's own top-level switches are read with ``dict.get``
    (``"zero_allow_untested_optimizer": "false"`` is on). Also a section its readers walk (:data:`SECTIONS`) given
    as anything but an object (``"offload_optimizer": true``, Lightning-AI/pytorch-lightning#17790): transformers
    crashes on it in LLaMA-Factory's parser with an AttributeError naming no key. huggingface/accelerate#1828 is
    the same kind: a learning rate that reached DeepSpeed as a string.

    Raises:
        ConfigError: naming each key path with its value as written, and the file.
    """
    found = _user_file(run)
    if found is None:
        return
    path, text = found
    try:
        tree = loads_json(text)
    except ValueError:
        return
    quoted, sections = [], []
    for where, value in _walk(tree):
        kind = _spelled(value) if isinstance(value, str) else None
        if kind == "boolean" or (kind == "number" and where in NUMERIC_KEYS):
            quoted.append(f"{where}={json.dumps(value)} (a {kind} written as a string)")
        if where in SECTIONS and value is not None and not isinstance(value, dict):
            sections.append(f"{where}={_short(value)}")
    if sections:
        raise ConfigError(
            f"{named(run, 'deepspeed')} gives {'; '.join(sections)} where DeepSpeed and transformers read an object "
            'of options (e.g. "offload_optimizer": {"device": "cpu"}, not true).',
            f"Write those keys as objects in {path}, or remove them.",
        )
    if quoted:
        raise ConfigError(
            f"{named(run, 'deepspeed')} quotes values that have a JSON type: {'; '.join(quoted)}. DeepSpeed "
            'converts them, but transformers reads a quoted boolean as true whatever it says (bool("false")) and '
            "a quoted number as text.",
            f"Remove the quotes in {path} (true, false, 3).",
        )


def _written(tree: Any, dotted: str) -> tuple[bool, Any]:
    node = tree
    for part in dotted.split(".") if dotted else []:
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False, None
    return bool(dotted), node


def _problem_text(problem: dict[str, Any], written_tree: Any) -> str:
    where, value, reason = problem.get("path") or "", problem.get("value"), problem.get("reason") or ""
    if not where:
        return reason
    found, written = _written(written_tree, where)
    if found and written != value:
        return f"{where}={json.dumps(written)} (transformers filled in {json.dumps(value)}): {reason}"
    if not found and value is None:
        return f"{where}: {reason}"
    return f"{where}={json.dumps(written if found else value)}: {reason}"


def deepspeed_refusal(plan: Any, problems: list[dict[str, Any]]) -> ConfigError:
    """DeepSpeed's own refusal of the run's ds_config (the parser child's :func:`rocmft.validate.dsmodel.judge`) as
    a ConfigError with one finding of code :data:`DEEPSPEED_MODEL`: the file, each key path with its value as
    written and DeepSpeed's reason, and a fix. Kinds it catches that rocmft's own rules do not: an option DeepSpeed
    does not have ("Extra inputs are not permitted": deepspeedai/DeepSpeed#2721), an offload device it does not know
    (huggingface/accelerate#232), an offload block written as a boolean (Lightning-AI/pytorch-lightning#17790), a
    fraction where it takes a whole number (huggingface/accelerate#2814), out-of-range values and DeepSpeed's own
    assertions."""
    rendered = plan.ds_config is not None
    path = Path(str(plan.arguments.get("deepspeed")))
    with noting() as noted:
        if rendered:
            knob = plan.settings.knob
            what = (f"rocmft's rendered ds_config ({knob('zero_stage')}, {knob('offload')}, "
                    f"{knob('offload_device')})")  # fmt: skip
            written_tree: Any = plan.ds_config
        else:
            what = named(plan, "deepspeed")
            try:
                written_tree = loads_json(path.expanduser().read_text())
            except (OSError, ValueError):
                written_tree = None
    listed = "; ".join(_problem_text(problem, written_tree) for problem in problems)
    extra = any("Extra inputs" in str(p.get("reason")) for p in problems)
    message = f"DeepSpeed's own config classes refuse {what}: {listed}."
    fix = ((f"Correct those keys in {path} as DeepSpeed says" if not rendered else
            "Fix the deepspeed.json.j2 of ROCMFT_TEMPLATES (or unset it), or the ROCMFT_ settings named")
           + (" (an option DeepSpeed does not have is a misspelling or another version's: DeepSpeed's config "
              "docs list its keys)" if extra else "") + "; `rocmft render` checks again.")  # fmt: skip
    text = f"{message}\n{fix}"
    chosen = {s.name: s for s in reversed(noted) if s.text and s.text in text}
    error = ConfigError(message, fix)
    error.findings = (Finding(DEEPSPEED_MODEL, ERROR, message, fix, tuple(chosen.values())),)
    return error


__all__ = ["DEEPSPEED_MODEL", "NUMERIC_KEYS", "deepspeed_refusal", "duplicate_keys", "offload_settings",
           "typed_values"]  # fmt: skip
