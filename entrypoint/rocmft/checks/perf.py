"""The performance preflight (issue 30): slow GPUs on this node, and on several nodes slow nodes and version drift.

``gpu-perf`` measures each visible GPU's bf16 GEMM TFLOPS and device-memory copy bandwidth (the probe child of
:mod:`rocmft.facts.perf`, through the run's probe provider as ``perf``; tests inject it there) and judges them
against the GPU model's expected figures (:data:`rocmft.facts.perf.MODELS`) and against the node's other GPUs of the
same model. The public reports: ROCm/TheRock#7696 (MI350X nodes 9-25% slower than their peers while passing every
correctness check) and AMD Primus' node smoke test, which measures the same two kernels to list slow nodes.

On several nodes each node sends its figures and versions with its network checks to node 0
(:func:`node_record`, through rocmft.checks.network's rendezvous), and node 0 marks in its per-node list
(:func:`judge_nodes`) the nodes slower than the others and those whose versions differ from its own; the
``--exclude=`` line names them with the failing ones. ``ROCMFT_ON_SLOW_NODE=fail`` turns these warnings into
failures (exit 3), for a job script that resubmits without the named hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmft.checks import FAIL, PASS, SKIP, WARN, Outcome, check
from rocmft.checks.gpu import devices_probe, image_record
from rocmft.facts import perf as facts

# A GPU below this share of its model's expected figure (peak · the model's achievable share) is slow. The expected
# figure is already what a healthy GPU reaches; 0.7 leaves 30% for the spread between boards and power limits of
# one model and for a one-second measurement, and still catches what halves a GPU's speed (a power cap or clocks
# stuck low, a BLAS library fallback, a memory fault). Smaller slowdowns are the comparison's below.
SLOW_SHARE = 0.7
# A GPU below this share of its node's median GPU of the same model, or a node whose slowest GPU is below this share
# of the job's (upper) median node, is slow: ROCm/TheRock#7696 reported nodes 9-25% slower than their peers;
# identical GPUs measured the same way differ by a few percent, so 10% below the others is a real difference.
PEER_SHARE = 0.9


def on_slow(subject) -> str:
    """ROCMFT_ON_SLOW_NODE: ``warn`` (the default) or ``fail``."""
    return getattr(getattr(subject.plan.settings, "rocmft", None), "on_slow_node", "warn")


def perf_result(subject) -> dict[str, Any]:
    """The perf probe's result (rocmft.facts.perf.perf_probe), measured once as ``perf``."""
    gpus = len(devices_probe(subject).get("gpus") or [])
    return subject.probes.get("perf", lambda: facts.perf_probe(gpus))


def _upper_median(values: list[float]) -> float:
    """The median, the upper of the middle two for an even count (of two nodes: the faster one)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def judge_gpus(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured GPU's verdict: ``{"index", "name", "tflops", "gbps", "model" (the table's label or None),
    "expected_tflops", "expected_gbps" (None without a row), "slow": [reasons], "error"}``. A GPU is slow below
    SLOW_SHARE of its model's expected figure, or below PEER_SHARE of the (upper) median of its node's GPUs of the
    same name (with two or more)."""
    peers: dict[str, list[dict[str, Any]]] = {}
    for gpu in gpus:
        if "error" not in gpu:
            peers.setdefault(gpu["name"], []).append(gpu)
    verdicts = []
    for gpu in gpus:
        model = facts.model_of(gpu.get("name") or "", gpu.get("arch") or "")
        verdict: dict[str, Any] = {"index": gpu["index"], "name": gpu.get("name") or gpu.get("arch") or "GPU",
                                   "tflops": gpu.get("gemm_tflops"), "gbps": gpu.get("copy_gbps"),
                                   "model": model.label if model else None, "slow": [], "error": gpu.get("error"),
                                   "expected_tflops": round(model.expected_tflops, 1) if model else None,
                                   "expected_gbps": round(model.expected_gbps, 1) if model else None}  # fmt: skip
        if "error" not in gpu:
            table = _table_reasons(gpu, model)
            verdict["slow"] = table + _peer_reasons(gpu, peers[gpu["name"]], table)
        verdicts.append(verdict)
    return verdicts


def _table_reasons(gpu: dict[str, Any], model: facts.Model | None) -> list[str]:
    """``gpu``'s figures below SLOW_SHARE of ``model``'s expected ones, in words; the datasheet once at the end."""
    if model is None:
        return []
    reasons = []
    for what, measured, expected, peak, unit in (
        ("GEMM", gpu["gemm_tflops"], model.expected_tflops, model.peak_tflops, "TFLOPS"),
        ("copy", gpu["copy_gbps"], model.expected_gbps, model.peak_gbps, "GB/s"),
    ):
        if measured < SLOW_SHARE * expected:
            reasons.append(f"{what} {measured:g} {unit}, {measured / expected:.0%} of the {expected:.0f} expected "
                           f"({expected / peak:.0%} of the {peak:g} peak)")  # fmt: skip
    if reasons:
        label = "published figures" if model.measured is None else f"measured {model.measured}"
        reasons[-1] += f" ({model.label}: {label}, {model.source})"
    return reasons


def _peer_reasons(gpu: dict[str, Any], peers: list[dict[str, Any]], flagged: list[str]) -> list[str]:
    """``gpu``'s figures below PEER_SHARE of the (upper) median of its node's ``peers`` (two or more GPUs of its
    name: of two, the faster one), for the kernels the table did not already flag (``flagged``)."""
    if len(peers) < 2:
        return []
    reasons = []
    for what, key, unit in (("GEMM", "gemm_tflops", "TFLOPS"), ("copy", "copy_gbps", "GB/s")):
        middle = _upper_median([p[key] for p in peers])
        if gpu[key] < PEER_SHARE * middle and not any(r.startswith(what) for r in flagged):
            reasons.append(f"{what} {gpu[key]:g} {unit}, {gpu[key] / middle:.0%} of the median {middle:g} of this "
                           f"node's {len(peers)} {gpu['name']}")  # fmt: skip
    return reasons


def _shown(verdict: dict[str, Any]) -> str:
    return f"GPU {verdict['index']} ({verdict['name']})"


_SLOW_REMEDY = (
    "If gpu-memory named a process on that GPU, it shares the GPU: stop it first. Otherwise tell the operator the GPU "
    "and the figures above (a power cap or clocks stuck low: `amd-smi metric --power "
    "--clock`, `rocm-smi --showperflevel`; nvidia-smi -q -d PERFORMANCE,CLOCK); run without it (HIP_VISIBLE_DEVICES/"
    "CUDA_VISIBLE_DEVICES) or on another node. A data-parallel run goes at the pace of its slowest GPU."
)


def _shared_gpus(subject) -> str | None:
    """Why this process leaves the measurement to another, or None: in task mode (Slurm's one task per GPU) the
    node's tasks run their checks at once, and where each sees several GPUs they would measure the same GPUs
    together and find each other slow; then the node's local rank 0 measures them all (a task bound to its one GPU
    measures that one)."""
    from rocmft.errors import ConfigError
    from rocmft.facts.scheduler import job_layout

    try:
        layout = job_layout(subject.plan.settings.environ)
    except ConfigError:  # the net-* and gpu-runtime checks report a bad layout
        return None
    gpus = len(devices_probe(subject).get("gpus") or [])
    if layout.mode == "task" and (layout.local_world_size or 1) > 1 and gpus > 1 and layout.local_rank:
        return (f"Slurm started {layout.local_world_size} tasks on this node, each seeing its {gpus} GPUs: local "
                "rank 0 measures them (measured by every task at once, each would find them slow).")  # fmt: skip
    return None


@check("gpu-perf", "GPU bf16 GEMM TFLOPS and memory bandwidth against the model's figures", timeout_s=200,
       needs=("gpu-runtime", "gpu-compute"))  # fmt: skip
def gpu_perf(subject) -> Outcome:
    """Per visible GPU, a bf16 GEMM's TFLOPS and a device-memory copy's bandwidth (about 1 s per GPU): below
    SLOW_SHARE (70%) of the model's expected figure, or below PEER_SHARE (90%) of the node's median GPU of the same
    model, **warns** naming the GPU's index and name, measured against expected (**fails** with
    ROCMFT_ON_SLOW_NODE=fail). A model not in rocmft.facts.perf.MODELS is measured and named, without a verdict. A
    probe that failed or timed out warns (fails with ROCMFT_ON_SLOW_NODE=fail). In task mode, where a node's tasks
    share its GPUs, local rank 0 measures them and the others skip."""
    shared = _shared_gpus(subject)
    if shared:
        return Outcome(SKIP, "local rank 0 measures", shared)
    result = perf_result(subject)
    strict = FAIL if on_slow(subject) == "fail" else WARN
    if "skipped" in result:
        return Outcome(SKIP, "not measured", f"The GPUs' speed was not measured: {result['skipped']}.")
    if "error" in result:
        return Outcome(strict, "not measured", f"The performance probe failed: {result['error']}.",
                       "`python -m rocmft.facts.probe perf` shows its error; skip the check with "
                       "ROCMFT_SKIP_CHECKS=gpu-perf to go on.", data={"probe": result})  # fmt: skip
    verdicts = judge_gpus(result.get("gpus") or [])
    if not verdicts:
        return Outcome(SKIP, "no GPU", "The performance probe saw no GPU.", data={"probe": result})
    data = {"probe": result, "gpus": verdicts}
    measured = [v for v in verdicts if not v["error"]]
    value = (f"GEMM {min(v['tflops'] for v in measured):g} TFLOPS, copy {min(v['gbps'] for v in measured):g} GB/s "
             f"(slowest of {len(measured)})" if measured else "not measured")  # fmt: skip
    problems = [f"{_shown(v)}: could not measure: {v['error']}" for v in verdicts if v["error"]]
    problems += [f"{_shown(v)}: {'; '.join(v['slow'])}" for v in verdicts if v["slow"]]
    unknown = sorted({v["name"] for v in measured if v["model"] is None})
    note = (f" No expected figures for {', '.join(unknown)} (rocmft.facts.perf.MODELS has none): measured, not "
            "judged against a table." if unknown else "")  # fmt: skip
    if problems:
        return Outcome(strict, value, "; ".join(problems) + "." + note, _SLOW_REMEDY, data)
    if len(unknown) == len({v["name"] for v in measured}) and len(measured) < 2:
        return Outcome(SKIP, value, note.strip(), data=data)
    models = sorted({(v["model"], v["expected_tflops"], v["expected_gbps"]) for v in measured if v["model"]})
    expected = "; ".join(f"{m}: ≥ {SLOW_SHARE * t:.0f} TFLOPS, ≥ {SLOW_SHARE * g:.0f} GB/s" for m, t, g in models)
    judged = (f"every GPU at {SLOW_SHARE:.0%} of its model's expected figures or more ({expected})" if models
              else f"every GPU at {PEER_SHARE:.0%} of the node's median or more")  # fmt: skip
    return Outcome(PASS, value, judged + "." + note, data=data)


# ---- several nodes: what each node sends, what node 0 makes of it ----------------------------------------------
def node_record(subject) -> dict[str, Any]:
    """What this node sends node 0 with its network checks: ``{"perf": {"status", "gpus": [{"index", "name",
    "tflops", "gbps"}]} or None (not measured: the check was skipped or did not run), "versions":
    rocmft.facts.perf.node_versions}``. Never measures a GPU (reads the probes kept so far)."""
    root = Path(subject.probes.known("node_root", "/"))
    driver = subject.probes.get("driver_version", lambda: facts.driver_version(root))
    image_id = subject.probes.get("image_id", lambda: facts.image_identity(root / "etc/rocmft/build.json"))
    devices = subject.probes.known("devices")
    versions = facts.node_versions(devices if isinstance(devices, dict) else None, image_record(subject), driver,
                                   image_id)  # fmt: skip
    result = subject.probes.known("perf")
    figures = None
    if isinstance(result, dict) and result.get("gpus"):
        verdicts = judge_gpus(result["gpus"])
        figures = {"status": WARN if any(v["slow"] or v["error"] for v in verdicts) else PASS,
                   "gpus": [{k: v[k] for k in ("index", "name", "tflops", "gbps")} for v in verdicts]}  # fmt: skip
    return {"perf": figures, "versions": versions}


def judge_nodes(infos: dict[int, dict[str, Any]]) -> dict[int, list[str]]:
    """Node 0's warnings per NODE_RANK, from each node's :func:`node_record` (``infos``: NODE_RANK -> its info as
    it arrived; missing or older nodes' records are read as unknown):

    * slow: its own gpu-perf found a slow GPU; or, per GPU model, its slowest GPU is below PEER_SHARE of the
      (upper) median over the nodes of the same (with two or more nodes that have it);
    * versions: a version (rocmft.facts.perf.VERSION_KEYS) known on both that differs from node 0's."""
    warnings: dict[int, list[str]] = {rank: [] for rank in infos}
    slowest: dict[str, dict[int, dict[str, float]]] = {}
    for rank, info in infos.items():
        figures = (info or {}).get("perf") or {}
        if figures.get("status") in (WARN, FAIL):
            warnings[rank].append("slow: its own gpu-perf check warned (a slow GPU, or one it could not measure)")
        for gpu in figures.get("gpus") or []:
            if gpu.get("tflops") is None or gpu.get("gbps") is None:
                continue
            mine = slowest.setdefault(gpu["name"], {}).setdefault(rank, {"tflops": gpu["tflops"], "gbps": gpu["gbps"]})
            mine["tflops"], mine["gbps"] = min(mine["tflops"], gpu["tflops"]), min(mine["gbps"], gpu["gbps"])
    for name, by_rank in slowest.items():
        if len(by_rank) < 2:
            continue
        for key, what, unit in (("tflops", "GEMM", "TFLOPS"), ("gbps", "copy", "GB/s")):
            middle = _upper_median([figures[key] for figures in by_rank.values()])
            for rank, figures in by_rank.items():
                if figures[key] < PEER_SHARE * middle:
                    warnings[rank].append(f"slow: {what} {figures[key]:g} {unit} on its slowest {name}, "
                                          f"{figures[key] / middle:.0%} of the median node's {middle:g}")  # fmt: skip
    reference = ((infos.get(0) or {}).get("versions")) or {}
    for rank, info in infos.items():
        versions = (info or {}).get("versions") or {}
        differ = [f"{key} {versions[key]} (node 0: {reference[key]})" for key in facts.VERSION_KEYS
                  if versions.get(key) and reference.get(key) and versions[key] != reference[key]]  # fmt: skip
        if rank != 0 and differ:
            warnings[rank].append("versions differ from node 0's: " + ", ".join(differ))
    return warnings


__all__ = ["PEER_SHARE", "SLOW_SHARE", "gpu_perf", "judge_gpus", "judge_nodes", "node_record", "on_slow"]
