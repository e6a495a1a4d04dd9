"""The one reading of a JSON text from a user's file, with a bound on how deeply it nests.

json's C scanner recurses once per ``[`` / ``{`` and raises RecursionError (not ValueError) at about the
interpreter's recursion limit (1000 by default; CPython Modules/_json.c, ``scan_once_unicode`` calls
``Py_EnterRecursiveCall``). Every walk over a parsed value (rocmft's own, ``json.dumps``, OmegaConf's) recurses the
same way, so a file just under that depth parses and then crashes the next reader. :func:`loads_json` turns both
into :class:`TooDeep`, a ValueError, which every caller already reports as an unreadable file naming it.

:data:`MAX_DEPTH` is far beyond what the files rocmft reads nest in practice: a LLaMA-Factory dataset_info.json
entry nests 3 levels, a sharegpt record 3, a DeepSpeed config 3, a model's config.json 3-4 (text_config,
rope_scaling); and well below the recursion limit, with room for the callers' own frames.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 100
TOO_DEEP = f"nested too deeply (lists or objects more than {MAX_DEPTH} levels deep)"


class TooDeep(ValueError):
    """A parsed file nests lists/objects more than :data:`MAX_DEPTH` levels deep."""

    def __init__(self) -> None:
        super().__init__(TOO_DEEP)


def depth(value: Any) -> int:
    """How many levels of lists / dicts ``value`` nests (0 for a scalar), counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list | tuple) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:  # beyond it the answer is already "too deep"
            stack.extend((child, level + 1) for child in children)
    return deepest


def check_depth(value: Any) -> Any:
    """``value`` itself when it nests at most :data:`MAX_DEPTH` levels.

    Raises:
        TooDeep: it nests deeper.
    """
    if depth(value) > MAX_DEPTH:
        raise TooDeep()
    return value


def loads_json(text: str | bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``json.loads(text)``, refusing nesting beyond :data:`MAX_DEPTH` levels. ``object_pairs_hook`` as json's
    (each object's key/value pairs in file order, duplicates included: rocmft.validate.rules.dsconfig finds keys
    written twice with it).

    Raises:
        json.JSONDecodeError: not JSON; TooDeep: nested too deeply (both are ValueError).
    """
    try:
        return check_depth(json.loads(text, object_pairs_hook=object_pairs_hook))
    except RecursionError as err:
        raise TooDeep() from err


__all__ = ["MAX_DEPTH", "TOO_DEEP", "TooDeep", "check_depth", "depth", "loads_json"]
