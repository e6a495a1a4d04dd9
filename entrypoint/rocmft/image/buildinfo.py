"""The image build's check and its build record, run once as the last step of an image build.

``python -m rocmft.image.buildinfo /etc/rocmft/arch.env /etc/rocmft/build.json`` checks, without a GPU, that the
installed image keeps what its architecture profile (docker/arch/<ARCH>.env) promises, and fails the build
listing every broken promise. It inspects the artefacts themselves: the code objects inside the HIP libraries
(rocmft.facts.codeobjects), the distributions pip installed, DeepSpeed's own install record. Each check:

* ``python``: the interpreter is the profile's PYTHON_VERSION (the lock was resolved for it);
* ``torch``: torch/torchvision/torchaudio import; a ROCm image's torch is the HIP build of the profile's
  ROCM_VERSION, and its ``libtorch_hip.so`` carries code for the gfx target (PYTORCH_ROCM_ARCH);
* ``cuda-wheels``: no ``nvidia-*`` or ``cuda-*`` distribution where the profile forbids them;
* ``triton``: in a ROCm image, no PyPI ``triton`` distribution beside triton-rocm (both own ``triton/``);
* ``bitsandbytes``: the library bitsandbytes will load for the image's HIP version carries the gfx target, and
  its shared-library dependencies resolve (``ldd``);
* ``deepspeed``: DeepSpeed was installed for the profile's accelerator (DS_ACCELERATOR), its DS_BUILD_OPS_LIST
  ops are prebuilt and carry the gfx target, and none of its CPU ops is prebuilt (they would carry the build
  host's -march=native);
* ``flash-attn``: the backend's import switch is in the image's environment, flash_attn imports, and a
  Composable Kernel build carries the gfx target;
* ``liger-kernel`` and ``imports`` (LLaMA-Factory, rocmft's CLI) import;
* ``steps``: every build step ran (docker/steps/lib.sh records them).

In a rehearsal (the profile's REHEARSAL=1 build against a stand-in base, ``make rehearse``) the checks whose
inputs the build could not install are skipped with the reason; the rest run as in a real build.

The build record (JSON: architecture, ROCm version, base image, package versions, git commit, date, the steps
and the checks) is what ``rocmft env`` prints and every run's manifest includes.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import importlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from rocmft.facts.image import ARCH_PROFILE, read_profile
from rocmft.facts.rocmlibs import bitsandbytes_library, hip_version_of

# What each build step did (docker/steps/lib.sh appends one JSON object per line).
STEP_LOG = Path("/etc/rocmft/build-steps.jsonl")
# DeepSpeed's ops built by TorchCPUOpBuilder, with the build host's -march=native (DeepSpeed 0.18.4: the builders
# of op_builder/{async_io,cpu_adagrad,cpu_adam,cpu_lion,dc,gds}.py; builder.py cpu_arch(); SIGILL on another CPU:
# deepspeedai/DeepSpeed#1886). Never prebuilt.
DEEPSPEED_CPU_OPS = ("async_io", "cpu_adagrad", "cpu_adam", "cpu_lion", "dc", "gds")

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"


@dataclass(frozen=True)
class Check:
    """One build check's outcome: ``status`` is pass, fail or skipped; ``detail`` says what was seen or why."""

    name: str
    status: str
    detail: str


# Every key a profile must have, with the values it may take (None: free text, checked by the rules below).
# One schema for all: make image/rehearse, the lock and the build check validate against it (validate_profile).
PROFILE_KEYS: dict[str, tuple[str, ...] | None] = {
    "ARCH": None, "GPU_FAMILY": None, "BASE_IMAGE": None, "BASE_DIGEST": None, "PYTHON_VERSION": None,
    "ROCM_VERSION": None, "LOCK": None, "TORCH_INDEX_URL": None, "TORCH_IS_HIP": ("0", "1"),
    "NVIDIA_WHEELS": ("allowed", "forbidden"), "PYTORCH_ROCM_ARCH": None, "BITSANDBYTES": ("wheel", "source", "none"),
    "LIGER_KERNEL": ("install", "none"), "FLASH_ATTN_BACKEND": ("ck", "triton", "none"),
    "DS_ACCELERATOR": ("cuda", "cpu"), "DS_BUILD_OPS_LIST": None, "RCCL_BUSBW_FLOOR_GBPS": None,
    "FULL_NODE_GPUS": None, "SERVE_IMAGE": None,
}  # fmt: skip
# flash-attention 2.8.3's setup.py (validate_and_update_archs) accepts only these for its Composable Kernel backend
FLASH_ATTN_CK_TARGETS = ("gfx90a", "gfx942", "gfx950")


def validate_profile(path: Path) -> list[str]:
    """What is wrong with the architecture profile ``path``, each a sentence naming the key and the fix; empty
    when it is usable. Checks: every key of :data:`PROFILE_KEYS` present with an allowed value, ARCH the file's
    name, SERVE_IMAGE empty on cpu (make serve-image builds that one) and set on ROCm (it pulls that one; ``none``
    where no vLLM image is published for the target, which make serve-image refuses with exit 2), and in a
    ROCm profile the four spellings of its ROCm version agreeing (ROCM_VERSION, the base image's tag,
    TORCH_INDEX_URL, LOCK), a gfx target, and a CK flash-attention backend only on a target flash-attn has."""
    try:
        profile = read_profile(path)
    except (OSError, UnicodeDecodeError) as err:
        return [f"{path}: cannot read it ({err})"]
    problems = [f"{path}: {key} is missing (every profile names it: see docker/arch/cpu.env)"
                for key in PROFILE_KEYS if key not in profile]  # fmt: skip
    for key, allowed in PROFILE_KEYS.items():
        if allowed and key in profile and profile[key] not in allowed:
            problems.append(f"{path}: {key}={profile[key]} is not one of {', '.join(allowed)}")
    if problems:
        return problems
    get = profile.get
    if get("ARCH") != path.stem and path.name != ARCH_PROFILE.name:  # the image's copy is arch.env
        problems.append(f"{path}: ARCH={get('ARCH')} but the file is {path.name}: name the file docker/arch/<ARCH>.env")
    if get("BASE_DIGEST") and not re.fullmatch(r"sha256:[0-9a-f]{64}", get("BASE_DIGEST")):
        problems.append(f"{path}: BASE_DIGEST={get('BASE_DIGEST')} is not a sha256:<64 hex> digest (make pin-bases)")
    for key in ("RCCL_BUSBW_FLOOR_GBPS", "FULL_NODE_GPUS"):
        if not re.fullmatch(r"\d+(\.\d+)?", get(key)):
            problems.append(f"{path}: {key}={get(key)} is not a number")
    rocm = get("ROCM_VERSION")
    if rocm == "none":
        if get("TORCH_IS_HIP") != "0":
            problems.append(f"{path}: ROCM_VERSION=none needs TORCH_IS_HIP=0")
        if get("SERVE_IMAGE"):
            problems.append(
                f"{path}: SERVE_IMAGE={get('SERVE_IMAGE')} on the cpu flavour: leave it empty "
                "(make serve-image ARCH=cpu builds rocmft-serve:cpu from docker/serve/Dockerfile.cpu)"
            )
        return problems
    if not get("SERVE_IMAGE"):
        problems.append(
            f"{path}: SERVE_IMAGE is empty: name the vLLM ROCm image for {get('ARCH')} "
            "(make serve-image pulls it; see docker/arch/gfx942.env), or none where no published image is known "
            "(see docker/arch/gfx1201.env)"
        )
    spellings = {
        "the base image's tag": re.search(rf":{re.escape(rocm)}[.-]", get("BASE_IMAGE")) is not None,
        "TORCH_INDEX_URL": get("TORCH_INDEX_URL").rstrip("/").endswith(f"rocm{rocm}"),
        "LOCK": get("LOCK") == f"docker/lock/rocm{rocm}.txt",
    }
    together = f"BASE_IMAGE={get('BASE_IMAGE')}, TORCH_INDEX_URL={get('TORCH_INDEX_URL')}, LOCK={get('LOCK')}"
    for name, agrees in spellings.items():
        if not agrees:
            problems.append(f"{path}: {name} does not say ROCm {rocm} (ROCM_VERSION): {together}; change them together")
    if get("TORCH_IS_HIP") != "1" or get("NVIDIA_WHEELS") != "forbidden":
        problems.append(f"{path}: a ROCm profile needs TORCH_IS_HIP=1 and NVIDIA_WHEELS=forbidden")
    if not get("PYTORCH_ROCM_ARCH"):
        problems.append(f"{path}: PYTORCH_ROCM_ARCH is empty: name the gfx target (e.g. gfx942)")
    targets = set(get("PYTORCH_ROCM_ARCH").split(";"))
    if get("FLASH_ATTN_BACKEND") == "ck" and not targets <= set(FLASH_ATTN_CK_TARGETS):
        supported = ", ".join(FLASH_ATTN_CK_TARGETS)
        problems.append(f"{path}: FLASH_ATTN_BACKEND=ck supports {supported} only (flash-attn 2.8.3's setup.py), "
                        f"not {get('PYTORCH_ROCM_ARCH')}: use triton or none")  # fmt: skip
    return problems


def _distribution_names() -> set[str]:
    """Installed distributions by normalized name (PEP 503: ``liger_kernel`` is ``liger-kernel``)."""
    return {re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() for d in metadata.distributions()}


def _package_dir(module: str) -> Path | None:
    """Where an installed package's files are, found without importing it (bitsandbytes' import needs torch)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).parent if spec and spec.origin else None


def unresolved_libraries(library: Path) -> list[str]:
    """The shared libraries ``library`` needs that the dynamic loader does not find here (``ldd``'s "not found")."""
    try:
        result = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [f"(ldd did not run: {err})"]
    return [line.split("=>")[0].strip() for line in result.stdout.splitlines() if "not found" in line]


def _gfx_check(name: str, library: Path, gfx: str, remedy: str) -> Check:
    """Whether ``library``'s code objects include every target of ``gfx`` (PYTORCH_ROCM_ARCH: ``gfx942``, or
    ``gfx90a;gfx942``), by rocmft.image.codeobjects; ``remedy`` is added to a failure."""
    from rocmft.facts.codeobjects import CodeObjectError, gfx_targets

    wanted = [target for target in gfx.split(";") if target]
    try:
        targets = gfx_targets(library)
    except CodeObjectError as err:
        return Check(name, FAIL, f"{err}. {remedy}")
    missing = [target for target in wanted if target not in targets]
    if wanted and not missing:
        return Check(name, PASS, f"{library.name} has {', '.join(wanted)} code (of {len(targets)} targets)")
    return Check(name, FAIL, f"{library.name} has no {', '.join(missing) or 'PYTORCH_ROCM_ARCH'} code; it has "
                             f"{', '.join(sorted(targets))}. {remedy}")  # fmt: skip


def check_torch(profile: dict[str, str]) -> list[Check]:
    """torch imports, is the profile's HIP build, and carries the gfx target (``libtorch_hip.so``)."""
    hip_image = profile.get("TORCH_IS_HIP") == "1"
    try:
        import torch

        for name in ("torchvision", "torchaudio"):
            importlib.import_module(name)
    except Exception as err:
        return [Check("torch", FAIL, f"the torch triple does not import: {type(err).__name__}: {err}")]
    if not hip_image:
        return [Check("torch", PASS, f"torch {torch.__version__} (CUDA {torch.version.cuda}, runs on the CPU)")]
    if not torch.version.hip:
        return [Check("torch", FAIL, f"torch {torch.__version__} is not the HIP build (torch.version.hip is empty); "
                                     f"check TORCH_INDEX_URL={profile.get('TORCH_INDEX_URL')}")]  # fmt: skip
    if hip_version_of(torch.version.hip) != hip_version_of(profile.get("ROCM_VERSION", "")):
        return [Check("torch", FAIL, f"torch {torch.__version__} is built for HIP {torch.version.hip}, the profile "
                                     f"says ROCM_VERSION={profile.get('ROCM_VERSION')}")]  # fmt: skip
    checks = [Check("torch", PASS, f"torch {torch.__version__}, HIP {torch.version.hip}")]
    library = Path(torch.__file__).parent / "lib" / "libtorch_hip.so"
    checks.append(_gfx_check("torch-gfx", library, profile.get("PYTORCH_ROCM_ARCH", ""),
                             f"Use a torch index whose wheels support this GPU (TORCH_INDEX_URL in docker/arch/"
                             f"{profile.get('ARCH')}.env)."))  # fmt: skip
    return checks


# Name prefixes of the CUDA runtime's distributions. PyPI's torch 2.11.0 (Linux x86_64 wheel, its Requires-Dist)
# requires both kinds: ``cuda-toolkit[cublas,cudart,...]==13.0.2`` and ``cuda-bindings>=13.0.3,<14`` (which brings
# ``cuda-pathfinder``) besides ``nvidia-cudnn-cu13``, ``nvidia-nccl-cu13`` and the like; NVIDIA's own packages
# (cuda-python, cuda-core) share the prefix. docker/lock/rocm_lock.py drops the same names from the ROCm lock.
CUDA_PREFIXES = ("nvidia-", "cuda-")


def check_cuda_wheels(profile: dict[str, str]) -> Check:
    """No ``nvidia-*`` or ``cuda-*`` distribution (:data:`CUDA_PREFIXES`, PEP 503 names) where the profile forbids
    them (``NVIDIA_WHEELS=forbidden``): they are CUDA's runtime, which a ROCm image must not carry."""
    if profile.get("NVIDIA_WHEELS") != "forbidden":
        return Check("cuda-wheels", PASS, "allowed by the profile (NVIDIA_WHEELS=allowed)")
    cuda = sorted(name for name in _distribution_names() if name.startswith(CUDA_PREFIXES))
    if cuda:
        return Check("cuda-wheels", FAIL, f"CUDA wheels slipped into a ROCm image: {', '.join(cuda)}")
    return Check("cuda-wheels", PASS, "no nvidia-* or cuda-* distribution")


def check_triton(profile: dict[str, str]) -> Check:
    """In a ROCm image, PyPI's ``triton`` (CUDA's) must not be installed: triton-rocm and it both own ``triton/``
    and the last one installed wins, silently (liger-kernel requires plain ``triton``)."""
    if profile.get("TORCH_IS_HIP") != "1":
        return Check("triton", PASS, "not a ROCm image")
    names = _distribution_names()
    if "triton" in names:
        beside = " beside triton-rocm" if "triton-rocm" in names else ""
        return Check("triton", FAIL, f"PyPI's triton {metadata.version('triton')} (a CUDA build) is installed{beside}: "
                     "something required `triton`; install it with --no-deps (docker/steps/target.sh)")  # fmt: skip
    present = "triton-rocm " + metadata.version("triton-rocm") if "triton-rocm" in names else "no triton at all"
    return Check("triton", PASS, f"no PyPI triton ({present})")


def check_bitsandbytes(profile: dict[str, str], hip: tuple[int, int] | None, hip_source: str) -> list[Check]:
    """The library bitsandbytes loads for HIP ``hip`` carries the gfx target, and its dependencies resolve."""
    package = _package_dir("bitsandbytes")
    if package is None:
        return [Check("bitsandbytes", FAIL, "bitsandbytes is not installed (BITSANDBYTES in the profile)")]
    if hip is None:
        return [Check("bitsandbytes", FAIL, f"no HIP version to choose bitsandbytes' library by ({hip_source})")]
    library = bitsandbytes_library(package, hip)
    if library is None:
        found = ", ".join(sorted(p.name for p in package.glob("libbitsandbytes_rocm*.so"))) or "none"
        detail = (f"bitsandbytes has no library for ROCm {hip[0]}.{hip[1]} (libbitsandbytes_rocm*.so: {found}). "
                  f"Build it from source: BITSANDBYTES=source in docker/arch/{profile.get('ARCH')}.env.")  # fmt: skip
        return [Check("bitsandbytes", FAIL, detail)]
    gfx = _gfx_check(
        "bitsandbytes",
        library,
        profile.get("PYTORCH_ROCM_ARCH", ""),
        f"Build it from source for the target: BITSANDBYTES=source in docker/arch/{profile.get('ARCH')}.env.",
    )
    gfx = Check(gfx.name, gfx.status, f"{gfx.detail}; chosen for HIP {hip[0]}.{hip[1]} ({hip_source})")
    missing = unresolved_libraries(library)
    if not missing:
        return [gfx, Check("bitsandbytes-libs", PASS, f"every library {library.name} needs resolves")]
    detail = (f"{library.name} needs {', '.join(missing)}, not found here: the base lacks ROCm {hip[0]}.{hip[1]}'s "
              "hipBLAS/hipBLASLt (BASE_IMAGE and ROCM_VERSION must match)")  # fmt: skip
    return [gfx, Check("bitsandbytes-libs", FAIL, detail)]


def _deepspeed_record(package: Path) -> dict[str, Any]:
    """DeepSpeed's install record (git_version_info_installed.py: installed_ops, accelerator_name), read as
    literals: importing deepspeed imports torch."""
    record = {}
    source = (package / "git_version_info_installed.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            record[node.targets[0].id] = ast.literal_eval(node.value)
    return record


def check_deepspeed(profile: dict[str, str], rehearsal: bool) -> list[Check]:
    """DeepSpeed was installed for DS_ACCELERATOR, with DS_BUILD_OPS_LIST prebuilt for the gfx target and no CPU op."""
    package = _package_dir("deepspeed")
    if package is None or not (package / "git_version_info_installed.py").is_file():
        return [Check("deepspeed", FAIL, "DeepSpeed is not installed, or without its install record")]
    try:
        record = _deepspeed_record(package)
    except (OSError, SyntaxError, ValueError) as err:
        return [Check("deepspeed", FAIL, f"cannot read DeepSpeed's install record: {err}")]
    wanted = profile.get("DS_ACCELERATOR", "")
    accelerator = record.get("accelerator_name", "")
    checks = [
        Check("deepspeed", PASS, f"installed for the {accelerator} accelerator") if accelerator == wanted else Check(
            "deepspeed", FAIL, f"DeepSpeed was installed for the '{accelerator}' accelerator, not DS_ACCELERATOR="
            f"{wanted}: its prebuilt ops would be refused on the GPU and JIT-compiled at first use "
            "(set DS_ACCELERATOR while DeepSpeed installs, deepspeedai/DeepSpeed#7011)")
    ]  # fmt: skip
    ops = record.get("installed_ops", {})
    cpu_ops = [op for op in DEEPSPEED_CPU_OPS if ops.get(op)]
    if cpu_ops:
        checks.append(Check("deepspeed-cpu-ops", FAIL, f"CPU ops prebuilt with the build host's -march=native: "
                            f"{', '.join(cpu_ops)} (take them out of DS_BUILD_OPS_LIST)"))  # fmt: skip
    else:
        checks.append(Check("deepspeed-cpu-ops", PASS, "none prebuilt (they JIT on the host that runs them)"))
    wanted_ops = [op.lower() for op in profile.get("DS_BUILD_OPS_LIST", "").split()]
    if not wanted_ops:
        return checks
    if rehearsal:
        return [*checks, Check("deepspeed-ops", SKIPPED, f"needs torch to compile {', '.join(wanted_ops)}")]
    missing = [op for op in wanted_ops if not ops.get(op)]
    if missing:
        return [*checks, Check("deepspeed-ops", FAIL, f"not prebuilt: {', '.join(missing)} (installed_ops: {ops}); "
                                                      "the deepspeed step's build log says why")]  # fmt: skip
    checks.append(Check("deepspeed-ops", PASS, f"prebuilt: {', '.join(wanted_ops)}"))
    gfx = profile.get("PYTORCH_ROCM_ARCH", "")
    if gfx:
        for op in wanted_ops:
            built = sorted((package / "ops").rglob(f"{op}_op*.so"))
            if built:
                remedy = "DeepSpeed compiles for PYTORCH_ROCM_ARCH: see the deepspeed step's log."
                checks.append(_gfx_check(f"deepspeed-{op}-gfx", built[0], gfx, remedy))
            else:
                checks.append(Check(f"deepspeed-{op}-gfx", FAIL, f"no compiled {op}_op*.so under {package / 'ops'}"))
    return checks


def check_flash_attn_env(profile: dict[str, str], environ: dict[str, str] | None = None) -> Check:
    """flash-attention's backend switch is what FLASH_ATTN_BACKEND needs: ``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE``
    for the Triton backend (read at import by flash_attn_interface.py), anything else for CK. Run in the build and
    again in a container of the finished image (``--report``), whose environment is the one users get."""
    environ = os.environ if environ is None else environ
    backend = profile.get("FLASH_ATTN_BACKEND", "none")
    switch = environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "")
    if backend != "none" and (backend == "triton") != (switch == "TRUE"):
        detail = (f"FLASH_ATTN_BACKEND={backend} but the image's environment has FLASH_ATTENTION_TRITON_AMD_ENABLE="
                  f"{switch or '(unset)'}: flash_attn_interface.py picks its backend by that variable at import "
                  "(Dockerfile, target stage; make image derives it)")  # fmt: skip
        return Check("flash-attn-env", FAIL, detail)
    return Check("flash-attn-env", PASS, f"FLASH_ATTENTION_TRITON_AMD_ENABLE={switch or '(unset)'} for {backend}")


def check_flash_attn(profile: dict[str, str], rehearsal: bool) -> list[Check]:
    """The backend's import switch is set in the image; flash_attn imports; a CK build carries the gfx target."""
    backend = profile.get("FLASH_ATTN_BACKEND", "none")
    if backend == "none":
        return [Check("flash-attn", PASS, "none for this architecture")]
    env = check_flash_attn_env(profile)
    if env.status == FAIL:
        return [env]
    checks = [env]
    if rehearsal:
        return [*checks, Check("flash-attn", SKIPPED, "not built: flash-attn's setup.py needs torch")]
    try:
        module = importlib.import_module("flash_attn")
    except Exception as err:
        return [*checks, Check("flash-attn", FAIL, f"flash_attn does not import: {type(err).__name__}: {err}")]
    checks.append(Check("flash-attn", PASS, f"flash_attn {getattr(module, '__version__', '?')} imports ({backend})"))
    if backend == "ck":
        built = sorted(Path(module.__file__).parents[1].glob("flash_attn_2_cuda*.so"))
        checks.append(_gfx_check("flash-attn-gfx", built[0], profile.get("PYTORCH_ROCM_ARCH", ""),
                                 "flash-attn compiles for GPU_ARCHS=PYTORCH_ROCM_ARCH: see the flash-attn stage's log.")
                      if built else Check("flash-attn-gfx", FAIL, "no flash_attn_2_cuda*.so extension was built: "
                                          "see the flash-attn stage's log (FLASH_ATTN_BACKEND=ck)"))  # fmt: skip
    return checks


def check_imports(profile: dict[str, str], rehearsal: bool) -> list[Check]:
    """liger-kernel (when the profile installs it), LLaMA-Factory and rocmft's CLI import."""
    modules = (["liger_kernel"] if profile.get("LIGER_KERNEL") == "install" else []) + ["llamafactory", "rocmft.cli"]
    checks = []
    if "liger_kernel" in modules and "liger-kernel" not in _distribution_names():
        checks.append(Check("liger-kernel", FAIL, "liger-kernel is not installed (LIGER_KERNEL=install)"))
    if rehearsal:
        return [*checks, Check("imports", SKIPPED, f"{', '.join(modules)} import torch (the torch step was skipped)")]
    failed = []
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:
            failed.append(f"{module}: {type(err).__name__}: {err}")
    return [
        *checks,
        Check("imports", FAIL, "; ".join(failed)) if failed else Check("imports", PASS, ", ".join(modules)),
    ]


def read_steps(path: Path = STEP_LOG) -> list[dict[str, Any]]:
    """The build steps' records (docker/steps/lib.sh), in order; empty when there are none."""
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _torch_hip() -> tuple[tuple[int, int] | None, str]:
    """torch.version.hip as (major, minor) and where it came from; None when torch does not import (the torch
    check reports that)."""
    try:
        import torch
    except Exception as err:
        return None, f"torch does not import: {type(err).__name__}"
    return hip_version_of(torch.version.hip or ""), f"torch.version.hip {torch.version.hip}"


def check(profile: dict[str, str], rehearsal: bool = False, steps: list[dict[str, Any]] | None = None) -> list[Check]:
    """Every check of the module docstring for ``profile``, in order.

    Args:
        profile: the architecture profile's values (:func:`read_profile`).
        rehearsal: a rehearsal build: checks whose inputs need torch are skipped (the rest run); the HIP version
            bitsandbytes' library is chosen by is the profile's ROCM_VERSION instead of torch.version.hip.
        steps: the build steps' records (:func:`read_steps`); each must have run, except in a rehearsal.
    """
    checks = []
    expected, running = profile.get("PYTHON_VERSION", ""), ".".join(platform.python_version_tuple()[:2])
    if rehearsal:
        checks.append(
            Check("python", SKIPPED, f"the stand-in base's Python is {running}; the real base's is {expected}")
        )
    else:
        checks.append(
            Check("python", PASS, f"Python {running}")
            if running == expected
            else Check("python", FAIL, f"Python {running}, but the lock was resolved for PYTHON_VERSION={expected}")
        )
    if rehearsal:
        checks.append(Check("torch", SKIPPED, "not installed: the torch step was skipped"))
    else:
        checks += check_torch(profile)
    checks.append(check_cuda_wheels(profile))
    checks.append(check_triton(profile))
    if profile.get("BITSANDBYTES", "none") != "none":
        if rehearsal:
            hip, source = hip_version_of(profile.get("ROCM_VERSION", "")), "the profile's ROCM_VERSION: torch is absent"
        else:
            hip, source = _torch_hip()
        checks += check_bitsandbytes(profile, hip, source)
    checks += check_deepspeed(profile, rehearsal)
    checks += check_flash_attn(profile, rehearsal)
    checks += check_imports(profile, rehearsal)
    skipped = [s["step"] for s in steps or [] if s.get("status") != "ran"]
    if skipped and not rehearsal:
        checks.append(Check("steps", FAIL, f"build steps that did not run: {', '.join(skipped)}"))
    else:
        checks.append(Check("steps", PASS, f"{len(steps or [])} recorded, skipped: {', '.join(skipped) or 'none'}"))
    return checks


def record(
    profile: dict[str, str], checks: list[Check], steps: list[dict[str, Any]], rehearsal: bool
) -> dict[str, Any]:
    """The build record: the profile's build facts, package versions, commit, date, steps and checks."""
    from rocmft.config.lfargs import stack_versions

    try:
        import torch

        toolkit = {"torch_hip": torch.version.hip, "torch_cuda": torch.version.cuda}
    except Exception:
        toolkit = {"torch_hip": None, "torch_cuda": None}
    keys = ("ARCH", "GPU_FAMILY", "ROCM_VERSION", "PYTHON_VERSION", "PYTORCH_ROCM_ARCH", "BITSANDBYTES",
            "LIGER_KERNEL", "FLASH_ATTN_BACKEND", "DS_ACCELERATOR", "DS_BUILD_OPS_LIST", "TORCH_INDEX_URL",
            "LOCK", "RCCL_BUSBW_FLOOR_GBPS")  # fmt: skip
    return {
        **{key.lower(): profile.get(key, "") for key in keys},
        "rehearsal": rehearsal,
        "base_image": os.environ.get("ROCMFT_BASE_IMAGE", "unknown"),
        "git_commit": os.environ.get("ROCMFT_GIT_COMMIT", "unknown"),
        "build_date": os.environ.get("ROCMFT_BUILD_DATE")
        or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": dict(stack_versions()),
        **toolkit,
        "runtime_profile": {k.removeprefix("RUNTIME_"): v for k, v in profile.items() if k.startswith("RUNTIME_")},
        "steps": steps,
        "checks": [asdict(c) for c in checks],
    }


def report(build: dict[str, Any]) -> str:
    """The build record's steps and checks as text, one line each: what ran, what was skipped and why."""
    title = "rehearsal" if build.get("rehearsal") else "build"
    lines = [f"rocmft {title} for {build.get('arch')} (base {build.get('base_image')}, commit "
             f"{str(build.get('git_commit'))[:12]})", "", "steps:"]  # fmt: skip
    width = max(
        [len(s["step"]) for s in build.get("steps", [])] + [len(c["name"]) for c in build.get("checks", [])] + [4]
    )
    lines += [f"  {s['step']:<{width}}  {s['status']:<7}  {s['detail']}" for s in build.get("steps", [])]
    lines += ["", "checks:"] + [
        f"  {c['name']:<{width}}  {c['status']:<7}  {c['detail']}" for c in build.get("checks", [])
    ]
    return "\n".join(lines) + "\n"


def _read_record(path: Path) -> dict[str, Any]:
    """A build record written by :func:`main`.

    Raises:
        ValueError: the file is unreadable, not JSON, or holds no checks (the message names the file).
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not a readable build record ({err})") from None
    if not isinstance(data, dict) or not data.get("checks"):
        raise ValueError(f"{path}: not a build record (no checks in it); the image build writes /etc/rocmft/build.json")
    return data


def main(argv: list[str]) -> int:
    """``PROFILE RECORD``: check the image against the profile and write the record (1 on failures);
    ``--report RECORD``: print a record's steps and checks, and check the environment of the process it runs in
    again (make image and make rehearse run it in a container of the finished image: 1 when that check fails);
    ``--validate PROFILE...``: the profiles' problems (:func:`validate_profile`). Bad input exits 2."""
    parser = argparse.ArgumentParser(prog="python -m rocmft.image.buildinfo", description=main.__doc__)
    parser.add_argument("--report", type=Path, metavar="RECORD", help="print RECORD's steps and checks")
    parser.add_argument("--validate", action="store_true", help="validate the profiles given as paths")
    parser.add_argument("paths", nargs="*", type=Path, help="PROFILE RECORD, or the profiles to --validate")
    args = parser.parse_args(argv)
    if args.validate:
        problems = [problem for path in args.paths for problem in validate_profile(path)]
        print("\n".join(problems) or f"{len(args.paths)} profile(s) valid", file=sys.stderr if problems else sys.stdout)
        return 2 if problems or not args.paths else 0
    if args.report:
        try:
            print(report(_read_record(args.report)), end="")
        except ValueError as err:
            print(f"rocmft.image.buildinfo: {err}", file=sys.stderr)
            return 2
        if not ARCH_PROFILE.is_file():
            return 0
        again = check_flash_attn_env(read_profile(ARCH_PROFILE))
        print(f"\nin the finished image:\n  {again.name}  {again.status}  {again.detail}")
        return 1 if again.status == FAIL else 0
    if len(args.paths) != 2:
        parser.error("give PROFILE RECORD (e.g. /etc/rocmft/arch.env /etc/rocmft/build.json)")
    problems = validate_profile(args.paths[0])
    if problems:
        print("rocmft.image.buildinfo: the profile is not usable:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        return 2
    profile, target = read_profile(args.paths[0]), args.paths[1]
    rehearsal = os.environ.get("REHEARSAL", "0") == "1"
    steps = read_steps()
    checks = check(profile, rehearsal, steps)
    data = record(profile, checks, steps, rehearsal)
    failed = [c for c in checks if c.status == FAIL]
    if failed:
        print(report(data), end="", file=sys.stderr)
        print(f"\nrocmft image for {profile.get('ARCH')} is broken:\n  - "
              + "\n  - ".join(f"{c.name}: {c.detail}" for c in failed), file=sys.stderr)  # fmt: skip
        return 1
    from rocmft.fsutil import atomic_write_text

    try:
        atomic_write_text(target, json.dumps(data, indent=2) + "\n")
    except OSError as err:
        print(f"rocmft.image.buildinfo: cannot write the build record {target}: {err}", file=sys.stderr)
        return 2
    print(report(data), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
