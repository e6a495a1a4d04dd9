"""The one reading of a yes/no value, from an environment variable, a YAML value or a JSON field."""

from __future__ import annotations

from typing import Any

# The spellings of "yes" that rocmft accepts anywhere: huggingface_hub's (constants.py ENV_VARS_TRUE_VALUES:
# 1, ON, YES, TRUE), so that rocmft reads HF_HUB_OFFLINE as the hub library does; anything else, empty included,
# is no. (pydantic's bool parsing, which types the settings, also takes t and y.)
TRUE_WORDS = ("1", "on", "true", "yes")


def truthy(value: Any) -> bool:
    """Whether ``value`` means yes: a string among :data:`TRUE_WORDS` (case and surrounding spaces ignored),
    else Python's truth of the value (``True``, a non-zero number). ``None`` is no."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


__all__ = ["TRUE_WORDS", "truthy"]
