"""The data sets fit STAGE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmft.config.stages import RANKING_STAGES
from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.validate.rules import independent, rule
from rocmft.validate.rules.common import named


@rule("rendered", 105)
def dataset_names(run: Rendered) -> list[str]:
    """DATASET / EVAL_DATASET names written the way people name files, judged against the registry
    (:func:`rocmft.render.datasets.build_registry`). LLaMA-Factory's ``get_dataset_list`` accepts only the names of
    dataset_info.json ("Undefined dataset /opt/.../train1.json in dataset_info.json": hiyouga/LlamaFactory#5341;
    "Undefined dataset alpaca_data_en_52k.json": #735); rocmft registers plain files itself, so a name that means
    a registered entry must get that entry's columns, never a guessed format. A name used as the registered data
    set it means (``alpaca_en_demo.json`` for ``alpaca_en_demo``, or a path to the file one entry registers) is a
    warning naming the entry; a name that could be either of two things (a file there, and a registered stem with
    another file; a file several entries register) is refused, each on its own.

    Returns:
        Warnings, one per name used as a registered data set.

    Raises:
        ConfigError: naming DATASET, the file, the registered names and the dataset_info.json holding them.
    """
    from rocmft.render.datasets import split_names

    registry = run.registry
    training = split_names(run.arguments.get("dataset"))

    def variable_of(name: str) -> str:  # the variable that holds the name, as the user wrote it
        return named(run, "dataset" if name in training else "eval_dataset")

    for name, (path, keys, holder) in registry.ambiguous.items():
        variable = variable_of(name)
        with independent():
            listed = " and ".join(repr(k) for k in keys)
            if len(keys) == 1:
                their = registry_file(holder, keys[0])
                raise ConfigError(f"{variable}: data set {name!r} names the file {path}, but {holder} registers "
                                  f"{listed} for {their}: which one is meant is unclear.",
                                  f"Write {keys[0]} instead for the registered entry, or register the file "
                                  f"under a name of its own in {holder}: {_own_entry(path, holder)} and write "
                                  f"{path.stem}_file.")  # fmt: skip
            raise ConfigError(f"{variable}: data set {name!r} is the file {path}, which {holder} registers as "
                              f"{listed} (each with its own columns or options): which one is meant is unclear.",
                              f"Write one of {', '.join(keys)} instead of the file's name.")  # fmt: skip
    return [f"{variable_of(name)}: data set {name!r} is used as {key!r}, the data set {holder} registers for it (its "
            f"columns and options; LLaMA-Factory itself knows only the registered name): write {key} instead."
            for name, (key, holder) in registry.aliases.items()]  # fmt: skip


def _own_entry(path: Path, holder: Path) -> str:
    """The dataset_info.json entry that registers ``path`` as it is (its format read from its first record,
    :func:`rocmft.render.datasets.detect_entry`) under ``<stem>_file``, its file name relative to ``holder``'s
    folder where it lies there."""
    import json

    from rocmft.render.datasets import detect_entry, info_file_name

    try:
        entry = detect_entry(path)
    except (OSError, ValueError):
        entry = {}
    entry["file_name"] = info_file_name(path, holder.parent)
    return json.dumps({f"{path.stem}_file": entry})


def registry_file(holder: Path, key: str) -> str:
    """What entry ``key`` of the dataset_info.json ``holder`` reads, for a message: its file_name or hub id."""
    from rocmft.nesting import loads_json

    try:
        entry = loads_json(holder.read_text(encoding="utf-8"))[key]
    except (OSError, ValueError, KeyError, TypeError):
        return "another source"
    source = next((entry.get(k) for k in ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url")
                   if isinstance(entry, dict) and entry.get(k)), None)  # fmt: skip
    return str(source) if source else "another source"


@rule("rendered", 110)
def stage_data(run: Rendered) -> None:
    """The data sets fit STAGE: a plain-text corpus (records with only "text") for pt (or ppo, which reads prompts
    alone), never for stages that train on answers (hiyouga/LlamaFactory#1312);
    pairwise data (``"ranking": true`` with chosen/rejected) for rm and dpo and
    only there; kto needs a ``kto_tag`` column (LLaMA-Factory's data/README.md). Each data set is checked on its
    own: every one that does not fit is reported.

    Raises:
        ConfigError: naming STAGE, the data set and its dataset_info entry's relevant keys.
    """
    for name, entry in run.registry.entries.items():
        with independent():
            _fits_stage(run, name, entry)


def _fits_stage(run: Rendered, name: str, entry: dict[str, Any]) -> None:
    """Data set ``name`` (its dataset_info ``entry``) fits STAGE; its first problem only, as the others follow from
    the same stage.

    Raises:
        ConfigError: see :func:`stage_data`.
    """
    from rocmft.render.datasets import first_record

    stage = str(run.arguments.get("stage") or "sft")
    stage_named = named(run, "stage", "sft")
    if name in run.registry.text_only and stage not in ("pt", "ppo"):  # ppo's processor takes prompts alone
        from rocmft.render.datasets import info_file_name, text_only_entry

        path = Path(str(entry.get("file_name", "")))
        column = entry["columns"]["prompt"]
        raise ConfigError(f"{stage_named} trains on prompt/response pairs, but data set {name!r} ({path}; "
                          f"{named(run, 'dataset')}) is plain text: its records have only {column!r}, a "
                          "pre-training corpus. LLaMA-Factory reads no response from it and drops every record "
                          '("Cannot find valid samples").',
                          f"Set STAGE=pt to pre-train on it (rocmft registers it so itself), or, to register it in "
                          f"{run.registry.source_dir}/dataset_info.json: "
                          f"{text_only_entry(path.stem, info_file_name(path, run.registry.source_dir), column)} "
                          f"and use DATASET={path.stem} with "
                          "STAGE=pt.")  # fmt: skip
    ranking = bool(entry.get("ranking"))
    columns = entry.get("columns", {})
    if stage in RANKING_STAGES and not ranking:
        path = Path(str(entry.get("file_name", "")))
        record = first_record(path) if path.is_file() else None
        pairs = bool(record) and {"chosen", "rejected"} <= set(record)
        fix = (f'Add "ranking": true and "columns": {{..., "chosen": "chosen", "rejected": "rejected"}} to '
               f"{name!r} in dataset_info.json." if pairs else
               "Use a preference data set (chosen/rejected answers, \"ranking\": true in dataset_info.json; "
               "LLaMA-Factory's data/README.md), or STAGE=sft for this one.")  # fmt: skip
        raise ConfigError(f"{stage_named} trains on pairwise data, but data set {name!r} is not pairwise (no "
                          f"\"ranking\": true in its dataset_info entry"
                          f"{'; its records do have chosen/rejected' if pairs else ''}; {named(run, 'dataset')}).",
                          fix)  # fmt: skip
    if stage not in RANKING_STAGES and ranking:
        raise ConfigError(f"{stage_named} with data set {name!r}, which is pairwise (\"ranking\": true, "
                          f"chosen/rejected answers; {named(run, 'dataset')}): LLaMA-Factory refuses it after "
                          "loading the model.",
                          "Set STAGE=dpo for preference training on this data set.")  # fmt: skip
    if stage == "kto" and "kto_tag" not in columns:
        raise ConfigError(f"{stage_named} needs a kto_tag column (true for a desirable answer, false for "
                          f"an undesirable one), and data set {name!r} ({named(run, 'dataset')}) maps none.",
                          f'Add "kto_tag": "<column>" to the "columns" of {name!r} in dataset_info.json, or '
                          "use STAGE=dpo with pairwise data.")  # fmt: skip
