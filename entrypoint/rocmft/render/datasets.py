"""The run's data set registry: which files the named data sets are, in LLaMA-Factory's dataset_info format.

LLaMA-Factory finds a data set by its name in ``<dataset_dir>/dataset_info.json`` (file names relative to
that folder). rocmft never writes into the user's data folder (it is often a read-only mount); instead it
renders the run's own ``rocmft/data/dataset_info.json`` holding exactly the data sets the run uses, with
absolute file paths, and points ``dataset_dir`` there:

* a name found in the user's ``dataset_info.json`` keeps its entry (relative file names made absolute);
* a name written the way people name files (LLaMA-Factory's ``get_dataset_list`` takes only dataset_info names and
  refuses any other with "Undefined dataset ... in dataset_info.json": hiyouga/LlamaFactory#5341 for a path,
  #735 for ``alpaca_data_en_52k.json``) is used as meant when that is unambiguous: ``alpaca_en_demo.json`` whose
  stem is registered for that very file (or for no file there), or a path (``/data/my.json``,
  ``./data/train.jsonl``) to a file dataset_info.json registers once, takes the registered entry, with its columns
  and tags (:attr:`Registry.aliases`, said as a warning by the ``data.dataset_names`` rule); a name that could be
  either of two things is refused there (:attr:`Registry.ambiguous`);
* a plain ``.json``/``.jsonl`` file no entry registers (a name in the data folder, ``alpaca_zh_demo`` or
  ``alpaca_zh_demo.json``, or a path) is registered automatically, its format (alpaca, sharegpt, OpenAI
  messages, pairwise ranking, or plain text for pre-training) read from its first record;
* any other name is reported by the ``data`` check with a did-you-mean and the folder searched.

Format and column conventions: LLaMA-Factory's data/README.md.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmft.nesting import TooDeep, loads_json

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
        aliases: name as written -> (the registered name whose entry it was given, the dataset_info.json holding
            it): ``alpaca_en_demo.json`` or a path used as the registered data set it means.
        ambiguous: name as written -> (the file it names, the registered names it could mean instead, the
            dataset_info.json holding them): refused by the ``data.dataset_names`` rule.
        text_only: names registered automatically as plain text (records with one text field, mapped
            ``{"prompt": <field>}`` as LLaMA-Factory's own pre-training corpora are).
    """

    source_dir: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    auto: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    info_error: str | None = None
    aliases: dict[str, tuple[str, Path]] = field(default_factory=dict)
    ambiguous: dict[str, tuple[Path, list[str], Path]] = field(default_factory=dict)
    text_only: list[str] = field(default_factory=list)


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
                        records.append(loads_json(line))
                    except json.JSONDecodeError as err:
                        raise ValueError(f"{path}: line {number} is not JSON ({err.msg})") from err
                    except TooDeep as err:
                        raise ValueError(f"{path}: line {number} is {err}") from err
                if len(records) >= limit:
                    break
    else:
        try:
            data = loads_json(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
        except TooDeep as err:
            raise ValueError(f"{path}: {err}") from err
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON array of records, found {type(data).__name__}")
        records = data[:limit]
    bad = [i for i, record in enumerate(records) if not isinstance(record, dict)]
    if bad:
        raise ValueError(f"{path}: record {bad[0]} is not an object")
    return records


# Sampling of a data file for the record checks: the first and last SAMPLE_PART records and SAMPLE_PART spread
# evenly through the rest, so a bad record in the middle or at the end of a file (a second file appended, a
# converter that failed half-way) is found too. SAMPLE_SECONDS bounds the scan of a .jsonl file (measured on the
# developer machine: ~1.5 s per GiB to find the line offsets), so a huge file costs seconds, not minutes.
SAMPLE_PART = 200
SAMPLE_SECONDS = 20.0
# LLaMA-Factory's default sharegpt tags (DatasetAttr in llamafactory/data/parser.py)
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}  # fmt: skip


@dataclass
class Sample:
    """Records sampled across one data file.

    Attributes:
        records: (record number, record) pairs, numbers counted from 0 in file order.
        total: the number of records in the file, or of those scanned when the scan hit SAMPLE_SECONDS.
        complete: whether the whole file was scanned.
    """

    records: list[tuple[int, dict[str, Any]]]
    total: int
    complete: bool = True


def _spread(total: int, part: int) -> list[int]:
    """Record numbers to look at: the first and last ``part`` and ``part`` evenly spaced in between."""
    if total <= 3 * part:
        return list(range(total))
    step = (total - 2 * part) / part
    middle = {part + int(i * step) for i in range(part)}
    return sorted(set(range(part)) | middle | set(range(total - part, total)))


def sample_records(path: Path, part: int = SAMPLE_PART, budget_s: float = SAMPLE_SECONDS) -> Sample:
    """Records sampled across ``path`` (a .json array or .jsonl file): see :data:`SAMPLE_PART`.

    A .jsonl file is scanned for line offsets (bounded by ``budget_s`` seconds), then only the chosen lines are
    parsed; a .json file is parsed whole (LLaMA-Factory loads it whole too).

    Raises:
        ValueError: a sampled line is not JSON, the file is not an array of records, or a record is not an object
            (the message gives the record number and, for .jsonl, the line number).
    """
    import time

    if path.suffix != ".jsonl":
        records = read_records(path, limit=2**63)
        chosen = _spread(len(records), part)
        return Sample([(i, records[i]) for i in chosen], len(records))
    started = time.monotonic()
    offsets: list[tuple[int, int]] = []  # (byte offset, line number) of each non-empty line
    complete = True
    with path.open("rb") as handle:
        position = 0
        for number, line in enumerate(handle, 1):
            if line.strip():
                offsets.append((position, number))
            position += len(line)
            if number % 100_000 == 0 and time.monotonic() - started > budget_s:
                complete = False
                break
        sampled = []
        for index in _spread(len(offsets), part):
            offset, number = offsets[index]
            handle.seek(offset)
            text = handle.readline()
            try:
                record = loads_json(text)
            except ValueError as err:
                raise ValueError(f"{path}: record {index} (line {number}) is not JSON ({err})") from err
            if not isinstance(record, dict):
                raise ValueError(f"{path}: record {index} (line {number}) is not an object")
            sampled.append((index, record))
    return Sample(sampled, len(offsets), complete)


def required_columns(entry: dict[str, Any], stage: str = "sft") -> list[str]:
    """The columns every record of a data set needs, from its dataset_info entry (LLaMA-Factory's data/README.md:
    alpaca needs the prompt and response columns, or chosen/rejected when ranking; sharegpt the messages column).
    For ``stage`` pt the prompt column alone: LLaMA-Factory's pre-training processor reads only the first prompt
    message (``preprocess_pretrain_dataset``), so a corpus mapped ``{"prompt": "text"}`` has all it needs."""
    columns = entry.get("columns", {})
    if entry.get("formatting", "alpaca") == "alpaca":
        needed = [columns.get("prompt", ALPACA_COLUMNS["prompt"])]
        if stage == "pt":
            return needed
        if entry.get("ranking"):
            return [*needed, columns.get("chosen", "chosen"), columns.get("rejected", "rejected")]
        return [*needed, columns.get("response", ALPACA_COLUMNS["response"])]
    needed = [columns.get("messages", "conversations")]
    if entry.get("ranking"):
        needed += [columns.get("chosen", "chosen"), columns.get("rejected", "rejected")]
    return needed


def _tags_found(records: list[tuple[int, dict[str, Any]]], messages: str) -> tuple[set[str], dict[str, set[str]]]:
    """The keys of the messages in ``records`` and, per key, the short text values seen (roles live there)."""
    keys: set[str] = set()
    values: dict[str, set[str]] = {}
    for _, record in records:
        turns = record.get(messages)
        for turn in turns if isinstance(turns, list) else []:  # {"messages": 3} is the problem being described
            if isinstance(turn, dict):
                keys.update(turn)
                for key, value in turn.items():
                    if isinstance(value, str) and len(value) <= 24:
                        values.setdefault(key, set()).add(value)
    return keys, values


def _suggest_tags(keys: set[str], values: dict[str, set[str]]) -> dict[str, str]:
    """A "tags" mapping that fits what the file has: the usual role/content key names and role values."""
    role = next((k for k in ("role", "from", "speaker", "author") if k in keys), None)
    content = next((k for k in ("content", "value", "text", "message") if k in keys), None)
    tags: dict[str, str] = {}
    if role:
        tags["role_tag"] = role
        seen = values.get(role, set())
        for name, options in (("user_tag", ("user", "human")), ("assistant_tag", ("assistant", "gpt", "bot", "model")),
                              ("system_tag", ("system",))):  # fmt: skip
            found = next((o for o in options if o in seen), None)
            if found:
                tags[name] = found
    if content:
        tags["content_tag"] = content
    return tags


def _message_problem(turns: Any, tags: dict[str, str]) -> str | None:
    """Why a sharegpt message list would be dropped or fail in LLaMA-Factory's converter, or None."""
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        return "its messages are not a list of objects"
    role, content = tags["role_tag"], tags["content_tag"]
    for position, turn in enumerate(turns):
        absent = [k for k in (role, content) if k not in turn]
        if absent:
            return f"message {position} has no {' / '.join(absent)} key (it has: {', '.join(sorted(turn)) or 'none'})"
    if turns and turns[0][role] == tags["system_tag"]:
        turns = turns[1:]
    accept = ((tags["user_tag"], tags["observation_tag"]), (tags["assistant_tag"], tags["function_tag"]))
    for position, turn in enumerate(turns):
        if turn[role] not in accept[position % 2]:
            want = " or ".join(repr(t) for t in accept[position % 2])
            return f"turn {position} has {role}={turn[role]!r} where {want} must come (turns alternate user, assistant)"
    return None


def record_problem(name: str, entry: dict[str, Any], path: Path, sample: Sample, stage: str = "sft") -> str | None:
    """The first sampled record of ``path`` that does not fit its dataset_info entry, described with what the
    file has, or None.

    Rules (LLaMA-Factory's data/README.md and its converters): every record has the columns its format needs
    (:func:`required_columns`); in sharegpt data every message has the role and content keys of the entry's
    "tags" (defaults: :data:`SHAREGPT_TAGS`), and roles alternate user/observation and assistant/function after
    an optional first system turn (LLaMA-Factory drops other records with only a warning, "Invalid role tag").
    """
    needed = required_columns(entry, stage)
    for index, record in sample.records:
        absent = [c for c in needed if c not in record]
        if absent:
            text = text_column(record)
            fix = (
                f"; it is plain text (a pre-training corpus): register it in dataset_info.json as "
                f"{text_only_entry(name, info_file_name(path, path.parent), text)} and train with STAGE=pt"
                if text is not None
                else f'; fix the file or the "columns" of {name!r} in dataset_info.json'
            )
            return (f"data set {name!r}: record {index} of {path.name} lacks {', '.join(absent)} "
                    f"(has: {', '.join(sorted(record))}){fix}.")  # fmt: skip
    if entry.get("formatting") != "sharegpt":
        return None
    tags = {**SHAREGPT_TAGS, **(entry.get("tags") or {})}
    messages = entry.get("columns", {}).get("messages", "conversations")
    for index, record in sample.records:
        problem = _message_problem(record.get(messages), tags)
        if problem is None and entry.get("ranking"):  # a pairwise sharegpt record's answers are single messages
            columns = entry.get("columns", {})
            answers = [record.get(columns.get(k, k)) for k in ("chosen", "rejected")]
            bad = [a for a in answers if not isinstance(a, dict) or tags["role_tag"] not in a
                   or tags["content_tag"] not in a]  # fmt: skip
            if bad:
                problem = f"its chosen/rejected answer {str(bad[0])[:80]} lacks the role or content key"
        if problem is not None:
            keys, values = _tags_found(sample.records, messages)
            given = {k: tags[k] for k in ("role_tag", "content_tag", "user_tag", "assistant_tag")}
            fit = _suggest_tags(keys, values)
            roles = ", ".join(sorted(values.get(fit.get("role_tag", tags["role_tag"]), set()))) or "none found"
            hint = (f' Set "tags": {json.dumps(fit)} for {name!r} in dataset_info.json.'
                    if fit and any(given.get(k) != v for k, v in fit.items()) else "")  # fmt: skip
            return (f"data set {name!r}: record {index} of {path.name}: {problem}. The tags in effect are "
                    f"{json.dumps(given)}; the file's messages have keys {', '.join(sorted(keys)) or 'none'} and "
                    f"role values {roles}.{hint}")  # fmt: skip
    return None


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
        text = text_column(record)
        if text is not None:
            columns = {"prompt": text}
    if "chosen" in record and "rejected" in record:
        entry["ranking"] = True
        columns.update({"chosen": "chosen", "rejected": "rejected"})
    if columns:
        entry["columns"] = columns
    return entry


def entry_problem(entry: dict[str, Any]) -> str | None:
    """Why a dataset_info entry cannot be read as LLaMA-Factory's data/README.md describes it (``file_name`` a file
    name, ``formatting`` alpaca or sharegpt, ``columns`` and ``tags`` objects of names), or None. Every later reader
    (the record checks, the token counts) takes those shapes for granted."""
    file_name = entry.get("file_name")
    if file_name is not None and (not isinstance(file_name, str) or "\x00" in file_name):
        return f'"file_name" is {file_name!r}, not a file name'
    if entry.get("formatting", "alpaca") not in ("alpaca", "sharegpt"):
        return f'"formatting" is {entry["formatting"]!r}; LLaMA-Factory reads "alpaca" or "sharegpt"'
    for key in ("columns", "tags"):
        value = entry.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return f'"{key}" is {json.dumps(value)[:80]}, not an object of names (e.g. {{"prompt": "instruction"}})'
    return None


def text_column(record: dict[str, Any]) -> str | None:
    """The field of a plain-text (pre-training) record, or None when the record has another format's columns (an
    alpaca column, messages, chosen/rejected): ``text`` when it holds a string (LLaMA-Factory's own corpora c4_demo
    and wiki_demo are registered ``"columns": {"prompt": "text"}``; hiyouga/LlamaFactory#1312, #976), else the
    record's only field when that holds a string."""
    other = {*ALPACA_COLUMNS.values(), "conversations", "messages", "chosen", "rejected"}
    if other & set(record):
        return None
    if isinstance(record.get("text"), str):
        return "text"
    if len(record) == 1 and isinstance(next(iter(record.values())), str):
        return next(iter(record))
    return None


def text_only_entry(name: str, file_name: str, column: str = "text") -> str:
    """The exact dataset_info.json entry that registers plain-text records for pre-training (``STAGE=pt``), as
    LLaMA-Factory's data/dataset_info.json registers c4_demo: ``{"<name>": {"file_name": ..., "columns": {"prompt":
    "<column>"}}}``. With ``columns`` given, LLaMA-Factory's ``DatasetAttr.join`` leaves every unnamed column None,
    so no instruction/output column is read (tests/test_data_naming.py proves it with LLaMA-Factory's loader)."""
    return json.dumps({name: {"file_name": file_name, "columns": {"prompt": column}}})


def info_file_name(path: Path, folder: Path) -> str:
    """``path`` as a dataset_info.json in ``folder`` writes its ``file_name``: relative when it lies in that folder
    (LLaMA-Factory joins ``dataset_dir`` and ``file_name``), else absolute (os.path.join keeps it)."""
    try:
        return str(path.resolve().relative_to(folder.resolve()))
    except ValueError:
        return str(path)


def _read_info(info_path: Path) -> dict[str, Any]:
    """A dataset_info.json as an object of name: entry. Raises ValueError, OSError: unreadable, not JSON, not an
    object."""
    info = loads_json(info_path.read_text(encoding="utf-8"))
    if not isinstance(info, dict):
        raise ValueError("expected an object of name: entry")
    return info


def _registered(name: str, raw: Any, info_path: Path, registry: Registry) -> dict[str, Any] | None:
    """The entry ``raw`` of ``info_path`` for the run, its local file made absolute (relative to that file's
    folder); None, with the reason in ``registry.missing[name]``, when it is not an entry LLaMA-Factory reads."""
    if not isinstance(raw, dict):
        registry.missing[name] = (f"its entry in {info_path} is a JSON {type(raw).__name__}, not an "
                                  'object such as {"file_name": "data.json"}')  # fmt: skip
        return None
    entry = dict(raw)
    problem = entry_problem(entry)
    if problem:
        registry.missing[name] = f"its entry in {info_path}: {problem}"
        return None
    if entry.get("file_name") and not any(key in entry for key in HUB_KEYS):
        entry["file_name"] = str((info_path.parent / entry["file_name"]).resolve())
    return entry


def _entry_file(entry: Any, folder: Path) -> Path | None:
    """The local file a dataset_info entry reads (resolved against ``folder``), None for a hub or script entry."""
    if not isinstance(entry, dict) or any(key in entry for key in HUB_KEYS) or "script_url" in entry:
        return None
    file_name = entry.get("file_name")
    return (folder / file_name).resolve() if isinstance(file_name, str) and "\x00" not in file_name else None


def _named_file(name: str, source_dir: Path) -> Path | None:
    """The .json/.jsonl file ``name`` denotes: ``<DATASET_DIR>/<name>`` with or without a suffix, or a path as
    written (absolute, ``~``, or relative to the working folder: ``./data/train.jsonl``), resolved; None if none
    exists."""
    candidates = [source_dir / name] + [source_dir / f"{name}{suffix}" for suffix in DATA_FILE_SUFFIXES]
    if "/" in name or name.startswith("~"):
        candidates.append(Path(os.path.expanduser(name)).absolute())  # pathlib's raises for ~user of no user
    found = next((c for c in candidates if c.is_file() and c.suffix in DATA_FILE_SUFFIXES), None)
    return found.resolve() if found is not None else None


_Info = tuple[Path, dict[str, Any]]  # a dataset_info.json and its entries


def _meant(name: str, found: Path | None, infos: list[_Info]) -> tuple[list[str], _Info] | None:
    """The registered names ``name`` may mean, and the dataset_info.json holding them: the stem of ``name``
    (``alpaca_en_demo`` for ``alpaca_en_demo.json``) when registered, else the entries whose local file is ``found``
    (the file a path names), from the data folder's dataset_info.json first, then the file's own folder's."""
    stem = next((name[: -len(s)] for s in DATA_FILE_SUFFIXES if name.endswith(s)), None)
    for info_path, info in infos:
        if stem and stem in info:
            return [stem], (info_path, info)
    for info_path, info in infos:
        same = [key for key, entry in info.items() if found is not None
                and _entry_file(entry, info_path.parent) == found]  # fmt: skip
        if same:
            return same, (info_path, info)
    return None


def build_registry(names: list[str], source_dir: Path) -> Registry:
    """Resolve data set names against ``source_dir`` (see the module docstring)."""
    registry = Registry(source_dir=source_dir)
    info: dict[str, Any] = {}
    info_path = source_dir / "dataset_info.json"
    if info_path.is_file():
        try:
            info = _read_info(info_path)
        except (ValueError, OSError) as err:
            registry.info_error = f"{info_path} is not valid: {err}"
    for name in names:
        if name in info and (entry := _registered(name, info[name], info_path, registry)) is not None:
            registry.entries[name] = entry
        if name in info:
            continue
        found = _named_file(name, source_dir)
        infos = [(info_path, info)]
        if (
            found is not None
            and found.parent != source_dir.resolve()
            and (found.parent / "dataset_info.json").is_file()
        ):
            try:
                infos.append((found.parent / "dataset_info.json", _read_info(found.parent / "dataset_info.json")))
            except (ValueError, OSError):
                pass  # that folder's file is not the run's: the run's own broken one is reported above
        meant = _meant(name, found, infos)
        if meant is not None:
            keys, (holder, held) = meant
            if len(keys) == 1 and (found is None or _entry_file(held[keys[0]], holder.parent) == found):
                if (entry := _registered(name, held[keys[0]], holder, registry)) is not None:
                    registry.entries[name] = entry
                    registry.aliases[name] = (keys[0], holder)
                continue
            registry.ambiguous[name] = (found or source_dir / name, keys, holder)
            continue
        if found is not None:
            try:
                registry.entries[name] = detect_entry(found)
                registry.auto.append(name)
                columns = registry.entries[name].get("columns", {})
                if set(columns) == {"prompt"} and columns["prompt"] not in ALPACA_COLUMNS.values():  # text_column
                    registry.text_only.append(name)
            except (ValueError, OSError) as err:
                registry.missing[name] = f"{found} cannot be read: {err}"
            continue
        registry.missing[name] = ("no such .json/.jsonl file (a relative path is read from DATASET_DIR and from the "
                                  f"working folder {Path.cwd()})" if "/" in name or name.startswith("~") else
                                  "not in dataset_info.json and no such .json/.jsonl file")  # fmt: skip
    return registry


def available_names(source_dir: Path) -> list[str]:
    """Data set names one could use from ``source_dir``: registered names and plain data files."""
    names: set[str] = set()
    info_path = source_dir / "dataset_info.json"
    if info_path.is_file():
        try:
            info = loads_json(info_path.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            info = None
        if isinstance(info, dict):  # a list of names ([1, 2]) is not dataset_info.json: build_registry says so
            names.update(info)
    if source_dir.is_dir():
        names.update(
            p.stem for p in source_dir.iterdir() if p.suffix in DATA_FILE_SUFFIXES and p.name != "dataset_info.json"
        )
    return sorted(names)


def trainable_text(record: dict[str, Any], entry: dict[str, Any]) -> str:
    """The trainable text of a record (prompt and response contents, without chat markup)."""
    columns = entry.get("columns", {})
    if entry.get("formatting", "alpaca") == "alpaca":
        keys = [columns.get(role, ALPACA_COLUMNS[role]) for role in ("prompt", "query", "response", "system")]
        return "\n".join(str(record.get(k) or "") for k in keys)
    content = entry.get("tags", {}).get("content_tag", "value")
    turns = record.get(columns.get("messages", "conversations")) or []
    turns = turns if isinstance(turns, list) else []  # {"messages": 3}: nothing to count (the dataset check says why)
    return "\n".join(str(t.get(content, "")) for t in turns if isinstance(t, dict))


def token_counter(model_dir: Path, trust_remote_code: bool = False):
    """texts -> token counts (no special tokens) with the model's tokenizer.

    A folder with tokenizer.json is read by the `tokenizers` library itself (what transformers' fast tokenizers
    wrap): 0.2 s, where importing transformers for AutoTokenizer cost 12 s of `rocmft check` on the H200 host
    once nothing else had imported it (BENCHMARKS.md). Other folders (slow/sentencepiece-only tokenizers) go
    through AutoTokenizer.

    Raises:
        ValueError: the tokenizer cannot be loaded (a damaged tokenizer.json raised tokenizers' bare Exception).
    """
    try:
        if (model_dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            fast = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            return lambda texts: [len(e.ids) for e in fast.encode_batch(texts, add_special_tokens=False)]
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except Exception as err:  # tokenizers raises Exception itself; transformers OSError, ValueError, KeyError, ...
        raise ValueError(f"the tokenizer in {model_dir} cannot be loaded ({type(err).__name__}: {err})") from err
    return lambda texts: [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def sample_token_lengths(entries: list[dict[str, Any]], model_dir: Path, trust_remote_code: bool = False,
                         limit: int = 500) -> list[int]:  # fmt: skip
    """Token counts of the first ``limit`` records of each local data file in ``entries`` (registry entries),
    trainable text only (:func:`trainable_text`: the chat template's markup is not counted), with the model's
    tokenizer; unreadable or missing files are skipped (the dataset check reports them). Each file's counts are
    kept for the process (:func:`_file_token_lengths`): render's planner and the ``lengths`` check ask for the
    same files, and a .json data file is read whole.

    Raises:
        ValueError: the model's tokenizer cannot be loaded (:func:`token_counter`).
    """
    lengths: list[int] = []
    for entry in entries:
        path = Path(entry.get("file_name", ""))
        if path.is_file():
            lengths += _file_token_lengths(str(path), path.stat().st_mtime_ns, json.dumps(entry, sort_keys=True),
                                           str(model_dir), trust_remote_code, limit)  # fmt: skip
    return lengths


@functools.lru_cache(maxsize=64)
def _file_token_lengths(path: str, _mtime_ns: int, entry: str, model_dir: str, trust_remote_code: bool,
                        limit: int) -> tuple[int, ...]:  # fmt: skip
    """One file's counts for :func:`sample_token_lengths` (the modification time is part of the key)."""
    try:
        records = read_records(Path(path), limit)
    except ValueError:
        return ()
    parsed = json.loads(entry)
    return tuple(_counter(model_dir, trust_remote_code)([trainable_text(r, parsed) for r in records]))


@functools.lru_cache(maxsize=4)
def _counter(model_dir: str, trust_remote_code: bool):
    return token_counter(Path(model_dir), trust_remote_code)
