"""The data sets fit STAGE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmft.config.stages import RANKING_STAGES
from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.validate.rules import independent, rule
from rocmft.validate.rules.common import named


@rule("rendered", 110)
def stage_data(run: Rendered) -> None:
    """The data sets fit STAGE: pairwise data (``"ranking": true`` with chosen/rejected) for rm and dpo and
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
