"""Render: settings in, the run's files out (train.yaml, ds_config.json, data/dataset_info.json, run.json).

Layers, lowest first: the template's defaults (templates/train.yaml.j2; the seed recipe for LoRA SFT) <
the built-in default (templates/demo.yaml, only when no model is given) < ROCMFT_CONFIG < environment (those
three: :func:`rocmft.config.layers.layer`) < what rocmft decides here (output and data folders, precision, the
distributed config, the planner's defaults, the checkpoint to resume). The rendered YAML is parsed back and
*that* is the configuration every later step (the rules, validation, checks, the worker) reads, so what is
saved is exactly what ran. :func:`render` decides and renders (a frozen :class:`Rendered`), :func:`write`
writes; :func:`rocmft.validate.rules.render_checked` runs the rules between them.

Everything is written into a staging folder inside OUTPUT_DIR and moved to ``OUTPUT_DIR/rocmft`` only
when validation and the checks pass (:func:`rocmft.fsutil.replace_dir`).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jinja2
import yaml

from rocmft import __version__
from rocmft.config.layers import BUILTIN_SOURCE, Layers, builtin_templates
from rocmft.config.provenance import Kind, Source
from rocmft.config.settings import Settings
from rocmft.console import say, warn
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.facts.job import JobShape, asked_processes, job_shape
from rocmft.facts.modeldir import ModelDir
from rocmft.facts.scheduler import JobLayout, job_layout
from rocmft.fsutil import atomic_write_json, atomic_write_text
from rocmft.nesting import loads_json
from rocmft.records import MANIFEST_FILE, read_manifest
from rocmft.render import checkpointing, planner
from rocmft.render.datasets import Registry, build_registry, split_names
from rocmft.render.loader import WORKERS, plan_workers
from rocmft.render.precision import Precision, resolve_precision
from rocmft.render.resume import ResumeChoice, checkpoints, choose, given_checkpoint

RUN_SUBDIR = "rocmft"
TEMPLATE_SOURCE = Source(Kind.TEMPLATE)

# FSDP through transformers' TrainingArguments (works under torchrun, as LLaMA-Factory requires): full
# sharding with auto-wrap of the model's own decoder-layer class (_no_split_modules), PyTorch docs'
# recommended prefetch, and the rank-0 loading that keeps host memory at one copy of the weights.
FSDP_OPTIONS = "full_shard auto_wrap"
# ROCMFT_ON_HANG=retry: the process group's timeout (DDP_TIMEOUT, s) when the user gave none: transformers' own
# TrainingArguments default (LLaMA-Factory's 180000000 would never end a hang, so nothing would retry)
HANG_TIMEOUT_S = 1800
FSDP_CONFIG = {
    "backward_prefetch": "backward_pre",
    "forward_prefetch": False,
    "use_orig_params": True,
    "sync_module_states": True,
    "cpu_ram_efficient_loading": True,
    "activation_checkpointing": False,
}


def run_subdir(layout: JobLayout) -> str:
    """``rocmft`` on node 0 (in task mode: for rank 0); ``rocmft-node<k>`` on the other nodes of a multi-node run
    (``rocmft-rank<r>`` for the other tasks), so that node 0 alone writes OUTPUT_DIR/rocmft and the weights, while
    each other process that rocmft runs keeps its own record beside it. ``layout``: the run's job layout."""
    if layout.is_first_node:
        return RUN_SUBDIR
    return f"{RUN_SUBDIR}-rank{layout.rank}" if layout.mode == "task" else f"{RUN_SUBDIR}-node{layout.node_rank}"


def _yaml_value(value: Any) -> str:
    """One YAML flow value (scalar, list or mapping) that reads back as ``value``."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6).strip()
    return text[: -len("\n...")].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


class _Renderer:
    """The Jinja side of rendering: arg()/value()/is_set()/rest() over the layered values."""

    def __init__(self, layered: dict[str, Any], fixed: dict[str, Any]) -> None:
        self.layered = layered
        self.fixed = fixed
        self.used: set[str] = set()

    def value(self, name: str, default: Any = None) -> Any:
        if name in self.fixed:
            return self.fixed[name]
        return self.layered.get(name, default)

    def arg(self, name: str, default: Any = None) -> Any:
        self.used.add(name)
        return self.value(name, default)

    def is_set(self, name: str) -> bool:
        return self.value(name) is not None

    def rest(self) -> list[tuple[str, Any]]:
        merged = {**self.layered, **self.fixed}
        names = [n for n in merged if n not in self.used and merged[n] is not None]
        self.used.update(names)
        return [(n, merged[n]) for n in names]


def _environment(settings: Settings) -> jinja2.Environment:
    loaders: list[jinja2.BaseLoader] = []
    if settings.rocmft.templates is not None:
        if not settings.rocmft.templates.is_dir():
            raise ConfigError(
                f"ROCMFT_TEMPLATES={settings.rocmft.templates} is not a folder.",
                "Mount your template folder and point ROCMFT_TEMPLATES at it, or unset it.",
            )
        loaders.append(jinja2.FileSystemLoader(str(settings.rocmft.templates)))
    loaders.append(jinja2.FileSystemLoader(str(builtin_templates())))
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # YAML and JSON, not HTML
    )
    env.filters["y"] = _yaml_value
    return env


def _render(env: jinja2.Environment, name: str, **context: Any) -> str:
    try:
        return env.get_template(name).render(**context)
    except Exception as err:  # a template is code: {{ 1 / 0 }}, arg() without a name, a file not UTF-8, ...
        where = getattr(err, "filename", None) or name
        line = getattr(err, "lineno", None)
        detail = str(err) if isinstance(err, jinja2.TemplateError) else f"{type(err).__name__}: {err}"
        raise ConfigError(
            f"Template {where}{f' line {line}' if line else ''} failed to render: {detail}",
            "Fix the template (or unset ROCMFT_TEMPLATES to use the built-in ones).",
        ) from err


def _load_rendered_yaml(text: str, name: str) -> dict[str, Any]:
    """Parse the rendered YAML the way LLaMA-Factory will (OmegaConf: duplicate keys are errors)."""
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except Exception as err:  # OmegaConf's parse errors have many types
        raise ConfigError(f"The rendered {name} is not valid YAML: {err}", "Fix the template.") from err
    if not isinstance(loaded, dict):
        raise ConfigError(f"The rendered {name} is not a mapping.", "Fix the template.")
    return loaded


def default_run_name(arguments: dict[str, Any], demo: bool) -> str:
    """``rocmft-demo`` for the built-in default, else ``<model folder or repo name>-<stage>-<method>``."""
    if demo:
        return "rocmft-demo"
    model = str(arguments.get("model_name_or_path", "model")).rstrip("/")
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", model.split("/")[-1]) or "model"
    return f"{base}-{arguments.get('stage', 'sft')}-{arguments.get('finetuning_type', 'lora')}"


def default_output_dir(arguments: dict[str, Any], saves_dir: Path, run_name: str | None, demo: bool) -> Path:
    """The absolute OUTPUT_DIR of a run: ``output_dir`` when given, else ``saves_dir/<run name>`` (ROCMFT_RUN_NAME,
    else :func:`default_run_name`). ``rocmft export`` and ``chat`` find the run of the same settings by it."""
    chosen = arguments.get("output_dir") or saves_dir / (run_name or default_run_name(arguments, demo))
    return Path(chosen).expanduser().absolute()


@dataclass(frozen=True)
class _Destination:
    """Where the run's files go: OUTPUT_DIR, ``OUTPUT_DIR/rocmft`` (or ``rocmft-node<k>``), and the staging folder."""

    output_dir: Path
    run_dir: Path
    staging: Path


@dataclass(frozen=True)
class _Fixed:
    """What rocmft decides over the layered arguments (folders, precision, the distributed config), with sources."""

    values: dict[str, Any]
    sources: dict[str, Source]
    ds_config: dict[str, Any] | None
    launcher: str


@dataclass(frozen=True)
class Rendered:
    """One run rendered but not yet written: the subject of the ``rendered`` rules (rocmft.validate.rules), then
    of :func:`write`, which makes it a :class:`Plan`.

    Attributes:
        settings: the read settings.
        output_dir: absolute OUTPUT_DIR.
        run_dir: ``OUTPUT_DIR/rocmft``, where the rendered files end up.
        staging: the folder they are written to first.
        arguments: the effective training arguments, parsed back from the rendered train.yaml.
        sources: argument name -> where its value came from (variable, file, built-in or template default).
        precision: the resolved precision policy.
        device: the probed device.
        registry: the data sets.
        ds_config: the rendered DeepSpeed config, when ROCMFT_DISTRIBUTED=deepspeed.
        demo: whether this is the built-in default (tiny model, demo data).
        perf: the planner's choices (rocmft.render.planner.PerfPlan): micro-batch, packing, checkpointing,
            attention, fused kernels, each with its reason; for the manifest and ``rocmft plan``.
        text: the rendered train.yaml.
        resume: ROCMFT_RESUME's choice (rocmft.render.resume.choose).
        resumable: whether OUTPUT_DIR has checkpoints (used or not): the resume note is printed then.
        layout: the run's job layout (rocmft.facts.scheduler), read once by render.
        job: the job's shape (rocmft.facts.job.JobShape: launcher, nodes, processes per node, world size), computed
            once when the launcher is chosen; ``launcher`` and ``world_size`` read it.
    """

    settings: Settings
    output_dir: Path
    run_dir: Path
    staging: Path
    arguments: dict[str, Any]
    sources: dict[str, Source]
    precision: Precision
    device: DeviceFacts
    registry: Registry
    ds_config: dict[str, Any] | None
    demo: bool
    perf: Any
    text: str
    resume: ResumeChoice
    resumable: bool
    layout: JobLayout
    job: JobShape

    @property
    def launcher(self) -> str:
        """``python`` (one process), ``torchrun``, or ``task`` (one rank of a scheduler's one-process-per-GPU run)."""
        return self.job.launcher

    @property
    def world_size(self) -> int:
        """Processes in the job: NNODES × processes per node, or the scheduler's task count (:attr:`job`)."""
        return self.job.world_size

    @cached_property
    def model(self) -> ModelDir:
        """The model folder of the rendered MODEL_NAME_OR_PATH (read once for all rules)."""
        return ModelDir(str(self.arguments.get("model_name_or_path", "")))


@dataclass(frozen=True)
class Plan(Rendered):
    """One run, rendered and written: what later steps read (validation, the launch spec, the checks, the
    manifest). A :class:`Rendered` (every attribute of it) and:

    Attributes:
        files: name (``train.yaml``, ``dataset_info.json``, ``ds_config.json``, ``run.json``) -> staged path of each
            written file (read-only).

    Frozen: no later stage changes it. What the checks measure is kept by the run's probe provider
    (rocmft.facts.probes), how the worker starts is rocmft.launch.prepare_launch's LaunchSpec.
    """

    files: Mapping[str, Path] = field(default_factory=lambda: MappingProxyType({}))

    def staged(self, final: str | Path) -> Path:
        """Map a path under ``run_dir`` to its staged twin (used to validate before files move)."""
        final = Path(final)
        try:
            return self.staging / final.relative_to(self.run_dir)
        except ValueError:
            return final


def _destination(settings: Settings, layout: JobLayout, layered: dict[str, Any], sources: dict[str, Source], demo: bool,
                 make_staging) -> _Destination:  # fmt: skip
    """OUTPUT_DIR (:func:`default_output_dir`) and the staging folder; records the default's source in ``sources``."""
    rocmft = settings.rocmft
    output_dir = default_output_dir(layered, rocmft.saves_dir, rocmft.run_name, demo)
    if "output_dir" not in layered:
        name = "ROCMFT_RUN_NAME" if rocmft.run_name else "<run name>"
        sources["output_dir"] = Source(Kind.ROCMFT_DEFAULT, f"ROCMFT_SAVES_DIR/{name}")
    run_dir = output_dir / run_subdir(layout)
    return _Destination(output_dir=output_dir, run_dir=run_dir, staging=make_staging(output_dir))


def _registry(layered: dict[str, Any]) -> Registry:
    """The data set registry of DATASET and EVAL_DATASET over DATASET_DIR (default ``data``)."""
    names = split_names(layered.get("dataset")) + split_names(layered.get("eval_dataset"))
    source_dir = Path(layered.get("dataset_dir") or "data").expanduser().absolute()
    return build_registry(list(dict.fromkeys(names)), source_dir)


def _fixed(settings: Settings, device: DeviceFacts, env: jinja2.Environment, layered: dict[str, Any],
           sources: dict[str, Source], where: _Destination, registry: Registry,
           precision: Precision, layout: JobLayout) -> _Fixed:  # fmt: skip
    """The values rocmft sets itself: output and data folders, precision, the DeepSpeed or FSDP config, and the
    launcher (``torchrun`` for any distributed strategy, several GPUs or processes: LLaMA-Factory refuses one
    process driving several GPUs, "Please launch distributed training with llamafactory-cli or torchrun").

    Raises:
        ConfigError: the rendered deepspeed.json.j2 is not JSON.
    """
    rocmft = settings.rocmft
    source_dir = registry.source_dir
    fixed: dict[str, Any] = {
        "output_dir": str(where.output_dir),
        "dataset_dir": str(where.run_dir / "data"),
        "bf16": precision.bf16,
        "fp16": precision.fp16,
    }
    data_source = sources.get("dataset_dir")
    policy = Source(Kind.ROCMFT, f"precision policy ({precision.reason})",
                    basis=sources.get(precision.chosen_by) if precision.chosen_by else None)  # fmt: skip
    fixed_sources = {
        "output_dir": sources.get("output_dir", Source.environment("OUTPUT_DIR")),
        "dataset_dir": Source(
            Kind.ROCMFT,
            f"rocmft's data set registry of {source_dir} ({data_source or 'default data/'})",
            basis=data_source,
        ),
        "bf16": policy,
        "fp16": policy,
    }
    ds_config = None
    if rocmft.distributed == "deepspeed" and "deepspeed" not in layered:
        text = _render(env, "deepspeed.json.j2", zero_stage=rocmft.zero_stage, offload=rocmft.offload,
                       offload_device=rocmft.offload_device, nvme_path=str(rocmft.nvme_path or ""))  # fmt: skip
        try:
            ds_config = loads_json(text)
        except ValueError as err:
            raise ConfigError(f"The rendered deepspeed.json.j2 is not JSON: {err}", "Fix the template.") from err
        zero = ds_config.get("zero_optimization", {}) if isinstance(ds_config, dict) else None
        stage = zero.get("stage", 0) if isinstance(zero, dict) else None
        if not isinstance(stage, int) or isinstance(stage, bool):  # the planner and memory-fit read the stage
            raise ConfigError("The rendered deepspeed.json.j2 is not a DeepSpeed config object with a whole-number "
                              f"zero_optimization.stage (it has {json.dumps(ds_config)[:120]}).",
                              "Fix the template (or unset ROCMFT_TEMPLATES to use the built-in one).")  # fmt: skip
        fixed["deepspeed"] = str(where.run_dir / "ds_config.json")
        fixed_sources["deepspeed"] = Source(Kind.ROCMFT, f"ROCMFT_DISTRIBUTED=deepspeed, ZeRO-{rocmft.zero_stage}, "
                                                         f"offload {rocmft.offload}")  # fmt: skip
    if rocmft.distributed == "fsdp":
        fixed["fsdp"] = FSDP_OPTIONS
        fixed["fsdp_config"] = {**FSDP_CONFIG, **(layered.get("fsdp_config") or {})}
        fixed_sources["fsdp"] = fixed_sources["fsdp_config"] = Source(Kind.ROCMFT, "ROCMFT_DISTRIBUTED=fsdp")
    if rocmft.on_hang == "retry" and not (sources.get("ddp_timeout") and sources["ddp_timeout"].user_chosen):
        fixed["ddp_timeout"] = HANG_TIMEOUT_S  # a hang must end for the retry to start
        fixed_sources["ddp_timeout"] = Source(
            Kind.ROCMFT, "ROCMFT_ON_HANG=retry: a hung collective ends after transformers' default 1800 s, not "
            "LLaMA-Factory's 180000000 s")  # fmt: skip
    torchrun = (rocmft.distributed != "none" or layered.get("deepspeed") or device.count > 1
                or asked_processes(settings, layout) > 1)  # fmt: skip
    # a scheduler that started one process per GPU (Slurm's task layout) is the launch: no torchrun on top
    launcher = "task" if layout.mode == "task" else "torchrun" if torchrun else "python"
    return _Fixed(values=fixed, sources=fixed_sources, ds_config=ds_config, launcher=launcher)


def _resumed(settings: Settings, fixed: _Fixed, resume: ResumeChoice, resumable: bool) -> _Fixed:
    """``fixed`` with ROCMFT_RESUME's decision: the checkpoint to resume from, or overwrite_output_dir when
    checkpoints are there but not used (LLaMA-Factory would otherwise resume by itself, from any checkpoint)."""
    values, sources = dict(fixed.values), dict(fixed.sources)
    if resume.checkpoint is not None:
        values["resume_from_checkpoint"] = str(resume.checkpoint)
        weights = ", weights only (ROCMFT_RESUME_WEIGHTS_ONLY=true)" if resume.weights_only else ""
        sources["resume_from_checkpoint"] = Source(Kind.ROCMFT, f"ROCMFT_RESUME={settings.rocmft.resume}{weights}")
    elif resumable:
        values["overwrite_output_dir"] = True
        sources["overwrite_output_dir"] = Source(Kind.ROCMFT, f"ROCMFT_RESUME={settings.rocmft.resume} ({resume.note})")
    return _Fixed(values=values, sources=sources, ds_config=fixed.ds_config, launcher=fixed.launcher)


def _train_yaml(env: jinja2.Environment, layered: dict[str, Any], fixed: _Fixed,
                rendered_at: str) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """train.yaml.j2 over the layered and fixed values: the text and the arguments parsed back from it."""
    renderer = _Renderer(layered, fixed.values)
    text = _render(env, "train.yaml.j2", arg=renderer.arg, value=renderer.value, is_set=renderer.is_set,
                   rest=renderer.rest, rocmft_version=__version__, rendered_at=rendered_at)  # fmt: skip
    text = text.rstrip("\n") + "\n"
    return text, _load_rendered_yaml(text, "train.yaml")


def _final_sources(layered: dict[str, Any], sources: dict[str, Source], fixed: _Fixed,
                   arguments: dict[str, Any]) -> dict[str, Source]:  # fmt: skip
    """Where each rendered argument came from; the template's own defaults are :data:`TEMPLATE_SOURCE`.

    Raises:
        ConfigError: a replacement template dropped given arguments (it lacks the rest() block).
    """
    dropped = [name for name, val in {**layered, **fixed.values}.items() if val is not None and name not in arguments]
    if dropped:
        raise ConfigError(
            f"The train.yaml template dropped given arguments: {', '.join(sorted(dropped))}.",
            "A replacement template must end with the rest() block of the built-in train.yaml.j2.",
        )
    sources = dict(sources)
    for name in arguments:
        if name in fixed.values:
            sources[name] = fixed.sources[name]
        elif name not in sources and arguments[name] is not None:
            sources[name] = TEMPLATE_SOURCE
    return sources


def render(settings: Settings, device: DeviceFacts, layers: Layers, make_staging,
           shm_bytes: int | None = None) -> Rendered:  # fmt: skip
    """Render the run: what rocmft decides over the layered arguments, the planner's defaults, ROCMFT_RESUME's
    choice, the train.yaml text and the arguments parsed back from it. Writes nothing but the (empty) staging
    folder; :func:`write` writes the files once the ``rendered`` rules have passed
    (:func:`rocmft.validate.rules.render_checked` runs the three).

    Args:
        settings: the read settings.
        device: the probed device (for the precision policy, the launcher and the planner).
        layers: the layered arguments (:func:`rocmft.config.layers.layer`).
        make_staging: ``callable(output_dir) -> Path`` creating the staging folder (the caller owns its
            clean-up, see :mod:`rocmft.cli`).
        shm_bytes: the size of /dev/shm (rocmft.facts.host.shm_bytes, through the run's probe provider); None:
            not known, and no loader workers are planned for it (rocmft.render.loader).

    Raises:
        ConfigError: precision conflicts, a bad template, a template that dropped a given argument.
    """
    layered, sources, demo = dict(layers.arguments), dict(layers.sources), layers.demo
    precision = resolve_precision(settings, layered, device)
    layout = job_layout(settings.environ)  # the run's job layout, read once
    where = _destination(settings, layout, layered, sources, demo, make_staging)
    registry = _registry(layered)
    env = _environment(settings)
    fixed = _fixed(settings, device, env, layered, sources, where, registry, precision, layout)
    rendered_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    text, arguments = _train_yaml(env, layered, fixed, rendered_at)
    job = job_shape(settings, device, fixed.launcher, layout)  # the job's shape, once: every later step reads it
    # the planner replaces template defaults (never the user's values) with ones chosen for the GPU
    perf = _plan_performance(settings, arguments, device, precision, fixed.ds_config, job.world_size, demo, registry)
    plan_workers(perf, arguments, sources.get(WORKERS), shm_bytes, job.communicating)  # /dev/shm, when not yours
    layered, sources, changed = planner.apply(perf, layered, sources)
    # adapters on frozen weights: the gradient-checkpointing mode that works with them (rocmft.render.checkpointing)
    layered, sources, mode_changed = checkpointing.safe_mode(layered, sources, fixed.values, fixed.ds_config)
    if changed or mode_changed:
        text, arguments = _train_yaml(env, layered, fixed, rendered_at)
    # the checkpoint decision compares the rendered arguments (template defaults included) with the earlier run's
    resume = _resume(settings, arguments, where.output_dir, where.run_dir, job.world_size)
    resumable = resume.checkpoint is not None or bool(checkpoints(where.output_dir))  # checkpoints there, used or not
    fixed = _resumed(settings, fixed, resume, resumable)
    if resumable:
        text, arguments = _train_yaml(env, layered, fixed, rendered_at)
    return Rendered(
        settings=settings,
        output_dir=where.output_dir,
        run_dir=where.run_dir,
        staging=where.staging,
        arguments=arguments,
        sources=_final_sources(layered, sources, fixed, arguments),
        precision=precision,
        device=device,
        registry=registry,
        ds_config=fixed.ds_config,
        demo=demo,
        perf=perf,
        text=text,
        resume=resume,
        resumable=resumable,
        layout=layout,
        job=job,
    )


def write(rendered: Rendered) -> Plan:
    """Say what ROCMFT_RESUME found, write the run's files into the staging folder (train.yaml,
    data/dataset_info.json, ds_config.json when rendered, run.json) and return the :class:`Plan`."""
    for name, problem in rendered.resume.skipped:
        warn(f"skipping {rendered.output_dir / name}: {problem}", all_ranks=True)  # whatever RANK says, as always
    if rendered.resume.weights_only:  # the opt-in's line: what continues and what starts fresh
        warn(rendered.resume.note, all_ranks=True)
    elif rendered.resumable:
        say(rendered.resume.note, all_ranks=True)
    staging = rendered.staging
    files = {
        "train.yaml": atomic_write_text(staging / "train.yaml", rendered.text),
        "dataset_info.json": atomic_write_json(staging / "data" / "dataset_info.json", rendered.registry.entries),
    }
    if rendered.ds_config is not None:
        files["ds_config.json"] = atomic_write_json(staging / "ds_config.json", rendered.ds_config)
    files["run.json"] = atomic_write_json(staging / "run.json", worker_policy(rendered))
    rendered_fields = {f.name: getattr(rendered, f.name) for f in fields(Rendered)}  # by name: no twin to keep in step
    return Plan(**rendered_fields, files=MappingProxyType(files))


def _plan_performance(settings: Settings, arguments: dict[str, Any], device: DeviceFacts, precision: Precision,
                      ds_config: dict[str, Any] | None, world_size: int, demo: bool,
                      registry: Registry) -> planner.PerfPlan:  # fmt: skip
    """rocmft.render.planner over the rendered arguments; the user's arguments (environment, ROCMFT_CONFIG) are
    never changed. FSDP is planned as ZeRO-3 (both shard weights, gradients and optimizer states). The mean
    sample length (for the rows of a packed step) is measured only where the planner will use it: SFT on a GPU
    with a local model folder."""
    zero = int(((ds_config or {}).get("zero_optimization") or {}).get("stage", 0))
    if settings.rocmft.distributed == "fsdp":
        zero = 3
    offload = settings.rocmft.offload if settings.rocmft.distributed == "deepspeed" else "none"
    sample_tokens = None
    model_dir = Path(str(arguments.get("model_name_or_path") or "")).expanduser()
    if not demo and device.count and arguments.get("stage", "sft") == "sft" and model_dir.is_dir():
        from rocmft.render.datasets import sample_token_lengths

        train = [registry.entries[n] for n in split_names(arguments.get("dataset")) if n in registry.entries]
        try:
            lengths = sample_token_lengths(train, model_dir, bool(arguments.get("trust_remote_code")))
        except ValueError:  # a damaged tokenizer: planned without the lengths; the lengths check reports it
            lengths = []
        sample_tokens = sum(lengths) / len(lengths) if lengths else None
    return planner.plan_defaults(arguments, set(settings.arguments), device, compute_dtype=precision.compute_dtype,
                                 zero_stage=zero, offload=offload, world_size=world_size, demo=demo,
                                 sample_tokens=sample_tokens)  # fmt: skip


def _resume(settings: Settings, arguments: dict[str, Any], output_dir: Path, run_dir: Path,
            world_size: int) -> ResumeChoice:  # fmt: skip
    """ROCMFT_RESUME against the checkpoints in OUTPUT_DIR and the earlier run's record in OUTPUT_DIR/rocmft
    (its train.yaml, and the world size its worker reported in manifest.json; unknown parts are not compared)."""
    current = {**arguments, "world_size": world_size}
    try:  # unreadable (not UTF-8, not YAML, not a mapping): no earlier record to compare, as when it is missing
        previous = yaml.safe_load((run_dir / "train.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        previous = None
    state = {"weights_only_ok": settings.rocmft.resume_weights_only, "deepspeed": bool(arguments.get("deepspeed"))}
    given = settings.sources.get("resume_from_checkpoint")
    if given is not None and given.user_chosen and arguments.get("resume_from_checkpoint"):
        from rocmft.config.provenance import named_in

        label = named_in("resume_from_checkpoint", arguments, settings.sources, settings.given)
        choice = given_checkpoint(str(arguments["resume_from_checkpoint"]), label, **state)
        if choice is not None:
            return choice
    if not isinstance(previous, dict):
        return choose(settings.rocmft.resume, output_dir, None, current, **state)
    try:  # a missing or damaged manifest: the earlier world size is unknown
        worker = read_manifest(run_dir / MANIFEST_FILE).worker or {}
    except ConfigError:
        worker = {}
    world = worker.get("world_size")
    world = world if isinstance(world, int) and not isinstance(world, bool) else None
    previous["world_size"] = world if world is not None else world_size  # unknown: not compared
    from rocmft.config.provenance import named_in

    return choose(
        settings.rocmft.resume,
        output_dir,
        previous,
        current,
        lambda name: named_in(name, arguments, settings.sources, settings.given),
        run_dir / "train.yaml",
        **state,
    )


def worker_policy(plan: Rendered) -> dict[str, Any]:
    """What the worker needs beyond train.yaml (rocmft/run.json): the forced dtype, the faults a test injected
    (rocmft.testhooks). The JSON object of :class:`rocmft.records.RunPolicy` (its one reader is
    rocmft.records.read_run_policy)."""
    from rocmft import testhooks
    from rocmft.records import RunPolicy

    rocmft = plan.settings.rocmft
    return RunPolicy(
        rocmft_version=__version__,
        precision=plan.precision.as_dict(),
        distributed=rocmft.distributed,
        launcher=plan.launcher,
        fault_nan_at_step=testhooks.fault("nan_at_step"),  # the faults a test injected; None in production
        fault_kill_in_save_at_step=testhooks.fault("kill_in_save_at_step"),
        fault_slow_final_save_s=testhooks.fault("slow_final_save_s"),
        fault_grad_spike_at_step=testhooks.fault("grad_spike_at_step"),
        fault_hang_at_step=testhooks.fault("hang_at_step"),
        loss_spike_factor=rocmft.loss_spike_factor,
        grad_norm_spike_factor=rocmft.grad_norm_spike_factor,
        grad_norm_limit=rocmft.grad_norm_limit,
        on_grad_norm_spike=rocmft.on_grad_norm_spike,
        peer_timeout_s=rocmft.peer_timeout_s,
        collectives=rocmft.collectives,
        demo=plan.demo,
        packed_attention=getattr(plan.perf, "packed_attention", None),
        sample_tokens=getattr(plan.perf, "sample_tokens", None),
    ).to_json()


__all__ = [
    "BUILTIN_SOURCE",
    "RUN_SUBDIR",
    "TEMPLATE_SOURCE",
    "Plan",
    "Rendered",
    "builtin_templates",
    "render",
    "worker_policy",
    "write",
]
