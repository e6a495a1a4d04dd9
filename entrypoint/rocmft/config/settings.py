"""Settings: environment variables, an optional LLaMA-Factory YAML and ``key=value`` command-line overrides in
(:mod:`rocmft.config.cmdline`), typed values out.

Two kinds of variables (DESIGN.md, "Interface conventions"):

* **Training arguments** — every argument of the installed LLaMA-Factory, by its UPPER_SNAKE_CASE name
  (``LEARNING_RATE=1e-4``), typed by LLaMA-Factory's own dataclass annotations (see :mod:`rocmft.config.lfargs`).
* **rocmft's own knobs** — the ``ROCMFT_`` prefix (:class:`RocmftSettings`).

Both are read with pydantic-settings. A misspelled ``ROCMFT_`` variable, or a variable that is not an
argument of the installed LLaMA-Factory but looks like one (``INCLUDE_TOKENS_PER_SECOND``, removed in
transformers 5), is a :class:`~rocmft.errors.ConfigError` with a did-you-mean — never silently ignored.

Where the parts live (every name is importable from here): the knobs in :mod:`rocmft.config.knobs`, the training
arguments' environment model, its lenient reading and the unknown-variable refusals in
:mod:`rocmft.config.envargs`, the user's YAML in :mod:`rocmft.config.userconfig`; here :class:`Settings` and
:func:`load_settings`, which layers them with the command line.
"""

import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from rocmft.config.cmdline import SECRET_FIX, CommandLine
from rocmft.config.envargs import (
    FOREIGN_NAMES,
    FOREIGN_PREFIXES,
    REPLACED,
    TYPO_CUTOFF,
    _default_cache_dir_in,
    _field_type,
    _from_mapping,
    _training_env_model,
    case_twin_errors,
    replacement,
    unknown_variable_errors,
)
from rocmft.config.knobs import PATH_KNOBS, PREFIX, RocmftSettings
from rocmft.config.lfargs import is_secret_name, lf_arguments
from rocmft.config.provenance import Kind, Source, texts
from rocmft.config.userconfig import _refuse_unknown_keys, _typed_values, load_user_config
from rocmft.errors import ConfigError, combined
from rocmft.findings import ERROR, OUTSIDE_RULES, Finding, Setting


@dataclass
class Settings:
    """Everything the environment says, typed and checked, before any default is applied.

    Attributes:
        rocmft: rocmft's own knobs.
        explicit_rocmft: names of the ROCMFT_ fields that were set (``precision``, ...), to tell a default
            from a choice.
        arguments: training arguments given by the user (the YAML first, environment over it, the command line's
            key=value over both), by field name, secrets excluded.
        sources: where each argument came from (:class:`rocmft.config.provenance.Source`: the environment
            variable, ROCMFT_CONFIG's file, the command line's YAML or its key=value), for decisions (by kind),
            messages and the manifest (rendered).
        secrets: secret-valued arguments given in the environment (env name -> value). Never rendered; the
            worker receives them through its environment.
        given: the text the user wrote for each argument (field name) and each ROCMFT_ setting (``ROCMFT_<FIELD>``),
            before typing, for messages (:mod:`rocmft.config.provenance`): ``1e-4`` where the value is 0.0001.
        environ: the environment the settings were read from, a read-only snapshot taken where the command
            started: every later stage reads the process's variables (torch's, ROCm's, the scheduler's) here, never
            from ``os.environ`` (issue 29; docs/layout.md, "One run context").
        unknown: variables that look meant for rocmft but that it does not understand (variable -> message;
            :func:`rocmft.config.envargs.unknown_variable_errors`), kept when :func:`load_settings` defers them.
        overridden: rocmft's settings that rocmft itself set for this attempt (field -> its source, e.g. the
            restart after a non-finite loss: precision fp32, resume from a checkpoint); never in
            ``explicit_rocmft``, so no rule takes rocmft's decision for the user's.
    """

    rocmft: RocmftSettings
    explicit_rocmft: set[str]
    arguments: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    given: dict[str, str] = field(default_factory=dict)
    overridden: dict[str, Source] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    unknown: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def unknown_refusal(self) -> ConfigError | None:
        """The refusal of the variables rocmft does not understand (:attr:`unknown`), or None when there are none:
        :func:`rocmft.validate.rules.render_checked` reports it with the rules' findings."""
        return unknown_settings(self.unknown) if self.unknown else None

    def named(self, name: str) -> str:
        """Argument ``name`` for a message: its value and where it came from
        (:func:`rocmft.config.provenance.named`)."""
        from rocmft.config.provenance import named_in

        return named_in(name, self.arguments, self.sources, self.given)

    def knob(self, field: str) -> str:
        """rocmft's setting ``field`` for a message: ``ROCMFT_<FIELD>=value (set in the environment)`` or
        ``(rocmft's default)`` (:func:`rocmft.config.provenance.knob`)."""
        from rocmft.config.provenance import knob

        return knob(field, getattr(self.rocmft, field), field in self.explicit_rocmft,
                    self.given.get(f"ROCMFT_{field.upper()}"), self.overridden.get(field))  # fmt: skip

    def source_of(self, name: str) -> str:
        """Where an argument came from, in words (the source rendered), or ``the default of <name>``."""
        source = self.sources.get(name)
        return str(source) if source is not None else f"the default of {name}"

    def redacted(self) -> dict[str, Any]:
        """The settings for the manifest: rocmft knobs, arguments and their sources; secrets as names only."""
        return {
            "rocmft": self.rocmft.model_dump(mode="json"),
            "explicit_rocmft": sorted(self.explicit_rocmft),
            "arguments": self.arguments,
            "sources": texts(self.sources),
            "rocmft_overrides": texts(self.overridden),
            "secrets_given": sorted(self.secrets),
        }


# Values from tutorials and other tools that a field does not take, with what to write instead.
REPLACED_VALUES: dict[tuple[str, str], str] = {
    ("finetuning_type", "qlora"): "QLoRA in LLaMA-Factory is FINETUNING_TYPE=lora with QUANTIZATION_BIT=4",
    ("finetuning_type", "dora"): "DoRA in LLaMA-Factory is FINETUNING_TYPE=lora with USE_DORA=true",
    ("finetuning_type", "lora_plus"): "LoRA+ in LLaMA-Factory is FINETUNING_TYPE=lora with LORAPLUS_LR_RATIO=16",
    ("stage", "orpo"): "ORPO in LLaMA-Factory is STAGE=dpo with PREF_LOSS=orpo",
    ("stage", "simpo"): "SimPO in LLaMA-Factory is STAGE=dpo with PREF_LOSS=simpo",
}


def _validation_messages(err: ValidationError, env_name: typing.Callable[[str], str], arguments: dict) -> list[str]:
    messages = []
    for item in err.errors():
        name = str(item["loc"][0]) if item["loc"] else "?"
        given = item.get("input")
        expected = ""
        if name in arguments:
            expected = f" (expected {arguments[name].type_text})"
        hint = REPLACED_VALUES.get((name, str(given).strip().lower()))
        shown = "<not repeated: a secret's name>" if is_secret_name(name) else repr(given)  # a token given by mistake
        messages.append(f"{env_name(name)}={shown}: {hint}" if hint else
                        f"{env_name(name)}={shown}: {item['msg']}{expected}")  # fmt: skip
    return messages


def _allowed_values(err: ValidationError) -> str:
    """The fix for invalid ROCMFT_ settings: per variable named in ``err``, what it takes, read from the field (its
    choices, or its type and bounds: ``ROCMFT_NET_TIMEOUT_S: a number from 2 to 540``)."""
    import annotated_types as at

    fixes = []
    for name in dict.fromkeys(str(item["loc"][0]) for item in err.errors() if item["loc"]):
        field = RocmftSettings.model_fields.get(name)
        if field is None:
            continue
        annotation = field.annotation
        kinds = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (
            annotation,)  # fmt: skip
        choices = [c for kind in kinds if typing.get_origin(kind) is typing.Literal for c in typing.get_args(kind)]
        bounds = {}
        for m in field.metadata:
            for cls, attr in ((at.Ge, "ge"), (at.Gt, "gt"), (at.Le, "le"), (at.Lt, "lt")):
                if isinstance(m, cls):
                    bounds[attr] = getattr(m, attr)
        if choices:
            what = "one of " + ", ".join(str(c) for c in choices)
        else:
            what = ("a whole number" if int in kinds else "a number" if float in kinds else
                    "a path" if Path in kinds else "a value of its type")  # fmt: skip
            low = f"{bounds['ge']:g}" if "ge" in bounds else f"above {bounds['gt']:g}" if "gt" in bounds else None
            high = f"{bounds['le']:g}" if "le" in bounds else f"below {bounds['lt']:g}" if "lt" in bounds else None
            what += (f" from {low} to {high}" if low and high else f", at least {low}" if low else
                     f", at most {high}" if high else "")  # fmt: skip
        fixes.append(f"{PREFIX}{name.upper()} to {what}" + (" (or unset it)" if type(None) in kinds else ""))
    if not fixes:
        return "See the README's variable reference for the values each variable takes."
    return f"Set {'; '.join(fixes)}. The README's variable reference lists every variable."


def load_settings(environ: Mapping[str, str], command_line: CommandLine | None = None,
                  overrides: Mapping[str, tuple[Any, Source]] | None = None, *,
                  defer_unknown: bool = False) -> Settings:  # fmt: skip
    """Read and check every setting from ``environ`` (the process environment, which the command line passes: the
    run's one snapshot, kept as :attr:`Settings.environ`) and the command line.

    Precedence, highest first (README, "Your own model and data"): a ``key=value`` on the command line > the
    environment > the YAML (``rocmft train CONFIG.yaml`` or ROCMFT_CONFIG) > rocmft's defaults (applied later, by
    :mod:`rocmft.config.layers` and :mod:`rocmft.render`). A command-line mapping (``lr_scheduler_kwargs.min_lr=0``)
    is merged into a mapping from below, as ``OmegaConf.merge`` merges LLaMA-Factory's overrides into its YAML.

    Args:
        environ: the environment to read.
        command_line: the command's ``[CONFIG.yaml] [key=value ...]``
            (:func:`rocmft.config.cmdline.parse_command_line`), or None.
        overrides: rocmft's settings that rocmft itself decides for this attempt, field -> (value, source), above
            the environment (a restart's precision and checkpoint: rocmft.cli.train); recorded in
            :attr:`Settings.overridden`, never as the user's.
        defer_unknown: keep the refusal of unknown variables in :attr:`Settings.unknown` for the command's rules to
            report with their own findings (:func:`rocmft.validate.rules.render_checked`: a misspelled name and a
            bad value come in one run, a newcomer's trial, 2026-12-05) instead of raising it here; a refusal while
            reading the other settings then reports them too. The commands that run no rules leave it off.

    Raises:
        ConfigError: an unknown ``ROCMFT_`` variable, a variable that looks like a removed or misspelled
            argument, a value of the wrong type (naming the variable and the expected type), a bad
            YAML file, a YAML on the command line that is not ROCMFT_CONFIG's, or a command-line key that is not
            an argument or a value of the wrong type (named as typed).
    """
    environ = dict(environ)
    unknown = unknown_variable_errors(environ)
    if unknown and not defer_unknown:
        raise unknown_settings(unknown)
    try:
        return _read_settings(environ, command_line or CommandLine(), dict(overrides or {}), unknown)
    except ConfigError as error:
        if not unknown:
            raise
        raise combined(unknown_settings(unknown), error) from error


def _read_settings(environ: dict[str, str], command_line: CommandLine, overrides: dict[str, tuple[Any, Source]],
                   unknown: Mapping[str, str]) -> Settings:  # fmt: skip
    """:func:`load_settings` past the unknown variables (kept in :attr:`Settings.unknown`).

    Raises:
        ConfigError: as :func:`load_settings` says, but for the unknown variables.
    """
    _refuse_case_twins(environ)
    rocmft, explicit = _read_rocmft_settings(environ, overrides)
    values = _read_training_environment(environ)
    rocmft, config_source = _choose_the_yaml(rocmft, explicit, command_line)
    settings = Settings(rocmft=rocmft, explicit_rocmft=explicit, environ=MappingProxyType(environ),
                        overridden={name: source for name, (_, source) in overrides.items()},
                        unknown=MappingProxyType(dict(unknown)))  # fmt: skip
    upper = {k.upper(): v for k, v in environ.items()}
    settings.given.update({PREFIX + name.upper(): upper[PREFIX + name.upper()].strip() for name in explicit
                           if PREFIX + name.upper() in upper})  # fmt: skip
    if rocmft.config is not None:
        _apply_yaml(settings, rocmft.config, config_source, on_command_line=command_line.config is not None)
    _apply_environment(settings, values, environ)
    _apply_command_line(settings, command_line)
    _refuse_overlong_names({f"{name} ({settings.source_of(name)})": value for name, value in settings.arguments.items()
                            if PATH_ARGUMENT.fullmatch(name) and isinstance(value, str | list)})  # fmt: skip
    _refuse_undecodable(settings)
    _refuse_unknown_homes(settings)
    return settings


def unknown_settings(unknown: Mapping[str, str]) -> ConfigError:
    """The refusal of variables rocmft does not understand (variable -> message,
    :func:`rocmft.config.envargs.unknown_variable_errors`): one message a line, and a finding naming each variable
    as set in the environment (its value left out: a misspelled secret's name would otherwise print the secret)."""
    error = ConfigError("Unknown settings:\n  " + "\n  ".join(unknown.values()),
                        "Rename or remove these variables (the variable reference is in the README).")  # fmt: skip
    named = tuple(Setting(name, None, name, text=name, kind=Kind.ENVIRONMENT.value) for name in unknown)
    error.findings = (Finding(OUTSIDE_RULES, ERROR, error.message, error.remedy, named),)
    return error


def _refuse_case_twins(environ: Mapping[str, str]) -> None:
    """Raise for one setting given twice under names that differ only in case (:func:`case_twin_errors`).

    Raises:
        ConfigError: the settings given twice, one a line.
    """
    twins = case_twin_errors(environ)
    if twins:
        raise ConfigError("One setting given twice:\n  " + "\n  ".join(twins),
                          "Unset every spelling but one; keep the UPPER_CASE name the README uses.")  # fmt: skip


def _read_rocmft_settings(
    environ: Mapping[str, str], overrides: Mapping[str, tuple[Any, Source]]
) -> tuple[RocmftSettings, set[str]]:
    """rocmft's knobs from ``environ`` with rocmft's own ``overrides`` over them, and the names the user set (an
    override is never the user's). The cache folder's default reads XDG_CACHE_HOME/HOME from ``environ`` too.

    Raises:
        ConfigError: a value a knob does not take (with what each takes), or a path name over :data:`NAME_MAX`.
    """
    given = {k.upper() for k in environ}
    default = {} if PREFIX + "CACHE_DIR" in given else {"cache_dir": _default_cache_dir_in(environ)}
    try:
        rocmft = _from_mapping(RocmftSettings, environ, **default, **{k: value for k, (value, _) in overrides.items()})
    except ValidationError as err:
        raise ConfigError(
            "Invalid rocmft settings:\n  " + "\n  ".join(_validation_messages(err, lambda n: PREFIX + n.upper(), {})),
            _allowed_values(err),
        ) from err
    explicit = {name for name in RocmftSettings.model_fields
                if PREFIX + name.upper() in {k.upper() for k in environ} and name not in overrides}  # fmt: skip
    _refuse_overlong_names({PREFIX + name.upper(): getattr(rocmft, name) for name in PATH_SETTINGS})
    return rocmft, explicit


def _read_training_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The training arguments set in ``environ``, typed (field name -> JSON-ready value; unset ones left out).

    Raises:
        ConfigError: values of the wrong type, each with the type expected.
    """
    try:
        return _from_mapping(_training_env_model(), environ).model_dump(exclude_none=True, mode="json")
    except ValidationError as err:
        raise ConfigError(
            "Invalid training arguments:\n  " + "\n  ".join(_validation_messages(err, str.upper, lf_arguments())),
            "Give each variable a value of the type shown (e.g. LEARNING_RATE=1e-4, BF16=true).",
        ) from err


def _choose_the_yaml(
    rocmft: RocmftSettings, explicit: set[str], command_line: CommandLine
) -> tuple[RocmftSettings, Source]:
    """The training YAML to read, ROCMFT_CONFIG's or the command line's (then recorded as the user's ``config``
    in ``explicit``), and its source.

    Raises:
        ConfigError: both name a YAML, and not the same file.
    """
    config_source = Source(Kind.CONFIG_FILE, str(rocmft.config))
    if command_line.config is not None:
        if rocmft.config is not None and not _same_file(rocmft.config, command_line.config):
            raise ConfigError(
                f"Two training YAMLs: {command_line.config} on the command line and ROCMFT_CONFIG={rocmft.config} "
                "in the environment; rocmft does not guess which one you meant.",
                "Give one: drop the file from the command line, or unset ROCMFT_CONFIG (compose files and job "
                "scripts may set it).",
            )
        rocmft = rocmft.model_copy(update={"config": command_line.config})
        explicit.add("config")
        config_source = Source(Kind.COMMAND_LINE_YAML, str(command_line.config))
    return rocmft, config_source


def _apply_yaml(settings: Settings, path: Path, config_source: Source, on_command_line: bool) -> None:
    """Put the YAML's arguments into ``settings`` (the lowest of the user's layers), each with ``config_source``.

    Raises:
        ConfigError: the YAML is bad (:func:`load_user_config`) or holds a secret argument.
    """
    raw: dict[str, Any] = {}
    for key, value in load_user_config(path, on_command_line, raw).items():
        if lf_arguments()[key].secret:
            raise ConfigError(
                f"{config_source} holds the secret `{key}`; it would be copied into the run's saved configs.",
                f"Remove it from the file and pass it as the environment variable {key.upper()} (or HF_TOKEN).",
            )
        settings.arguments[key] = value
        settings.sources[key] = config_source
        _remember(settings.given, key, raw.get(key))


def _apply_environment(settings: Settings, values: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """Put the environment's training arguments over the YAML's (secrets kept apart, by variable name)."""
    upper = {k.upper(): v for k, v in environ.items()}
    for key, value in values.items():
        argument = lf_arguments()[key]
        if argument.secret:
            settings.secrets[argument.env] = str(value)
            continue
        settings.arguments[key] = value
        settings.sources[key] = Source.environment(argument.env)
        _remember(settings.given, key, environ.get(argument.env, upper.get(argument.env.upper())))


# Arguments that name files or folders (a list of data set names counts: each is looked up as a file), and the file
# system's limit on one name in a path (NAME_MAX on Linux): a longer one made pathlib's is_file() raise OSError
# ENAMETOOLONG, where it returns False for a missing file.
PATH_ARGUMENT = re.compile(r".*(_path|_dir|_file|_or_path)$|^(dataset|eval_dataset|deepspeed|resume_from_checkpoint)$")
NAME_MAX = 255
# The rocmft knobs named in files and folders: the path knobs (one list with knobs' empty-path check: nvme_path was
# missing here, and an NVMe offload folder of a 300-byte name raised ENAMETOOLONG in the offload rule), the run's
# folder name and ROCMFT_RESUME (a checkpoint folder).
PATH_SETTINGS = (*PATH_KNOBS, "run_name", "resume")


def _refuse_overlong_names(given: Mapping[str, Any]) -> None:
    """Raise when a path-valued setting (``where`` -> value) has a name (a part between slashes, or one data set
    name of a list) longer than :data:`NAME_MAX` bytes.

    Raises:
        ConfigError: naming each variable or key and where it came from (exit 2).
    """
    parts = {where: re.split(r"[/,\[\]'\"]", str(value)) for where, value in given.items() if value is not None}
    long = [where for where, split in parts.items()
            if any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in split)]  # fmt: skip
    if long:
        raise ConfigError(f"These settings name a file or folder longer than {NAME_MAX} bytes (the file system's "
                          f"limit for one name in a path): {', '.join(long)}.",
                          "Give a shorter name (a part between slashes may have at most 255 bytes).")  # fmt: skip


# rocmft's path settings whose values are written into train.yaml or the ds_config (the output folder's parts, the
# NVMe folder, the checkpoint to resume) or handed to tokenizers (the cache: the built-in model's tokenizer.json
# raised UnicodeEncodeError in tokenizers' save); ROCMFT_CONFIG and ROCMFT_TEMPLATES are only opened, and a name that
# is not UTF-8 works there.
RENDERED_KNOBS = ("saves_dir", "run_name", "nvme_path", "resume", "cache_dir")


def _undecodable(value: Any) -> bool:
    """Whether ``value`` (a string, or a list of them) holds bytes that were not UTF-8: Python reads such bytes of
    the environment as lone surrogates (U+DC80-U+DCFF, PEP 383's surrogateescape)."""
    if isinstance(value, list):
        return any(_undecodable(item) for item in value)
    return isinstance(value, str | Path) and any("\udc80" <= char <= "\udcff" for char in str(value))


def _refuse_undecodable(settings: Settings) -> None:
    """Raise when a training argument or one of rocmft's path settings holds bytes that are not UTF-8
    (``OUTPUT_DIR=/saves/caf\\xe9``, a Latin-1 folder name). train.yaml, run.json and LLaMA-Factory take UTF-8 text
    only: such a value ended ``rocmft render`` in "The rendered train.yaml is not valid YAML ... fix: Fix the
    template", naming no variable (a break-it trial, 2026-12-06).

    Raises:
        ConfigError: naming each setting, its bytes escaped (``caf\\xe9``), and where it was set (exit 2).
    """
    from rocmft.config.provenance import knob, named

    def shown(value: Any) -> str:
        return str(value).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")

    bad = [named(name, shown(value), settings.sources.get(name)) for name, value in settings.arguments.items()
           if _undecodable(value)]  # fmt: skip
    bad += [knob(name, shown(getattr(settings.rocmft, name)), name in settings.explicit_rocmft)
            for name in RENDERED_KNOBS if _undecodable(getattr(settings.rocmft, name))]  # fmt: skip
    if bad:
        raise ConfigError("These settings hold bytes that are not UTF-8 (a name in Latin-1 or another legacy "
                          "encoding; each shown as \\x<byte>): " + "; ".join(bad) + ". train.yaml, run.json and "
                          "LLaMA-Factory take UTF-8 text only.",
                          "Rename the file or folder to a UTF-8 name (e.g. `convmv -f latin1 -t utf-8 --notest "
                          "<path>`), or write the value in UTF-8.")  # fmt: skip


def _unknown_home(value: Any) -> str | None:
    """The ``~user`` that starts ``value`` (or an item of its comma list) when no such user is here, else None:
    ``os.path.expanduser`` leaves it as it is, pathlib's raises RuntimeError ("Could not determine home
    directory")."""
    for item in str(value).split(","):
        item = item.strip()
        if item.startswith("~") and os.path.expanduser(item) == item:
            return item.split("/")[0]
    return None


def _refuse_unknown_homes(settings: Settings) -> None:
    """Raise when a path setting starts with the home folder of a user there is none of here
    (``MODEL_NAME_OR_PATH=~alice/models/qwen`` from the host's .env, in a container that has no user alice):
    OUTPUT_DIR, MODEL_NAME_OR_PATH and DATASET_DIR so written ended ``rocmft render`` in pathlib's RuntimeError,
    a traceback with exit 1 (a break-it trial, 2026-12-06).

    Raises:
        ConfigError: naming each setting and the ``~user`` (exit 2).
    """
    from rocmft.config.provenance import knob, named

    homes = {named(name, value, settings.sources.get(name)): _unknown_home(value)
             for name, value in settings.arguments.items()
             if PATH_ARGUMENT.fullmatch(name) and isinstance(value, str) and _unknown_home(value)}  # fmt: skip
    homes.update(
        {
            knob(name, getattr(settings.rocmft, name), name in settings.explicit_rocmft): _unknown_home(
                getattr(settings.rocmft, name)
            )
            for name in (*PATH_KNOBS, "resume")
            if getattr(settings.rocmft, name) is not None and _unknown_home(getattr(settings.rocmft, name))
        }
    )
    if homes:
        raise ConfigError("These settings start with the home folder of a user this machine or container does not "
                          "have: " + "; ".join(f"{where}: no user {home[1:]!r} here" for where, home in homes.items())
                          + ".",
                          "Write the full path as rocmft sees it (a folder mounted into the container), or ~/... "
                          "for the home folder of the user rocmft runs as.")  # fmt: skip


def _apply_command_line(settings: Settings, command_line: CommandLine) -> None:
    """Put the command line's overrides over ``settings.arguments`` (checked and typed as a YAML's keys are; a
    mapping merged into a mapping from below), recording each source as ``command line (<tokens>)``.

    Raises:
        ConfigError: a key that is not an argument, a secret argument, or a value of the wrong type.
    """
    from omegaconf import OmegaConf

    overrides = dict(command_line.overrides)
    if not overrides:
        return
    where = "The command line"
    value_of = {name: command_line.tokens[name][-1].partition("=")[2] for name in overrides}
    _refuse_unknown_keys(overrides, where, command_line.shown, lambda key: replacement(key, cli_value=value_of[key]))
    merged_into: dict[str, Source | None] = {}
    for key, value in overrides.items():
        if lf_arguments()[key].secret:  # parse_command_line refuses these by name already; the vocabulary decides
            raise ConfigError(f"`{key}` on the command line is a secret (the value is not repeated here).", SECRET_FIX)
        below = settings.arguments.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            overrides[key] = OmegaConf.to_container(OmegaConf.merge(below, value))
            merged_into[key] = settings.sources.get(key)
    typed = _typed_values(overrides, where, lambda key, _value: command_line.shown(key),
                          "Give each key a value of the type shown (e.g. learning_rate=5e-5 bf16=true "
                          "lora_target=q_proj,v_proj report_to=[wandb,tensorboard]).")  # fmt: skip
    for key, value in typed.items():
        settings.arguments[key] = value
        settings.sources[key] = command_line.source(key, merged_into.get(key))
        _remember(settings.given, key, value_of[key] if key not in merged_into else None)


def _remember(given: dict[str, str], key: str, text: Any) -> None:
    """Record ``text`` as the user's spelling of ``key`` (only a string: a YAML number is shown as typed)."""
    if isinstance(text, str):
        given[key] = text
    else:
        given.pop(key, None)


def _same_file(first: Path, second: Path) -> bool:
    """Whether two paths name one file (``os.path.samefile``; the same absolute path when one is missing)."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return first.expanduser().absolute() == second.expanduser().absolute()


__all__ = [
    "FOREIGN_NAMES",
    "FOREIGN_PREFIXES",
    "NAME_MAX",
    "PATH_ARGUMENT",
    "PATH_SETTINGS",
    "PREFIX",
    "REPLACED",
    "REPLACED_VALUES",
    "TYPO_CUTOFF",
    "RocmftSettings",
    "Settings",
    "_field_type",
    "is_secret_name",
    "load_settings",
    "load_user_config",
    "replacement",
    "unknown_settings",
    "unknown_variable_errors",
]
