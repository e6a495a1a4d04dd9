"""Distributed settings: the strategy's settings that cannot work together, quantization that cannot be sharded,
a user's own DeepSpeed config against the trainer, and the job's shape (NNODES, NODE_RANK, WORLD_SIZE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmft.config.provenance import environment_variable, origin
from rocmft.container import mount
from rocmft.errors import ConfigError
from rocmft.facts.scheduler import job_layout
from rocmft.nesting import loads_json
from rocmft.render import Plan, Rendered
from rocmft.validate.rules import Inputs, independent, rule
from rocmft.validate.rules.common import named
from rocmft.values import truthy

# ds_config keys transformers fills when they are "auto" (transformers.integrations.deepspeed,
# HfTrainerDeepSpeedConfig.trainer_config_process/_finalize); "auto" anywhere else reaches DeepSpeed as a string.
AUTO_FILLED = {
    "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.total_num_steps",
    "scheduler.params.warmup_num_steps", "fp16.enabled", "bf16.enabled", "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
}  # fmt: skip


@rule("inputs", 20)
def distributed(run: Inputs) -> None:
    """Refuse distributed settings that cannot work together (each with the variables involved): ZeRO settings
    without ROCMFT_DISTRIBUTED=deepspeed, parameter offload below ZeRO-3, a DEEPSPEED file with fsdp/ddp, FSDP
    arguments with deepspeed. Each is reported when present (an offload already refused for the strategy is not
    also refused for its stage).

    Raises:
        ConfigError: naming the variables.
    """
    settings, arguments = run.settings, run.arguments
    rocmft, explicit = settings.rocmft, settings.explicit_rocmft
    refused: set[str] = set()
    if rocmft.distributed != "deepspeed":
        for name in ("zero_stage", "offload"):
            if name in explicit and not (name == "offload" and rocmft.offload == "none"):
                refused.add(name)
                with independent():
                    raise ConfigError(
                        f"{settings.knob(name)} has no effect with {settings.knob('distributed')}: only DeepSpeed "
                        "has ZeRO stages and offload.",
                        f"Set ROCMFT_DISTRIBUTED=deepspeed to use ROCMFT_{name.upper()}, or remove "
                        f"ROCMFT_{name.upper()}.",
                    )
    if rocmft.offload == "optimizer+params" and rocmft.zero_stage != 3 and "offload" not in refused:
        with independent():
            raise ConfigError(
                f"{settings.knob('offload')} needs ZeRO stage 3, and {settings.knob('zero_stage')}: only stage 3 "
                "partitions, and so can offload, the parameters.",
                "Set ROCMFT_ZERO_STAGE=3 (or ROCMFT_OFFLOAD=optimizer to offload the optimizer state only).",
            )
    if arguments.get("deepspeed") and rocmft.distributed in ("fsdp", "ddp"):
        with independent():
            raise ConfigError(
                f"{named(run, 'deepspeed')} gives a DeepSpeed config but {settings.knob('distributed')}.",
                f"Remove DEEPSPEED ({origin('deepspeed', run.sources.get('deepspeed'))}) to train with "
                f"{rocmft.distributed}; for DeepSpeed, ROCMFT_DISTRIBUTED=deepspeed renders the config.",
            )
    if arguments.get("fsdp") and rocmft.distributed == "deepspeed":
        raise ConfigError(
            f"{named(run, 'fsdp')} asks for FSDP but {settings.knob('distributed')}; they exclude each other.",
            f"Remove FSDP ({origin('fsdp', run.sources.get('fsdp'))}) and set ROCMFT_DISTRIBUTED=fsdp for FSDP "
            "(rocmft renders its settings).",
        )


@rule("inputs", 30)
def sharded_quantization(run: Inputs) -> None:
    """With ZeRO-3 or FSDP, quantization that cannot be sharded, refused before the model loads (LLaMA-Factory
    0.9.5 raises the same only while loading it: model/model_utils/quantization.py, configure_quantization).

    * a checkpoint already quantized after training (GPTQ, AWQ, ...: ``quantization_config`` in its
      config.json): its packed integer weights cannot be partitioned;
    * on-the-fly quantization other than 4-bit bitsandbytes (QUANTIZATION_BIT=8, or the hqq/eetq methods):
      only 4-bit bitsandbytes stores its weights in a float dtype that ZeRO-3/FSDP can shard
      (bnb_4bit_quant_storage, the "fsdp+qlora" path).

    Raises:
        ConfigError: naming the model or QUANTIZATION_BIT/METHOD and the strategy.
    """
    rocmft, arguments = run.settings.rocmft, run.arguments
    sharded = (rocmft.distributed == "deepspeed" and rocmft.zero_stage == 3) or rocmft.distributed == "fsdp"
    if not sharded:
        return
    strategy = (f"FSDP ({run.settings.knob('distributed')})" if rocmft.distributed == "fsdp" else
                f"ZeRO-3 ({run.settings.knob('distributed')}, {run.settings.knob('zero_stage')})")  # fmt: skip
    config_path = run.model.config_path
    quantized = run.model.quantization_method() if config_path.is_file() else None  # unreadable: the model check
    # single-shot: quantizing on the fly a model already quantized is moot, so the first refusal is the one
    if quantized:
        raise ConfigError(
            f"The model {named(run, 'model_name_or_path')} is already quantized ({quantized}, quantization_config "
            f"in {config_path}), and {strategy} cannot shard its packed weights.",
            "Set ROCMFT_DISTRIBUTED=ddp: each GPU then holds the whole quantized model, which needs no sharding.",
        )
    bits = arguments.get("quantization_bit")
    method = str(arguments.get("quantization_method") or "bnb")
    if bits and (method != "bnb" or int(bits) != 4):
        raise ConfigError(
            f"{named(run, 'quantization_bit')} with {named(run, 'quantization_method', 'bnb')} cannot be combined "
            f"with {strategy}: only 4-bit bitsandbytes (QLoRA) is shardable.",
            "Set QUANTIZATION_BIT=4 with QUANTIZATION_METHOD=bnb (QLoRA), which ZeRO-3 and FSDP can shard.",
        )


@rule("inputs", 40)
def one_deepspeed_config(run: Inputs) -> None:
    """A DEEPSPEED file and ROCMFT_DISTRIBUTED=deepspeed (which renders one) exclude each other.

    Raises:
        ConfigError: naming both.
    """
    settings = run.settings
    if run.arguments.get("deepspeed") and settings.rocmft.distributed == "deepspeed":
        raise ConfigError(
            f"{named(run, 'deepspeed')} gives a DeepSpeed config and {settings.knob('distributed')} renders one.",
            f"Remove DEEPSPEED ({origin('deepspeed', run.sources.get('deepspeed'))}): rocmft renders the ZeRO "
            "config from ROCMFT_ZERO_STAGE and ROCMFT_OFFLOAD.",
        )


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _autos(tree: Any, prefix: str = "") -> list[str]:
    if isinstance(tree, dict):
        return [p for key, value in tree.items() for p in _autos(value, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if tree == "auto" else []


@rule("rendered", 30)
def user_ds_config(run: Rendered) -> list[str]:
    """Check a DeepSpeed config the user gave (DEEPSPEED=path) against the trainer arguments.

    Rules: ``train_batch_size`` = micro-batch × accumulation × world size (DeepSpeed's own identity);
    offload settings DeepSpeed can honour (:func:`ds_offload`);
    literals that transformers would compare (batch, accumulation, clipping, learning rate, warmup, fp16/bf16)
    must equal the trainer's values, every mismatched pair listed; ``"auto"`` only in keys transformers fills
    (:data:`AUTO_FILLED`). Returns nothing. Once the file reads as a JSON object, the three (literals, offload,
    "auto") are checked on their own and each that fails is reported.

    Raises:
        ConfigError: the file is missing or not JSON, or a rule fails (message lists every offending key).
    """
    if not (run.arguments.get("deepspeed") and run.ds_config is None):
        return []
    arguments, world_size, source = run.arguments, run.world_size, run.sources.get("deepspeed", "DEEPSPEED")
    path = Path(str(arguments["deepspeed"])).expanduser()
    try:
        ds = loads_json(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"DEEPSPEED={path} ({source}) cannot be read as JSON: {err}.",
                          "Point DEEPSPEED at a DeepSpeed JSON config, or use ROCMFT_DISTRIBUTED=deepspeed "
                          "(rocmft renders one from the same settings as the trainer).") from err  # fmt: skip
    zero = ds.get("zero_optimization", {}) if isinstance(ds, dict) else None
    if not isinstance(ds, dict) or not isinstance(zero, dict):
        what = "the file" if not isinstance(ds, dict) else "its zero_optimization"
        found = type(ds if not isinstance(ds, dict) else zero).__name__
        raise ConfigError(f"DEEPSPEED={path} ({source}): {what} is a JSON {found}, where DeepSpeed reads an object.",
                          "Point DEEPSPEED at a DeepSpeed JSON config (an object of its keys), or use "
                          "ROCMFT_DISTRIBUTED=deepspeed.")  # fmt: skip
    micro = int(arguments.get("per_device_train_batch_size") or 8)
    accumulation = int(arguments.get("gradient_accumulation_steps") or 1)

    def trainer(name: str, default: Any) -> str:
        return named(run, name, default)

    batch = (f"micro-batch {micro} ({trainer('per_device_train_batch_size', 8)}) x accumulation {accumulation} "
             f"({trainer('gradient_accumulation_steps', 1)}) x world size {world_size}")  # fmt: skip
    expected = {
        "train_micro_batch_size_per_gpu": (micro, trainer("per_device_train_batch_size", 8)),
        "gradient_accumulation_steps": (accumulation, trainer("gradient_accumulation_steps", 1)),
        "train_batch_size": (micro * accumulation * world_size, f"{micro * accumulation * world_size} = {batch}"),
        "gradient_clipping": (float(arguments.get("max_grad_norm", 1.0)), trainer("max_grad_norm", 1.0)),
        "optimizer.params.lr": (float(arguments.get("learning_rate", 5e-5)), trainer("learning_rate", 5e-5)),
        "scheduler.params.warmup_max_lr": (float(arguments.get("learning_rate", 5e-5)), trainer("learning_rate", 5e-5)),
        "fp16.enabled": (bool(arguments.get("fp16")), trainer("fp16", False)),
        "bf16.enabled": (bool(arguments.get("bf16")), trainer("bf16", False)),
    }  # fmt: skip
    mismatched = scheduler_steps(run, ds)
    for key, (want, name) in expected.items():
        have = _get(ds, key)
        if have is None or have == "auto":
            continue
        if isinstance(want, bool) and isinstance(have, str):
            have = truthy(have)
        if have != want:
            mismatched.append(f"{key}={have!r} vs {name}")
    if mismatched:
        with independent():
            raise ConfigError(
                f"{named(run, 'deepspeed')} contradicts the trainer: " + "; ".join(mismatched) + ".",
                f'Set those keys to "auto" in {path} (transformers fills them from the trainer arguments).',
            )
    with independent():
        ds_offload(ds, path)
    unfilled = [key for key in _autos(ds) if key not in AUTO_FILLED]
    if unfilled:
        raise ConfigError(
            f'DEEPSPEED={path} leaves "auto" in keys nothing fills: {", ".join(unfilled)}; DeepSpeed would get '
            'the string "auto".',
            f'Give them values (only these may be "auto": {", ".join(sorted(AUTO_FILLED))}).',
        )
    return []


def _number(value: Any) -> float | None:
    try:
        return None if isinstance(value, bool) or value is None else float(value)
    except (TypeError, ValueError):
        return None


def scheduler_steps(run: Rendered, ds: dict[str, Any]) -> list[str]:
    """The step counts of a user's ds_config scheduler (WarmupLR, WarmupDecayLR, ...: ``scheduler.params``) against
    the trainer's, as transformers compares them, but only once the model is loaded
    (``HfTrainerDeepSpeedConfig.trainer_config_finalize`` fills ``"auto"`` and compares literals):
    ``warmup_num_steps`` against ``get_warmup_steps`` (WARMUP_STEPS, or ceil(WARMUP_RATIO × total steps), else 0)
    and ``total_num_steps`` against the run's total steps (MAX_STEPS, else computed from the data and the epochs:
    a literal can only match by chance). huggingface/transformers#29348: the trainer refuses the run after the
    model loaded; hendrycks/apps#9: a warmup in the ds_config and another in the script. Returns the mismatched
    pairs, as :func:`user_ds_config` lists them."""
    arguments, found = run.arguments, []
    warmup = _get(ds, "scheduler.params.warmup_num_steps")
    if warmup is not None and warmup != "auto":
        steps, ratio = _number(arguments.get("warmup_steps")) or 0.0, _number(arguments.get("warmup_ratio")) or 0.0
        if ratio > 0 or 0 < steps < 1:  # transformers 5 reads a warmup_steps below 1 as a ratio too
            name = named(run, "warmup_ratio") if ratio > 0 else named(run, "warmup_steps")
            found.append(f"scheduler.params.warmup_num_steps={warmup!r} vs {name}, a ratio transformers turns into "
                         "ceil(ratio x the run's total steps)")  # fmt: skip
        elif _number(warmup) != (int(steps) if steps >= 1 else 0):
            found.append(f"scheduler.params.warmup_num_steps={warmup!r} vs {named(run, 'warmup_steps', 0)}")
    total = _get(ds, "scheduler.params.total_num_steps")
    if total is not None and total != "auto":
        max_steps = _number(arguments.get("max_steps")) or 0.0
        if max_steps <= 0:
            found.append(f"scheduler.params.total_num_steps={total!r} vs the run's total steps, which transformers "
                         f"computes from the data and {named(run, 'num_train_epochs', 3.0)} ("
                         f"{named(run, 'max_steps')})")  # fmt: skip
        elif _number(total) != max_steps:
            found.append(f"scheduler.params.total_num_steps={total!r} vs {named(run, 'max_steps')}")
    return found


def ds_offload(ds: dict[str, Any], path: Path) -> None:
    """Offload settings of a user's ds_config that DeepSpeed cannot honour (DeepSpeed's config docs,
    "ZeRO optimizations"): ``offload_param`` exists only in ZeRO stage 3 (lower stages keep whole parameters
    on every GPU: deepspeed/runtime/engine.py:1841 hands stages 1-2 only ``offload_optimizer``) and
    ``offload_optimizer`` needs stage 1 or more (stage 0 builds no ZeRO optimizer: engine.py:1436); ``device: nvme``
    needs stage 3 (stages 1-2 read it as CPU offload: deepspeed/runtime/zero/stage_1_and_2.py:176-177) and
    ``nvme_path``, a folder that exists (DeepSpeed's AIO swapper writes its swap files there and fails at the first
    swap otherwise).

    Raises:
        ConfigError: naming the file, the keys and the stage.
    """
    zero = ds.get("zero_optimization") or {}
    try:
        stage = int(zero.get("stage", 0))
    except (TypeError, ValueError):
        return
    problems = []
    for key, lowest in (("offload_param", 3), ("offload_optimizer", 1)):
        block = zero.get(key)
        if not isinstance(block, dict) or str(block.get("device", "none")).lower() in ("none", ""):
            continue
        if stage < lowest:
            problems.append(f"zero_optimization.{key} (device {block.get('device')}) needs ZeRO stage {lowest}, "
                            f"the file has stage {stage}")  # fmt: skip
        if str(block.get("device")).lower() == "nvme":
            if key == "offload_optimizer" and 1 <= stage < 3:  # stage_1_and_2.py:176-177: any device is CPU
                problems.append(f"zero_optimization.offload_optimizer.device is nvme at stage {stage}, where "
                                "DeepSpeed keeps the optimizer state in CPU memory (only stage 3 swaps to "
                                "NVMe)")  # fmt: skip
            nvme = block.get("nvme_path")
            if not nvme:
                problems.append(f"zero_optimization.{key}.device is nvme but there is no nvme_path")
            elif not Path(str(nvme)).is_dir():
                problems.append(f"zero_optimization.{key}.nvme_path={nvme} is not a folder here")
    if problems:
        raise ConfigError(
            f"DEEPSPEED={path}: " + "; ".join(problems) + ".",
            "Use ZeRO stage 3 for parameter offload (ROCMFT_DISTRIBUTED=deepspeed with ROCMFT_ZERO_STAGE=3 and "
            "ROCMFT_OFFLOAD=optimizer+params renders it), or remove the offload block; for nvme, set nvme_path to "
            f"a folder on a fast local disk mounted into the container ({mount('/mnt/nvme/rocmft', '/nvme')}).",
        )


@rule("launch", 10)
def world_size(plan: Plan) -> None:
    """Refuse a job shape that cannot start: a hand-set WORLD_SIZE that disagrees with NNODES × processes per node
    (torchrun would wait forever for ranks that never come), or a multi-node run of one process per node without
    torchrun. The scheduler's own layout (rocmft.facts.scheduler) is checked where it is read.

    Raises:
        ConfigError: naming the variables and their values.
    """
    environ = plan.settings.environ
    layout = plan.layout or job_layout(environ)
    # single-shot: WORLD_SIZE is checked against the processes per node of a torchrun launch, which the first
    # refusal's fix changes
    if plan.launcher == "task":
        return  # the scheduler started every rank: its layout is the job
    nodes, per_node = plan.job.nnodes, plan.job.local_processes
    if nodes > 1 and plan.launcher != "torchrun":
        where = ", ".join(f"{k} from {v}" for k, v in layout.sources.items() if k in ("nnodes", "node_rank"))
        raise ConfigError(f"This job has {nodes} nodes ({where}), which needs a torchrun launch on each, but this "
                          "run is one process.", "Set ROCMFT_DISTRIBUTED=ddp, deepspeed or fsdp for a multi-node "
                          "run.")  # fmt: skip
    # the training operator v1 sets WORLD_SIZE to the pods (rocmft.facts.scheduler reads it as the node count)
    given = environ.get("WORLD_SIZE", "").strip() if layout.engine != "kubernetes" else ""
    if given and given != str(nodes * per_node):
        shape = ", ".join(f"{k} from {v}" for k, v in layout.sources.items() if k in ("nnodes", "nproc_per_node"))
        per_node_from = (plan.settings.knob("nproc_per_node") if "nproc_per_node" in plan.settings.explicit_rocmft
                         else environment_variable("NPROC_PER_NODE", environ) if environ.get("NPROC_PER_NODE")
                         else f"one per visible GPU, {plan.device.count}")  # fmt: skip
        raise ConfigError(
            f"{environment_variable('WORLD_SIZE', environ)} disagrees with NNODES={nodes} "
            f"({shape or 'not set: one node'}) x {per_node} processes per node ({per_node_from}) = {nodes * per_node}.",
            "Unset WORLD_SIZE: torchrun sets it for every rank from NNODES and the processes per node.",
        )
