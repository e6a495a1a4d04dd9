"""Render: settings in, the run's files out (train.yaml, ds_config.json, data/dataset_info.json, run.json).

Layers, lowest first: the template's defaults (templates/train.yaml.j2; the seed recipe for LoRA SFT) <
the built-in default (templates/demo.yaml, only when no model is given) < ROCMFT_CONFIG < environment
< what rocmft decides (output and data folders, precision, the distributed config). The rendered YAML is
parsed back and *that* is the configuration every later step (validation, checks, the worker) reads, so
what is saved is exactly what ran.

Everything is written into a staging folder inside OUTPUT_DIR and moved to ``OUTPUT_DIR/rocmft`` only
when validation and the checks pass (:func:`rocmft.fsutil.replace_dir`).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from rocmft import __version__
from rocmft.config.settings import Settings
from rocmft.errors import ConfigError
from rocmft.facts.device import DeviceFacts
from rocmft.facts.job import asked_processes, local_processes, nnodes, node_rank
from rocmft.fsutil import atomic_write_json, atomic_write_text
from rocmft.render import planner
from rocmft.render.datasets import Registry, build_registry, split_names
from rocmft.render.precision import Precision, resolve_precision
from rocmft.render.resume import ResumeChoice, checkpoints, choose

RUN_SUBDIR = "rocmft"
BUILTIN_SOURCE = "the built-in default (templates/demo.yaml)"
TEMPLATE_SOURCE = "the default in train.yaml.j2"

# FSDP through transformers' TrainingArguments (works under torchrun, as LLaMA-Factory requires): full
# sharding with auto-wrap of the model's own decoder-layer class (_no_split_modules), PyTorch docs'
# recommended prefetch, and the rank-0 loading that keeps host memory at one copy of the weights.
FSDP_OPTIONS = "full_shard auto_wrap"
FSDP_CONFIG = {
    "backward_prefetch": "backward_pre",
    "forward_prefetch": False,
    "use_orig_params": True,
    "sync_module_states": True,
    "cpu_ram_efficient_loading": True,
    "activation_checkpointing": False,
}


def run_subdir() -> str:
    """``rocmft`` on node 0; ``rocmft-node<k>`` on the other nodes of a multi-node run, so that node 0 alone
    writes OUTPUT_DIR/rocmft and the weights, while each other node keeps its own record beside it."""
    rank = node_rank()
    return RUN_SUBDIR if rank == 0 else f"{RUN_SUBDIR}-node{rank}"


def builtin_templates() -> Path:
    """The folder of the templates shipped with rocmft: ``rocmft/templates`` in an installed wheel,
    ``templates/`` at the top of the repository in a source checkout (editable install)."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "templates", package.parents[1] / "templates"):
        if (candidate / "train.yaml.j2").is_file():
            return candidate
    raise ConfigError(f"rocmft's built-in templates are missing next to {package}.", "Reinstall rocmft.")


@dataclass
class Plan:
    """One run, rendered: what later steps read.

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
        launcher: ``"python"`` (one process) or ``"torchrun"``.
        files: name -> staged path of each rendered file.
        probes: facts the GPU checks measured (device probe, all-reduce, the image's build record), kept
            for the manifest; tests put probe data here instead of running a probe.
        launch: how the worker is started (rocmft.launch.prepare_launch): command, NUMA binding, the
            effective communication environment with each value's source; for the manifest.
        perf: the planner's choices (rocmft.render.planner.PerfPlan): micro-batch, packing, checkpointing,
            attention, fused kernels, each with its reason; for the manifest and ``rocmft plan``.
    """

    settings: Settings
    output_dir: Path
    run_dir: Path
    staging: Path
    arguments: dict[str, Any]
    sources: dict[str, str]
    precision: Precision
    device: DeviceFacts
    registry: Registry
    ds_config: dict[str, Any] | None = None
    demo: bool = False
    launcher: str = "python"
    files: dict[str, Path] = field(default_factory=dict)
    probes: dict[str, Any] = field(default_factory=dict)
    launch: dict[str, Any] = field(default_factory=dict)
    perf: Any = None

    def staged(self, final: str | Path) -> Path:
        """Map a path under ``run_dir`` to its staged twin (used to validate before files move)."""
        final = Path(final)
        try:
            return self.staging / final.relative_to(self.run_dir)
        except ValueError:
            return final


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
    except jinja2.TemplateError as err:
        where = getattr(err, "filename", None) or name
        line = getattr(err, "lineno", None)
        raise ConfigError(
            f"Template {where}{f' line {line}' if line else ''} failed to render: {err}",
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


def render(settings: Settings, device: DeviceFacts, make_staging) -> Plan:
    """Render the run's files into a staging folder and return the :class:`Plan`.

    Args:
        settings: the read settings.
        device: the probed device (for the precision policy).
        make_staging: ``callable(output_dir) -> Path`` creating the staging folder (the caller owns its
            clean-up, see :mod:`rocmft.cli`).

    Raises:
        ConfigError: precision conflicts, a bad template, a template that dropped a given argument, or
            mutually exclusive distributed settings.
    """
    from rocmft.config.demo import ensure_demo_data, ensure_tiny_model

    layered: dict[str, Any] = {}
    sources: dict[str, str] = {}
    demo = "model_name_or_path" not in settings.arguments
    if demo:
        builtin = yaml.safe_load((builtin_templates() / "demo.yaml").read_text(encoding="utf-8"))
        cache = settings.rocmft.cache_dir
        builtin["model_name_or_path"] = str(ensure_tiny_model(cache))
        layered.update(builtin)
        sources.update(dict.fromkeys(builtin, BUILTIN_SOURCE))
    layered.update(settings.arguments)
    sources.update(settings.sources)
    if demo and "dataset" not in settings.arguments:
        # the built-in data set, wherever DATASET_DIR points (the image presets DATASET_DIR=/data)
        layered["dataset_dir"] = str(ensure_demo_data(settings.rocmft.cache_dir))
        sources["dataset_dir"] = BUILTIN_SOURCE

    precision = resolve_precision(settings, layered, device)
    rocmft = settings.rocmft
    _check_distributed(settings, layered)

    output_dir = default_output_dir(layered, rocmft.saves_dir, rocmft.run_name, demo)
    if "output_dir" not in layered:
        name = "ROCMFT_RUN_NAME" if rocmft.run_name else "<run name>"
        sources["output_dir"] = f"rocmft's default (ROCMFT_SAVES_DIR/{name})"
    run_dir = output_dir / run_subdir()
    staging = make_staging(output_dir)

    names = split_names(layered.get("dataset")) + split_names(layered.get("eval_dataset"))
    source_dir = Path(layered.get("dataset_dir") or "data").expanduser().absolute()
    registry = build_registry(list(dict.fromkeys(names)), source_dir)

    fixed: dict[str, Any] = {
        "output_dir": str(output_dir),
        "dataset_dir": str(run_dir / "data"),
        "bf16": precision.bf16,
        "fp16": precision.fp16,
    }
    fixed_sources = {
        "output_dir": sources.get("output_dir", "OUTPUT_DIR"),
        "dataset_dir": f"rocmft's data set registry of {source_dir} ({sources.get('dataset_dir', 'default data/')})",
        "bf16": f"precision policy ({precision.reason})",
        "fp16": f"precision policy ({precision.reason})",
    }
    env = _environment(settings)
    ds_config = None
    launcher = "python"
    if rocmft.distributed == "deepspeed" and "deepspeed" not in layered:
        text = _render(env, "deepspeed.json.j2", zero_stage=rocmft.zero_stage, offload=rocmft.offload)
        try:
            ds_config = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"The rendered deepspeed.json.j2 is not JSON: {err}", "Fix the template.") from err
        fixed["deepspeed"] = str(run_dir / "ds_config.json")
        fixed_sources["deepspeed"] = f"ROCMFT_DISTRIBUTED=deepspeed, ZeRO-{rocmft.zero_stage}, offload {rocmft.offload}"
    if rocmft.distributed == "fsdp":
        fixed["fsdp"] = FSDP_OPTIONS
        fixed["fsdp_config"] = {**FSDP_CONFIG, **(layered.get("fsdp_config") or {})}
        fixed_sources["fsdp"] = fixed_sources["fsdp_config"] = "ROCMFT_DISTRIBUTED=fsdp"
    # LLaMA-Factory refuses one process driving several GPUs ("Please launch distributed training with
    # llamafactory-cli or torchrun"); like its own launcher, more than one visible GPU means torchrun (DDP),
    # and so does asking for more than one process per node.
    if rocmft.distributed != "none" or layered.get("deepspeed") or device.count > 1 or asked_processes(settings) > 1:
        launcher = "torchrun"

    rendered_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    def render_train_yaml() -> tuple[str, dict[str, Any]]:
        renderer = _Renderer(layered, fixed)
        text = _render(env, "train.yaml.j2", arg=renderer.arg, value=renderer.value, is_set=renderer.is_set,
                       rest=renderer.rest, rocmft_version=__version__, rendered_at=rendered_at)  # fmt: skip
        text = text.rstrip("\n") + "\n"
        return text, _load_rendered_yaml(text, "train.yaml")

    text, arguments = render_train_yaml()
    world_size = local_processes(settings, device, launcher) * nnodes()
    # the planner replaces template defaults (never the user's values) with ones chosen for the GPU
    perf = _plan_performance(settings, arguments, device, precision, ds_config, world_size, demo, registry)
    if planner.apply(perf, layered, sources):
        text, arguments = render_train_yaml()
    # the checkpoint decision compares the rendered arguments (template defaults included) with the earlier run's
    resume = _resume(settings, arguments, output_dir, run_dir, world_size)
    resumable = resume.checkpoint is not None or bool(checkpoints(output_dir))  # checkpoints there, used or not
    if resume.checkpoint is not None:
        fixed["resume_from_checkpoint"] = str(resume.checkpoint)
        fixed_sources["resume_from_checkpoint"] = f"ROCMFT_RESUME={rocmft.resume}"
    elif resumable:
        fixed["overwrite_output_dir"] = True  # LLaMA-Factory would otherwise resume by itself, from any checkpoint
        fixed_sources["overwrite_output_dir"] = f"ROCMFT_RESUME={rocmft.resume} ({resume.note})"
    if resumable:
        text, arguments = render_train_yaml()
    dropped = [name for name, val in {**layered, **fixed}.items() if val is not None and name not in arguments]
    if dropped:
        raise ConfigError(
            f"The train.yaml template dropped given arguments: {', '.join(sorted(dropped))}.",
            "A replacement template must end with the rest() block of the built-in train.yaml.j2.",
        )
    for name in arguments:
        if name in fixed:
            sources[name] = fixed_sources[name]
        elif name not in sources and arguments[name] is not None:
            sources[name] = TEMPLATE_SOURCE

    _apply_rules(arguments, sources, device, world_size, ds_config is None, registry)
    for name, problem in resume.skipped:
        print(f"[rocmft] WARNING: skipping {output_dir / name}: {problem}", flush=True)
    if resumable:
        print(f"[rocmft] {resume.note}", flush=True)
    plan = Plan(
        settings=settings,
        output_dir=output_dir,
        run_dir=run_dir,
        staging=staging,
        arguments=arguments,
        sources=sources,
        precision=precision,
        device=device,
        registry=registry,
        ds_config=ds_config,
        demo=demo,
        launcher=launcher,
        perf=perf,
    )
    plan.files["train.yaml"] = atomic_write_text(staging / "train.yaml", text)
    plan.files["dataset_info.json"] = atomic_write_json(staging / "data" / "dataset_info.json", registry.entries)
    if ds_config is not None:
        plan.files["ds_config.json"] = atomic_write_json(staging / "ds_config.json", ds_config)
    plan.files["run.json"] = atomic_write_json(staging / "run.json", worker_policy(plan))
    return plan


def _apply_rules(arguments: dict[str, Any], sources: dict[str, str], device: DeviceFacts, world_size: int,
                 user_deepspeed: bool, registry: Registry) -> None:  # fmt: skip
    """The rules of rocmft.validate.rules on the rendered arguments and the run's data set registry (errors raise
    ConfigError, warnings are printed)."""
    from rocmft.validate import rules

    rules.text_hygiene(arguments, sources)  # first: stray spaces and CRs would mislead every later message
    rules.folders(arguments, sources, registry.source_dir, list(registry.entries) + list(registry.missing))
    if arguments.get("deepspeed") and user_deepspeed:
        rules.user_ds_config(arguments, world_size, sources.get("deepspeed", "DEEPSPEED"))
    rules.quoted_values(arguments, sources)
    rules.template(arguments, sources)
    rules.method_settings(arguments, sources)
    rules.output_not_input(arguments, sources, registry.source_dir)
    rules.more_ranges(arguments, sources)
    rules.lora_target(arguments, sources.get("lora_target", TEMPLATE_SOURCE))
    rules.fp16_on_bf16_model(arguments, device.bf16, sources.get("fp16", "precision policy"))
    rules.stage_data(arguments, sources, registry.entries)
    rules.model_shapes(arguments, sources)
    warnings = rules.ranges(arguments, sources) + rules.more_values(arguments, sources)
    for warning in warnings + rules.chat_template_fits(arguments, sources):
        print(f"[rocmft] WARNING: {warning}", flush=True)


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
        lengths = sample_token_lengths(train, model_dir, bool(arguments.get("trust_remote_code")))
        sample_tokens = sum(lengths) / len(lengths) if lengths else None
    return planner.plan_defaults(arguments, set(settings.arguments), device, compute_dtype=precision.compute_dtype,
                                 zero_stage=zero, offload=offload, world_size=world_size, demo=demo,
                                 sample_tokens=sample_tokens)  # fmt: skip


def processes_per_node(plan: Plan) -> int:
    """Local processes the launch starts: 1 without torchrun; with it ROCMFT_NPROC_PER_NODE, else
    NPROC_PER_NODE, else one per visible GPU (at least one)."""
    return local_processes(plan.settings, plan.device, plan.launcher)


def _resume(settings: Settings, arguments: dict[str, Any], output_dir: Path, run_dir: Path,
            world_size: int) -> ResumeChoice:  # fmt: skip
    """ROCMFT_RESUME against the checkpoints in OUTPUT_DIR and the earlier run's record in OUTPUT_DIR/rocmft
    (its train.yaml, and the world size its worker reported in manifest.json; unknown parts are not compared)."""
    current = {**arguments, "world_size": world_size}
    try:
        previous = yaml.safe_load((run_dir / "train.yaml").read_text())
    except (OSError, yaml.YAMLError):
        previous = None
    if not isinstance(previous, dict):
        return choose(settings.rocmft.resume, output_dir, None, current)
    try:
        world = (json.loads((run_dir / "manifest.json").read_text()).get("worker") or {}).get("world_size")
    except (OSError, ValueError):
        world = None
    previous["world_size"] = world if world is not None else world_size  # unknown: not compared
    return choose(settings.rocmft.resume, output_dir, previous, current)


def worker_policy(plan: Plan) -> dict[str, Any]:
    """What the worker needs beyond train.yaml (rocmft/run.json): the forced dtype, fault injection. The JSON
    object of :class:`rocmft.records.RunPolicy` (its one reader is rocmft.records.read_run_policy)."""
    from rocmft.records import RunPolicy

    rocmft = plan.settings.rocmft
    return RunPolicy(
        rocmft_version=__version__,
        precision=plan.precision.as_dict(),
        distributed=rocmft.distributed,
        launcher=plan.launcher,
        fault_nan_at_step=rocmft.fault_nan_at_step,
        fault_kill_in_save_at_step=rocmft.fault_kill_in_save_at_step,
        fault_slow_final_save_s=rocmft.fault_slow_final_save_s,
        loss_spike_factor=rocmft.loss_spike_factor,
        demo=plan.demo,
    ).to_json()


def _check_distributed(settings: Settings, arguments: dict[str, Any]) -> None:
    """Refuse distributed settings that cannot work together (each with the variables involved)."""
    rocmft, explicit = settings.rocmft, settings.explicit_rocmft
    if rocmft.distributed != "deepspeed":
        for name in ("zero_stage", "offload"):
            if name in explicit and not (name == "offload" and rocmft.offload == "none"):
                raise ConfigError(
                    f"ROCMFT_{name.upper()}={getattr(rocmft, name)} has no effect with "
                    f"ROCMFT_DISTRIBUTED={rocmft.distributed}.",
                    "Set ROCMFT_DISTRIBUTED=deepspeed, or remove the variable.",
                )
    if rocmft.offload == "optimizer+params" and rocmft.zero_stage != 3:
        raise ConfigError(
            f"ROCMFT_OFFLOAD=optimizer+params needs ZeRO stage 3 (ROCMFT_ZERO_STAGE={rocmft.zero_stage}): "
            "only stage 3 partitions, and so can offload, the parameters.",
            "Set ROCMFT_ZERO_STAGE=3, or ROCMFT_OFFLOAD=optimizer.",
        )
    if arguments.get("deepspeed") and rocmft.distributed in ("fsdp", "ddp"):
        raise ConfigError(
            f"{settings.source_of('deepspeed')} gives a DeepSpeed config but ROCMFT_DISTRIBUTED={rocmft.distributed}.",
            "Use one strategy: ROCMFT_DISTRIBUTED=deepspeed (rocmft renders the config), or drop DEEPSPEED.",
        )
    if arguments.get("fsdp") and rocmft.distributed == "deepspeed":
        raise ConfigError(
            f"{settings.source_of('fsdp')} asks for FSDP but ROCMFT_DISTRIBUTED=deepspeed; they exclude each other.",
            "Use one strategy: ROCMFT_DISTRIBUTED=fsdp or ROCMFT_DISTRIBUTED=deepspeed.",
        )
    sharded = (rocmft.distributed == "deepspeed" and rocmft.zero_stage == 3) or rocmft.distributed == "fsdp"
    if sharded:
        _check_sharded_quantization(settings, arguments)
    if arguments.get("deepspeed") and rocmft.distributed == "deepspeed":
        raise ConfigError(
            f"{settings.source_of('deepspeed')} gives a DeepSpeed config and ROCMFT_DISTRIBUTED=deepspeed renders one.",
            "Keep one: unset DEEPSPEED to use rocmft's ZeRO settings, or unset ROCMFT_DISTRIBUTED.",
        )


def _check_sharded_quantization(settings: Settings, arguments: dict[str, Any]) -> None:
    """Quantization that cannot be sharded by ZeRO-3 or FSDP, refused before the model loads (LLaMA-Factory
    0.9.5 raises the same only while loading it: model/model_utils/quantization.py, configure_quantization).

    * a checkpoint already quantized after training (GPTQ, AWQ, ...: ``quantization_config`` in its
      config.json): its packed integer weights cannot be partitioned;
    * on-the-fly quantization other than 4-bit bitsandbytes (QUANTIZATION_BIT=8, or the hqq/eetq methods):
      only 4-bit bitsandbytes stores its weights in a float dtype that ZeRO-3/FSDP can shard
      (bnb_4bit_quant_storage, the "fsdp+qlora" path).
    """
    rocmft = settings.rocmft
    strategy = "FSDP (ROCMFT_DISTRIBUTED=fsdp)" if rocmft.distributed == "fsdp" else "ZeRO-3 (ROCMFT_ZERO_STAGE=3)"
    config_path = Path(str(arguments.get("model_name_or_path") or "")).expanduser() / "config.json"
    quantized = None
    if config_path.is_file():
        try:
            quantized = (json.loads(config_path.read_text()).get("quantization_config") or {}).get("quant_method")
        except (OSError, ValueError):
            quantized = None  # the model check reports an unreadable config
    if quantized:
        raise ConfigError(
            f"The model {config_path.parent} is already quantized ({quantized}, quantization_config in its "
            f"config.json), and {strategy} cannot shard its packed weights.",
            "Use ROCMFT_DISTRIBUTED=ddp (or deepspeed with ROCMFT_ZERO_STAGE=2), or the unquantized model with "
            "QUANTIZATION_BIT=4.",
        )
    bits = arguments.get("quantization_bit")
    method = str(arguments.get("quantization_method") or "bnb")
    if bits and (method != "bnb" or int(bits) != 4):
        raise ConfigError(
            f"QUANTIZATION_BIT={bits} with QUANTIZATION_METHOD={method} cannot be combined with {strategy}: only "
            "4-bit bitsandbytes (QLoRA) is shardable.",
            "Use QUANTIZATION_BIT=4 (bitsandbytes), or ROCMFT_DISTRIBUTED=ddp / ROCMFT_ZERO_STAGE=2.",
        )


__all__ = ["RUN_SUBDIR", "Plan", "builtin_templates", "render", "worker_policy"]
