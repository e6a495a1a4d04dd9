"""The installed LLaMA-Factory's training arguments, discovered from its own dataclasses.

rocmft never keeps a hand list of training arguments: LLaMA-Factory's ``get_train_args`` parses exactly
the fields of ``ModelArguments``, ``DataArguments``, ``TrainingArguments`` (which extends transformers'
``Seq2SeqTrainingArguments``), ``FinetuningArguments`` and ``GeneratingArguments``, so those fields are
the vocabulary. A new LLaMA-Factory or transformers release adds or removes names here with no edit.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Any

# Field names that are not read from the environment, with the reason. They stay reachable through
# ROCMFT_CONFIG (the user's own YAML).
NOT_FROM_ENVIRONMENT: dict[str, str] = {
    # torchrun sets LOCAL_RANK in every worker; transformers reads it from there itself.
    "local_rank": "set by torchrun per process",
    # MASTER_ADDR/MASTER_PORT are torchrun's rendezvous variables (LLaMA-Factory's launcher uses them
    # the same way); RayArguments merely shares the names.
    "master_addr": "torchrun rendezvous variable",
    "master_port": "torchrun rendezvous variable",
    # DEBUG is set by many unrelated tools; transformers' `debug` option is rarely wanted.
    "debug": "too common an environment variable name",
}

# A field is a secret when one of its underscore-separated words is one of these (hub_token,
# hf_hub_token, swanlab_api_key, swanlab_lark_secret, swanlab_lark_webhook_url, ...). Secrets are never
# written into rendered files, manifests or logs; the worker receives them through its environment.
_SECRET_WORDS = {"token", "secret", "key", "password", "webhook", "credentials"}


def is_secret_name(name: str) -> bool:
    """True when ``name`` (a field or variable name, any case) names a credential.

    Also covers variables outside LLaMA-Factory's arguments such as ``HF_TOKEN`` or ``WANDB_API_KEY``.
    """
    return any(word in _SECRET_WORDS for word in re.split(r"[_\-.]", name.lower()))


def type_text(annotation: Any) -> str:
    """A short readable form of a type annotation: ``float``, ``str | None``, ``SchedulerType | str``."""
    text = str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    return re.sub(r"\b[a-z_][a-z0-9_]*\.(?:[a-z_][a-z0-9_]*\.)*(?=[A-Z])", "", text)


@dataclass(frozen=True)
class LfArgument:
    """One training argument of the installed LLaMA-Factory.

    Attributes:
        name: the dataclass field name, as used in LLaMA-Factory YAML (``learning_rate``).
        env: the environment variable that sets it (``LEARNING_RATE``).
        owner: the dataclass that declares it (``TrainingArguments``).
        annotation: the field's type annotation, used to type the environment value.
        default: the dataclass default (``dataclasses.MISSING`` when required).
        help: the field's help text from its metadata.
        secret: whether the value is a credential (see :func:`is_secret_name`).
    """

    name: str
    env: str
    owner: str
    annotation: Any
    default: Any
    help: str
    secret: bool


def _train_dataclasses() -> list[type]:
    # The same five classes, in the same order, that llamafactory.hparams.parser.get_train_args parses.
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )

    return [ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments]


@functools.lru_cache(maxsize=1)
def lf_arguments() -> dict[str, LfArgument]:
    """All training arguments the installed LLaMA-Factory accepts, keyed by field name.

    Fields with ``init=False`` (``compute_dtype``, ``device_map``, …) are internal to LLaMA-Factory's
    parser and are left out, as HfArgumentParser leaves them out. Importing LLaMA-Factory takes about
    5 s (it imports transformers), hence the cache.
    """
    found: dict[str, LfArgument] = {}
    for cls in _train_dataclasses():
        for field in dataclasses.fields(cls):
            if not field.init or field.name in found:
                continue
            default = field.default
            if field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            found[field.name] = LfArgument(
                name=field.name,
                env=field.name.upper(),
                owner=cls.__name__,
                annotation=field.type,
                default=default,
                help=" ".join(str(field.metadata.get("help", "")).split()),
                secret=is_secret_name(field.name),
            )
    return found


def env_arguments() -> dict[str, LfArgument]:
    """The arguments read from the environment, keyed by environment variable name."""
    return {a.env: a for a in lf_arguments().values() if a.name not in NOT_FROM_ENVIRONMENT}


@functools.lru_cache(maxsize=1)
def stack_versions() -> dict[str, str]:
    """Installed versions of the packages that decide what a run does (``importlib.metadata``)."""
    from importlib import metadata

    names = [
        "rocmft", "llamafactory", "transformers", "torch", "torchvision", "torchaudio", "peft", "accelerate",
        "trl", "datasets", "tokenizers", "deepspeed", "bitsandbytes", "flash-attn", "liger-kernel",
    ]  # fmt: skip
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
