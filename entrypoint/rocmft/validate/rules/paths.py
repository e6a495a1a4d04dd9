"""Paths that are the wrong kind of thing, and an output folder inside an input."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from rocmft.config.provenance import Source, origin
from rocmft.container import mount
from rocmft.errors import ConfigError
from rocmft.facts.modeldir import looks_like_path
from rocmft.render import Rendered
from rocmft.validate.rules import independent, rule
from rocmft.validate.rules.common import named
from rocmft.validate.rules.common import user_set as _user_set


@rule("rendered", 20)
def folders(run: Rendered) -> None:
    """Paths that are the wrong kind of thing: MODEL_NAME_OR_PATH, DATASET_DIR or OUTPUT_DIR naming a file
    where a folder is needed; ADAPTER_NAME_OR_PATH or RESUME_FROM_CHECKPOINT naming a path that does not exist;
    a DATASET that is a model folder or a MODEL_NAME_OR_PATH that is a data set name (the two swapped); a path
    through a loop of symbolic links; OUTPUT_DIR the file system's root (a break-it trial, 2026-12-06). Each path
    is checked on its own, and every one that is wrong is reported; the swap is one finding.

    Raises:
        ConfigError: naming the variable, the path and what it is.
    """
    arguments, sources = run.arguments, run.sources
    source_dir = run.registry.source_dir
    dataset_names = list(run.registry.entries) + list(run.registry.missing)
    model = str(arguments.get("model_name_or_path") or "")
    checks = [
        ("MODEL_NAME_OR_PATH", Path(model).expanduser() if model else None, sources.get("model_name_or_path")),
        ("DATASET_DIR", source_dir, _basis(sources.get("dataset_dir"))),
        ("OUTPUT_DIR", Path(str(arguments.get("output_dir", ""))).expanduser(), sources.get("output_dir")),
    ]
    for variable, path, source in checks:
        if path is not None and _loops(path):
            with independent():
                raise ConfigError(f"{variable}={path} ({origin(variable.lower(), source)}) goes through a loop of "
                                  "symbolic links (a link that leads back to itself, directly or through others).",
                                  f"Set {variable} to a real folder, or fix the links (`ls -l` each part of "
                                  f"{path}).")  # fmt: skip
        if path is not None and path.is_file():
            parent = f" (its folder {path.parent} may be what you meant)" if variable != "OUTPUT_DIR" else ""
            with independent():
                raise ConfigError(f"{variable}={path} ({origin(variable.lower(), source)}) is a file, not a "
                                  f"folder{parent}.",
                                  f"Set {variable} to a folder: " + {
                                      "MODEL_NAME_OR_PATH": "the model's folder, with config.json and the weights.",
                                      "DATASET_DIR": "the folder holding the data files (and dataset_info.json); name "
                                                     "the file in DATASET.",
                                      "OUTPUT_DIR": "a new or empty folder for the run's results.",
                                  }[variable])  # fmt: skip
    for name in ("adapter_name_or_path", "resume_from_checkpoint"):
        value = arguments.get(name)
        if not isinstance(value, str) or not _user_set(name, sources):
            continue
        missing = [item.strip() for item in value.split(",")
                   if looks_like_path(item.strip()) and not Path(item.strip()).expanduser().exists()]  # fmt: skip
        if missing:
            with independent():
                raise ConfigError(
                    f"{named(run, name)}: {', '.join(missing)} does not exist here.",
                    f"Mount it at that path: {mount('<the folder on the host>', missing[0])}; or remove the "
                    f"variable{' (ROCMFT_RESUME=auto resumes from OUTPUT_DIR by itself)' if 'resume' in name else ''}.",
                )
    _not_adapters(run)
    output = str(arguments.get("output_dir") or "")
    if output and os.path.realpath(os.path.expanduser(output)) == "/":  # `OUTPUT_DIR=$SAVES/$RUN`, both unset
        with independent():
            raise ConfigError(f"{named(run, 'output_dir')} is the file system's root: the weights, checkpoints and "
                              "rocmft/ would be written straight into /.",
                              "Set OUTPUT_DIR to a folder of its own (saves/<run name> by default); if it was built "
                              "from variables (OUTPUT_DIR=$SAVES/$RUN), set them.")  # fmt: skip
    _swapped(run, model, dataset_names)


def _swapped(run: Rendered, model: str, dataset_names: list[str]) -> None:
    """MODEL_NAME_OR_PATH and DATASET swapped: a DATASET that is a model folder, or a MODEL_NAME_OR_PATH that is a
    data set's name. One finding: both ways of seeing it are the same mistake.

    Raises:
        ConfigError: naming both variables.
    """
    source_dir = run.registry.source_dir
    for name in dataset_names:
        folder = Path(os.path.expanduser(name))  # pathlib's raises RuntimeError for ~user of no user here
        if (folder / "config.json").is_file() or (source_dir / name / "config.json").is_file():
            raise ConfigError(f"{named(run, 'dataset')}: {name} is a model folder (it has config.json), and "
                              f"{named(run, 'model_name_or_path')}: MODEL_NAME_OR_PATH and DATASET look swapped.",
                              "MODEL_NAME_OR_PATH is the model (folder or hub id); DATASET names data sets in "
                              "DATASET_DIR (dataset_info.json names or .json/.jsonl file names).")  # fmt: skip
    if model and not looks_like_path(model) and not Path(model).exists() and source_dir.is_dir():
        from rocmft.render.datasets import available_names

        if model in available_names(source_dir) or model.removesuffix(".json") in available_names(source_dir):
            raise ConfigError(f"{named(run, 'model_name_or_path')} is the name of a data set in {source_dir}, not "
                              f"a model, and {named(run, 'dataset')}: MODEL_NAME_OR_PATH and DATASET look swapped.",
                              "Set MODEL_NAME_OR_PATH to the model's folder or hub id and DATASET to the data set "
                              "name.")  # fmt: skip


def _not_adapters(run: Rendered) -> None:
    """ADAPTER_NAME_OR_PATH naming something that exists and is not an adapter folder: a file, a pipe, or a folder
    without ``adapter_config.json``. peft's ``PeftModel.from_pretrained`` reads that file from each folder LLaMA-Factory
    passes it; render and check passed (exit 0) and training would fail after the model loaded (a break-it trial,
    2026-12-06). A missing path is the caller's finding; a hub id is left to the hub.

    Raises:
        ConfigError: naming ADAPTER_NAME_OR_PATH and each path that is not an adapter folder.
    """
    value = run.arguments.get("adapter_name_or_path")
    if not isinstance(value, str) or not _user_set("adapter_name_or_path", run.sources):
        return
    paths = [Path(item.strip()).expanduser() for item in value.split(",") if looks_like_path(item.strip())]
    wrong = [str(p) for p in paths if p.exists() and not (p / "adapter_config.json").is_file()]
    if wrong:
        with independent():
            raise ConfigError(f"{named(run, 'adapter_name_or_path')}: {', '.join(wrong)} is not an adapter folder "
                              "(no adapter_config.json in it; peft loads an adapter from that file and its weights).",
                              "Point ADAPTER_NAME_OR_PATH at the folder a LoRA run saved (its OUTPUT_DIR or a "
                              "checkpoint-N inside it, with adapter_config.json), or remove it.")  # fmt: skip


def _loops(path: Path) -> bool:
    """Whether ``path`` (or a folder on its way) is a loop of symbolic links: ``os.stat`` fails with ELOOP.
    pathlib's ``is_file()`` reads that as False and its ``resolve()`` raises (RuntimeError in Python 3.11), so an
    OUTPUT_DIR through a loop ended ``rocmft render`` in a traceback (exit 1; a break-it trial, 2026-12-06)."""
    try:
        os.stat(path)
    except OSError as err:
        return err.errno == errno.ELOOP
    except ValueError:  # a NUL byte: another rule's
        return False
    return False


def _basis(source: Source | None) -> Source | None:
    """The user's input behind a value rocmft derived (DATASET_DIR behind the data set registry); None: not set."""
    return source.basis if source is not None else None


@rule("rendered", 70)
def output_not_input(run: Rendered) -> None:
    """OUTPUT_DIR is neither the model's folder (or inside it) nor the data folder ``data_dir`` (DATASET_DIR, or
    inside it): saving there overwrites the base weights (`model.safetensors`) or writes into the data, which
    the README promises is never written to (and is often a read-only mount). Both are reported when both hold.

    Raises:
        ConfigError: naming both paths.
    """
    arguments = run.arguments
    data_dir = run.registry.source_dir
    try:
        output = Path(str(arguments.get("output_dir", ""))).expanduser().resolve()
    except (OSError, RuntimeError):  # a loop of symbolic links (Python 3.11 raises RuntimeError): `folders` says so
        return
    model = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    if model.is_dir() and (output == model.resolve() or model.resolve() in output.parents):
        with independent():  # the data folder is checked too: both may hold OUTPUT_DIR
            raise ConfigError(f"{named(run, 'output_dir')} is the model's folder {named(run, 'model_name_or_path')} "
                              "or inside it: saving would overwrite the base model.",
                              "Set OUTPUT_DIR to a folder of its own (saves/<run name> by default).")  # fmt: skip
    if data_dir is not None and data_dir.is_dir() and (output == data_dir.resolve() or data_dir.resolve() in
                                                       output.parents):  # fmt: skip
        raise ConfigError(f"{named(run, 'output_dir')} is the data folder (DATASET_DIR={data_dir}, "
                          f"{origin('dataset_dir', run.settings.sources.get('dataset_dir'))}) or inside it: results "
                          "and checkpoints would be written into the data.",
                          "Set OUTPUT_DIR to a folder of its own (saves/<run name> by default).")  # fmt: skip
