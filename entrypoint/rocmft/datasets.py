"""The run's data set registry: which files the named data sets are, in LLaMA-Factory's dataset_info format.

LLaMA-Factory finds a data set by its name in ``<dataset_dir>/dataset_info.json`` (file names relative to
that folder). rocmft never writes into the user's data folder (it is often a read-only mount); instead it
renders the run's own ``rocmft/data/dataset_info.json`` holding exactly the data sets the run uses, with
absolute file paths, and points ``dataset_dir`` there:

* a name found in the user's ``dataset_info.json`` keeps its entry (relative file names made absolute);
* a name that is a plain ``.json``/``.jsonl`` file in the data folder (``alpaca_zh_demo`` or
  ``alpaca_zh_demo.json``) is registered automatically, its format (alpaca, sharegpt, OpenAI messages,
  pairwise ranking) read from its first record;
* any other name is reported by the ``data`` check with a did-you-mean and the folder searched.

Format and column conventions: LLaMA-Factory's data/README.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_FILE_SUFFIXES = (".json", ".jsonl")
# LLaMA-Factory's default alpaca columns (DatasetAttr in llamafactory/data/parser.py): role -> column name
ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
                  "history": "history"}  # fmt: skip
HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


@dataclass
class Registry:
    """The data sets of one run.

    Attributes:
        source_dir: the user's data folder (DATASET_DIR), absolute.
        entries: name -> dataset_info entry, file paths absolute; what rocmft/data/dataset_info.json holds.
        auto: names registered automatically from plain files.
        missing: name -> why it could not be found.
        info_error: why the user's dataset_info.json could not be read, if it exists and is broken.
    """

    source_dir: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    auto: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    info_error: str | None = None


def split_names(value: Any) -> list[str]:
    """``"a, b"`` or ``["a", "b"]`` -> ``["a", "b"]``; None -> []."""
    if value is None:
        return []
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def first_record(path: Path) -> dict[str, Any] | None:
    """The first record of a .json (list of objects) or .jsonl file, or None when empty/unreadable."""
    records = read_records(path, limit=1)
    return records[0] if records else None


def read_records(path: Path, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` records of a .json array or .jsonl file.

    Raises:
        ValueError: the file is not valid JSON / JSON lines, or its records are not objects.
    """
    if path.suffix == ".jsonl":
        records = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}: line {number} is not JSON ({err.msg})") from err
                if len(records) >= limit:
                    break
    else:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON array of records, found {type(data).__name__}")
        records = data[:limit]
    bad = [i for i, record in enumerate(records) if not isinstance(record, dict)]
    if bad:
        raise ValueError(f"{path}: record {bad[0]} is not an object")
    return records


def detect_entry(path: Path) -> dict[str, Any]:
    """A dataset_info entry for a plain data file, from the keys of its first record."""
    entry: dict[str, Any] = {"file_name": str(path)}
    record = first_record(path) or {}
    if "conversations" in record or "messages" in record:
        messages = "conversations" if "conversations" in record else "messages"
        entry["formatting"] = "sharegpt"
        columns = {"messages": messages}
        for optional in ("system", "tools", "images", "videos", "audios"):
            if optional in record:
                columns[optional] = optional
        turns = record.get(messages) or [{}]
        if isinstance(turns, list) and turns and isinstance(turns[0], dict) and "role" in turns[0]:
            entry["tags"] = {
                "role_tag": "role", "content_tag": "content", "user_tag": "user",
                "assistant_tag": "assistant", "system_tag": "system",
            }  # fmt: skip
    else:
        columns = {role: column for role, column in ALPACA_COLUMNS.items() if column in record}
    if "chosen" in record and "rejected" in record:
        entry["ranking"] = True
        columns.update({"chosen": "chosen", "rejected": "rejected"})
    if columns:
        entry["columns"] = columns
    return entry


def build_registry(names: list[str], source_dir: Path) -> Registry:
    """Resolve data set names against ``source_dir`` (see the module docstring)."""
    registry = Registry(source_dir=source_dir)
    info: dict[str, Any] = {}
    info_path = source_dir / "dataset_info.json"
    if info_path.is_file():
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
            if not isinstance(info, dict):
                raise ValueError("expected an object of name: entry")
        except (ValueError, OSError) as err:
            registry.info_error = f"{info_path} is not valid: {err}"
            info = {}
    for name in names:
        if name in info:
            entry = dict(info[name])
            file_name = entry.get("file_name")
            if file_name and not any(key in entry for key in HUB_KEYS):
                entry["file_name"] = str((source_dir / file_name).resolve())
            registry.entries[name] = entry
            continue
        candidates = [source_dir / name] + [source_dir / f"{name}{suffix}" for suffix in DATA_FILE_SUFFIXES]
        found = next((c for c in candidates if c.is_file() and c.suffix in DATA_FILE_SUFFIXES), None)
        if found is not None:
            try:
                registry.entries[name] = detect_entry(found.resolve())
                registry.auto.append(name)
            except (ValueError, OSError) as err:
                registry.missing[name] = f"{found} cannot be read: {err}"
            continue
        registry.missing[name] = "not in dataset_info.json and no such .json/.jsonl file"
    return registry


def available_names(source_dir: Path) -> list[str]:
    """Data set names one could use from ``source_dir``: registered names and plain data files."""
    names: set[str] = set()
    info_path = source_dir / "dataset_info.json"
    if info_path.is_file():
        try:
            names.update(json.loads(info_path.read_text(encoding="utf-8")))
        except (ValueError, OSError):
            pass
    if source_dir.is_dir():
        names.update(
            p.stem for p in source_dir.iterdir() if p.suffix in DATA_FILE_SUFFIXES and p.name != "dataset_info.json"
        )
    return sorted(names)
