"""The model folder's metadata agrees with itself: config.json against the weights' shapes."""

from __future__ import annotations

import struct

from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.validate.rules import rule
from rocmft.validate.rules.common import named


@rule("rendered", 120)
def model_shapes(run: Rendered) -> None:
    """config.json agrees with the weights' shapes: the input embedding is vocab_size x hidden_size and the
    decoder has num_hidden_layers layers (the ``layers.<n>.`` indices in the tensor names). A config.json from
    another size of the family (a 7B config beside 1.5B weights) loads with a size-mismatch error after minutes,
    or not at all. Skipped for quantized checkpoints (packed shapes) and configs without these keys.

    Raises:
        ConfigError: naming the config key, its value, the tensor and its shape.
    """
    import re

    model = run.model
    config_path = model.config_path
    if not config_path.is_file():
        return
    try:
        config = model.config_json()
        shapes = model.safetensors_shapes()
    except (OSError, ValueError, struct.error):
        return
    if not shapes or not isinstance(config, dict) or config.get("quantization_config"):
        return
    config = config.get("text_config") or config
    embed = next((k for k in shapes if re.search(r"(embed_tokens|wte|word_embeddings)\.weight$", k)), None)
    problems = []
    if embed and len(shapes[embed] or []) == 2:
        rows, cols = shapes[embed]
        for key, have in (("vocab_size", rows), ("hidden_size", cols)):
            if isinstance(config.get(key), int) and config[key] != have:
                problems.append(f"{key}={config[key]} but {embed} is {rows} x {cols}")
    layers = {int(m.group(1)) for k in shapes if (m := re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", k))}
    wanted = config.get("num_hidden_layers")
    if layers and isinstance(wanted, int) and wanted != max(layers) + 1:
        problems.append(f"num_hidden_layers={wanted} but the weights have {max(layers) + 1} layers")
    if problems:
        raise ConfigError(f"{config_path} does not describe the weights beside it "
                          f"({named(run, 'model_name_or_path')}): "
                          + "; ".join(problems) + ".",
                          "The config.json belongs to another model or size: put back the config.json that came "
                          "with these weights (download the folder again).")  # fmt: skip
