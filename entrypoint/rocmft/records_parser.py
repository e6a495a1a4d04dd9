"""The records between rocmft and LLaMA-Factory's parser child (``python -m rocmft.validate.child``): the
request and the train order on its stdin (:class:`ParseRequest`, :class:`TrainOrder`, written by
:class:`rocmft.validate.Validator`) and its result.json (:class:`ParseResult`, read by :func:`read_parse_result`).
Re-exported by :mod:`rocmft.records` (the table of every record)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmft.fsutil import atomic_write_json
from rocmft.records_common import VERSION, _json_object


@dataclass(frozen=True)
class ParseRequest:
    """The parser child's first stdin line: parse ``arguments`` (train.yaml's mapping) with ``environ`` (added to
    the child's environment first: torchrun's rank-0 variables for a torchrun launch)."""

    arguments: Mapping[str, Any]
    environ: Mapping[str, str] = field(default_factory=dict)
    version: int = VERSION

    def to_line(self) -> str:
        """One JSON line ``{version, arguments, environ}`` (newline included)."""
        data = {"version": self.version, "arguments": dict(self.arguments), "environ": dict(self.environ)}
        return json.dumps(data) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ParseRequest:
        """Raises ValueError: not JSON, or without ``arguments``."""
        data = _json_object(line, "the parse request")
        if "arguments" not in data:
            raise ValueError("the parse request has no arguments")
        return cls(data["arguments"], data.get("environ") or {}, data.get("version", 1))


@dataclass(frozen=True)
class TrainOrder:
    """The parser child's second stdin line: become the worker of ``run_dir`` (RUN_DIR), with ``environ`` added
    to its environment (secrets included: this line is the only place they travel, never a file)."""

    run_dir: str
    environ: Mapping[str, str] = field(default_factory=dict)
    version: int = VERSION

    def to_line(self) -> str:
        """One JSON line ``{version, train: RUN_DIR, environ}`` (newline included)."""
        return json.dumps({"version": self.version, "train": self.run_dir, "environ": dict(self.environ)}) + "\n"

    @classmethod
    def from_line(cls, line: str) -> TrainOrder:
        """Raises ValueError: not JSON, or without ``train``."""
        data = _json_object(line, "the train order")
        if "train" not in data:
            raise ValueError("the train order names no run folder")
        return cls(data["train"], data.get("environ") or {}, data.get("version", 1))


@dataclass(frozen=True)
class ParseResult:
    """The parser child's ``result.json``: LLaMA-Factory's verdict on one configuration.

    Attributes:
        ok: whether ``get_train_args`` accepted it.
        world_size, parallel_mode, compute_dtype: what the parser derived (``ok`` only; the dtype before rocmft's
            precision policy, e.g. ``torch.bfloat16`` or ``None``).
        type, error: the exception's type name and message (not ``ok``).
        llamafactory: the installed LLaMA-Factory's version, when known.
        seconds: the parse, s; import_s: the child's LLaMA-Factory import, s.
        deepspeed: with a DeepSpeed config (``ok`` only), what DeepSpeed's config classes refused in it
            (:func:`rocmft.validate.dsmodel.judge`: ``{path, value, reason}`` each; empty: accepted);
            deepspeed_s: that judgement, s.

    Also readable as a mapping (``result["ok"]``), the JSON object's keys.
    """

    ok: bool
    world_size: int | None = None
    parallel_mode: str | None = None
    compute_dtype: str | None = None
    type: str | None = None
    error: str | None = None
    llamafactory: str | None = None
    seconds: float = 0.0
    import_s: float = 0.0
    deepspeed: list[dict[str, Any]] | None = None
    deepspeed_s: float | None = None
    version: int = VERSION

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (keys that are None left out)."""
        data = {"version": self.version, **dataclasses.asdict(self)}
        return {k: v for k, v in data.items() if v is not None}

    def write(self, path: Path) -> Path:
        """Write it to ``path`` atomically (the parent polls for the file: never a half-written one)."""
        return atomic_write_json(Path(path), self.to_json())


def read_parse_result(path: Path) -> ParseResult | None:
    """The parser child's result at ``path``; None when it has not written one (it died first).

    Raises:
        ValueError: the file is not a parse result.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    data = _json_object(text, "the parse result")
    known = {f.name for f in dataclasses.fields(ParseResult)}
    try:
        return ParseResult(**{k: v for k, v in data.items() if k in known})
    except TypeError as err:  # no "ok"
        raise ValueError(f"not a parse result: {err}") from err


__all__ = ["ParseRequest", "ParseResult", "TrainOrder", "read_parse_result"]
