"""Framework monkeypatches: what LLaMA-Factory and transformers do not offer, each written for one pinned version
(pyproject.toml; DESIGN.md, "Pinned stack") and guarded by it (:func:`_applies`).

On the pinned version a patch applies as it always did. On another version it applies only if the function it
wraps is still there, with a warning (rank 0) naming the patch and both versions; without that function it is
left out with a warning and the run goes on as the installed version behaves. That is the safe side for both
patches here: the fp32 policy is verified at train start (rocmft.worker.callbacks: parameters not all float32 stop
the run), and a token count left to transformers costs only the tokens/s figure.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from importlib import metadata

from rocmft.console import warn

# The versions each patch was written for (pyproject.toml's pins).
LLAMAFACTORY = "0.9.5"
TRANSFORMERS = "5.6.0"
PEFT = "0.18.1"
ACCELERATE = "1.11.0"


def _applies(patch: str, package: str, written_for: str, targets: dict[str, object]) -> bool:
    """Whether to apply ``patch``, written for ``package`` ``written_for``, wrapping ``targets`` (name -> the
    object that must have it, e.g. ``{"get_train_args": tuner}``); see the module docstring."""
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        installed = "(not installed)"
    if installed == written_for:
        return True
    missing = [name for name, owner in targets.items() if not hasattr(owner, name)]
    if missing:
        warn(f"{patch} not applied: written for {package} {written_for}, and {package} {installed} has no "
             f"{', '.join(missing)}")  # fmt: skip
        return False
    warn(f"{patch}: written for {package} {written_for}, applied to {package} {installed} (the functions it wraps "
         "are there; if this run misbehaves, pin the written-for version)")  # fmt: skip
    return True


def force_compute_dtype(dtype_name: str) -> None:
    """Make LLaMA-Factory load and train the weights in ``dtype_name`` (used for the fp32 policy).

    LLaMA-Factory 0.9.5 has no training argument for the weights' dtype (DESIGN.md): ``get_train_args``
    sets ``model_args.compute_dtype`` only for bf16/fp16, and its loader calls ``from_pretrained`` with
    ``torch_dtype="auto"``, which transformers 5 resolves from the config, i.e. the checkpoint's own
    dtype — a bf16 checkpoint loads in bf16 whatever the flags say (measured: a LoRA run of a bf16
    checkpoint with bf16 and fp16 off had 26 bf16 base tensors). So two names are wrapped, both bound
    at module level where LLaMA-Factory calls them:

    * ``llamafactory.train.tuner.get_train_args``: set ``model_args.compute_dtype`` after parsing
      (autocast, upcasting and quantization read it);
    * ``llamafactory.model.loader.patch_config``: set ``config.dtype`` so that ``"auto"`` resolves to it.

    The dtypes actually used are verified by the worker's callback at train start, so a future
    LLaMA-Factory that bypasses these cannot make "fp32" silently not fp32.
    """
    import torch
    from llamafactory.model import loader
    from llamafactory.train import tuner

    if not _applies("the fp32 weights patch", "llamafactory", LLAMAFACTORY,
                    {"get_train_args": tuner, "patch_config": loader}):  # fmt: skip
        return
    dtype = getattr(torch, dtype_name)
    parse, patch_config = tuner.get_train_args, loader.patch_config

    def get_train_args_with_dtype(args=None):
        model_args, data_args, training_args, finetuning_args, generating_args = parse(args)
        model_args.compute_dtype = dtype
        return model_args, data_args, training_args, finetuning_args, generating_args

    def patch_config_with_dtype(config, *args, **kwargs):
        patch_config(config, *args, **kwargs)
        config.dtype = dtype

    tuner.get_train_args = get_train_args_with_dtype
    loader.patch_config = patch_config_with_dtype


def count_tokens_under_4d_masks() -> None:
    """Count non-padding tokens right when the attention mask is 4-D (LLaMA-Factory's neat packing under SDPA or
    eager attention: ``prepare_4d_attention_mask`` in llamafactory/data/collator.py).

    transformers 5.6's ``Trainer._track_num_input_tokens`` counts ``attention_mask.sum()`` for
    ``include_num_input_tokens_seen: non_padding``; a 4-D mask holds 0 where attention is allowed and the dtype's
    minimum elsewhere, so that sum is 0 or negative (measured on an H200: ``num_input_tokens_seen`` stayed 0 for a
    whole neat-packed run, and tokens/s read nan). A position is a real token exactly when it may attend to itself,
    so the count is the number of zeros on the mask's diagonal. Other masks are left to transformers.
    """
    import torch
    from transformers import Trainer

    if not _applies("the 4-D mask token count", "transformers", TRANSFORMERS, {"_track_num_input_tokens": Trainer}):
        return
    track = Trainer._track_num_input_tokens

    def track_with_4d_masks(self, inputs):
        mask = inputs.get("attention_mask") if hasattr(inputs, "get") else None
        if self.args.include_num_input_tokens_seen != "non_padding" or mask is None or mask.dim() != 4:
            return track(self, inputs)
        tokens = (mask.diagonal(dim1=-2, dim2=-1) == 0).sum().to(device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += self.accelerator.gather(tokens).sum().item()

    Trainer._track_num_input_tokens = track_with_4d_masks


def step_logs_said_once() -> None:
    """Print each training step's log once: rocmft's step line (rocmft.worker.callbacks), not also the trainer's raw
    ``{'loss': ...}`` dict beside it.

    transformers 5.6 prints every ``logs`` dict on the console: ``ProgressCallback.on_log`` (tqdm's ``write``) or,
    with ``disable_tqdm``, ``PrinterCallback.on_log`` (transformers/trainer_callback.py). A dict with ``loss`` is a
    training step's, which rocmft's line already says (and train.log holds); those two are skipped for it. Every
    other dict (evaluation, the final ``train_runtime`` summary) is printed as before, and the trackers' callbacks
    (TensorBoard, MLflow, W&B), LLaMA-Factory's trainer_log.jsonl and ``state.log_history`` get every dict, as
    they are other callbacks.
    """
    from transformers import trainer_callback

    printers = {"ProgressCallback": trainer_callback, "PrinterCallback": trainer_callback}
    if not _applies("the one step line", "transformers", TRANSFORMERS, printers):
        return
    for name in printers:
        owner = getattr(trainer_callback, name)
        if getattr(owner.on_log, "_rocmft", False):
            continue

        def on_log(self, args, state, control, logs=None, _print=owner.on_log, **kwargs):
            if logs is not None and "loss" in logs:
                return None
            return _print(self, args, state, control, logs=logs, **kwargs)

        on_log._rocmft = True
        owner.on_log = on_log


def deepspeed_accelerator_without_gpu(environ: MutableMapping[str, str]) -> str | None:
    """Name DeepSpeed's accelerator ``cpu`` in ``environ`` (the worker's os.environ) when this process sees no GPU
    and DS_ACCELERATOR is not set; returns what was set (None: nothing).

    DeepSpeed 0.18's ``get_accelerator`` (deepspeed/accelerator/real_accelerator.py), run when transformers and
    accelerate import DeepSpeed, picks ``cuda`` when ``torch.cuda.device_count() > 0 and torch.cuda.is_available()``
    and otherwise ``cpu``, printing "[WARNING] ... Setting accelerator to CPU. If you have GPU or other accelerator,
    we were unable to detect it." — a line every CPU run printed while training started. DS_ACCELERATOR is its
    documented override (read first, no detection, no line). The same test here gives the same accelerator, so a
    GPU run is untouched (its detection and any line it prints are DeepSpeed's as before), and a user's
    DS_ACCELERATOR always wins.
    """
    if "DS_ACCELERATOR" in environ:
        return None
    import torch

    if torch.cuda.device_count() > 0 and torch.cuda.is_available():
        return None
    environ["DS_ACCELERATOR"] = "cpu"
    return "cpu"


def deepspeed_unimported_unless_configured(arguments: dict) -> bool:
    """Keep DeepSpeed out of a run whose training arguments (``arguments``, the rendered train.yaml) name no
    ``deepspeed`` config; returns whether the patch was applied.

    accelerate 1.11's ``extract_model_from_parallel`` (accelerate/utils/other.py), which transformers' Trainer calls
    from its ``__init__`` and when saving, imports DeepSpeed whenever it is installed, only to add
    ``DeepSpeedEngine`` to the wrappers it unwraps. Importing DeepSpeed 0.18 after LLaMA-Factory costs 4.2 CPU-s on
    our CPU machines (measured: ``import deepspeed`` after ``import llamafactory.train.tuner``, 4.20-4.27 s; it
    imports mlflow through its autotuner), paid by every worker before its first step. Without a DeepSpeed config
    the model is never a ``DeepSpeedEngine``, so that module's ``is_deepspeed_available`` answers False there and
    nothing else changes. A run with DeepSpeed is untouched.
    """
    if arguments.get("deepspeed"):
        return False
    from accelerate.utils import other

    if not _applies("the DeepSpeed import skip", "accelerate", ACCELERATE,
                    {"is_deepspeed_available": other, "extract_model_from_parallel": other}):  # fmt: skip
        return False
    other.is_deepspeed_available = lambda: False
    return True


def wandb_unimported_unless_reported(arguments: dict) -> bool:
    """Keep wandb out of a run whose training arguments (``arguments``, the rendered train.yaml) do not name it in
    ``report_to`` (nor ``all``); returns whether the patch was applied. Call it before anything imports trl.

    transformers 5.6's ``is_wandb_available`` (transformers/integrations/integration_utils.py) imports wandb to
    answer, and trl 0.24 asks it when its trainer modules are imported (trl/trainer/base_trainer.py and the DPO,
    KTO, ORPO... trainers: ``if is_wandb_available(): import wandb``), which LLaMA-Factory 0.9.5's
    ``llamafactory.train.tuner`` does for every stage (it imports all workflows). Importing wandb 0.31 costs every
    worker 0.8 s of its start-up (measured: ``python -X importtime``, wandb's cumulative time under
    trl.trainer.base_trainer, 2026-12-05). Where wandb is not in ``report_to``, transformers builds no
    ``WandbCallback``, so nothing reads wandb: the answer False changes only what trl's model card would link to
    (``wandb.run.url``, None without a ``wandb.init``). A run that names wandb (or ``all``) is untouched; other
    trackers' checks (tensorboard, mlflow, ...) only look for their package and are left alone. The answer is set
    where trl binds it: transformers' top level, ``transformers.integrations`` and its ``integration_utils``.
    """
    from rocmft.checks.trackers import report_to_names

    names = report_to_names(arguments.get("report_to"))
    if "wandb" in names or "all" in names:
        return False
    import transformers
    from transformers import integrations
    from transformers.integrations import integration_utils

    if not _applies("the wandb import skip", "transformers", TRANSFORMERS,
                    {"is_wandb_available": integration_utils}):  # fmt: skip
        return False

    def is_wandb_available() -> bool:
        return False

    for owner in (integration_utils, integrations, transformers):
        owner.is_wandb_available = is_wandb_available
    return True


class _ConfigClasses(Sequence):
    """What transformers' ``_LazyAutoMapping.keys()`` returns (the mapping's config classes, in its order), except
    that ``in`` imports only the configuration modules of model types whose config class has the asked class's
    name (see :func:`model_kind_asked_without_importing_every_config`)."""

    def __init__(self, mapping, keys) -> None:
        self._mapping, self._keys = mapping, keys

    def __contains__(self, config_class) -> bool:
        mapping, name = self._mapping, getattr(config_class, "__name__", None)
        if config_class in mapping._extra_content:
            return True
        return any(mapping._load_attr_from_module(model_type, class_name) is config_class
                   for model_type, class_name in mapping._config_mapping.items()
                   if class_name == name and model_type in mapping._model_mapping)  # fmt: skip

    def __getitem__(self, index):
        return self._keys()[index]

    def __len__(self) -> int:
        return len(self._keys())


def model_kind_asked_without_importing_every_config() -> bool:
    """Let LLaMA-Factory ask whether a model is image-text, audio-text or text-to-waveform without importing the
    configuration module of every model type those kinds have; returns whether the patch was applied.

    LLaMA-Factory 0.9.5's ``load_model`` (llamafactory/model/loader.py) picks the Auto class with
    ``type(config) in AutoModelForImageTextToText._model_mapping.keys()`` (then ``AutoModelForSeq2SeqLM``,
    ``AutoModelForTextToWaveform``), and transformers 5.6's ``_LazyAutoMapping.keys`` imports the config class of
    every model type in the mapping to build that list: 210 modules, 0.85-0.99 CPU-s of every worker (measured:
    ``time.process_time`` around the three tests for a Qwen2 config after ``import llamafactory.model.loader``).
    Here ``keys()`` of those three mappings gives a sequence whose ``in`` loads only the config classes named like
    the asked one and compares them by identity, as the list does; the answer is the list's wherever no config
    class of the mapping is an alias under another name (tests/test_train.py checks every class of the pinned
    mappings). Indexing, iteration and ``len`` build the full list as before.
    """
    import transformers
    from transformers.models.auto import auto_factory

    if not _applies("the model kind without every config", "transformers", TRANSFORMERS,
                    {"_load_attr_from_module": auto_factory._LazyAutoMapping,
                     "keys": auto_factory._LazyAutoMapping}):  # fmt: skip
        return False
    for auto in ("AutoModelForImageTextToText", "AutoModelForSeq2SeqLM", "AutoModelForTextToWaveform"):
        mapping = getattr(transformers, auto)._model_mapping
        if "keys" not in vars(mapping):  # not patched yet (calling keys() here would import them all)
            mapping.keys = lambda mapping=mapping, keys=mapping.keys: _ConfigClasses(mapping, keys)
    return True


def resume_optimizer_on_cpu_ranks() -> None:
    """Let a multi-process run on the CPU (gloo: a CPU-only multi-node job, CI's two-node Slurm cluster) resume.

    transformers 5.6's ``Trainer._load_optimizer_and_scheduler`` loads optimizer.pt with ``map_location=
    self.args.device`` when ``world_size > 1``; on the CPU that device is ``cpu:0`` (accelerate 1.11
    ``PartialState.set_device``: ``torch.device("cpu", local_process_index % torch.cpu.device_count())``), and
    torch 2.11 refuses it: "don't know how to restore data location of torch.storage.UntypedStorage (tagged with
    cpu:0)" (reproduced: ``torch.load(f, map_location=torch.device("cpu", 0))``). While that method runs on a CPU
    device, a ``cpu:N`` map_location is read as ``cpu`` — the same memory. GPU runs are untouched.
    """
    import torch
    from transformers import Trainer

    if not _applies("the CPU multi-process resume", "transformers", TRANSFORMERS,
                    {"_load_optimizer_and_scheduler": Trainer}):  # fmt: skip
        return
    load_states, torch_load = Trainer._load_optimizer_and_scheduler, torch.load

    def load_on_cpu(*args, map_location=None, **kwargs):
        if isinstance(map_location, torch.device) and map_location.type == "cpu":
            map_location = "cpu"
        return torch_load(*args, map_location=map_location, **kwargs)

    def load_states_on_cpu_ranks(self, checkpoint):
        if self.args.device.type != "cpu" or self.args.world_size <= 1:
            return load_states(self, checkpoint)
        torch.load = load_on_cpu  # only for this call: the worker is one thread here (before training starts)
        try:
            return load_states(self, checkpoint)
        finally:
            torch.load = torch_load

    Trainer._load_optimizer_and_scheduler = load_states_on_cpu_ranks


def dataloader_workers_ignore_stop_signals() -> None:
    """Keep DataLoader worker processes alive through a scheduler's SIGTERM/SIGINT, so the rank can finish its step.

    torch 2.11's DataLoader workers (``torch.utils.data._utils.worker._worker_loop``) install a C-level SIGTERM
    handler (``_set_worker_signal_handlers``, torch/csrc/DataLoader.cpp) that exits quietly only when the signal
    comes from the parent process and otherwise dies of it. Slurm's ``scancel --signal=TERM`` and preemption
    signal every process of the step (proctrack), so the workers died, and the trainer raised "DataLoader worker
    (pid N) is killed by signal: Terminated" mid-step: no checkpoint. After torch's own handlers are set, the
    workers here ignore SIGTERM and SIGINT; they still end when the trainer shuts them down (a sentinel on their
    index queue) or their rank dies (torch's ManagerWatchdog polls the parent). The workers are forked (Linux's
    default start method up to Python 3.13), so the wrapper set here is theirs. Not version-guarded: it wraps a
    module function that torch's worker loop looks up at call time, and without it the run behaves as before.
    """
    import signal

    from torch.utils.data._utils import signal_handling

    if getattr(signal_handling._set_worker_signal_handlers, "_rocmft", False):
        return
    install = signal_handling._set_worker_signal_handlers

    def install_then_ignore_stops(*args, **kwargs):
        install(*args, **kwargs)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    install_then_ignore_stops._rocmft = True
    signal_handling._set_worker_signal_handlers = install_then_ignore_stops


def packed_varlen_attention() -> None:
    """Neat-packed rows through variable-length attention (rocmft.worker.attention, whose docstring has the why).

    Three names, each written for LLaMA-Factory 0.9.5 / transformers 5.6:

    * transformers' ``AttentionInterface`` / ``AttentionMaskInterface`` get ``rocmft_varlen`` (public API);
    * ``SFTDataCollatorWith4DAttentionMask.__call__`` (llamafactory/data/collator.py): for a model whose attention
      is ``rocmft_varlen``, the 4-D mask is not built and packed batches get the samples' boundaries;
    * ``llamafactory.train.sft.workflow.load_model``: the loaded model's attention is set to ``rocmft_varlen``
      (``set_attn_implementation``) before the workflow builds the collator, which reads it from the config.
    """
    from llamafactory.data import collator
    from llamafactory.train.sft import workflow

    from rocmft.worker import attention

    owner = collator.SFTDataCollatorWith4DAttentionMask
    if not _applies("the packed varlen attention", "llamafactory", LLAMAFACTORY,
                    {"__call__": owner, "load_model": workflow}):  # fmt: skip
        return
    attention.register()
    collate, load_model = owner.__call__, workflow.load_model

    def collate_packed(self, features):
        if self.attn_implementation != attention.NAME or not self.neat_packing:
            return collate(self, features)
        self.block_diag_attn = False  # keep the 2-D index mask: no dense 4-D mask
        batch = collate(self, features)
        # batches that are not packed rows (left-padded prompts for generation) keep their 0/1 padding mask, from
        # which transformers' SDPA builds the same mask the 4-D one was
        return attention.pack_kwargs(batch) if attention.is_packed_batch(batch) else batch

    def load_model_with_varlen(*args, **kwargs):
        model = load_model(*args, **kwargs)
        attention.use_on(model)
        return model

    owner.__call__ = collate_packed
    workflow.load_model = load_model_with_varlen


def lora_inputs_uncast_under_autocast() -> None:
    """Under autocast, give LoRA adapters their input as it is instead of an fp32 copy that autocast casts back.

    peft 0.18.1's ``lora.Linear.forward`` casts the input to the adapter's dtype (``_cast_input_dtype``;
    LLaMA-Factory keeps adapters in fp32), and under bf16/fp16 autocast ``lora_A`` casts it back to a *new*
    bf16 tensor, which it saves for backward: two elementwise copies per adapted Linear in forward, two more for
    the gradients in backward, and one saved input per adapter instead of one per input. Both casts are exact
    (bf16 → fp32 → bf16), so skipping them changes no value for plain LoRA (no dropout, no DoRA: those compute on
    the cast input, and keep it): tests/test_packed_attention.py checks the loss and every gradient bit for bit and
    the saved bytes. peft does exactly this for its own bitsandbytes layers
    (``tuners/lora/bnb.py``: ``requires_conversion = not torch.is_autocast_enabled()``), which is why QLoRA ran
    faster than bf16 LoRA (BENCHMARKS.md). Without autocast (DeepSpeed, the fp32 policy) peft's cast is kept.
    """
    import torch
    from peft.tuners.lora import layer

    if getattr(layer.Linear._cast_input_dtype, "_rocmft", False):
        return
    if not _applies("the LoRA input without casts", "peft", PEFT, {"_cast_input_dtype": layer.Linear}):
        return
    cast = layer.Linear._cast_input_dtype

    def cast_unless_autocast(self, x, dtype):
        # plain LoRA only: dropout and DoRA compute on the cast input, so skipping the cast changes their values
        plain = not getattr(self, "lora_variant", None) and all(
            isinstance(self.lora_dropout[name], torch.nn.Identity) for name in self.active_adapters
            if name in self.lora_dropout)  # fmt: skip
        if x is not None and plain and torch.is_autocast_enabled(x.device.type):
            return x
        return cast(self, x, dtype)

    cast_unless_autocast._rocmft = True
    layer.Linear._cast_input_dtype = cast_unless_autocast


def lora_product_in_the_gemm() -> None:
    """Run plain LoRA Linears under autocast as :class:`rocmft.worker.lora_kernel.LoraLinear`: the adapter's product
    added by the matrix products' epilogues instead of peft's separate write, scale and add passes (that module's
    docstring has the why and the measurement). Wraps peft 0.18.1's ``lora.Linear.forward``; every case it does not
    cover (dropout, DoRA, QLoRA's bitsandbytes bases, ZeRO-3, no autocast) goes to peft's own forward."""
    from peft.tuners.lora import layer

    from rocmft.worker import lora_kernel

    if getattr(layer.Linear.forward, "_rocmft", False):
        return
    if not _applies("the LoRA product in the GEMM", "peft", PEFT, {"forward": layer.Linear}):
        return
    layer.Linear.forward = lora_kernel.forward_with(layer.Linear.forward)


def train_mode_set_once() -> None:
    """Skip the per-micro-step ``model.train()`` walk when every module of the model is already training.

    transformers 5.6's ``Trainer.training_step`` calls ``model.train()`` on every micro-step. ``nn.Module.train``
    sets ``training`` on every submodule through ``Module.__setattr__``: 2,333 modules for the 7B (Qwen2) shape with
    LoRA on its seven Linears, 6.1 ms a call on the 2-CPU build machine (``bench/host_cost.py``), while the GPU waits
    (a step starts after the trainer read the last one's loss). Unsloth 2026.10.9 skips that walk too
    (``unsloth/models/_utils.py``, ``_unsloth_train_if_needed``), trusting the root module's flag. Here every
    module's own flag is read instead (0.14 ms for those 2,333): the walk is skipped only when each module listed at
    the last full walk already trains, so an evaluation that put the root, the model inside a DDP wrapper or any one
    submodule in eval mode gets the full walk back. Wraps ``PreTrainedModel.train``; a model whose tree holds a
    class with a ``train`` of its own (other than ``PreTrainedModel``'s), or that asked for hub kernels
    (``use_kernels``: its ``train`` kernelizes), always gets the full walk. A module registered into the tree after a
    walk (``layer.mlp = loaded``: it may be in eval mode, as ``from_pretrained`` leaves one) brings the full walk
    back, through rocmft.worker.params' registration hooks.
    """
    import weakref

    import torch
    from transformers import modeling_utils

    from rocmft.worker import params

    owner = modeling_utils.PreTrainedModel
    if getattr(owner.train, "_rocmft", False):
        return
    if not _applies("the train mode set once", "transformers", TRANSFORMERS, {"train": owner}):
        return
    train, listed = owner.train, weakref.WeakKeyDictionary()

    def train_unless_training(self, mode: bool = True):
        try:
            seen = listed.get(self)  # (params.changes() when listed, the modules under self) or None
        except TypeError:  # a class with __eq__ and no __hash__, which torch's train never hashes
            return train(self, mode)
        # ``mode is True``, not any true value: torch's train refuses a mode that is not a bool (ValueError)
        if (mode is True and seen is not None and seen[0] == params.changes() and self.training
                and not getattr(self, "use_kernels", False) and all(m.training for m in seen[1])):  # fmt: skip
            return self
        out = train(self, mode)
        modules = tuple(self.modules())
        # not self itself: a value that holds its key keeps it alive (every model once trained stayed in memory)
        listed[self] = (params.track(modules), modules[1:]) if all(type(m).train in plain for m in modules) else None
        return out

    plain = {torch.nn.Module.train, train, train_unless_training}
    train_unless_training._rocmft = True
    owner.train = train_unless_training


def gradients_found_without_walking() -> None:
    """Clip and zero the trained model's gradients through :mod:`rocmft.worker.params` (its docstring has the why and
    the measurement) instead of walking its module tree at every optimizer step.

    Wraps transformers 5.6's ``Trainer._clip_grad_norm`` (``accelerator.clip_grad_norm_(model.parameters(), ...)``):
    for one process and DDP (accelerate's ``DistributedType.NO``/``MULTI_GPU``, where accelerate unscales and hands
    the parameters to torch's ``clip_grad_norm_``) the same call gets the listed parameters that hold a gradient;
    DeepSpeed, FSDP, every other kind and SageMaker model parallel under fp16 keep transformers' call. And
    ``torch.nn.Module.zero_grad``: for a model clipped that way, with the default ``set_to_none``, the listed
    parameters' gradients are set to None, as torch's loop over ``parameters()`` does; other modules,
    ``set_to_none=False`` and DataParallel replicas get torch's own.
    """
    import torch
    from accelerate.utils import DistributedType
    from transformers import Trainer, trainer

    from rocmft.worker import params

    if getattr(Trainer._clip_grad_norm, "_rocmft", False):
        return
    if not _applies("the gradients found without walking", "transformers", TRANSFORMERS,
                    {"_clip_grad_norm": Trainer}):  # fmt: skip
        return
    clip, zero_grad = Trainer._clip_grad_norm, torch.nn.Module.zero_grad
    plain = (DistributedType.NO, DistributedType.MULTI_GPU)

    def clip_listed(self, model):
        if self.accelerator.distributed_type not in plain or self.is_fsdp_enabled or self.is_deepspeed_enabled:
            return clip(self, model)
        if self.args.fp16 and trainer.is_sagemaker_mp_enabled():  # transformers clips the optimizer's fp32 master
            return clip(self, model)  # gradients there (its clip_master_grads), not the model's
        return self.accelerator.clip_grad_norm_(params.with_grad(model), self.args.max_grad_norm)

    def zero_grad_listed(self, set_to_none: bool = True) -> None:
        if not set_to_none or getattr(self, "_is_replica", False) or not params.is_listed(self):
            return zero_grad(self, set_to_none)
        for param in params.listed(self):
            if param.grad is not None:
                param.grad = None
        return None

    clip_listed._rocmft = zero_grad_listed._rocmft = True
    Trainer._clip_grad_norm = clip_listed
    torch.nn.Module.zero_grad = zero_grad_listed
