"""Settings of the fine-tuning method: another method's settings, LoRA targets the model does not have."""

from __future__ import annotations

from pathlib import Path

from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.validate.rules import rule
from rocmft.validate.rules.common import named
from rocmft.validate.rules.common import user_set as _user_set


@rule("rendered", 60)
def method_settings(run: Rendered) -> None:
    """Settings of a fine-tuning method that is not the one chosen (LORA_RANK with FINETUNING_TYPE=full): they
    would be ignored without a word. The method's settings are the fields of LLaMA-Factory's own LoraArguments /
    FreezeArguments / OFTArguments dataclasses.

    Raises:
        ConfigError: naming the settings and the method.
    """
    arguments, sources = run.arguments, run.sources
    from rocmft.config.lfargs import lf_arguments

    chosen = arguments.get("finetuning_type", "lora")
    owners = {"LoraArguments": "lora", "FreezeArguments": "freeze", "OFTArguments": "oft"}
    stray = [a for a in lf_arguments().values() if owners.get(a.group, chosen) != chosen and _user_set(a.name, sources)]
    if stray:
        shown = ", ".join(f"{named(run, a.name)}, a setting of {owners[a.group]}" for a in stray)
        raise ConfigError(f"{named(run, 'finetuning_type', 'lora')} ignores {shown}.",
                          f"Remove {', '.join(a.name.upper() for a in stray)}, or set FINETUNING_TYPE="
                          f"{owners[stray[0].group]} if that is the method you meant.")  # fmt: skip


@rule("rendered", 90)
def lora_target(run: Rendered) -> None:
    """LORA_TARGET names only modules the model has (``all`` always does).

    Raises:
        ConfigError: listing the unknown names and the model's linear module names.
    """
    arguments = run.arguments
    if arguments.get("finetuning_type", "lora") != "lora":
        return
    value = arguments.get("lora_target", "all")
    wanted = [t.strip() for t in (value if isinstance(value, list) else str(value).split(",")) if t.strip()]
    if not wanted or wanted == ["all"]:
        return
    model_dir = Path(str(arguments.get("model_name_or_path", ""))).expanduser()
    found = run.model.linear_names() if model_dir.is_dir() else None
    if not found:
        return
    unknown = [t for t in wanted if t not in found]
    spaced = [t for t in unknown if len(t.split()) > 1 and all(part in found for part in t.split())]
    # single-shot: the spaced names are among the unknown ones, which the spaces alone may explain
    if spaced:
        raise ConfigError(f"{named(run, 'lora_target')} separates module names with spaces.",
                          f"Separate them with commas: LORA_TARGET={','.join(spaced[0].split())}.")  # fmt: skip
    if unknown:
        raise ConfigError(
            f"{named(run, 'lora_target')} names no module of {named(run, 'model_name_or_path')}: {', '.join(unknown)}.",
            f"Use `all`, or names among the model's linear modules: {', '.join(sorted(found))}.",
        )
