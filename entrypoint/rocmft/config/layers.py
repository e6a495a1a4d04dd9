"""The layered training arguments, lowest first: the template's defaults (templates/train.yaml.j2, filled in by
render) < the built-in default (templates/demo.yaml, only when no model is given) < the user's YAML (ROCMFT_CONFIG
or `rocmft train CONFIG.yaml`) < environment < the command line's key=value (the last three merged by
:func:`rocmft.config.settings.load_settings`).

What rocmft itself decides (output and data folders, precision, the distributed config) is layered on top by
:mod:`rocmft.render`; the rules of the ``inputs`` phase (:mod:`rocmft.validate.rules`) read these arguments first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from rocmft.config.provenance import Kind, Source
from rocmft.config.settings import Settings
from rocmft.errors import ConfigError

BUILTIN_SOURCE = Source(Kind.BUILTIN)


def builtin_templates() -> Path:
    """The folder of the templates shipped with rocmft: ``rocmft/templates`` in an installed wheel,
    ``templates/`` at the top of the repository in a source checkout (editable install).

    Raises:
        ConfigError: neither folder has train.yaml.j2.
    """
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "templates", package.parents[1] / "templates"):
        if (candidate / "train.yaml.j2").is_file():
            return candidate
    raise ConfigError(f"rocmft's built-in templates are missing next to {package}.", "Reinstall rocmft.")


@dataclass(frozen=True)
class Layers:
    """The user's training arguments over the built-in default.

    Attributes:
        arguments: argument name -> value (read-only).
        sources: argument name -> where its value came from (variable, file, or :data:`BUILTIN_SOURCE`).
        demo: whether no model was given, so the built-in default (tiny model, demo data) is the base.
    """

    arguments: Mapping[str, Any]
    sources: Mapping[str, Source]
    demo: bool


def layer(settings: Settings) -> Layers:
    """Layer ``settings.arguments`` over the built-in default when no MODEL_NAME_OR_PATH is given; the tiny model
    and the demo data set are made in ROCMFT_CACHE_DIR then (:mod:`rocmft.config.demo`), the data set only when
    no DATASET is given."""
    from rocmft.config.demo import ensure_demo_data, ensure_tiny_model

    layered: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    demo = "model_name_or_path" not in settings.arguments
    if demo:
        builtin = yaml.safe_load((builtin_templates() / "demo.yaml").read_text(encoding="utf-8"))
        builtin["model_name_or_path"] = str(ensure_tiny_model(settings.rocmft.cache_dir))
        layered.update(builtin)
        sources.update(dict.fromkeys(builtin, BUILTIN_SOURCE))
    layered.update(settings.arguments)
    sources.update(settings.sources)
    if demo and "dataset" not in settings.arguments:
        # the built-in data set, wherever DATASET_DIR points (the image presets DATASET_DIR=/data)
        layered["dataset_dir"] = str(ensure_demo_data(settings.rocmft.cache_dir))
        sources["dataset_dir"] = BUILTIN_SOURCE
    return Layers(arguments=MappingProxyType(layered), sources=MappingProxyType(sources), demo=demo)


__all__ = ["BUILTIN_SOURCE", "Layers", "builtin_templates", "layer"]
