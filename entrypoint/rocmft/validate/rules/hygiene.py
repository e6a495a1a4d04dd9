"""Text hygiene: values that carry invisible characters, quotes, or a host path the container cannot have."""

from __future__ import annotations

from rocmft.config.lfargs import COMMA_LIST_ARGUMENTS
from rocmft.config.provenance import named_in, origin, written
from rocmft.container import mount
from rocmft.errors import ConfigError
from rocmft.render import Rendered
from rocmft.validate.rules import independent, rule
from rocmft.validate.rules.common import named
from rocmft.validate.rules.common import user_set as _user_set

# Arguments that hold a path (a folder or file inside the container).
PATH_ARGUMENTS = ("model_name_or_path", "adapter_name_or_path", "dataset_dir", "output_dir", "deepspeed",
                  "resume_from_checkpoint", "cache_dir", "tokenized_path", "media_dir", "logging_dir")  # fmt: skip


# The secrets a run hands to the hub and the trackers, besides LLaMA-Factory's own (Settings.secrets): a quoted one
# ("hf_...") was taken without a word and sent with its quotes, a token the hub does not know (401 Unauthorized), only
# once training downloads (a break-it trial, 2026-12-06). huggingface_hub strips spaces and line breaks from
# HF_TOKEN, not quotes (huggingface_hub.utils._auth._clean_token).
QUOTED_SECRETS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY")


def _in_quotes(value: object) -> bool:
    """Whether ``value`` is a text wrapped in matching single or double quotes."""
    return isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"


@rule("rendered", 10, masks=True)
def text_hygiene(run: Rendered) -> None:
    """Values the user set that carry invisible characters or a host path the container cannot have:
    leading/trailing spaces and tabs (``DATASET=alpaca_en_demo `` in a .env file), a carriage return (a .env
    saved with Windows CRLF line endings: ``docker --env-file`` keeps the ``\r``), a Windows path
    (``C:\\models\\qwen``; the container sees Linux paths of mounted volumes only).

    A comma-separated list with an empty item (``DATASET=alpaca_en_demo,``, ``LORA_TARGET=q_proj,,v_proj``):
    LLaMA-Factory keeps the empty item (:data:`rocmft.config.lfargs.COMMA_LIST_ARGUMENTS`), so an empty data set
    name passed every check and the worker then failed at data loading with exit 4 (a break-it trial, 2026-12-05).

    Each of the four (empty, spaced, empty list items, Windows paths) is reported when present, one finding each.

    Raises:
        ConfigError: naming each variable with its value shown by ``repr``.
    """
    arguments, sources = run.arguments, run.sources
    # the user's own values too: rocmft replaces an empty OUTPUT_DIR by the default folder before the rules run
    # (rocmft.render.default_output_dir), which ran the run there without a word (a break-it trial, 2026-12-05)
    given = {**run.settings.arguments, **arguments}
    given.update({name: "" for name, value in run.settings.arguments.items() if value == ""})
    empty = [named_in(name, given, sources, run.settings.given) for name, value in given.items()
             if value == "" and _user_set(name, sources)]  # fmt: skip
    if empty:
        with independent():
            raise ConfigError(f"Empty values: {', '.join(empty)}.",
                              "Give each a value, or remove the line (unset means the default).")  # fmt: skip
    spaced = [(name, value) for name, value in arguments.items()
              if isinstance(value, str) and value != value.strip() and _user_set(name, sources)]  # fmt: skip
    if spaced:
        shown = ", ".join(f"{name.upper()}={value!r} ({origin(name, sources[name])})" for name, value in spaced)
        with independent():
            if any("\r" in value for _, value in spaced):
                raise ConfigError(f"Values end in a carriage return: {shown}: the .env file has Windows (CRLF) "
                                  "line endings, which docker --env-file keeps.",
                                  "Save the .env file with Unix (LF) line endings (dos2unix .env, or your editor's "
                                  "line-ending setting).")  # fmt: skip
            raise ConfigError(f"Values with spaces around them: {shown}.", "Remove the spaces in the .env file.")
    with independent():
        _empty_items(run)
    windows = [
        named(run, name)
        for name in PATH_ARGUMENTS
        if isinstance(value := arguments.get(name), str) and (value[1:3] in (":\\", ":/") or "\\" in value)
    ]
    if windows:
        raise ConfigError(f"Windows paths: {', '.join(windows)}; inside the container only Linux paths of mounted "
                          "folders exist.",
                          f"Mount the folder into the container ({mount('C:/models', '/models', read_only=True)}) "
                          "and use the path inside it (/models/<name>), with forward slashes.")  # fmt: skip


def _empty_items(run: Rendered) -> None:
    """Raise for the :data:`rocmft.config.lfargs.COMMA_LIST_ARGUMENTS` the user set whose text has an empty item
    between, before or after its commas (an empty value is the ``Empty values`` finding's).

    Raises:
        ConfigError: naming each setting as written, with the list without its empty items.
    """
    found = [(name, value) for name in COMMA_LIST_ARGUMENTS
             if isinstance(value := run.arguments.get(name), str) and value.strip() and "," in value
             and any(not item.strip() for item in value.split(",")) and _user_set(name, run.sources)]  # fmt: skip
    if found:
        shown = ", ".join(named(run, name) for name, _ in found)
        fixed = ", ".join(written(name, ",".join(i.strip() for i in value.split(",") if i.strip()), run.sources[name])
                          for name, value in found)  # fmt: skip
        raise ConfigError(f"Lists with an empty item (a comma too many): {shown}. LLaMA-Factory keeps the empty "
                          "item as a name of its own (an empty data set or module name fails only once training "
                          "starts, after every check passed).",
                          f"Remove the extra comma: {fixed}.")  # fmt: skip


@rule("rendered", 40, masks=True)
def quoted_values(run: Rendered) -> None:
    """Text values wrapped in matching quotes: ``docker run --env-file`` and some .env loaders keep them, so
    TEMPLATE="qwen" reaches LLaMA-Factory as the seven characters ``"qwen"``.

    Raises:
        ConfigError: naming each variable.
    """
    arguments, sources = run.arguments, run.sources
    quoted = [named(run, name) for name, value in arguments.items()
              if _in_quotes(value) and _user_set(name, sources)]  # fmt: skip
    secrets = {**{k: v for k, v in run.settings.environ.items() if k.upper() in QUOTED_SECRETS}, **run.settings.secrets}
    quoted += [f"{name} (set in the environment; a secret, its value is not shown)" for name, value in secrets.items()
               if _in_quotes(value)]  # fmt: skip
    if quoted:
        fix = "Remove the quotes in the .env file (docker --env-file passes them on as they are)."
        raise ConfigError(f"Values with their quotes still on: {', '.join(quoted)}.", fix)
