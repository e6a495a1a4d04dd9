"""Checks that need no GPU: the data sets, the model, the output folder and the disk.

Each function's docstring says what it measures and where its thresholds come from.
"""

from __future__ import annotations

import os
import socket
import statistics
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rocmft.checks import FAIL, PASS, SKIP, WARN, Outcome, check
from rocmft.container import AS_YOU, mount
from rocmft.facts.modeldir import TOKENIZER_FILES, ModelDir, looks_like_path
from rocmft.fsutil import folder_fix, write_error
from rocmft.render.datasets import available_names, record_problem, sample_records, sample_token_lengths
from rocmft.values import truthy

# Share of samples longer than cutoff_len above which the length check warns: LLaMA-Factory truncates
# them silently, so the model never sees their ends (responses first). 5% is a judgement call: a few
# outliers are normal, a twentieth of the data losing its answers is not.
TRUNCATED_WARN_SHARE = 0.05
LENGTH_SAMPLE = 500  # records per data set tokenized for the length distribution (~1 s with a fast tokenizer)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def allowed_cpus(environ) -> tuple[int, str]:
    """The CPUs this process may use and where the number comes from: its affinity (os.sched_getaffinity: a
    container's cpuset, Slurm's task binding), and under Slurm ``SLURM_CPUS_PER_TASK`` (srun's --cpus-per-task, which
    deploy/slurm/train.sbatch passes: the allocation's CPUs per task) when smaller, since a cluster without task
    binding (task/none) leaves the whole node in the affinity."""
    count = len(os.sched_getaffinity(0))
    source = "this process's CPU affinity"
    given = str(environ.get("SLURM_CPUS_PER_TASK") or "")
    if given.isdigit() and 0 < int(given) < count:
        count, source = int(given), "SLURM_CPUS_PER_TASK, Slurm's CPUs per task"
    return count, source


# ---------------------------------------------------------------------------------------------------------
@check("cpus", "CPUs for the processes, threads and loader workers", timeout_s=10)
def cpus(subject) -> Outcome:
    """The CPUs this task may use (:func:`allowed_cpus`) against what the launch runs on them: per local process
    (torchrun's processes on this node; one for a single process or a scheduler's task, which has its own CPUs) its
    threads (OMP_NUM_THREADS, else 1: torchrun's own default for several processes, torch.distributed.run) plus its
    data-loader workers (``dataloader_num_workers``, one process each). More than the CPUs warns: they take turns
    on the cores and the GPUs wait for batches. A site's CPUs per node differ from the hardware's (Frontier and LUMI-G
    reserve 8 of 64 cores: docs/clusters.md, "CPUs per task"), which is why train.sbatch takes the allocation's."""
    plan = subject.plan
    environ = plan.settings.environ
    count, source = subject.probes.get("cpus_allowed", lambda: allowed_cpus(environ))
    processes = plan.job.local_processes  # 1 without torchrun
    threads_text = str(environ.get("OMP_NUM_THREADS") or "1")
    threads = int(threads_text) if threads_text.isdigit() and int(threads_text) > 0 else 1
    workers = int(plan.arguments.get("dataloader_num_workers") or 0)
    need = processes * (threads + workers)
    value = f"{count} CPU(s), need {need}"
    detail = (f"{processes} process(es) x ({threads} thread(s), OMP_NUM_THREADS, + {workers} loader worker(s), "
              f"DATALOADER_NUM_WORKERS) on {count} CPU(s) ({source})")  # fmt: skip
    if need <= count:
        return Outcome(PASS, value, detail)
    return Outcome(WARN, value, f"More work than CPUs: {detail}; they take turns and the GPUs wait for data.",
                   "Give the task more CPUs (Slurm: --cpus-per-task, or --exclusive for the whole node; Docker: "
                   "--cpus/--cpuset-cpus), or lower OMP_NUM_THREADS or DATALOADER_NUM_WORKERS.",
                   {"cpus": count, "need": need})  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
@check("output", "output folder writable", timeout_s=15)
def output_writable(subject) -> Outcome:
    """OUTPUT_DIR can be created and written by the running user (a test file is written and removed)."""
    target = subject.plan.output_dir
    if error := write_error(target):
        if fix := folder_fix("OUTPUT_DIR", error):  # a file, a device or a link to nothing is in the way
            return Outcome(
                FAIL,
                error,
                f"OUTPUT_DIR {target} cannot be a folder ({subject.plan.sources.get('output_dir')}).",
                fix,
            )
        uid, gid = os.getuid(), os.getgid()
        return Outcome(
            FAIL, error,
            f"OUTPUT_DIR {target} is not writable by uid {uid} gid {gid} ({subject.plan.sources.get('output_dir')}).",
            f"Run as the owner of the mounted folder: {AS_YOU}; mount it read-write: "
            f"{mount('./saves', '/saves')}; or set OUTPUT_DIR to a writable folder.",
        )  # fmt: skip
    if _inside_container_layer(target):
        return Outcome(
            WARN, "writable, not persistent",
            f"OUTPUT_DIR {target} is inside the container's own file system: everything written there is lost "
            "when the container is removed.",
            "Write under a mounted volume: compose mounts ./saves at /saves, where OUTPUT_DIR goes when unset "
            "(saves/<run>); with `docker run`, add `-v \"$PWD/saves:/saves\"` (or set OUTPUT_DIR under another "
            "mounted volume).",
        )  # fmt: skip
    return Outcome(PASS, "writable", f"{target}")


def _inside_container_layer(path: Path) -> bool:
    """In a rocmft image (its build record exists), whether ``path`` is on the container's root file system
    rather than a volume (same device number as ``/``)."""
    from rocmft.facts.image import BUILD_RECORD

    if not BUILD_RECORD.is_file():
        return False
    try:
        return path.stat().st_dev == Path("/").stat().st_dev
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------------
@check("dataset", "data sets found and well-formed", timeout_s=60)
def dataset(subject) -> Outcome:
    """Every data set in DATASET/EVAL_DATASET resolves to a readable file whose records have the columns its
    format needs (LLaMA-Factory's data/README.md), checked on records sampled across each file (first, last and
    evenly in between: rocmft.render.datasets.sample_records), and the first bad one named by its record number."""
    registry = subject.plan.registry
    if not subject.plan.arguments.get("dataset") and not subject.plan.arguments.get("eval_dataset"):
        return Outcome(
            FAIL,
            "no data set",
            "DATASET is not set.",
            "Set DATASET to a name in dataset_info.json or a .json/.jsonl file name.",
        )
    if not registry.source_dir.is_dir() and registry.missing:
        names = ", ".join(repr(n) for n in registry.missing)
        return Outcome(
            FAIL, "folder missing",
            f"data set {names} not found: DATASET_DIR {registry.source_dir} does not exist "
            f"({subject.plan.sources.get('dataset_dir', 'LLaMA-Factory default data/')}).",
            "Mount your data folder (compose: ./data:/data) and set DATASET_DIR to it.",
            data={"missing": list(registry.missing), "folder": str(registry.source_dir)},
        )  # fmt: skip
    problems: list[str] = []
    if registry.info_error:
        problems.append(registry.info_error)
    options = available_names(registry.source_dir)
    for name, why in registry.missing.items():
        import difflib

        close = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
        hint = (
            f" Did you mean {' or '.join(close)}?"
            if close
            else (f" Available: {', '.join(options[:10])}." if options else "")
        )
        problems.append(f"data set {name!r}: {why} in {registry.source_dir}.{hint}")
    counts = {}
    for name, entry in registry.entries.items():
        file_name = entry.get("file_name")
        if not file_name or "hf_hub_url" in entry or "ms_hub_url" in entry or "om_hub_url" in entry:
            counts[name] = "hub"
            continue
        path = Path(file_name)
        files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl")) if path.is_dir() else [path]
        if not files or not files[0].is_file():
            problems.append(f"data set {name!r}: file {path} does not exist.")
            continue
        try:
            sample = sample_records(files[0])
        except (ValueError, OSError) as err:
            problems.append(f"data set {name!r}: {err}")
            continue
        if not sample.records:
            problems.append(f"data set {name!r}: {files[0]} has no records.")
            continue
        problem = record_problem(name, entry, files[0], sample, str(subject.plan.arguments.get("stage") or "sft"))
        if problem:
            problems.append(problem)
        counts[name] = f"{len(sample.records)} of {sample.total}{'' if sample.complete else '+'}"
    if problems:
        return Outcome(
            FAIL, f"{len(problems)} problem(s)", "\n".join(problems),
            "Fix DATASET / DATASET_DIR or the files named; dataset_info.json format: LLaMA-Factory data/README.md.",
            data={"problems": problems, "folder": str(registry.source_dir)},
        )  # fmt: skip
    auto = f"; registered automatically: {', '.join(registry.auto)}" if registry.auto else ""
    summary = ", ".join(f"{n} ({c} checked)" if c != "hub" else f"{n} (hub)" for n, c in counts.items())
    return Outcome(
        PASS, f"{len(counts)} data set(s)", f"{summary} in {registry.source_dir}{auto}", data={"auto": registry.auto}
    )


# ---------------------------------------------------------------------------------------------------------
def _local_model_dir(subject) -> Path | None:
    path = Path(str(subject.plan.arguments.get("model_name_or_path", ""))).expanduser()
    return path if path.is_dir() else None


def _endpoint_reachable(environ, timeout_s: float = 3.0) -> tuple[bool, str]:
    endpoint = environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True, endpoint
    except OSError:
        return False, endpoint


@check("model", "model found", timeout_s=20)
def model(subject) -> Outcome:
    """The model is a local folder with config.json and tokenizer files, or a hub id that is in the local
    cache or downloadable (the hub's host answers within 3 s, unless HF_HUB_OFFLINE=1)."""
    name = str(subject.plan.arguments.get("model_name_or_path") or "")
    if not name:
        return Outcome(
            FAIL, "not set", "MODEL_NAME_OR_PATH is not set.", "Set MODEL_NAME_OR_PATH to a local folder or a hub id."
        )
    local = _local_model_dir(subject)
    if local is not None:
        missing = []
        config = local / "config.json"
        if not config.is_file():
            missing.append("config.json")
        else:
            try:
                ModelDir(local).config_json()
            except ValueError as err:
                return Outcome(
                    FAIL, "bad config.json", f"{config} is not valid JSON: {err}", "Re-download or re-export the model."
                )
        if not ModelDir(local).has_tokenizer():
            missing.append("tokenizer (" + " / ".join(TOKENIZER_FILES) + ")")
        if missing:
            return Outcome(
                FAIL, "incomplete", f"Model folder {local} has no {' and no '.join(missing)}.",
                "Point MODEL_NAME_OR_PATH at a complete Hugging Face model folder (save_pretrained output).",
            )  # fmt: skip
        weights = ModelDir(local).weight_bytes()
        return Outcome(PASS, f"local, {_gib(weights)} of weights", str(local), data={"weights_bytes": weights})
    if looks_like_path(name, nested=True):
        return Outcome(
            FAIL, "no such folder", f"MODEL_NAME_OR_PATH={name} looks like a path but is not a folder here.",
            f"Mount the model folder at that path: {mount('<the model folder on the host>', name, read_only=True)} "
            "(compose.yaml mounts ./models at /models).",
        )  # fmt: skip
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return Outcome(PASS, "hub id, cached", f"{name} is in the local hub cache ({Path(cached).parents[2]}).")
    offline = truthy(subject.plan.settings.environ.get("HF_HUB_OFFLINE", ""))
    if offline:
        return Outcome(
            FAIL, "not cached, offline", f"{name} is not in the hub cache and HF_HUB_OFFLINE is set.",
            "Download it on a machine with network (`hf download " + name + "`) into HF_HOME, or mount a local copy.",
        )  # fmt: skip
    reachable, endpoint = _endpoint_reachable(subject.plan.settings.environ)
    if not reachable:
        return Outcome(
            FAIL, "hub unreachable", f"{name} is not cached and {endpoint} cannot be reached from here.",
            "Mount a local copy and set MODEL_NAME_OR_PATH to it, or pre-fill the cache (HF_HOME) and set "
            "HF_HUB_OFFLINE=1, or give this machine network access.",
        )  # fmt: skip
    return Outcome(PASS, "hub id, will download", f"{name} will be downloaded from {endpoint}.")


# ---------------------------------------------------------------------------------------------------------
def _context_length(model_dir: Path) -> int | None:
    """max_position_embeddings from a local model's config.json (None when absent or unreadable)."""
    return ModelDir(model_dir).max_position_embeddings()


@check("lengths", "sample lengths vs cutoff_len", timeout_s=90, needs=("dataset", "model"))
def lengths(subject) -> Outcome:
    """Token length distribution of up to 500 records per data set (content only, without chat markup) with
    the model's own tokenizer, against cutoff_len. Warns when more than 5% would be truncated, or, when
    cutoff_len is beyond the model's context length (max_position_embeddings, no ROPE_SCALING), when more
    than 5% are longer than that context."""
    local = _local_model_dir(subject)
    if local is None:
        return Outcome(SKIP, "no local tokenizer", "Lengths are measured with a local model's tokenizer only.")
    cutoff = int(subject.plan.arguments.get("cutoff_len", 2048))
    try:
        lengths_all = sample_token_lengths(list(subject.plan.registry.entries.values()), local,
                                           bool(subject.plan.arguments.get("trust_remote_code")),
                                           LENGTH_SAMPLE)  # fmt: skip
    except ValueError as err:
        return Outcome(
            FAIL,
            "tokenizer unreadable",
            f"{err}; training loads the same tokenizer and would fail.",
            f"Put back the tokenizer files that came with the model in {local} (download it again).",
        )
    if not lengths_all:
        return Outcome(SKIP, "no local records", "No local data file to measure.")
    lengths_all.sort()
    p95 = lengths_all[min(len(lengths_all) - 1, int(0.95 * len(lengths_all)))]
    over = sum(n > cutoff for n in lengths_all) / len(lengths_all)
    value = f"p50 {int(statistics.median(lengths_all))}, p95 {p95}, max {lengths_all[-1]} tokens; {over:.1%} > {cutoff}"
    data = {"samples": len(lengths_all), "p50": statistics.median(lengths_all), "p95": p95, "max": lengths_all[-1],
            "over_cutoff_share": over, "cutoff_len": cutoff}  # fmt: skip
    if over > TRUNCATED_WARN_SHARE:
        return Outcome(
            WARN, value, f"{over:.1%} of sampled records are longer than cutoff_len={cutoff} and will be truncated.",
            f"Raise CUTOFF_LEN (p95 is {p95}) if memory allows, or filter the long records.", data=data,
        )  # fmt: skip
    context = _context_length(local) if not subject.plan.arguments.get("rope_scaling") else None
    if context is not None and context < cutoff:
        beyond = sum(n > context for n in lengths_all) / len(lengths_all)
        data.update(context_length=context, over_context_share=beyond)
        if beyond > TRUNCATED_WARN_SHARE:  # rule 25 warns of the setting; this says how much data it touches
            return Outcome(
                WARN, f"{value}; {beyond:.1%} > context {context}",
                f"{beyond:.1%} of sampled records are longer than the model's context length ({context}, "
                f"max_position_embeddings), and cutoff_len={cutoff} lets them through: the model sees positions it "
                "was never trained on.",
                f"Set CUTOFF_LEN={context} (those records are then truncated), filter them, or set ROPE_SCALING.",
                data=data,
            )  # fmt: skip
    return Outcome(PASS, value, f"{len(lengths_all)} records measured with the model's tokenizer.", data=data)


# ---------------------------------------------------------------------------------------------------------
def _param_count(subject) -> tuple[int | None, dict[str, Any]]:
    """Parameters of a local model from its weight files and config.json's dtype (bytes / bytes per param)."""
    local = _local_model_dir(subject)
    if local is None:
        return None, {}
    model = ModelDir(local)
    return model.stored_parameters(), model.config_json()


def _lora_params(config: dict[str, Any], rank: int) -> int:
    """LoRA parameters for all linear layers of a decoder block: rank × (in + out) per projection
    (q, k, v, o, gate, up, down; Hu et al. 2021), summed over the layers. A key that is not a whole number
    (``"hidden_size": "x"`` in a damaged config.json) counts as absent."""

    def number(key: str, default: int) -> int:
        value = config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default

    h = number("hidden_size", 0)
    inter = number("intermediate_size", 4 * h)
    heads = number("num_attention_heads", 1)
    kv = number("num_key_value_heads", heads) * (h // max(heads, 1))
    per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + inter) + (inter + h)
    return rank * per_layer * number("num_hidden_layers", 0)


def disk_estimate(subject) -> dict[str, Any] | None:
    """Bytes the run will write: final weights plus kept checkpoints, from the parameter count.

    Full/freeze: weights in fp32 (LLaMA-Factory upcasts trainable parameters) = 4 B/param, a checkpoint
    adds Adam's two fp32 moments = 12 B/param. LoRA: the adapter in fp32, a checkpoint 3× that. Kept
    checkpoints: SAVE_TOTAL_LIMIT, or 3 when unset (an assumption; unlimited runs may need more), none
    with SAVE_STRATEGY=no. Returns None when the model is not local.
    """
    params, config = _param_count(subject)
    if params is None:
        return None
    args = subject.plan.arguments
    if args.get("finetuning_type", "lora") == "lora":
        adapter = 4 * _lora_params(config, int(args.get("lora_rank", 8)))
        final, per_checkpoint = adapter, 3 * adapter
    else:
        final, per_checkpoint = 4 * params, 12 * params
    kept = 0 if str(args.get("save_strategy", "steps")) == "no" else int(args.get("save_total_limit") or 3)
    total = final + kept * per_checkpoint + 64 * 2**20  # + logs, plots, tokenizer copies
    return {"params": params, "final_bytes": final, "checkpoint_bytes": per_checkpoint,
            "checkpoints_kept": kept, "total_bytes": total}  # fmt: skip


@check("disk", "free disk space", timeout_s=15, needs=("output", "model"))
def disk(subject) -> Outcome:
    """Free space at OUTPUT_DIR (psutil) against :func:`disk_estimate`: fail below the final weights'
    size, warn below the whole estimate."""
    import psutil

    free = psutil.disk_usage(str(subject.plan.output_dir)).free
    estimate = disk_estimate(subject)
    if estimate is None:
        return Outcome(
            PASS, f"{_gib(free)} free", "No estimate: the model is not a local folder.", data={"free_bytes": free}
        )
    value = f"{_gib(free)} free, ~{_gib(estimate['total_bytes'])} needed"
    data = {"free_bytes": free, **estimate}
    if free < estimate["final_bytes"]:
        final = _gib(estimate["final_bytes"])
        return Outcome(FAIL, value, f"Not even the final weights ({final}) fit in {subject.plan.output_dir}.",
                       "Free space or point OUTPUT_DIR at a larger volume.", data=data)  # fmt: skip
    if free < estimate["total_bytes"]:
        each = _gib(estimate["checkpoint_bytes"])
        return Outcome(WARN, value, f"{estimate['checkpoints_kept']} checkpoints of {each} may not fit.",
                       "Set SAVE_TOTAL_LIMIT lower, or free space.", data=data)  # fmt: skip
    return Outcome(
        PASS, value, f"{estimate['params']:,} parameters; {estimate['checkpoints_kept']} checkpoints kept.", data=data
    )


# ---------------------------------------------------------------------------------------------------------
def hf_cache_paths() -> dict[str, str]:
    """The Hugging Face folders this process uses, as huggingface_hub resolves them from the environment
    (``huggingface_hub.constants``: HF_HOME, and HF_HUB_CACHE, which defaults to HF_HOME/hub)."""
    from huggingface_hub import constants

    return {"HF_HOME": constants.HF_HOME, "HF_HUB_CACHE": constants.HF_HUB_CACHE}


@check("hf-cache-locks", "Hugging Face cache on a file system whose locks lock", timeout_s=10)
def hf_cache_locks(subject) -> Outcome:
    """Warns when HF_HOME or the hub cache (HF_HUB_CACHE) lies on NFS, Lustre, GPFS, BeeGFS or CIFS/SMB
    (rocmft.facts.caches.NETWORK_FILESYSTEMS): file locks there do not exclude other processes, so processes that
    download into one cache at once can corrupt it (huggingface/huggingface_hub PR #4228). The file system is the
    mount with the longest mount point containing the resolved path (rocmft.facts.caches.mount_of over
    psutil.disk_partitions(all=True)). Tests inject ``{"hf_paths": ..., "partitions": ...}`` as the probe ``hf_cache``
    (an injected mount table)."""
    from rocmft.facts.caches import mount_of

    probe = subject.probes.known("hf_cache") or {}
    paths = probe.get("hf_paths") or hf_cache_paths()
    mounts = {name: mount_of(path, probe.get("partitions")) for name, path in paths.items()}
    data = {name: {"path": str(paths[name]), "fstype": m and m.fstype, "mountpoint": m and m.mountpoint}
            for name, m in mounts.items()}  # fmt: skip
    shared = [name for name, m in mounts.items() if m is not None and m.network]
    if not shared:
        kinds = ", ".join(f"{name} on {m.fstype}" if m else f"{name}: mount unknown" for name, m in mounts.items())
        return Outcome(PASS, kinds, "File locks work on these file systems.", data=data)
    first = mounts[shared[0]]
    assert first is not None
    return Outcome(
        WARN, f"{shared[0]} on {first.fstype}",
        f"{', '.join(f'{n}={paths[n]}' for n in shared)} lies on {first.fstype} ({first.mountpoint}), where file "
        "locks do not lock (huggingface/huggingface_hub PR #4228): processes or nodes that download into this cache "
        "at once can leave truncated or mixed files.",
        "Point HF_HOME at a node-local folder (e.g. HF_HOME=$TMPDIR/hf; or mount one: "
        f"{mount('/local/disk/hf', '/cache/huggingface')} with HF_HOME=/cache/huggingface), or fill "
        "the cache once from a single process (hf download ...) and run with HF_HUB_OFFLINE=1, so that no process "
        "writes to it during training.",
        data=data,
    )  # fmt: skip
