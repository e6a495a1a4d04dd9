"""GPU checks: device nodes, runtime, gfx target, memory in use, compute, shared memory.

The GPU facts come from :mod:`rocmft.facts.probe` in a child process (a hard HIP error cannot kill the
entrypoint), read once through the run's probe provider (``subject.probes``, rocmft.facts.probes); tests inject
probe data there instead (a fake device is data). What the image was built for comes from its build record
(``image``, read from
/etc/rocmft/build.json; absent outside an image).
"""

from __future__ import annotations

import grp
import os
from pathlib import Path
from typing import Any

from rocmft.checks import FAIL, PASS, SKIP, WARN, Outcome, check
from rocmft.container import GPU_DEVICES, IPC_HOST, render_group
from rocmft.facts.device import ALLREDUCE_MIB, ALLREDUCE_TIMEOUT_S
from rocmft.facts.gfx import (
    OVERRIDE,
    SAFE_OVERRIDES,
    base_target,
    built_targets,
    override_problems,
    override_target,
    safe_override,
)

# Share of a GPU's memory in use before training that suggests a leaked or foreign process (a fresh GPU shows
# well under 1%; ROCm/CUDA contexts of the probe itself are a few hundred MiB).
MEMORY_IN_USE_WARN = 0.10
# kept under its old name for rocmft.checks.node: the consumer cards with a well-known safe override
GFX_OVERRIDES = SAFE_OVERRIDES


def image_record(subject) -> dict[str, Any] | None:
    """The running image's build record (None outside a rocmft image), read once (``image``)."""
    from rocmft.facts.image import build_record

    return subject.probes.get("image", build_record)


def gpu_expected(subject) -> bool:
    """Whether this run must have a GPU: inside a ROCm image, or when a distributed strategy asks for one."""
    record = image_record(subject)
    return bool(record and record.get("arch") not in (None, "cpu"))


def devices_probe(subject) -> dict[str, Any]:
    """The device probe's result: the same child-process probe that told the precision policy about the GPUs
    (rocmft.facts.device.probe_devices_raw), seeded into the probe provider as ``devices``."""
    from rocmft.facts.device import probe_devices_raw

    return subject.probes.get("devices", probe_devices_raw)


# ---------------------------------------------------------------------------------------------------------
@check("gpu-devices", "GPU device nodes accessible", timeout_s=10)
def gpu_devices(subject) -> Outcome:
    """On ROCm images: /dev/kfd and every /dev/dri/renderD* exist and the running user can open them."""
    if not gpu_expected(subject):
        return Outcome(SKIP, "no ROCm image", "Device nodes matter only in a ROCm image.")
    nodes = device_nodes(subject)
    has_kfd = any(n["path"] == "/dev/kfd" for n in nodes)
    renders = [n for n in nodes if n["path"] != "/dev/kfd"]
    groups = ", ".join(_group_name(g) for g in os.getgroups()) or "none"
    if not has_kfd or not renders:
        missing = " and ".join(n for n, ok in (("/dev/kfd", has_kfd), ("/dev/dri/renderD*", bool(renders))) if not ok)
        return Outcome(
            FAIL, "missing", f"{missing} not present in the container: no GPU was passed in.",
            f"Pass the GPUs in: {GPU_DEVICES}.",
        )  # fmt: skip
    denied = [node for node in nodes if not node["access"]]
    if denied:
        detail = ", ".join(f"{node['path']} (group id {node['gid']})" for node in denied)
        gid = denied[-1]["gid"]
        return Outcome(
            FAIL, f"{len(denied)} not accessible",
            f"uid {os.getuid()} (groups: {groups}) cannot open {detail}.",
            f"Add the owning group: {render_group(gid)}.",
        )  # fmt: skip
    return Outcome(PASS, f"kfd + {len(renders)} render nodes", f"groups: {groups}")


def device_nodes(subject) -> list[dict[str, Any]]:
    """/dev/kfd and each /dev/dri/renderD* as ``{"path", "gid", "access"}`` (access: the running user may read
    and write it), measured once (``device_nodes``); tests inject recorded nodes instead."""

    def measure() -> list[dict[str, Any]]:
        renders = sorted(Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else []
        nodes = [p for p in [Path("/dev/kfd"), *renders] if p.exists()]
        return [{"path": str(p), "gid": p.stat().st_gid, "access": os.access(p, os.R_OK | os.W_OK)} for p in nodes]

    return subject.probes.get("device_nodes", measure)


def _group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name}({gid})"
    except KeyError:
        return str(gid)


@check("gpu-runtime", "GPU runtime and count", timeout_s=100)
def gpu_runtime(subject) -> Outcome:
    """torch is the build the image expects (HIP in ROCm images), GPUs are visible, and there are at least as
    many as the processes per node the launch asks for."""
    probe = devices_probe(subject)
    if "error" in probe:
        return Outcome(FAIL, "probe failed", f"The GPU probe failed: {probe['error']}.",
                       "Run `rocmft env` for details; check the driver on the host (`sudo dmesg | grep -i amdgpu`) "
                       f"and that the container has the GPU device nodes: {GPU_DEVICES}.")  # fmt: skip
    record = image_record(subject) or {}
    gpus, visible = probe.get("gpus", []), probe.get("visible", {})
    shown = ", ".join(f"{k}={v}" for k, v in visible.items()) or "no *_VISIBLE_DEVICES set"
    if record.get("torch_hip") and probe.get("backend") not in ("rocm",):
        return Outcome(FAIL, f"torch {probe.get('torch')}", "This ROCm image's torch is not the HIP build.",
                       "Rebuild the image (make image); a CUDA torch has slipped in.")  # fmt: skip
    wanted = subject.plan.job.local_processes
    if not gpus:
        if gpu_expected(subject) or (
            subject.plan.launcher == "torchrun" and subject.plan.settings.rocmft.nproc_per_node
        ):
            return Outcome(
                FAIL, "0 GPUs", f"No GPU is visible ({shown}), but this run needs {wanted}.",
                f"Pass the GPUs in: {GPU_DEVICES}; and check that HIP_VISIBLE_DEVICES leaves some.",
            )  # fmt: skip
        return Outcome(SKIP, "no GPU", "No GPU visible: training runs on the CPU.")
    if wanted > len(gpus):
        return Outcome(
            FAIL, f"{len(gpus)} GPU(s) for {wanted} processes",
            f"The launch asks for {wanted} processes per node but {len(gpus)} GPU(s) are visible ({shown}).",
            f"Set ROCMFT_NPROC_PER_NODE (or NPROC_PER_NODE) to at most {len(gpus)}, or make more GPUs visible.",
        )  # fmt: skip
    names = ", ".join(sorted({g["name"] for g in gpus}))
    return Outcome(PASS, f"{len(gpus)} GPU(s), {wanted} process(es)", f"{probe.get('backend')}: {names} ({shown})")


def real_gpu_targets(subject) -> list[str]:
    """The gfx targets of the container's GPUs as the hardware reports them: the KFD topology's mapped GPUs
    (``kfd_gpus`` under the injected ``node_root``; HSA_OVERRIDE_GFX_VERSION does not change them), else the device
    probe's gcnArchName (which the override does change)."""
    from rocmft.facts import amdgpu

    root = Path(subject.probes.known("node_root", "/"))
    gpus = subject.probes.get("kfd_gpus", lambda: amdgpu.kfd_gpus(root)) or []
    mapped = [g["target"] for g in gpus if g["render"] and (root / g["render"].lstrip("/")).exists()]
    return mapped or [base_target(g["arch"]) for g in devices_probe(subject).get("gpus", [])]


def current_override(subject) -> tuple[str | None, str]:
    """HSA_OVERRIDE_GFX_VERSION as the training will run with it, and who set it: rocmft (ROCMFT_GFX_OVERRIDE=auto,
    in the launch's variables) or the user (the run's environment)."""
    if OVERRIDE in subject.launch_environment:
        return subject.launch_environment[OVERRIDE], "set by ROCMFT_GFX_OVERRIDE=auto"
    return subject.plan.settings.environ.get(OVERRIDE), "set in the environment"


@check("gpu-arch", "GPU gfx targets built for", timeout_s=10, needs=("gpu-runtime",))
def gpu_arch(subject) -> Outcome:
    """Each GPU's gfx target (the KFD topology's, else gcnArchName without its feature flags) is one the image was
    built for (PYTORCH_ROCM_ARCH of the build record), or runs the image's code through HSA_OVERRIDE_GFX_VERSION.

    * HSA_OVERRIDE_GFX_VERSION malformed, of another family than a GPU, on an Instinct GPU naming another target,
      or naming a target the image lacks: **fail**, naming the value (rocmft.facts.gfx.override_problems);
    * set on an Instinct GPU that needs none: **warn**;
    * a GPU run as a family member through the override: **warn** (AMD does not guarantee the results);
    * a GPU the image was not built for: **fail**, naming ROCMFT_GFX_OVERRIDE=auto and the value where one is safe.
    """
    built = built_targets(image_record(subject))
    probe = devices_probe(subject)
    if probe.get("backend") != "rocm" or not built:
        return Outcome(SKIP, probe.get("backend", "?"), "gfx targets apply to ROCm images only.")
    real = sorted(set(real_gpu_targets(subject)))
    value, who = current_override(subject)
    shown, images = ", ".join(real), ", ".join(sorted(built))
    problems = override_problems(value, real, built) if value is not None else []
    fails, warns = [t for k, t in problems if k == "fail"], [t for k, t in problems if k == "warn"]
    safe = safe_override(real, built)
    if fails:
        fix = f"Unset {OVERRIDE}" + (f", or set {OVERRIDE}={safe} (ROCMFT_GFX_OVERRIDE=auto sets it for you)"
                                     if safe else " (the image has code for " + images + ")")  # fmt: skip
        return Outcome(FAIL, shown, f"{'; '.join(fails)} ({who}).", fix + ".")
    foreign = [t for t in real if t not in built]
    if foreign and value is not None and override_target(value) in built:
        note = f"Running {', '.join(foreign)} as {override_target(value)} via {OVERRIDE}={value} ({who})"
        return Outcome(WARN, shown, note + ". AMD does not guarantee correct results on an overridden GPU "
                       "(ROCm/ROCmValidationSuite#556).", "Nothing to do if the checks below pass; an image built "
                       f"for {', '.join(foreign)} (docker/arch/<target>.env) needs no override.")  # fmt: skip
    if not foreign:
        if warns:
            return Outcome(WARN, shown, f"{'; '.join(warns)} ({who}).", f"Unset {OVERRIDE}: the image has {images} "
                           "code.")  # fmt: skip
        return Outcome(PASS, shown, f"the image was built for {images}")
    advice = []
    for target in foreign:
        base, version = SAFE_OVERRIDES.get(target, (None, None))
        if base in built and safe:
            advice.append(f"{target}: set ROCMFT_GFX_OVERRIDE=auto (rocmft then sets {OVERRIDE}={version} and says "
                          f"so) or {OVERRIDE}={version} yourself, to run the image's {base} code")  # fmt: skip
        else:
            advice.append(f"{target}: no safe override; build an image for it (a docker/arch/{target}.env profile)")
    message = f"The image was built for {images}, not {', '.join(foreign)}."
    keep = [g["index"] for g in probe["gpus"] if base_target(g["arch"]) in built]
    if keep and len(keep) < len(probe["gpus"]):  # a node mixing families: the exact value that hides the others
        advice.append(f"or train on the others only: {keep_visible(keep, probe.get('visible') or {})}")
    return Outcome(FAIL, shown, message, "; ".join(advice))


def keep_visible(keep: list[int], visible: dict[str, str]) -> str:
    """The visibility setting that leaves only the probe's GPUs ``keep`` (torch indexes, which count the GPUs the
    current ``visible`` settings leave): HIP_VISIBLE_DEVICES=<those indexes> when none is set, else the one set
    variable with the entries at those positions (HIP indexes what ROCR_VISIBLE_DEVICES leaves, so only one of them
    is changed: rule 44)."""
    names = [n for n in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES") if visible.get(n)]
    if not names:
        return "HIP_VISIBLE_DEVICES=" + ",".join(str(i) for i in keep)
    name = names[0]  # HIP's (or CUDA's) applies last: its entries are what torch's indexes count
    entries = [e.strip() for e in visible[name].split(",")]
    if max(keep) >= len(entries):
        return "HIP_VISIBLE_DEVICES=" + ",".join(str(i) for i in keep) + f" (in place of {name}={visible[name]})"
    return f"{name}=" + ",".join(entries[i] for i in keep) + f" (was {visible[name]})"


@check("gpu-memory", "GPU memory already in use", timeout_s=10, needs=("gpu-runtime",))
def gpu_memory(subject) -> Outcome:
    """Per GPU, memory in use before the model loads above 10% of the total suggests a leaked or foreign process;
    the warning names the holders (rocmft.facts.amdgpu.gpu_holders: processes of this container with a GPU device
    open, and on ROCm the KFD's per-process VRAM, which also shows processes of other containers and the host)."""
    from rocmft.facts.device import memory_budget

    busy = []
    for gpu in devices_probe(subject)["gpus"]:
        budget = memory_budget(gpu)  # an APU's torch numbers are the carve-out or all system memory, not its pool
        used = budget.total_gib - budget.free_gib
        if used > MEMORY_IN_USE_WARN * budget.total_gib:
            busy.append(f"GPU {gpu['index']}: {used:.1f} of {budget.total_gib:.1f} GiB in use")
    if not busy:
        return Outcome(PASS, "free", "every GPU has more than 90% of its memory free")
    from rocmft.facts.amdgpu import gpu_holders

    holders = subject.probes.get("gpu_holders", lambda: gpu_holders(Path(subject.probes.known("node_root", "/"))))
    named = [f"pid {h['pid']} {h['name']} (user {h['user']}: {h['cmdline'] or '?'}) on {', '.join(h['devices'])}"
             + (f", {h['vram_gib']:.1f} GiB" if h.get("vram_gib") else "") for h in holders["visible"]]  # fmt: skip
    hidden = [f"host pid {h['pid']}: {h['vram_gib']:.1f} GiB on {h['gpus']}" for h in holders["hidden"]]
    message = "; ".join(busy) + ". "
    if named:
        message += "Held by: " + "; ".join(named) + ". "
    if hidden:
        message += "Not visible from this container (another container or the host): " + "; ".join(hidden) + ". "
    if not named and not hidden:
        message += ("No process of this container holds a GPU: the memory belongs to another container or the "
                    "host" + (f" ({holders['unreadable']} process(es) here could not be inspected)"
                              if holders.get("unreadable") else "") + ". ")  # fmt: skip
    remedy = (
        "Stop the processes named above (kill PID here; on the host: rocm-smi --showpids, amd-smi process, "
        "nvidia-smi) or run on other GPUs (HIP_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES)."
    )
    return Outcome(WARN, f"{len(busy)} busy", message.strip(), remedy, {"holders": holders})


# What else runs a GEMM in a dtype other than the run's compute dtype (the gpu-compute check's warning says it):
# fp32 GEMMs are the fp32 policy's (ROCMFT_PRECISION=fp32) and the automatic restart after a non-finite loss
# (ROCMFT_ON_NAN=fp32, rocmft.cli.train); fp16 is the policy of GPUs without bf16. Under bf16 autocast the model's
# matmuls (the LM head's included) run in bf16; the fp32 parts (loss, softmax, the optimizer) are not GEMMs.
OTHER_DTYPE_USE = {
    "float32": "fp32 GEMMs run only after a switch to fp32: ROCMFT_PRECISION=fp32, or the automatic restart "
    "after a non-finite loss (ROCMFT_ON_NAN=fp32)",
    "float16": "fp16 GEMMs run only with ROCMFT_PRECISION=fp16 (the policy of GPUs without bf16)",
    "bfloat16": "bf16 GEMMs run only with ROCMFT_PRECISION=bf16",
}
_GEMM_REMEDY = ("Do not train on these GPUs: check the gfx target and HSA_OVERRIDE_GFX_VERSION, the driver and "
                "firmware; exclude a bad GPU with HIP_VISIBLE_DEVICES.")  # fmt: skip
_FALLBACK_REMEDY = (
    "torch fell back from hipBLASLt to hipBLAS, so this torch's hipBLASLt cannot run GEMMs on this GPU (in "
    "AMDResearch/hpcfund#86 the retry itself then failed with 'CUDA error: file not found'). Use an image whose "
    "torch and hipBLASLt were built for this gfx target (a rocmft image for it: docker/arch/<arch>.env) and do not "
    "mix ROCm libraries from the host into it (LD_LIBRARY_PATH, HIPBLASLT_TENSILE_LIBPATH)."
)


def _gemm_problem(gemm: dict[str, Any], dtype: str) -> str | None:
    """What is wrong with one probed GEMM (rocmft.records.GemmRecord), or None."""
    from rocmft.facts.probe import GEMM_TOLERANCE

    if gemm.get("error"):
        return f"raised {gemm['error']}"
    if not gemm["finite"]:
        return f"non-finite result in {dtype}"
    if not gemm["max_rel_error"] <= GEMM_TOLERANCE[dtype]:
        return f"error {gemm['max_rel_error']:.2e} in {dtype} (tolerance {GEMM_TOLERANCE[dtype]:.0e})"
    if dtype == "float32" and gemm.get("precision") not in (None, "ieee"):
        return f"fp32 ran in {gemm['precision']} precision, not IEEE fp32"
    return None


def _blas_fallback(probe: dict[str, Any]) -> str | None:
    """The probe's hipBLASLt -> hipBLAS fallback, in words (None without one)."""
    blas = probe.get("blas") or {}
    warnings = blas.get("fallback_warnings") or []
    if not warnings:
        return None
    switched = f" (preferred library {blas.get('before')} -> {blas.get('after')})"
    return f"{warnings[0].split(' (Triggered internally')[0]}{switched}"


@check("gpu-compute", "GPU matrix product correct", timeout_s=10, needs=("gpu-runtime",))
def gpu_compute(subject) -> Outcome:
    """Per GPU, a 1024×1024 matrix product in every dtype the probe ran (bf16, fp16, fp32 in IEEE precision: TF32
    off) is finite and within the dtype's tolerance of a float64 reference (rocmft.facts.probe.GEMM_TOLERANCE),
    and no GEMM fell back from hipBLASLt to hipBLAS (rocmft.facts.probe.BLAS_FALLBACK_WARNINGS).

    * wrong in the run's compute dtype, a GPU without it, or a BLAS fallback: **fail**;
    * wrong in another dtype: **warn** (the run's GEMMs do not use it: :data:`OTHER_DTYPE_USE` says what would), but
      **fail** for fp32 when ROCMFT_ON_NAN=fp32 would restart the run in it.

    hipBLAS chosen without a fallback warning (preferred_blas_library("hipblas"), or torch's own default on a gfx
    target outside its hipBLASLt list) passes: only a switch torch made behind the run's back fails. Note that
    TORCH_BLAS_PREFER_HIPBLASLT=0 does not choose hipBLAS in torch 2.11: only =1 changes anything (ATen/Context.h
    of the 2.11.0 wheel: ``check_env(...) == true ? Cublaslt : Default``).
    """
    probe = devices_probe(subject)
    dtype = subject.plan.precision.compute_dtype
    on_nan = getattr(getattr(getattr(subject.plan, "settings", None), "rocmft", None), "on_nan", "stop")
    wrong, other, worst = [], [], 0.0
    for gpu in probe["gpus"]:
        where = f"GPU {gpu['index']} ({gpu['name']})"
        if dtype not in gpu["gemm"]:
            wrong.append(f"{where}: no {dtype} support")
        for name, gemm in gpu["gemm"].items():
            problem = _gemm_problem(gemm, name)
            if problem is None:
                if name == dtype:
                    worst = max(worst, gemm["max_rel_error"])
                continue
            if name == dtype or (name == "float32" and on_nan == "fp32"):
                wrong.append(f"{where}: {problem}" + ("" if name == dtype else " (ROCMFT_ON_NAN=fp32 restarts in it)"))
            else:
                other.append((name, f"{where}: {problem}"))
    fallback = _blas_fallback(probe)
    library = (probe.get("blas") or {}).get("after")
    shown = f"max rel. error {worst:.1e}" + (f", {library}" if library else "")
    if fallback:
        prefer = (probe.get("blas") or {}).get("prefer_hipblaslt")
        remedy = _FALLBACK_REMEDY
        if prefer and "Overriding blas backend" in fallback:
            remedy = (f"TORCH_BLAS_PREFER_HIPBLASLT={prefer} asks for hipBLASLt, which torch does not support on "
                      "this gfx target: unset it (torch then chooses hipBLAS itself, without a fallback), or "
                      + remedy[0].lower() + remedy[1:])  # fmt: skip
        wrong.append(f"BLAS fallback: {fallback}")
        return Outcome(FAIL, f"{len(wrong)} wrong", "; ".join(wrong), remedy)
    if wrong:
        return Outcome(FAIL, f"{len(wrong)} wrong", "; ".join(wrong), _GEMM_REMEDY)
    if other:
        uses = "; ".join(OTHER_DTYPE_USE[name] for name in sorted({name for name, _ in other}))
        return Outcome(WARN, shown + f", {len(other)} wrong in another dtype",
                       f"{dtype} GEMMs are correct on every GPU, but: {'; '.join(text for _, text in other)}. "
                       f"This run does not use that dtype for its GEMMs: {uses}.",
                       _GEMM_REMEDY + " Until then, do not switch this run to that dtype.")  # fmt: skip
    names = sorted({n for g in probe["gpus"] for n in g["gemm"]})
    return Outcome(PASS, shown, f"{', '.join(names)} GEMMs correct on every GPU ({dtype} is this run's)")


@check("shm", "shared memory (/dev/shm) size", timeout_s=10)
def shm(subject) -> Outcome:
    """/dev/shm holds 1 GiB per communicating local process plus 256 MiB per data-loader worker
    (rocmft.render.loader, which also planned fewer workers when the user did not choose their number). A refusal
    names the flag that grows /dev/shm and, when the user set the workers and fewer would fit, the number that fits."""
    from rocmft.container import shm_gib, shm_size
    from rocmft.facts.host import shm_bytes
    from rocmft.render.loader import SHM_PER_WORKER, WORKERS, shm_need, shown, workers_that_fit

    if not Path("/dev/shm").is_dir():
        return Outcome(SKIP, "no /dev/shm", "This system has no /dev/shm.")
    size = subject.probes.get("shm_bytes", shm_bytes)
    plan = subject.plan
    ranks = plan.job.communicating
    per_process = int(plan.arguments.get(WORKERS) or 0)
    workers = per_process * max(ranks, 1)
    need = shm_need(ranks, per_process)
    value = f"{shown(size)}, need {shown(need)}"
    if size >= need:
        return Outcome(PASS, value, f"{ranks} communicating process(es), {workers} loader worker(s)")
    message = (
        f"/dev/shm is too small: it holds {shown(size)}; {ranks} communicating local process(es) (1 GiB each) "
        f"and {workers} loader worker(s) ({shown(SHM_PER_WORKER)} each) need {shown(need)}."
    )
    grow = f"Give the container {shm_gib(need)} GiB of /dev/shm: {shm_size(shm_gib(need))}."
    fit = workers_that_fit(size, ranks)
    source = getattr(plan, "sources", {}).get(WORKERS)
    if fit is not None and per_process > fit and source is not None and source.user_chosen:
        from rocmft.config.provenance import named_in

        yours = named_in(WORKERS, plan.arguments, plan.sources, plan.settings.given)
        return Outcome(FAIL, value, message + f" The loader workers are yours: {yours}.",
                       f"Set DATALOADER_NUM_WORKERS={fit} (what this /dev/shm holds), or " + grow[0].lower() + grow[1:],
                       {"workers_that_fit": fit, "shm_gib": shm_gib(need)})  # fmt: skip
    return Outcome(FAIL, value, message, grow, {"workers_that_fit": fit, "shm_gib": shm_gib(need)})


HANG_CAUSES = (
    "IOMMU not in pass-through mode (kernel: iommu=pt; amd_iommu=on iommu=pt on AMD hosts); "
    "peer-to-peer access between the GPUs blocked (PCIe ACS, a VM without P2P; test with NCCL_P2P_DISABLE=1, "
    f"slower but it avoids P2P); /dev/shm too small ({IPC_HOST}); a firewall on the loopback rendezvous port; "
    "NCCL_DEBUG=INFO shows where it stops."
)


@check("collectives", "all-reduce across local GPUs", timeout_s=ALLREDUCE_TIMEOUT_S + 20, needs=("gpu-runtime",))
def collectives(subject) -> Outcome:
    """With more than one GPU: an all-reduce of 256 MiB across all local GPUs (RCCL on ROCm, NCCL on CUDA), one
    process per GPU, under a hard timeout; the result must be exact and the bus bandwidth
    (2·S·(n−1)/n / t, nccl-tests' definition) above the architecture's floor (RCCL_BUSBW_FLOOR_GBPS)."""
    gpus = devices_probe(subject)["gpus"]
    if len(gpus) < 2:
        return Outcome(SKIP, f"{len(gpus)} GPU", "Collectives need at least two GPUs.")
    from rocmft.facts.device import allreduce_probe

    result = subject.probes.get("allreduce", lambda: allreduce_probe(len(gpus)))
    if result.get("timed_out"):
        return Outcome(FAIL, f"hung > {ALLREDUCE_TIMEOUT_S} s",
                       f"An all-reduce across {len(gpus)} GPUs did not finish: training would hang at its first step.",
                       "Usual causes: " + HANG_CAUSES)  # fmt: skip
    if "error" in result or not result.get("correct"):
        return Outcome(FAIL, "failed", f"The all-reduce failed: {result.get('error', 'wrong sum')}.",
                       "Usual causes: " + HANG_CAUSES)  # fmt: skip
    busbw = result["busbw_gbps"]
    floor = float((image_record(subject) or {}).get("rccl_busbw_floor_gbps") or 0)
    value = f"{busbw:.1f} GB/s bus bandwidth ({len(gpus)} GPUs, {ALLREDUCE_MIB} MiB)"
    if busbw < floor:
        return Outcome(WARN, value, f"Below this architecture's floor of {floor:.0f} GB/s: traffic takes a slow path.",
                       "Check that the GPUs talk directly (rocm-smi --showtopo; NCCL_DEBUG=INFO shows the transport) "
                       "and that NCCL_P2P_DISABLE is not set.")  # fmt: skip
    return Outcome(PASS, value, f"{result['seconds'] * 1e3:.1f} ms per all-reduce, result exact")
