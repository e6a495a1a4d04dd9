"""Version skew between the host's driver, the image's ROCm and the libraries, and library versions known to be bad
(issue 30: item 4 and the driver and runtime compatibility check).

* ``driver``: the host's amdgpu kernel driver (/sys/module/amdgpu/version, rocmft.facts.amdgpu.driver_version)
  against the AMD GPU Driver releases AMD supports under the image's ROCm (:data:`DRIVER_SUPPORT`).
* ``rocm-builds``: torch's HIP version against the image's ROCm, the library bitsandbytes would load against
  torch's HIP version, and that library's gfx targets against the GPUs' (rocmft.facts.rocmlibs,
  rocmft.facts.codeobjects: read from the files, never imported into rocmft's process).
* ``library-versions``: the installed versions (importlib.metadata) against :data:`KNOWN_BAD`, each row with its
  public report and the exact version to install.

Facts come through the run's probe provider (``subject.probes``): tests inject them (a fake host is data).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmft.checks import FAIL, PASS, SKIP, WARN, Outcome, check
from rocmft.checks.gpu import current_override, devices_probe, image_record, real_gpu_targets
from rocmft.facts.gfx import OVERRIDE, SAFE_OVERRIDES, override_target
from rocmft.facts.rocmlibs import bitsandbytes_choice, hip_version_of, library_rocm, package_dir

# --- the driver ------------------------------------------------------------------------------------------------
# /sys/module/amdgpu/version of AMD's DKMS driver -> the release it belongs to, each with where that pairing is shown.
DKMS_RELEASES: dict[tuple[int, ...], tuple[str, str]] = {
    (6, 3, 6): ("ROCm 6.0's driver (amdgpu-dkms 6.3.6.60000)", "geohot/amdgpu-dkms#1; ROCm/legacy-rocm-build#2995"),
    (6, 10, 5): ("ROCm 6.3's driver (amdgpu-dkms 6.10.5.60300)", "repo.radeon.com/amdgpu/6.3: amdgpu-dkms "
                 "1:6.10.5.60300-2084815"),
    (6, 12, 12): ("ROCm 6.4's driver (amdgpu 6.12.12)", "ROCm/amdgpu-docs, MI300X partitioning requirements: "
                  "'AMD GPU Driver (amdgpu): version 6.12.12 ... ROCm 6.4'"),
    (6, 14, 14): ("AMD GPU Driver 30.10.x (ROCm 7.0)", "ROCm/amdgpu-docs, MI300X partitioning requirements: amd-smi "
                  "'amdgpu version: 6.14.14  ROCm version: 7.0.1'"),
    (6, 16, 6): ("AMD GPU Driver 30.20.x (ROCm 7.1)", "bottlerocket-os/bottlerocket-kernel-kit#326 (30.20.1 is "
                 "amdgpu-dkms 6.16.6); ROCm/legacy-rocm-build#5624 (ROCm 7.1.1: 'amdgpu version: 6.16.6')"),
}  # fmt: skip


@dataclass(frozen=True)
class DriverSupport:
    """The drivers AMD supports under one ROCm user space: ``drivers`` in words, ``oldest`` the lowest
    /sys/module/amdgpu/version among them (a DKMS_RELEASES key), ``source`` where AMD says so."""

    drivers: str
    oldest: tuple[int, ...]
    source: str


# Read 2026-12-03. ROCm 7.2.2's release notes list, for every Instinct GPU, the AMD GPU Driver 30.30.x, 30.20.x and
# 30.10.x; AMD's driver compatibility matrix: "The AMD GPU Driver (amdgpu) 30.30.x is compatible with ROCm 7.2.x,
# 7.1.x, 7.0.x, 6.4.x, and 6.3.x" (ROCm/amdgpu-docs docs/compatibility/compatibility-matrix.rst, PR #97), so a newer
# driver serves older user space and the bound that matters is the oldest driver.
DRIVER_SUPPORT: dict[tuple[int, int], DriverSupport] = {
    (7, 2): DriverSupport(
        "AMD GPU Driver 30.10.x, 30.20.x or 30.30.x", (6, 14, 14),
        "https://github.com/ROCm/legacy-rocm-build/releases/tag/rocm-7.2.2 and "
        "https://rocm.docs.amd.com/projects/install-on-linux/en/latest/reference/user-kernel-space-compat-matrix.html "
        "(read 2026-12-03)",
    ),
}  # fmt: skip


def _version_tuple(text: str) -> tuple[int, ...] | None:
    parts = text.strip().split(".")
    return tuple(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None


def _root(subject) -> Path:
    return Path(subject.probes.known("node_root", "/"))


@check("driver", "host amdgpu driver against the image's ROCm", timeout_s=10)
def driver(subject) -> Outcome:
    """The host's amdgpu driver (/sys/module/amdgpu/version: the DKMS driver's number) against the oldest AMD GPU
    Driver AMD supports under the image's ROCm (:data:`DRIVER_SUPPORT`): older **warns** with the supported range and
    its source (AMD tests +/- a few releases; outside them the runtime may work, but nobody tested it: unsloth#10657's
    ROCm 7.14 host failed every run with ROCm 7.2 wheels). The kernel's own (in-tree) driver has no version file: it
    passes, named. No ROCm image or no amdgpu driver skips."""
    from rocmft.facts import amdgpu

    rocm = hip_version_of(str((image_record(subject) or {}).get("rocm_version") or ""))
    if rocm is None:
        return Outcome(SKIP, "no ROCm image", "The driver is compared with a ROCm image's user space.")
    facts = subject.probes.get("amdgpu_driver", lambda: amdgpu.driver_version(_root(subject)))
    if not facts.get("loaded"):
        return Outcome(SKIP, "no amdgpu driver", "/sys/module/amdgpu is not there: no AMD GPU driver is loaded.")
    version = facts.get("version")
    if version is None:
        return Outcome(PASS, f"in-tree (kernel {facts.get('kernel') or '?'})",
                       "The kernel's own amdgpu driver (no /sys/module/amdgpu/version): AMD's matrix lists its DKMS "
                       "driver; the kernel's is as new as the kernel.", data=facts)  # fmt: skip
    support = DRIVER_SUPPORT.get(rocm)
    known = DKMS_RELEASES.get(_version_tuple(version) or ())
    named = f"amdgpu {version}" + (f", {known[0]}" if known else "")
    if support is None:
        return Outcome(SKIP, named, f"rocmft has no compatibility row for ROCm {rocm[0]}.{rocm[1]}.", data=facts)
    parsed = _version_tuple(version)
    if parsed is None or parsed >= support.oldest:
        how = "is" if parsed is not None else "cannot be compared (not dotted numbers), assumed"
        return Outcome(PASS, named, f"{how} at least the oldest driver for ROCm {rocm[0]}.{rocm[1]} "
                       f"({support.drivers}; {support.source})", data=facts)  # fmt: skip
    return Outcome(
        WARN, named,
        f"The host runs amdgpu {version}" + (f" ({known[0]})" if known else "") + f", older than the drivers AMD "
        f"supports under this image's ROCm {rocm[0]}.{rocm[1]}: {support.drivers} (amdgpu "
        f"{'.'.join(map(str, support.oldest))} or newer; {support.source}).",
        f"On the host, install one of them ({support.drivers}: amdgpu-install from repo.radeon.com, then reboot so "
        "that the module is reloaded), or run an image of the host's ROCm.",
        data=facts,
    )  # fmt: skip


# --- the libraries' ROCm builds ------------------------------------------------------------------------------------
def _bnb_facts(subject) -> dict[str, Any]:
    """bitsandbytes' package folder and the library it would load under torch's HIP version in the run's
    environment (BNB_ROCM_VERSION honoured), with that library's gfx targets when it exists; measured once
    (``bnb_library``), never by importing bitsandbytes."""
    from rocmft.facts.codeobjects import CodeObjectError, gfx_targets

    def measure() -> dict[str, Any]:
        hip = hip_version_of(str(devices_probe(subject).get("hip") or ""))
        package = package_dir("bitsandbytes")
        if package is None or hip is None:
            return {"package": str(package) if package else None, "library": None}
        library, how = bitsandbytes_choice(package, hip, subject.plan.settings.environ)
        facts: dict[str, Any] = {"package": str(package), "library": library.name, "how": how,
                                 "exists": library.is_file(), "available": sorted(
                                     p.name for p in package.glob("libbitsandbytes_rocm*.so"))}  # fmt: skip
        if library.is_file():
            try:
                facts["targets"] = sorted(gfx_targets(library))
            except (CodeObjectError, ImportError) as err:  # unreadable bundles, or no zstandard/pyelftools here
                facts["targets_error"] = str(err)
        return facts

    return subject.probes.get("bnb_library", measure)


def _torch_skew(record: dict[str, Any], probe: dict[str, Any]) -> tuple[str, str] | None:
    """torch's HIP version against the image's ROCm: the problem and its fix, or None."""
    image, torch_hip = (
        hip_version_of(str(record.get("rocm_version") or "")),
        hip_version_of(str(probe.get("hip") or "")),
    )
    if image is None or torch_hip is None or image == torch_hip:
        return None
    pinned = (record.get("versions") or {}).get("torch", "the image's torch")
    index = record.get("torch_index_url") or "the image's TORCH_INDEX_URL"
    return (f"torch {probe.get('torch')} is built for ROCm {torch_hip[0]}.{torch_hip[1]} (torch.version.hip "
            f"{probe.get('hip')}), but this image's ROCm libraries, and the bitsandbytes, flash-attention and "
            f"DeepSpeed ops built against them, are {image[0]}.{image[1]}: two ROCm runtimes in one process",
            f"pip install torch=={pinned} --index-url {index} (the image's torch), or rebuild: make image "
            f"ARCH={record.get('arch')}")  # fmt: skip


def _bnb_skew(bnb: dict[str, Any], torch_hip: tuple[int, int], needed: str | None) -> tuple[str, str, str] | None:
    """The library bitsandbytes loads against torch's HIP version: (severity, problem, fix) or None."""
    if not bnb.get("library"):
        return None
    severity = FAIL if needed else WARN
    wanted = f"libbitsandbytes_rocm{torch_hip[0]}{torch_hip[1]}.so"
    built = library_rocm(Path(bnb["library"]))
    fix = (f"use the image's torch and bitsandbytes together (docker/lock/), install a bitsandbytes that ships "
           f"{wanted}, or build it for this ROCm (BITSANDBYTES=source in docker/arch/<arch>.env)")  # fmt: skip
    if not bnb.get("exists"):
        return (severity, f"bitsandbytes would load {bnb['library']} ({bnb['how']}), which is not there (it has: "
                f"{', '.join(bnb.get('available') or []) or 'none'})", fix)  # fmt: skip
    if built == torch_hip:
        return None
    return (severity, f"bitsandbytes loads {bnb['library']} (ROCm {built[0]}.{built[1]}: {bnb['how']}) under torch's "
            f"HIP {torch_hip[0]}.{torch_hip[1]}: a library built for another ROCm in the same process (it crashed "
            f"training with SIGSEGV in unslothai/unsloth#10273)", fix)  # fmt: skip


def _bnb_targets(subject, bnb: dict[str, Any], needed: str) -> tuple[str, str] | None:
    """The bitsandbytes library's gfx targets against the GPUs' (as the runtime will load code: under the override,
    the override's target): (problem, fix) naming both, or None."""
    targets = bnb.get("targets")
    if not targets:
        return None
    real = sorted(set(real_gpu_targets(subject)))
    value, who = current_override(subject)
    seen = override_target(value) if value else None
    loaded = sorted({seen} if seen else set(real))
    missing = [t for t in loaded if t not in targets]
    if not missing:
        return None
    detected = ", ".join(real) + (f" (run as {seen} by {OVERRIDE}={value}, {who})" if seen else "")
    safe = [SAFE_OVERRIDES[t] for t in real if t in SAFE_OVERRIDES and SAFE_OVERRIDES[t][0] in targets]
    build = (f"build bitsandbytes for {', '.join(missing)}: BITSANDBYTES=source in docker/arch/<arch>.env (cmake "
             f"-DCOMPUTE_BACKEND=hip -DBNB_ROCM_ARCH={';'.join(missing)}), or unset QUANTIZATION_BIT")  # fmt: skip
    if safe and not seen:
        build = f"ROCMFT_GFX_OVERRIDE=auto or {OVERRIDE}={safe[0][1]} runs the {safe[0][0]} code it has; or {build}"
    fix = build
    return (f"{needed} needs bitsandbytes' GPU code, but {bnb['library']} has none for {', '.join(missing)}: the GPU "
            f"is {detected}; the library has {', '.join(targets)}", fix)  # fmt: skip


@check("rocm-builds", "libraries' ROCm builds against torch's and the image's", timeout_s=30)
def rocm_builds(subject) -> Outcome:
    """In a ROCm image, the ROCm builds in one process agree:

    * torch's HIP version (torch.version.hip, from the device probe) is the image's ROCm (the build record's
      rocm_version): else **fail** with the pip line for the image's torch (unsloth#10657: torch for ROCm 7.2 on a
      ROCm 7.14 system failed every fine-tuning run);
    * the library bitsandbytes loads (its own choice, BNB_ROCM_VERSION honoured: rocmft.facts.rocmlibs) is built for
      torch's HIP version: else **fail** when QUANTIZATION_BIT needs it, **warn** otherwise (unslothai/unsloth#10273:
      bitsandbytes' ROCm 6.4 library under torch's HIP 6.1 crashed training with SIGSEGV);
    * with QUANTIZATION_BIT, that library has code for the GPUs' gfx target (the override's where one is set): else
      **fail** naming the detected target and the library's targets (bitsandbytes-foundation/bitsandbytes#1955,
      ROCm/bitsandbytes#29: "invalid device function" on a target the library lacks).
    """
    record = image_record(subject) or {}
    probe = devices_probe(subject)
    if probe.get("backend") != "rocm" or not record.get("rocm_version") or record.get("rocm_version") == "none":
        return Outcome(SKIP, probe.get("backend", "?"), "ROCm builds are compared in a ROCm image only.")
    torch_hip = hip_version_of(str(probe.get("hip") or ""))
    if torch_hip is None:
        return Outcome(SKIP, "no torch.version.hip", "The device probe reported no HIP version.")
    bits = subject.plan.arguments.get("quantization_bit")
    needed = f"QUANTIZATION_BIT={bits}" if bits else None
    problems: list[tuple[str, str, str]] = []
    if skew := _torch_skew(record, probe):
        problems.append((FAIL, *skew))
    bnb = _bnb_facts(subject)
    if skew := _bnb_skew(bnb, torch_hip, needed):
        problems.append(skew)
    elif needed and (gap := _bnb_targets(subject, bnb, needed)):
        problems.append((FAIL, *gap))
    value = f"torch HIP {torch_hip[0]}.{torch_hip[1]}" + (f", {bnb['library']}" if bnb.get("library") else "")
    data = {"torch_hip": probe.get("hip"), "image_rocm": record.get("rocm_version"), "bitsandbytes": bnb}
    if not problems:
        return Outcome(PASS, value, f"torch, the image (ROCm {record.get('rocm_version')}) and bitsandbytes agree",
                       data=data)  # fmt: skip
    status = FAIL if any(s == FAIL for s, _, _ in problems) else WARN
    return Outcome(status, value, "; ".join(p for _, p, _ in problems) + ".",
                   "; ".join(dict.fromkeys(f for _, _, f in problems)) + ".", data)  # fmt: skip


# --- known-bad library versions -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KnownBad:
    """A version range of a distribution that works but is wrong for this stack.

    Attributes:
        distribution: the name importlib.metadata knows it by.
        bad: the bad versions, a PEP 440 specifier set (packaging.specifiers.SpecifierSet).
        install: the exact version to install instead (the one rocmft's images pin or build).
        needed_by: the probe name of rocmft.checks.system.needed_libraries that makes it matter to this run ("fa2",
            "bnb"): a bad version then **fails**; otherwise it **warns**.
        rocm_only: the row applies only under a ROCm torch.
        why: what goes wrong, in words; source: the public report.
    """

    distribution: str
    bad: str
    install: str
    needed_by: str
    rocm_only: bool
    why: str
    source: str


KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(
        "flash-attn", "<2.1.0", "flash-attn==2.8.3", "fa2", False,
        "before 2.1.0 its causal mask is aligned top-left, so it is right only when the query and key lengths are "
        "equal or the query is one token (ROCm's own fork stopped at 2.0.4); transformers refuses it for "
        "FLASH_ATTN=fa2 only once the model loads",
        "hiyouga/LlamaFactory#3464 (\"you need flash_attn package version to be greater or equal than 2.1.0. Detected "
        "version 2.0.4\"), Dao-AILab/flash-attention#965, turboderp-org/exllamav2#397",
    ),
    KnownBad(
        "bitsandbytes", "<=0.49.2", "bitsandbytes==0.50.2", "bnb", True,
        "its 4-bit GEMV kernel is broken on every ROCm target (warp-64 CDNA and RDNA3 alike: half the output never "
        "written), fixed by bitsandbytes PR #1887 after 0.49.2",
        "unslothai/unsloth#4954",
    ),
)  # fmt: skip


def installed_versions() -> dict[str, str]:
    """The installed version of each KNOWN_BAD distribution (importlib.metadata; absent ones left out)."""
    from importlib import metadata

    found = {}
    for row in KNOWN_BAD:
        try:
            found[row.distribution] = metadata.version(row.distribution)
        except metadata.PackageNotFoundError:
            continue
    return found


@check("library-versions", "library versions known to be bad", timeout_s=10)
def library_versions(subject) -> Outcome:
    """Each installed distribution of :data:`KNOWN_BAD` outside its bad range: a bad version **fails** when the
    configuration uses it (FLASH_ATTN=fa2, QUANTIZATION_BIT: rocmft.checks.system.needed_libraries), else **warns**;
    each names the installed version, the exact version to install, and the row's public report."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    from rocmft.checks.system import needed_libraries

    versions = subject.probes.get("library_versions", installed_versions)
    rocm = devices_probe(subject).get("backend") == "rocm"
    needs = needed_libraries(subject)
    bad = []
    for row in KNOWN_BAD:
        installed = versions.get(row.distribution)
        if installed is None or (row.rocm_only and not rocm):
            continue
        try:
            hit = Version(installed) in SpecifierSet(row.bad)
        except (InvalidVersion, InvalidSpecifier):
            continue  # a local build's version string: not comparable, not judged
        if hit:
            setting = needs.get(row.needed_by)
            bad.append((FAIL if setting else WARN, f"{row.distribution} {installed} ({row.bad}: {row.why}"
                        + (f"; {setting} uses it" if setting else "") + f"; {row.source})", row.install))  # fmt: skip
    shown = ", ".join(f"{name} {version}" for name, version in sorted(versions.items())) or "none installed"
    if not bad:
        return Outcome(PASS, shown, f"no installed version is in a known-bad range ({len(KNOWN_BAD)} rows)")
    status = FAIL if any(s == FAIL for s, _, _ in bad) else WARN
    pins = " ".join(f"'{i}'" for _, _, i in bad)
    return Outcome(status, shown, "; ".join(text for _, text, _ in bad) + ".",
                   f"pip install {pins} (the versions rocmft's images pin; on ROCm flash-attn builds from source: "
                   "docker/steps/flash-attn.sh, or rebuild the image with make image).",
                   {"versions": versions})  # fmt: skip


__all__ = ["DKMS_RELEASES", "DRIVER_SUPPORT", "KNOWN_BAD", "DriverSupport", "KnownBad", "driver", "installed_versions",
           "library_versions", "rocm_builds"]  # fmt: skip
