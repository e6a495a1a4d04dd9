"""Small readings the rules share."""

from __future__ import annotations


def user_set(name: str, sources: dict[str, str]) -> bool:
    """Whether the user chose ``name`` (environment or ROCMFT_CONFIG), not a template or built-in default."""
    return name in sources and "default" not in sources[name]


__all__ = ["user_set"]
