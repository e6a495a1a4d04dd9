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
# as turn boundaries. The family judgment against the model's own chat template also reads Mistral's and Llama 2's
# [INST] [/INST], which are plain text in older tokenizers.
FAMILY_MARKER = rf"{MARKER}|\[/?INST\]"
# A row whose largest value is at most this was never trained: unsloth's fix_untrained_tokens (eps = 1e-16), written
# for Llama 3 base, whose <|eot_id|> / <|start_header_id|> rows are untrained (unslothai/unsloth#915, #658).
UNTRAINED_MAX = 1e-16


def _template_markers(slots: list[str], pattern: str = MARKER) -> set[str]:
    import re

    return {m for slot in slots for m in re.findall(pattern, slot)}


def _ranking(templates: dict[str, list[str]], model_type: str, chat: set[str] | None = None):
    """A sort key over template names: most of ``chat``'s markers written first, then the fewest others (when
    given), then the closest
    name to config.json's model_type (the longest common start, less what the name adds beyond it: qwen before
    qwen2_vl for qwen2), then the most markers, then the shortest name."""

    def key(other: str) -> tuple[int, int, int, int, int]:
        shared = next(
            (i for i, (a, b) in enumerate(zip(other, model_type, strict=False)) if a != b),
            min(len(other), len(model_type)),
        )
        writes = _template_markers(templates[other], FAMILY_MARKER)
        covered, extra = (len(writes & chat), len(writes - chat)) if chat else (0, 0)
        return (-covered, extra, -(2 * shared - len(other)), -len(_template_markers(templates[other])), len(other))

    return key


def _model_type(run: Rendered) -> str:
    try:
        return str(run.model.config_json().get("model_type", ""))
    except (OSError, ValueError):
        return ""


@rule("rendered", 150)
def chat_template_fits(run: Rendered) -> list[str]:
    """TEMPLATE fits the model (a local folder): of the family of the tokenizer's own chat template
    (:func:`_same_family`), its turn markers tokens of the tokenizer (tokenizer.json / tokenizer_config.json), and
    those tokens' embedding rows trained (:func:`_untrained_markers`). A template whose markers are not tokens while
    other LLaMA-Factory templates' markers all are is another family's: an error naming the fitting TEMPLATE values
    (ranked by closeness of their name to the model_type in config.json). When no template fits (a base model
    without chat tokens), a warning.

    Returns:
        Warnings.

    Raises:
        ConfigError: naming TEMPLATE, its source, the missing or untrained markers and the template to use.
    """
    arguments = run.arguments
    from rocmft.config.lfargs import chat_template_slots

    TEMPLATES = chat_template_slots()  # name -> text slots
    name = arguments.get("template")
    model_dir = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    if name not in TEMPLATES or not model_dir.is_dir():
        return []
    model = run.model
    warnings = _same_family(run, str(name), TEMPLATES)
    tokens = model.tokenizer_tokens()
    markers = _template_markers(TEMPLATES[name])
    if tokens is None or not markers:
        return warnings
    if markers <= tokens:
        return warnings + _untrained_markers(run, markers)
    fitting = sorted((other for other, template in TEMPLATES.items()
                      if (found := _template_markers(template)) and found <= tokens),
                     key=_ranking(TEMPLATES, _model_type(run)))  # fmt: skip
    missing = ", ".join(sorted(markers - tokens))
    if not fitting:
        return [f"{named(run, 'template')} writes {missing}, which the tokenizer of {model_dir} does not have as "
                "tokens (a base model?): they are split into ordinary pieces; TEMPLATE=default or alpaca avoids "
                "special markers."]  # fmt: skip
    raise ConfigError(f"{named(run, 'template')} does not match the tokenizer of "
                      f"{named(run, 'model_name_or_path')}: {missing} are not its tokens; its chat markers fit "
                      f"{', '.join(fitting[:3])}.",
                      f"Set TEMPLATE={fitting[0]} (the template of the model's family).")  # fmt: skip


def _same_family(run: Rendered, name: str, templates: dict[str, list[str]]) -> list[str]:
    """TEMPLATE is of the family of the model's own chat template (chat_template.jinja or tokenizer_config.json's
    ``chat_template``): TEMPLATE writes at least one turn marker the model's template writes as text. Only a
    template sharing none is refused: a chat template may build a marker from pieces (Phi-3's ``'<|' + role +
    '|>'``), so one marker missing from its text proves nothing. The family's LLaMA-Factory templates are those
    sharing markers with it (ranked by :func:`_ranking`). Training in another
    family's format teaches the model markers it never answers with (hiyouga/LlamaFactory#6736: Qwen2.5-7B-Instruct
    trained with TEMPLATE=llama3 repeats itself without end). A template without markers (default, alpaca) on a
    model with a chat template is a warning: a legitimate choice, but not the format the model was tuned in.

    Returns:
        Warnings.

    Raises:
        ConfigError: naming TEMPLATE, the markers the model's template lacks, and the family's template.
    """
    import re

    own = run.model.chat_template()
    chat = set(re.findall(FAMILY_MARKER, own or ""))
    if not chat:
        return []  # no chat template, or one without markers: nothing to judge the family by
    family = sorted((other for other, slots in templates.items()
                     if _template_markers(slots, FAMILY_MARKER) & chat),
                    key=_ranking(templates, _model_type(run), chat))  # fmt: skip
    mine = _template_markers(templates[name], FAMILY_MARKER)
    writes = ", ".join(sorted(chat))
    where = f"the chat template of {named(run, 'model_name_or_path')}"
    if not mine:
        use = f"; TEMPLATE={family[0]} trains it in its own format" if family else ""
        return [f"{named(run, 'template')} writes no chat markers, but {where} writes {writes}: an instruct model, "
                f"tuned in that format{use}."]  # fmt: skip
    if mine & chat:
        return []
    fix = (f"Set TEMPLATE={family[0]} (the template of the model's family; LLaMA-Factory's {', '.join(family[:3])} "
           f"write its markers)." if family else
           f"Set TEMPLATE to the LLaMA-Factory template that writes {writes}, or TEMPLATE=default.")  # fmt: skip
    raise ConfigError(f"{named(run, 'template')} writes {', '.join(sorted(mine))}, none of which {where} "
                      f"writes: it is another family's template (the model's own writes {writes}).", fix)  # fmt: skip


def _untrained_markers(run: Rendered, markers: set[str]) -> list[str]:
    """The embedding rows of TEMPLATE's markers were trained. A base model has its chat tokens in the vocabulary
    with rows never trained (all at most :data:`UNTRAINED_MAX`, or identical to one another: unsloth's
    fix_untrained_tokens checks both); trained on them with the embeddings frozen (LoRA, freeze) the markers stay
    meaningless: NaNs ("Untrained tokens found, but embed_tokens & lm_head not trainable, causing NaNs":
    unslothai/unsloth#658, #1024), or a model that never stops (hiyouga/LlamaFactory#5834, #3813: Llama 3 base with
    TEMPLATE=llama3; the maintainer's fix: TEMPLATE=default). Refused when the rows cannot be learnt; a warning when
    they are (FINETUNING_TYPE=full, or ADDITIONAL_TARGET naming embed_tokens and lm_head).

    Returns:
        Warnings.

    Raises:
        ConfigError: naming TEMPLATE, the untrained markers, the model and the fixes.
    """
    import struct

    model = run.model
    ids = model.token_ids()
    marker_ids = {m: ids[m] for m in sorted(markers) if m in ids}
    try:
        rows = model.embedding_rows(list(marker_ids.values())) if marker_ids else {}
    except (OSError, ValueError, struct.error):
        return []  # an unreadable weight file is the model check's to report
    embed = next((found for tensor, found in rows.items() if "lm_head" not in tensor), None)
    if not embed:
        return []
    rounded = [tuple(round(x, 3) for x in row) for row in embed]
    bad = [m for m, row, same in zip(marker_ids, embed, rounded, strict=True)
           if max(row) <= UNTRAINED_MAX or rounded.count(same) > 1]  # fmt: skip
    if not bad:
        return []
    arguments = run.arguments
    additional = str(arguments.get("additional_target") or "")
    learnt = arguments.get("finetuning_type", "lora") == "full" or {"embed_tokens", "lm_head"} <= {
        t.strip() for t in additional.split(",")
    }
    message = (f"{named(run, 'template')} writes {', '.join(bad)}, whose embedding rows in "
               f"{named(run, 'model_name_or_path')} were never trained (zero or identical rows): a base model, to "
               "which these chat markers mean nothing")  # fmt: skip
    if learnt:
        return [f"{message}; they are learnt from scratch in this run (embeddings trained)."]
    raise ConfigError(f"{message}; with {named(run, 'finetuning_type', 'lora')} the embeddings stay frozen, so "
                      "they never will (NaN losses, or a model that never stops).",
                      "Use TEMPLATE=default for a base model (LLaMA-Factory's advice), or the instruct model with "
                      "this template; or let the rows be learnt: ADDITIONAL_TARGET=embed_tokens,lm_head, or "
                      "FINETUNING_TYPE=full.")  # fmt: skip
