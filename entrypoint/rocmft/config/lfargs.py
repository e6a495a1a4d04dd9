"""The installed LLaMA-Factory's training arguments, discovered from its own dataclasses.

rocmft never keeps a hand list of training arguments: LLaMA-Factory's ``get_train_args`` parses exactly
the fields of ``ModelArguments``, ``DataArguments``, ``TrainingArguments`` (which extends transformers'
``Seq2SeqTrainingArguments``), ``FinetuningArguments`` and ``GeneratingArguments``, so those fields are
the vocabulary. A new LLaMA-Factory or transformers release adds or removes names here with no edit.

Importing LLaMA-Factory takes 4-6 s on our CPU machines and 14 s on the H200 host (``python -X importtime -c
"import llamafactory.hparams"``: torch._dynamo through transformers.masking_utils 4.3 s, datasets 1.9 s,
scikit-learn 1.1 s; BENCHMARKS.md). That cost was most of `rocmft check`'s wall time, paid again by the
validator and the worker, which import it anyway. So what rocmft's own process needs (argument names, types
as plain data, owners, help, chat template names) is read once and kept as JSON in the cache folder under a
key made of the installed versions (:func:`vocabulary`); a different LLaMA-Factory, transformers, peft, trl,
accelerate, datasets or rocmft gives a different key, so a stale vocabulary is never read.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

# Field names that are not read from the environment, with the reason. They stay reachable through
# the user's own YAML (ROCMFT_CONFIG or `rocmft train CONFIG.yaml`) and the command line's key=value.
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

# Which names hold a credential. Secrets are never written into rendered files, manifests or logs; the worker
# receives them through its environment. A word anywhere in the name makes it one (swanlab_api_key,
# swanlab_lark_secret, swanlab_lark_webhook_url, AWS_SECRET_ACCESS_KEY, MLFLOW_TRACKING_PASSWORD):
_SECRET_WORDS = {"secret", "key", "apikey", "password", "passwd", "passphrase", "webhook", "credential", "credentials"}
# "token" is also a word of the vocabulary: LLaMA-Factory 0.9.5's hparams have ignore_pad_token_for_loss,
# add_special_tokens, split_special_tokens, max_new_tokens, include_num_input_tokens_seen, tokenized_path, ...; the
# credentials among its arguments end in it (hf_hub_token, ms_hub_token, om_hub_token, hub_token), as do the
# variables of the hubs and trackers (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, GITHUB_TOKEN, NEPTUNE_API_TOKEN). So "token"
# (singular) counts as the last word, or after a word that says access (AUTH_TOKEN_..., ACCESS_TOKEN_...); never
# after a word of the tokenizer's (pad, eos, ...: the token itself, a piece of text), nor in HF_TOKEN_PATH (a file's
# path, huggingface_hub's constants.py).
_TOKEN_KINDS = {"auth", "access", "api", "bearer", "refresh", "session", "id"}
_VOCABULARY_WORDS = {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "new", "added", "start", "end",
                     "stop", "image", "video", "audio", "think", "tool"}  # fmt: skip


# Arguments LLaMA-Factory 0.9.5 splits at commas and strips item by item, keeping empty items, and takes as a list
# as they are (``split_arg`` in hparams/data_args.py and hparams/finetuning_args.py): ``dataset: a,b`` and
# ``dataset: [a, b]`` name the same two data sets.
COMMA_LIST_ARGUMENTS = ("dataset", "eval_dataset", "interleave_probs", "lora_target", "oft_target",
                        "additional_target", "freeze_trainable_modules", "freeze_extra_modules", "galore_target",
                        "apollo_target")  # fmt: skip


def is_secret_name(name: str) -> bool:
    """True when ``name`` (a field or variable name, any case) names a credential: a word of :data:`_SECRET_WORDS`
    anywhere, or ``token`` as the last word or after a word of access (:data:`_TOKEN_KINDS`), unless a tokenizer
    word comes before it (``pad_token``). ``IGNORE_PAD_TOKEN_FOR_LOSS``, ``MAX_NEW_TOKENS``, ``HF_TOKEN_PATH`` are
    not secrets; ``HF_TOKEN``, ``HUB_TOKEN``, ``WANDB_API_KEY``, ``AUTH_TOKEN_FILE_CONTENT`` are.

    Also covers variables outside LLaMA-Factory's arguments such as ``HF_TOKEN`` or ``WANDB_API_KEY``.
    """
    words = [w for w in re.split(r"[_\-.]", name.lower()) if w]
    if any(word in _SECRET_WORDS for word in words):
        return True
    for i, word in enumerate(words):
        if word != "token" or (i > 0 and words[i - 1] in _VOCABULARY_WORDS):
            continue
        if i == len(words) - 1 or (i > 0 and words[i - 1] in _TOKEN_KINDS):
            return True
    return False


def type_text(annotation: Any) -> str:
    """A short readable form of a type annotation: ``float``, ``str | None``, ``SchedulerType | str``."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(repr(m.value) for m in annotation)
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
        type_text: the annotation as LLaMA-Factory writes it (:func:`type_text`), for messages and docs.
        default_text: ``repr`` of the default, ``None`` when the field is required.
        group: the dataclass that declares the field (``LoraArguments`` for ``lora_rank``; the owner's mixins).
    """

    name: str
    env: str
    owner: str
    annotation: Any
    default: Any
    help: str
    secret: bool
    type_text: str = ""
    default_text: str | None = None
    group: str = ""


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


def _plain_type(annotation: Any) -> Any:
    """An annotation as JSON data: ``"int"``, ``{"union": [...]}``, ``{"literal": [...]}``, ``{"list": [...]}``,
    ``{"dict": [...]}``. Enums become the literal of their values (what a YAML or environment value holds).
    An annotation pydantic cannot validate (GenerationConfig objects, ...) becomes ``"str"``: settings types
    those as text and LLaMA-Factory parses them (:func:`rocmft.config.settings._field_type` did the same before)."""
    from pydantic import TypeAdapter

    try:
        TypeAdapter(annotation)
    except Exception:
        return "str"
    return _describe(annotation)


def _describe(annotation: Any) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is None or annotation is type(None):
        return "none"
    if annotation is Any:
        return "any"
    if origin in (Union, types.UnionType):
        return {"union": [_describe(a) for a in args]}
    if origin is Literal:
        return {"literal": [a.value if isinstance(a, enum.Enum) else a for a in args]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"literal": [m.value for m in annotation]}
    if origin in (list, dict):
        return {origin.__name__: [_describe(a) for a in args]}
    if annotation in (int, float, str, bool, list, dict):
        return annotation.__name__
    # a class pydantic validates but JSON cannot carry (accelerate's ParallelismConfig): typed as text here,
    # LLaMA-Factory's own parser in the validator judges it
    return {"opaque": getattr(annotation, "__name__", str(annotation))}


_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict, "none": type(None),
          "any": Any}  # fmt: skip


def _annotation(plain: Any) -> Any:
    """The annotation :func:`_plain_type` described (the inverse, with enums as literals of their values)."""
    if isinstance(plain, str):
        return _TYPES[plain]
    ((kind, args),) = plain.items()
    if kind == "opaque":
        return str
    if kind == "literal":
        return Literal[tuple(args)]
    members = tuple(_annotation(a) for a in args)
    if kind == "union":
        return Union[members]  # noqa: UP007  (built from a runtime tuple)
    base = list if kind == "list" else dict
    return base[members] if members else base


def _declaring_class(cls: type, name: str) -> str:
    """The class in ``cls``'s MRO whose own annotations declare ``name`` (LoraArguments for lora_rank)."""
    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass):
            return klass.__name__
    return cls.__name__


def _live_vocabulary() -> dict[str, Any]:
    """What :func:`vocabulary` keeps, read from the installed LLaMA-Factory (the slow import)."""
    from llamafactory.data.template import TEMPLATES

    arguments = []
    seen: set[str] = set()
    for cls in _train_dataclasses():
        for field in dataclasses.fields(cls):
            if not field.init or field.name in seen:
                continue
            seen.add(field.name)
            default: Any = field.default
            if field.default_factory is not dataclasses.MISSING:
                default = field.default_factory()
            required = default is dataclasses.MISSING
            if isinstance(default, enum.Enum):
                default = default.value
            try:
                json.dumps(default)
            except TypeError:
                default = repr(default)
            arguments.append({
                "name": field.name, "owner": cls.__name__, "group": _declaring_class(cls, field.name),
                "type": _plain_type(field.type), "type_text": type_text(field.type),
                "default": None if required else default, "required": required,
                "default_text": None if required else repr(default),
                "help": " ".join(str(field.metadata.get("help", "")).split()),
            })  # fmt: skip
    slots = {name: [slot for formatter in (t.format_user, t.format_assistant, t.format_system)
                    for slot in getattr(formatter, "slots", []) if isinstance(slot, str)]
             for name, t in TEMPLATES.items()}  # fmt: skip
    return {"arguments": arguments, "templates": sorted(TEMPLATES), "template_slots": slots}


def _vocabulary_path() -> Path:
    versions = stack_versions()
    key = json.dumps({k: versions[k] for k in VOCABULARY_KEY}, sort_keys=True) + str(VOCABULARY_FORMAT)
    from rocmft.fsutil import default_cache_dir

    cache = Path(os.environ.get("ROCMFT_CACHE_DIR") or default_cache_dir())
    return cache / f"lf-vocabulary-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


# The image bakes the vocabulary here at build time (Dockerfile, next to build.json), so that a container's
# first start on an empty /cache volume does not pay LLaMA-Factory's import in rocmft's own process (measured on
# 2 x H200: `rocmft check` 21.9-25.4 s while building the vocabulary, 15.5-18.6 s with it; BENCHMARKS.md).
BAKED_DIR = Path("/etc/rocmft")


# The packages whose versions decide the vocabulary, and the file format's version.
VOCABULARY_KEY = ("rocmft", "llamafactory", "transformers", "peft", "trl", "accelerate", "datasets")
VOCABULARY_FORMAT = 3


@functools.lru_cache(maxsize=1)
def vocabulary() -> dict[str, Any]:
    """The installed LLaMA-Factory's training arguments (as JSON data) and chat template names.

    Read from ``$ROCMFT_CACHE_DIR/lf-vocabulary-<key>.json`` (key: a hash of :data:`VOCABULARY_KEY`'s versions),
    or the same name in :data:`BAKED_DIR` (written when the image is built); built from the live dataclasses
    when neither file is readable, and saved in the cache atomically when that folder is writable (a read-only
    cache only costs the import). Setting ``ROCMFT_VOCABULARY=live`` skips the files (tests compare both).

    Returns:
        ``{"arguments": [{name, owner, group, type, type_text, default, required, default_text, help}],
        "templates": [names], "template_slots": {name: [text slots]}}``.
    """
    path = None if os.environ.get("ROCMFT_VOCABULARY") == "live" else _vocabulary_path()
    if path is not None:
        for candidate in (path, BAKED_DIR / path.name):
            try:
                return json.loads(candidate.read_text())
            except (OSError, ValueError):
                pass
    from rocmft.proc import inductor_cache_env_kept

    with inductor_cache_env_kept():  # importing LLaMA-Factory can set TORCHINDUCTOR_CACHE_DIR (rocmft.proc)
        data = _live_vocabulary()
    if path is not None:
        from rocmft.fsutil import atomic_write_json

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, data)
        except OSError:
            pass
    return data


@functools.lru_cache(maxsize=1)
def lf_arguments() -> dict[str, LfArgument]:
    """All training arguments the installed LLaMA-Factory accepts, keyed by field name (from :func:`vocabulary`).

    Fields with ``init=False`` (``compute_dtype``, ``device_map``, …) are internal to LLaMA-Factory's
    parser and are left out, as HfArgumentParser leaves them out. ``annotation`` is rebuilt from the plain
    description (enums as literals of their values).
    """
    return {
        a["name"]: LfArgument(
            name=a["name"],
            env=a["name"].upper(),
            owner=a["owner"],
            annotation=_annotation(a["type"]),
            default=dataclasses.MISSING if a["required"] else a["default"],
            help=a["help"],
            secret=is_secret_name(a["name"]),
            type_text=a["type_text"],
            default_text=a["default_text"],
            group=a["group"],
        )
        for a in vocabulary()["arguments"]
    }


def chat_templates() -> list[str]:
    """Names of the installed LLaMA-Factory's chat templates (llamafactory.data.template.TEMPLATES)."""
    return vocabulary()["templates"]


def chat_template_slots() -> dict[str, list[str]]:
    """Each chat template's text slots (its user, assistant and system formatters' string pieces, where the turn
    markers such as ``<|im_start|>`` live), keyed by template name."""
    return vocabulary()["template_slots"]


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
