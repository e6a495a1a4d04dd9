"""The node's health before the model loads: RAS error counters, recent amdgpu faults in the kernel log, and GPUs
of families the image cannot run mapped into the container (issue 21, item 4).

The facts come from sysfs, /dev/kmsg and the KFD topology (:mod:`rocmft.facts.amdgpu`, which cites the kernel
source of each format), read under the injected probe ``node_root`` (``/`` unless a test puts a synthetic tree there)
and kept by the run's probe provider (rocmft.facts.probes); tests inject them there instead (a fake node is data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmft.checks import FAIL, PASS, SKIP, WARN, Outcome, check
from rocmft.checks.gpu import GFX_OVERRIDES, current_override, image_record
from rocmft.container import KERNEL_LOG
from rocmft.facts import amdgpu
from rocmft.facts.gfx import visible_devices

# Faults older than this are history (reported, not warned about): a ring timeout last week was handled by the
# reset that followed it. A day is a judgement: long enough to catch the previous job's crash on this node.
RECENT_FAULT_S = 24 * 3600
# The first GPU families ROCm's runtime still starts beside: with a gfx8 GPU (Polaris, gfx803) mapped into the
# container, ROCm 7.2's runtime fails to initialise for every GPU (rocminfo: "HSA_STATUS_ERROR: A generic error has
# occurred"), while ROCm 6.4 listed both, and mapping only the supported card's render node fixed it
# (ROCm/rocm-systems#6883: W6800 gfx1030 beside RX580 gfx803).
LEGACY_MAJOR = 9
RAS_DOC = "https://docs.kernel.org/gpu/amdgpu/ras.html"


def _root(subject) -> Path:
    return Path(subject.probes.known("node_root", "/"))


def _probe(subject, key: str, read):
    return subject.probes.get(key, lambda: read(_root(subject)))


# ---------------------------------------------------------------------------------------------------------
@check("gpu-ras", "GPU RAS error counters (ECC)", timeout_s=10)
def gpu_ras(subject) -> Outcome:
    """Per amdgpu card, the RAS error counters (/sys/class/drm/card*/device/ras/*_err_count, counted since the
    driver loaded): an uncorrectable error (ue) fails, naming the card, its PCI address and the block; correctable
    (ce) or deferred (de) errors warn with their count. No amdgpu card, or no RAS on the cards (the driver creates
    the ras folder only where RAS is enabled: data-centre GPUs; consumer cards have none) skips: there is nothing
    to read and nothing the user could change. A counter that cannot be read warns."""
    cards = _probe(subject, "amdgpu_cards", amdgpu.amdgpu_cards)
    if not cards:
        return Outcome(SKIP, "no amdgpu GPU", "No card driven by amdgpu under /sys/class/drm: RAS counters are "
                       "amdgpu's.")  # fmt: skip
    with_ras = [c for c in cards if c["ras"] is not None]
    if not with_ras:
        return Outcome(SKIP, "no RAS", f"{len(cards)} amdgpu card(s) without a ras folder: these GPUs report no "
                       "RAS counters (the driver exposes them only where RAS is enabled).")  # fmt: skip
    uncorrectable, correctable, unreadable, blocks = [], [], [], 0
    for card in with_ras:
        where = f"{card['card']} (PCI {card['pci']})"
        for block, counts in card["ras"]["blocks"].items():
            blocks += 1
            if not isinstance(counts, dict):
                unreadable.append(f"{where} {block}: {counts or 'query currently inaccessible'}")
                continue
            if counts.get("ue", 0) > 0:
                uncorrectable.append(f"{where} {block}: {counts['ue']} uncorrectable")
            soft = counts.get("ce", 0) + counts.get("de", 0)
            if soft > 0:
                correctable.append(f"{where} {block}: {soft} correctable")
        if card["ras"].get("bad_pages"):
            correctable.append(f"{where}: {card['ras']['bad_pages']} retired VRAM page(s)")
    data = {"cards": with_ras}
    if uncorrectable:
        return Outcome(
            FAIL, f"{len(uncorrectable)} uncorrectable", "; ".join(uncorrectable + correctable),
            "Do not train on this GPU: an uncorrectable error may have corrupted data (the driver resets the GPU; "
            "ras.rst). Drain the node and report it to the operator with the card and PCI address above; to run "
            "now, leave that GPU out (ROCR_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES without it: `rocm-smi --showbus` "
            f"maps index to PCI address). Counters: {RAS_DOC}.",
            data,
        )  # fmt: skip
    if unreadable or correctable:
        return Outcome(
            WARN, f"{len(correctable)} with corrected errors, {len(unreadable)} unreadable",
            "; ".join(correctable + unreadable),
            "Corrected errors are repaired by ECC, but a growing count predicts uncorrectable ones: tell the "
            "operator (amd-smi metric --ecc on the host shows the trend). 'Query currently inaccessible' means the "
            f"driver is recovering from an error: wait and look again. Counters: {RAS_DOC}.",
            data,
        )  # fmt: skip
    return Outcome(PASS, "0 errors", f"{blocks} RAS counter(s) on {len(with_ras)} card(s) read zero", data=data)


# ---------------------------------------------------------------------------------------------------------
def _kmsg(subject) -> dict[str, Any]:
    return subject.probes.get("kmsg", lambda: amdgpu.read_kmsg(str(_root(subject) / "dev/kmsg")))


@check("gpu-faults", "recent amdgpu faults in the kernel log", timeout_s=10)
def gpu_faults(subject) -> Outcome:
    """amdgpu faults in the kernel log (/dev/kmsg, read without blocking, at most 3 s): VM page faults, ring
    timeouts and GPU resets in the last 24 h warn, a GPU recovery that failed fails; counts per kind and the newest
    line are reported. When the container may not read the log (kernel.dmesg_restrict=1 without CAP_SYSLOG) it
    warns that it could not look, and how to look on the host."""
    if not _probe(subject, "amdgpu_cards", amdgpu.amdgpu_cards):
        return Outcome(SKIP, "no amdgpu GPU", "No card driven by amdgpu: its kernel messages do not apply.")
    log = _kmsg(subject)
    if log.get("error"):
        return Outcome(
            WARN, "kernel log not readable", f"Could not read the kernel log ({log['error']}): recent GPU faults "
            "were not looked for (containers usually may not: kernel.dmesg_restrict=1 needs CAP_SYSLOG).",
            "Look on the host: `sudo dmesg -T | grep -iE 'amdgpu.*(page fault|timeout|reset)'` or "
            f"`journalctl -k --since -24h | grep amdgpu`; or let the container read it: {KERNEL_LOG}.",
        )  # fmt: skip
    now = subject.probes.known("kmsg_now") or amdgpu.seconds_since_boot()
    faults = amdgpu.parse_kmsg(log["records"])
    recent = [f for f in faults if now - f["seconds"] <= RECENT_FAULT_S]
    old = len(faults) - len(recent)
    scanned = f"{len(log['records'])} kernel log records" + (" (stopped at the read limit)" if log.get("truncated")
                                                             else "")  # fmt: skip
    data = {"counts": {}, "older": old, "records": len(log["records"])}
    if not recent:
        history = f"; {old} older amdgpu fault(s) (over 24 h ago)" if old else ""
        return Outcome(PASS, "none in 24 h", f"{scanned}, no amdgpu fault in the last 24 h{history}", data=data)
    counts: dict[str, int] = {}
    for fault in recent:
        counts[fault["kind"]] = counts.get(fault["kind"], 0) + 1
    data["counts"] = counts
    newest = recent[-1]
    ago = (now - newest["seconds"]) / 60
    summary = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items())
    message = f"In the last 24 h: {summary}. Newest ({ago:.0f} min ago): {newest['text'][:200]}"
    if "recovery_failed" in counts:
        return Outcome(FAIL, summary, message,
                       "A GPU did not come back from a reset: training on it fails or hangs. Reboot the node (or "
                       "have the operator reset the GPU) before running here.", data)  # fmt: skip
    return Outcome(WARN, summary, message,
                   "The driver recovered, but the node recently had GPU faults: if this run fails the same way, "
                   "drain the node and report it (page faults usually come from a program's bad memory access; "
                   "repeated ring timeouts and resets from the GPU or its firmware).", data)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
def _supported(target: str, built: set[str], override: str | None) -> bool:
    """Whether the image can run ``target``: built for it, or for its override base with HSA_OVERRIDE_GFX_VERSION
    (``override``: the launch's, rocmft.checks.gpu.current_override) set to match (the same rule gpu-arch applies)."""
    if target in built:
        return True
    base, version = GFX_OVERRIDES.get(target, (None, None))
    return base in built and override == version


@check("gpu-families", "GPUs the image cannot run mapped in", timeout_s=10)
def gpu_families(subject) -> Outcome:
    """From the KFD topology (every GPU of the host, whether mapped into the container or not), the GPUs whose
    render node (/dev/dri/renderD<drm_render_minor>) is mapped into the container and whose gfx target the image
    was not built for. A GPU of a family ROCm no longer supports (gfx8 and older) fails: ROCm's runtime then fails to
    start for every GPU (ROCm/rocm-systems#6883); any other unbuilt target warns (the runtime lists it; work sent to
    it fails). The fix is to map only the supported GPUs' render nodes."""
    record = image_record(subject) or {}
    built = set(str(record.get("pytorch_rocm_arch", "")).replace(";", " ").split())
    if not built:
        return Outcome(SKIP, "no ROCm image", "gfx targets apply to ROCm images only.")
    gpus = _probe(subject, "kfd_gpus", amdgpu.kfd_gpus)
    if gpus is None:
        return Outcome(SKIP, "no KFD topology", "/sys/class/kfd/kfd/topology is not there: no AMD GPU driver.")
    root = _root(subject)
    mapped = [g for g in gpus if g["render"] and (root / g["render"].lstrip("/")).exists()]
    families = sorted({g["target"] for g in gpus})
    override = current_override(subject)[0]
    foreign = [g for g in mapped if not _supported(g["target"], built, override)]
    good = [g for g in mapped if g not in foreign]
    value = f"{len(mapped)} of {len(gpus)} GPU(s) mapped; host has {', '.join(families) or 'none'}"
    data = {"gpus": gpus, "mapped": [g["render"] for g in mapped], "built": sorted(built)}
    if not foreign:
        left = len(gpus) - len(mapped)
        note = f"; {left} GPU(s) of the host not mapped in" if left else ""
        return Outcome(PASS, value, f"every mapped GPU is one the image was built for ({', '.join(sorted(built))})"
                       f"{note}", data=data)  # fmt: skip
    named = "; ".join(f"{g['render']} ({g['target']}, {g['name'] or 'GPU'}, PCI {g['pci']})" for g in foreign)
    keep = " ".join(f"--device {g['render']}" for g in good)
    compose = ", ".join(["/dev/kfd", *(g["render"] for g in good)])
    fix = (f"Map only the GPUs the image runs: docker run --device /dev/kfd {keep} (not --device /dev/dri); compose: "
           f"devices [{compose}]." if good else
           "None of the mapped GPUs is one this image was built for: map the GPU you mean to use, or build an image "
           "for its target (docker/arch/<target>.env).")  # fmt: skip
    legacy = [g for g in foreign if g["major"] < LEGACY_MAJOR]
    if legacy:
        return Outcome(
            FAIL, value, f"Mapped into the container: {named}. With a {legacy[0]['target']} GPU present, ROCm's "
            "runtime fails to start for every GPU (hsa_init: HSA_STATUS_ERROR; ROCm/rocm-systems#6883).", fix, data,
        )  # fmt: skip
    visible = {
        k: v for k, v in subject.plan.settings.environ.items() if k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    }
    shown = ", ".join(f"{k}={v}" for k, v in visible.items())
    hidden = f" ({shown} is set: check it leaves them out)" if visible else ""
    hide = ""
    if good:  # the runtime's indexes of the GPUs to keep (rocmft.facts.gfx.visible_devices)
        keep = visible_devices(mapped, good)
        hide = (f" Or hide the others: ROCR_VISIBLE_DEVICES={keep} (or HIP_VISIBLE_DEVICES={keep} instead, not both: "
                "the second indexes what the first left).")  # fmt: skip
    data["visible_devices"] = visible_devices(mapped, good) if good else None
    return Outcome(
        WARN, value, f"Mapped into the container but not built for by this image ({', '.join(sorted(built))}): "
        f"{named}{hidden}. Work placed on them fails (no kernels for their target).",
        fix + hide, data,
    )  # fmt: skip
