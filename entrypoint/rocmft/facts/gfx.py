"""gfx targets and ``HSA_OVERRIDE_GFX_VERSION``: what an override value means, which card may safely use one, and
what a node mixing GPU families should hide. Pure functions over facts read elsewhere (the KFD topology:
rocmft.facts.amdgpu.kfd_gpus; the device probe; the image's build record); nothing here reads the machine.

``HSA_OVERRIDE_GFX_VERSION=<major>.<minor>.<stepping>`` makes ROCm's runtime (ROCr) report every GPU as that gfx
target, so code built for it is loaded: ``11.0.0`` is gfx1100, ``10.3.0`` gfx1030, ``9.4.2`` gfx942 (the three
numbers in decimal; the target's name prints minor and stepping in hex, as the KFD's gfx_target_version does:
rocmft.facts.amdgpu.gfx_target). Running another target's code is only sound within one family, the targets whose
names differ in the last digit only (gfx1100-gfx1103, gfx1030-gfx1036); outside it the GPU rejects the code
(``HSA_STATUS_ERROR_INVALID_ISA``: a gfx1150 run as 11.0.0, likelovewant/ROCmLibs-for-gfx1103-AMD780M-APU#37) or
crashes (an RX 5700, gfx1010, run as 10.3.0: ROCm/legacy-rocm-build#887).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

OVERRIDE = "HSA_OVERRIDE_GFX_VERSION"
# Consumer cards whose ISA is their family's first member's: the image built for that member runs them when
# HSA_OVERRIDE_GFX_VERSION names it (the value users run every RDNA3/RDNA2 card with: 7800 XT gfx1101 and 7600 XT
# gfx1102 as 11.0.0 in AUTOMATIC1111/stable-diffusion-webui#13534 and #15434; ROCm/bitsandbytes#29 on a 7900 XTX).
# ROCm/ROCmValidationSuite#556: the override runs an unsupported card without any guarantee of correct results,
# which is why rocmft applies it only when asked (ROCMFT_GFX_OVERRIDE=auto) and says so.
SAFE_OVERRIDES: dict[str, tuple[str, str]] = {
    "gfx1101": ("gfx1100", "11.0.0"),
    "gfx1102": ("gfx1100", "11.0.0"),
    "gfx1103": ("gfx1100", "11.0.0"),
    "gfx1031": ("gfx1030", "10.3.0"),
    "gfx1032": ("gfx1030", "10.3.0"),
    "gfx1034": ("gfx1030", "10.3.0"),
    "gfx1035": ("gfx1030", "10.3.0"),
    "gfx1036": ("gfx1030", "10.3.0"),
}
# Instinct (data-centre) GPUs: ROCm ships code for each of them, so an override there replaces a supported
# target with another (docker/arch/gfx90a.env, gfx942.env, gfx950.env; gfx908 MI100).
INSTINCT = {"gfx908": "MI100", "gfx90a": "MI210/MI250", "gfx942": "MI300X/MI325X", "gfx950": "MI350X/MI355X"}
_VALUE = re.compile(r"(\d{1,2})\.(\d{1,2})\.(\d{1,2})")


def base_target(arch: str) -> str:
    """The processor of a gfx target id without its features: ``gfx942:sramecc+:xnack-`` -> ``gfx942``."""
    return arch.split(":")[0].strip()


def override_target(value: str) -> str | None:
    """The gfx target an ``HSA_OVERRIDE_GFX_VERSION`` value makes the runtime report (``"11.0.0"`` -> ``"gfx1100"``,
    ``"9.0.10"`` -> ``"gfx90a"``), or None for a value that is not three dot-separated numbers (minor and stepping
    below 16, as a gfx name has one hex digit each)."""
    match = _VALUE.fullmatch(value.strip())
    if not match:
        return None
    major, minor, stepping = (int(part) for part in match.groups())
    if major < 6 or minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def family(target: str) -> str:
    """A target's family: its name without the last digit (``gfx1101`` -> ``gfx110``, ``gfx1151`` -> ``gfx115``,
    ``gfx942`` -> ``gfx94``, ``gfx90a`` -> ``gfx90``); only within one may an override stand in (module docstring)."""
    return base_target(target)[:-1]


def built_targets(record: Mapping[str, Any] | None) -> set[str]:
    """The gfx targets the image was built for (PYTORCH_ROCM_ARCH of its build record; empty outside one)."""
    return set(str((record or {}).get("pytorch_rocm_arch", "")).replace(";", " ").split())


def override_problems(value: str, targets: Iterable[str], built: set[str]) -> list[tuple[str, str]]:
    """What is wrong with ``HSA_OVERRIDE_GFX_VERSION=value`` on GPUs of ``targets`` (their real targets, from the
    KFD topology), for an image built for ``built``: ``[(severity "fail"|"warn", text)]``, empty when it is sound.

    * not three numbers: fail (the runtime ignores or misreads it);
    * a target of another family than a GPU's: fail (its code is rejected or crashes: module docstring);
    * set on an Instinct GPU, whose own target ROCm supports: warn when it names that same target (it changes
      nothing), fail when it names another (that GPU would run the wrong code);
    * a target the image has no code for: fail.
    """
    seen = override_target(value)
    if seen is None:
        return [("fail", f"{OVERRIDE}={value} is not a gfx version (three numbers, e.g. 11.0.0 for gfx1100)")]
    problems = []
    for target in sorted(set(targets)):
        if family(target) != family(seen):
            problems.append(("fail", f"{OVERRIDE}={value} makes the {target} GPU run {seen} code, of another "
                             f"family ({family(seen)}, not {family(target)})"))  # fmt: skip
        elif target in INSTINCT:
            kind, effect = ("warn", "") if seen == target else ("fail", f": it would run {seen} code")
            problems.append((kind, f"{OVERRIDE}={value} is set on an Instinct {INSTINCT[target]} ({target}), which "
                             f"needs no override{effect}"))  # fmt: skip
    if built and seen not in built and not any(k == "fail" for k, _ in problems):
        problems.append(("fail", f"{OVERRIDE}={value} asks for {seen} code, which this image was not built for "
                         f"({', '.join(sorted(built))})"))  # fmt: skip
    return problems


def safe_override(targets: Iterable[str], built: set[str]) -> str | None:
    """The one ``HSA_OVERRIDE_GFX_VERSION`` value that lets every GPU of ``targets`` run the image's code, or None:
    when each GPU is either built for or has a :data:`SAFE_OVERRIDES` base the image was built for, and not every
    one is built for, all with the same value (an override applies to every GPU of the process)."""
    values, foreign = set(), False
    for target in set(targets):
        if target in built:
            continue
        foreign = True
        base, value = SAFE_OVERRIDES.get(target, (None, None))
        if base not in built:
            return None
        values.add(value)
    if not foreign or len(values) != 1:
        return None
    value = values.pop()
    # the override applies to every GPU, those built for too: each must be the override's own target
    seen = override_target(value)
    return value if all(t == seen or SAFE_OVERRIDES.get(t, ("",))[0] == seen for t in targets) else None


def visible_devices(mapped: Sequence[Mapping[str, Any]], keep: Iterable[Mapping[str, Any]]) -> str:
    """The ``ROCR_VISIBLE_DEVICES`` value that leaves only ``keep`` of the ``mapped`` GPUs: their indexes among the
    mapped GPUs in KFD topology node order, the order ROCr enumerates the GPUs it can open (libhsakmt skips nodes
    whose render node the process cannot open). ``HIP_VISIBLE_DEVICES`` takes the same indexes when ROCR's is
    unset (it indexes what ROCR left: rocmft's rule 44)."""
    ordered = sorted(mapped, key=lambda g: g["node"])
    wanted = {g["node"] for g in keep}
    return ",".join(str(i) for i, g in enumerate(ordered) if g["node"] in wanted)


__all__ = ["INSTINCT", "OVERRIDE", "SAFE_OVERRIDES", "base_target", "built_targets", "family", "override_problems",
           "override_target", "safe_override", "visible_devices"]  # fmt: skip
