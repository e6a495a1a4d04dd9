"""Checks of what the run needs beyond the GPUs themselves: host kernel settings the container cannot change,
the libraries the configuration asks for, and whether the model fits in GPU memory.

Facts come from the run's probe provider (``subject.probes``, rocmft.facts.probes): injected when a test put
recorded values there (a fake host is data), else read once: host settings from /proc and /sys
(:func:`host_settings`), library probes from ``python -m rocmft.facts.probe libs`` in a child process (a GPU kernel,
not just an import).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rocmft.checks import FAIL, PASS, SKIP, WARN, Outcome, check
from rocmft.checks.gpu import devices_probe
from rocmft.errors import ConfigError

LIBS_TIMEOUT_S = 60


def host_settings(root: Path = Path("/")) -> dict[str, Any]:
    """The host kernel's settings that matter to multi-GPU training, read from procfs/sysfs under ``root``.

    Returns:
        ``numa_balancing``: the value of /proc/sys/kernel/numa_balancing (``"0"``, ``"1"``, or None if absent);
        ``numa_nodes``: how many NUMA nodes are online; ``iommu_group_types``: count of IOMMU groups per
        type (/sys/kernel/iommu_groups/*/type: ``identity`` is pass-through, ``DMA``/``DMA-FQ`` translate
        every DMA; an empty mapping means no IOMMU or none visible); ``cmdline``: /proc/cmdline.
        In a container /proc/cmdline and sysfs show the host's kernel.
    """
    from rocmft.facts.topology import numa_nodes

    def read(path: str) -> str | None:
        try:
            return (root / path).read_text().strip()
        except OSError:
            return None

    types: dict[str, int] = {}
    groups = root / "sys/kernel/iommu_groups"
    if groups.is_dir():
        for group in groups.iterdir():
            kind = read(f"sys/kernel/iommu_groups/{group.name}/type") or "unknown"
            types[kind] = types.get(kind, 0) + 1
    return {
        "numa_balancing": read("proc/sys/kernel/numa_balancing"),
        "numa_nodes": len(numa_nodes(root)) or 1,
        "iommu_group_types": types,
        "cmdline": read("proc/cmdline") or "",
    }


def _host(subject) -> dict[str, Any]:
    return subject.probes.get("host", host_settings)


def _gpus(subject) -> list[dict[str, Any]]:
    return devices_probe(subject).get("gpus", [])


@check("numa-balancing", "host: automatic NUMA balancing", timeout_s=5)
def numa_balancing(subject) -> Outcome:
    """With GPUs on a host of more than one NUMA node, automatic NUMA balancing should be off: it unmaps and
    migrates the training processes' pages in the background, which stalls the CPU side of GPU work (AMD's
    MI300X system optimization guide: disable it, ``kernel.numa_balancing=0``)."""
    if not _gpus(subject):
        return Outcome(SKIP, "no GPU", "NUMA balancing matters only for GPU training.")
    host = _host(subject)
    value, nodes = host.get("numa_balancing"), host.get("numa_nodes", 1)
    if value is None:
        return Outcome(SKIP, "not readable", "/proc/sys/kernel/numa_balancing is not there (kernel without it).")
    if value != "0" and nodes > 1:
        return Outcome(
            WARN, f"on ({value}), {nodes} NUMA nodes",
            "The host kernel migrates the training processes' memory between NUMA nodes in the background; "
            "AMD recommends turning this off for GPU work (stalls, uneven step times).",
            "On the host (a container cannot): sudo sysctl -w kernel.numa_balancing=0, and to keep it: "
            "echo kernel.numa_balancing=0 | sudo tee /etc/sysctl.d/90-rocmft.conf.",
        )  # fmt: skip
    state = "off" if value == "0" else f"on ({value}), but one NUMA node: nothing to migrate"
    return Outcome(PASS, state, f"{nodes} NUMA node(s)")


@check("iommu", "host: IOMMU mode", timeout_s=5)
def iommu(subject) -> Outcome:
    """With more than one GPU, the IOMMU should be off or in pass-through mode: a translating IOMMU puts every
    peer-to-peer and host transfer through address translation, which costs RCCL bandwidth and can hang
    collectives (ROCm's multi-GPU installation notes: ``iommu=pt``; ``amd_iommu=on iommu=pt`` on AMD CPUs)."""
    gpus = _gpus(subject)
    if len(gpus) < 2:
        return Outcome(SKIP, f"{len(gpus)} GPU", "The IOMMU mode matters for traffic between GPUs.")
    host = _host(subject)
    types = host.get("iommu_group_types") or {}
    translating = sum(n for kind, n in types.items() if kind.startswith("DMA"))
    if translating:
        cmdline = " ".join(w for w in host.get("cmdline", "").split() if "iommu" in w) or "no iommu option"
        return Outcome(
            WARN, f"translating ({translating} of {sum(types.values())} groups)",
            f"The host IOMMU translates DMA (kernel command line: {cmdline}): GPU peer-to-peer and RCCL "
            "traffic slow down, and collectives can hang.",
            "On the host: add iommu=pt (AMD CPUs: amd_iommu=on iommu=pt) to the kernel command line "
            "(GRUB_CMDLINE_LINUX in /etc/default/grub, update-grub, reboot).",
        )  # fmt: skip
    if not types:
        return Outcome(PASS, "off", "no IOMMU groups: the IOMMU is off or not exposed")
    return Outcome(PASS, "pass-through", f"{sum(types.values())} IOMMU groups in identity (pass-through) mode")


def needed_libraries(subject) -> dict[str, str]:
    """What the configuration asks of the libraries: probe name -> the setting that needs it."""
    needs = {}
    if subject.plan.arguments.get("quantization_bit"):
        needs["bnb"] = f"QUANTIZATION_BIT={subject.plan.arguments['quantization_bit']}"
    if subject.plan.arguments.get("flash_attn") == "fa2":
        needs["fa2"] = "FLASH_ATTN=fa2"
    return needs


def deepspeed_ops(subject) -> dict[str, dict[str, bool]]:
    """The DeepSpeed C++/HIP ops this run needs: ``cpu_adam`` when the optimizer is offloaded (ZeRO-Offload
    runs DeepSpeedCPUAdam; DeepSpeed refuses other optimizers with offload). Per op: ``installed``
    (pre-built into the image, deepspeed.git_version_info.installed_ops) and ``compatible`` (can be
    JIT-built here: compiler and headers present, the builder's is_compatible()). Measured once
    (``deepspeed_ops``)."""
    ds_config = subject.plan.ds_config or {}
    offload = (ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    wanted = ["cpu_adam"] if offload.get("device") not in (None, "none") else []

    def measure() -> dict[str, dict[str, bool]]:
        found: dict[str, dict[str, bool]] = {}
        if wanted:
            from deepspeed.git_version_info import installed_ops
            from deepspeed.ops.op_builder import CPUAdamBuilder

            builders = {"cpu_adam": CPUAdamBuilder}
            for name in wanted:
                found[name] = {"installed": bool(installed_ops.get(name)),
                               "compatible": bool(builders[name]().is_compatible(verbose=False))}  # fmt: skip
        return found

    return subject.probes.get("deepspeed_ops", measure)


@check("libraries", "libraries the configuration needs", timeout_s=LIBS_TIMEOUT_S + 15)
def libraries(subject) -> Outcome:
    """bitsandbytes when QUANTIZATION_BIT is set (a 4-bit NF4 matmul on the GPU, not just an import),
    flash-attention when FLASH_ATTN=fa2 (a forward against PyTorch's SDPA), DeepSpeed's ops when the
    DeepSpeed config needs them (CPU Adam for optimizer offload)."""
    needs = needed_libraries(subject)
    ds_ops = deepspeed_ops(subject) if subject.plan.arguments.get("deepspeed") else {}
    if not needs and not ds_ops:
        return Outcome(SKIP, "none needed", "No quantization, flash-attention or DeepSpeed op in this configuration.")
    problems, fine = [], []
    if needs:
        from rocmft.facts.device import run_probe

        override = {k: v for k, v in subject.launch_environment.items() if k == "HSA_OVERRIDE_GFX_VERSION"}
        env = {**subject.plan.settings.environ, **override} if override else None  # as the training will run
        probes = subject.probes.get("libs", lambda: run_probe(["libs", *needs], LIBS_TIMEOUT_S, env=env))
        for name, setting in needs.items():
            result = probes.get(name) or {"ok": False, "error": probes.get("error", "no result")}
            label = {"bnb": "bitsandbytes", "fa2": "flash-attention"}[name]
            if result.get("ok"):
                fine.append(f"{label} {result.get('version')} (error {result.get('max_rel_error', 0):.1e})")
            else:
                why = result.get("error") or (
                    f"{'non-finite' if not result.get('finite') else 'wrong'} result, error "
                    f"{result.get('max_rel_error', float('nan')):.2e}"
                )
                problems.append((f"{setting} needs {label} working on the GPU: {why}", _LIB_REMEDY[name]))
    for name, state in ds_ops.items():
        if state["installed"]:
            fine.append(f"DeepSpeed {name} pre-built")
        elif state["compatible"]:
            fine.append(f"DeepSpeed {name} JIT-built at first use")
        else:
            problems.append((
                f"DeepSpeed's {name} op (needed by ROCMFT_OFFLOAD) is neither pre-built nor buildable here.",
                "Use a rocmft image (it has the compiler DeepSpeed JIT-builds CPU_ADAM with), or ROCMFT_OFFLOAD=none.",
            ))  # fmt: skip
    if problems:
        return Outcome(FAIL, f"{len(problems)} missing", "; ".join(p for p, _ in problems),
                       " ".join(dict.fromkeys(r for _, r in problems)))  # fmt: skip
    jit = [f for f in fine if "JIT" in f]
    if jit:
        return Outcome(WARN, ", ".join(fine), "The first start compiles the op for this host's CPU (minutes).",
                       "Nothing to fix: it is kept in TORCH_EXTENSIONS_DIR (the /cache volume) for later runs. "
                       "rocmft images do not prebuild DeepSpeed's CPU ops: DeepSpeed compiles them with the build "
                       "host's -march=native, which can crash other CPUs (deepspeedai/DeepSpeed#1886).")  # fmt: skip
    return Outcome(PASS, ", ".join(fine), "each probed for real")


_LIB_REMEDY = {
    "bnb": "Use a rocmft ROCm image (its build checks that bitsandbytes' HIP library has code for its gfx target; "
    "BITSANDBYTES in docker/arch/<arch>.env), check that the GPU's gfx target is the image's (gpu-arch), or unset "
    "QUANTIZATION_BIT (LoRA in bf16 needs about 4x the weight memory).",
    "fa2": "Use an image built with flash-attention for this architecture (FLASH_ATTN_BACKEND in "
    "docker/arch/<arch>.env), or set FLASH_ATTN=sdpa (PyTorch's own attention; slower, same results).",
}


@check("memory-fit", "model fits in GPU memory (estimate)", timeout_s=10, needs=("gpu-runtime",))
def memory_fit(subject) -> Outcome:
    """Peak GPU memory per process, estimated from the model's config.json (no weights loaded) and the
    training arguments by :mod:`rocmft.render.memfit` (formula and sources in its docstring; within 3% of
    torch.cuda.max_memory_allocated on Qwen2-7B-shaped LoRA runs, BENCHMARKS.md), against the free memory
    of the emptiest-looking local GPU the run uses (rocmft.facts.device.memory_budget: on an APU, the shared system
    memory it may use). Fails with up to three changes that would fit.
    FSDP full sharding is estimated as ZeRO-3 (both partition parameters, gradients and optimizer states)."""
    from rocmft.facts.device import memory_budget
    from rocmft.render.memfit import estimate, fixes, read_model_shape, spec_from_arguments

    gpus = devices_probe(subject).get("gpus", [])[: subject.plan.job.local_processes]
    if not gpus:
        return Outcome(SKIP, "no GPU", "Memory fit is estimated for GPUs only.")
    model_dir = Path(str(subject.plan.arguments.get("model_name_or_path", ""))).expanduser()
    if not (model_dir / "config.json").is_file():
        return Outcome(SKIP, "config not local", f"{model_dir}/config.json is not on disk (a hub id not cached yet).")
    settings = subject.plan.settings.rocmft
    zero = (
        int(((subject.plan.ds_config or {}).get("zero_optimization") or {}).get("stage", 0))
        if subject.plan.ds_config
        else 0
    )
    if settings.distributed == "fsdp":
        zero = 3
    offload = settings.offload if settings.distributed == "deepspeed" else "none"
    world = subject.plan.world_size
    try:
        shape = read_model_shape(model_dir)
    except ConfigError as err:  # a damaged config.json is this check's finding, not its crash
        return Outcome(FAIL, "config.json unreadable", err.message, err.remedy)
    spec = spec_from_arguments(subject.plan.arguments, compute_dtype=subject.plan.precision.compute_dtype,
                               zero_stage=zero, offload=offload, world_size=world)  # fmt: skip
    peak = estimate(shape, spec)
    budget = min((memory_budget(g) for g in gpus), key=lambda b: b.free_gib)  # the one rule, APUs included
    free = int(budget.free_gib * 2**30)
    value = f"~{peak.total / 2**30:.1f} GiB of {free / 2**30:.1f} GiB free per GPU"
    data = {"estimate_gib": peak.breakdown(), "free_gib": round(free / 2**30, 2), "world_size": world,
            "memory_source": budget.source}  # fmt: skip
    if peak.fits(free):
        return Outcome(PASS, value, peak.summary(), data=data)
    options = fixes(shape, spec, free)
    return Outcome(
        FAIL, value,
        f"Training would run out of GPU memory: {peak.summary()}.",
        ("Any one of: " + "; ".join(options)) if options else
        "Nothing simple fits: use more GPUs with ROCMFT_DISTRIBUTED=deepspeed ROCMFT_ZERO_STAGE=3, or a smaller model.",
        data=data,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
def fabric_facts(root: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """What the ``fabric`` check judges: the Slingshot NICs under ``root`` and the network plugin RCCL would load in
    a process started with ``environ`` (the run's: rocmft.config.settings.Settings.environ), really loaded
    (:func:`rocmft.facts.topology.net_plugin`).

    Returns ``{"fabric": SlingshotFabric.as_dict(), "plugin": NetPlugin.as_dict(), "plugin_summary":
    NetPlugin.describe(), "nccl_net": NCCL_NET or None, "net_names": the names NCCL_NET may take}``.
    """
    from rocmft.facts.topology import net_names, net_plugin, slingshot_fabric

    plugin = net_plugin(environ)
    return {
        "fabric": slingshot_fabric(root).as_dict(),
        "plugin": plugin.as_dict(),
        "plugin_summary": plugin.describe(),
        "nccl_net": environ.get("NCCL_NET", "").strip() or None,
        "net_names": net_names(plugin),
    }


_BIND_PLUGIN = (
    "Bind the site's OFI plugin and libfabric into the container and put the plugin's folder on LD_LIBRARY_PATH (or "
    "NCCL_NET_PLUGIN=/path/to/librccl-net.so): RCCL of ROCm 7 needs aws-ofi-nccl >= 1.18 built --with-rocm (HPE's "
    "RCCL-on-Slingshot guide; the older aws-ofi-rccl exports only ncclNetPlugin_v5, which it no longer loads). "
    "LUMI: module load singularity-AI-bindings binds the system libraries; Frontier: build the plugin against "
    "/opt/cray/libfabric and add its lib/ to LD_LIBRARY_PATH (OLCF's PyTorch guide). docs/clusters.md, "
    "'Slingshot and libfabric', has the bind paths."
)


@check("fabric", "network: Slingshot and RCCL's OFI plugin", timeout_s=20)
def fabric(subject) -> Outcome:
    """On a Slingshot host, RCCL reaches the NICs only through the OFI network plugin (aws-ofi-nccl; HPE's
    RCCL-on-Slingshot guide, HewlettPackard/shs-ccl-docs rccl/rccl_tuning_guide.md @ 1617c309): the plugin is found
    the way RCCL finds it and really dlopen()ed (:func:`fabric_facts`).

    * NCCL_NET set by the user to a network no loadable plugin provides (and not RCCL's internal IB or Socket):
      **fail**, on any number of nodes: RCCL's init stops with "Failed to initialize any NET plugin" (ROCm/rocm-systems
      projects/rccl/src/plugin/net.cc @ 9512ccf8; LLNL's HPC-launcher saw it even on one node), which would come
      only after the model loaded.
    * Slingshot NICs, a multi-node run (NNODES > 1), no loadable plugin: **warn**: RCCL falls back to TCP sockets
      over the hsn interfaces, "significantly slower" than the plugin (CSCS's NCCL page,
      docs.cscs.ch/software/communication/nccl; no measured factor is claimed here). Also a warning: the plugin
      loads but this container sees no /dev/cxi* node (the plugin would find no NIC).
    * Otherwise pass (the plugin in use, or one node, where collectives do not use the network), or skip without a
      Slingshot NIC.
    """
    from rocmft.facts.scheduler import job_layout

    facts = subject.probes.get("fabric", lambda: fabric_facts(Path("/"), subject.plan.settings.environ))
    found, plugin, nccl_net = facts["fabric"], facts["plugin"], facts.get("nccl_net")
    names = facts.get("net_names") or []
    described = facts["plugin_summary"]
    if nccl_net:
        if nccl_net.lower() in (n.lower() for n in names):
            return Outcome(PASS, f"NCCL_NET={nccl_net}", f"{nccl_net!r} is a network RCCL has here; {described}",
                           data=facts)  # fmt: skip
        return Outcome(
            FAIL, f"NCCL_NET={nccl_net}: no such network",
            f"NCCL_NET={nccl_net} names a network nothing here provides ({described}); RCCL would have "
            f"{', '.join(repr(n) for n in names)}. RCCL's init would stop with \"Failed to initialize any NET "
            "plugin\", even on one node, after the model has loaded.",
            f"{_BIND_PLUGIN} Or unset NCCL_NET (rocmft sets it itself when the plugin loads).",
            data=facts,
        )  # fmt: skip
    if not (found["interfaces"] or found["devices"]):
        return Outcome(SKIP, "no Slingshot NIC", "No hsn* interface in /sys/class/net and no cxi device.", data=facts)
    nics = ", ".join(found["interfaces"] or found["devices"])
    if job_layout(subject.plan.settings.environ).nnodes == 1:
        return Outcome(PASS, f"Slingshot ({nics}), one node",
                       f"One node: collectives stay on the node's GPU links. {described}", data=facts)  # fmt: skip
    if not plugin["loads"]:
        return Outcome(
            WARN, f"Slingshot ({nics}), no OFI plugin",
            f"RCCL finds no network plugin that loads ({described}), so it sends inter-node traffic over TCP "
            f"sockets on {nics}: much slower than the fabric's RDMA.",
            _BIND_PLUGIN, data=facts,
        )  # fmt: skip
    if not found["device_nodes"]:
        return Outcome(
            WARN, f"Slingshot ({nics}), no /dev/cxi*",
            f"The plugin loads ({described}) but this container sees no /dev/cxi* device, so it would find no NIC; "
            "rocmft leaves NCCL_NET unset and RCCL uses TCP sockets.",
            "Give the container the NICs: Apptainer binds the host's /dev by default; with Docker add "
            "--device /dev/cxi0 (one per NIC).",
            data=facts,
        )  # fmt: skip
    return Outcome(PASS, f"{plugin['name']} via {plugin['symbol']}", f"Slingshot ({nics}); {described}", data=facts)
