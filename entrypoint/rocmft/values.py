"""The one reading of a yes/no value, from an environment variable, a YAML value or a JSON field; of a whole number
from text (:func:`whole_number`); and the one test of a count in a parsed JSON value (:func:`is_count`)."""

from __future__ import annotations

from typing import Any

# The spellings of "yes" that rocmft accepts anywhere: huggingface_hub's (constants.py ENV_VARS_TRUE_VALUES:
# 1, ON, YES, TRUE), so that rocmft reads HF_HUB_OFFLINE as the hub library does; anything else, empty included,
# is no. (pydantic's bool parsing, which types the settings, also takes t and y.)
TRUE_WORDS = ("1", "on", "true", "yes")


MAX_DIGITS = 20  # the digits of the largest unsigned 64-bit number: no count, port, rank or size rocmft reads is longer


def whole_number(text: str | None) -> int | None:
    """``text`` (surrounding spaces ignored) as a whole number of ASCII digits, at most :data:`MAX_DIGITS` of them,
    else None. The one reading of a number from an environment variable or a kernel file: ``str.isdigit`` alone
    accepts ``²``, which ``int`` refuses, and ``int`` refuses more than 4300 digits (a ValueError either way: a
    traceback, where the caller wanted to say the value is not a number)."""
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS else None


def is_count(value: object) -> bool:
    """Whether a parsed JSON/YAML ``value`` is a count (of steps, of logged lines): an ``int`` >= 0. JSON's
    ``true``/``false`` are ints to Python but no counts; a float (``3.0``) is none either."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def truthy(value: Any) -> bool:
    """Whether ``value`` means yes: a string among :data:`TRUE_WORDS` (case and surrounding spaces ignored),
    else Python's truth of the value (``True``, a non-zero number). ``None`` is no."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


__all__ = ["MAX_DIGITS", "TRUE_WORDS", "is_count", "truthy", "whole_number"]
