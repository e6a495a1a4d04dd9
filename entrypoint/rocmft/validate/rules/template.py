"""TEMPLATE: a chat template of the installed LLaMA-Factory, and one whose turn markers the tokenizer has."""

from __future__ import annotations

from pathlib import Path

from rocmft.errors import ConfigError
from rocmft.facts.modeldir import MARKER
from rocmft.render import Rendered
from rocmft.validate.rules import rule
from rocmft.validate.rules.common import named


@rule("rendered", 50)
def template(run: Rendered) -> None:
    """TEMPLATE is one of the installed LLaMA-Factory's chat templates (llamafactory.data.template.TEMPLATES);
    LLaMA-Factory itself finds out only after loading the tokenizer.

    Raises:
        ConfigError: with a did-you-mean among the template names.
    """
    arguments = run.arguments
    import difflib

    from rocmft.config.lfargs import chat_templates

    names = chat_templates()
    name = arguments.get("template")
    if name is None or name in names:
        return
    close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    raise ConfigError(
        f"{named(run, 'template')} is not a chat template of the installed LLaMA-Factory.{hint}",
        "Use the template of the model's family (qwen for Qwen2/2.5, llama3 for Llama 3, ...): LLaMA-Factory's "
        "README lists them.",
    )


# Chat-template markers (rocmft.facts.modeldir.MARKER): a template whose markers the tokenizer does not have as
# tokens belongs to another model family: the markers would be cut into ordinary pieces the model never learned
# as turn boundaries.


def _template_markers(slots: list[str]) -> set[str]:
    import re

    return {m for slot in slots for m in re.findall(MARKER, slot)}


@rule("rendered", 150)
def chat_template_fits(run: Rendered) -> list[str]:
    """TEMPLATE's turn markers are tokens of the model's tokenizer (a local folder's tokenizer.json /
    tokenizer_config.json). When they are not and other LLaMA-Factory templates' markers all are, the template
    is another family's: an error naming the fitting TEMPLATE values (ranked by closeness of their name to the
    model_type in config.json). When no template fits (a base model without chat tokens), a warning.

    Returns:
        Warnings.

    Raises:
        ConfigError: naming TEMPLATE, its source, the missing markers and the templates that fit.
    """
    arguments = run.arguments
    from rocmft.config.lfargs import chat_template_slots

    TEMPLATES = chat_template_slots()  # name -> text slots
    name = arguments.get("template")
    model_dir = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    if name not in TEMPLATES or not model_dir.is_dir():
        return []
    model = run.model
    tokens = model.tokenizer_tokens()
    markers = _template_markers(TEMPLATES[name])
    if tokens is None or not markers or markers <= tokens:
        return []
    try:
        model_type = str(model.config_json().get("model_type", ""))
    except (OSError, ValueError):
        model_type = ""

    def closeness(other: str) -> tuple[int, int, int]:
        shared = next(
            (i for i, (a, b) in enumerate(zip(other, model_type, strict=False)) if a != b),
            min(len(other), len(model_type)),
        )
        # the longest common start with model_type, less what the name adds beyond it (qwen before qwen2_vl)
        return (-(2 * shared - len(other)), -len(_template_markers(TEMPLATES[other])), len(other))

    fitting = sorted((other for other, template in TEMPLATES.items()
                      if (found := _template_markers(template)) and found <= tokens), key=closeness)  # fmt: skip
    missing = ", ".join(sorted(markers - tokens))
    if not fitting:
        return [f"{named(run, 'template')} writes {missing}, which the tokenizer of {model_dir} does not have as "
                "tokens (a base model?): they are split into ordinary pieces; TEMPLATE=default or alpaca avoids "
                "special markers."]  # fmt: skip
    raise ConfigError(f"{named(run, 'template')} does not match the tokenizer of "
                      f"{named(run, 'model_name_or_path')}: {missing} are not its tokens; its chat markers fit "
                      f"{', '.join(fitting[:3])}.",
                      f"Set TEMPLATE={fitting[0]} (the template of the model's family).")  # fmt: skip
