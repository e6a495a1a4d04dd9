"""Compile ONE of flash-attention's generated Composable Kernel (CK) forward kernels before the full CK build.

flash-attn 2.8.3's ROCm build generates ~2,775 kernels and compiles them for hours (issue 31, finding 1); a broken
toolchain (hipcc, the CK headers in the sdist, the ROCm/torch pairing) fails the same way on its first kernel. This
script generates the forward kernels as setup.py does, compiles one of them with the same compiler, include paths,
defines and --offload-arch flags, within a time limit, and says what failed. docker/steps/flash-attn.sh runs it
between patching the sdist and `pip wheel`.

Every flag is copied from flash-attn's setup.py at tag v2.8.3 (Dao-AILab/flash-attention, the sdist's setup.py;
line numbers below) or taken from torch itself (torch/utils/cpp_extension.py, the flags its BuildExtension adds to
every HIP compile), so that a change of either shows here and not as a copy going stale. Left out: torch's
include paths and extension-name defines, as the generated kernel includes no torch header.

Usage: flash_attn_ck_smoke.py TREE ARCHS [--hip-version V] [--timeout S] [--work DIR]
  TREE   the unpacked (and patched) flash-attn sdist
  ARCHS  the gfx targets, ';'-separated as in GPU_ARCHS / PYTORCH_ROCM_ARCH (e.g. "gfx942")
Exit status: 0 the kernel compiled; 1 it failed or ran past the limit (the message names the compiler's first
error); 2 bad input (no tree or generator, an unsupported target, no hipcc, a torch without HIP).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GENERATOR = "csrc/composable_kernel/example/ck_tile/01_fmha/generate.py"
# setup.py v2.8.3 lines 413-417: the extension's include_dirs
INCLUDE_DIRS = (
    "csrc/composable_kernel/include",
    "csrc/composable_kernel/library/include",
    "csrc/composable_kernel/example/ck_tile/01_fmha",
)
# setup.py v2.8.3 line 135 (validate_and_update_archs): the targets flash-attn's CK build accepts; "native" there
# asks the build machine's GPU, which an image build has not
ALLOWED_ARCHS = ("gfx90a", "gfx942", "gfx950")
# The kernel compiled: head dim 128 (Llama-style heads), bf16, fixed-length batch, causal mask, log-sum-exp kept
# for the backward pass, no dropout, no bias: the forward a causal-LM fine-tune runs. The first match, by name.
KERNEL = "fmha_fwd_d128_bf16_batch_*_nbias_mask_lse_ndropout_*.cpp"
# A limit, not a measurement: the full build compiled 2,775 such files in about 4 h with parallel jobs
# (huggingface/transformers#45913), so one file on a sound toolchain takes minutes; 20 min fails hours earlier.
TIMEOUT_S = 1200
BAD_INPUT, FAILED = 2, 1


class SmokeError(Exception):
    """A message for the build log, with the exit status."""

    def __init__(self, message: str, status: int = BAD_INPUT) -> None:
        super().__init__(message)
        self.status = status


def generate(tree: Path, out: Path, optdim: str) -> list[Path]:
    """Write the forward kernels' sources into `out` with the sdist's own generator, as setup.py v2.8.3 line 329
    runs it (`-d fwd --receipt 2 --optdim OPT_DIM`, OPT_DIM defaulting to 32,64,128,256, line 328). Returns the
    generated .cpp files, sorted. Raises SmokeError when the generator is missing or fails."""
    script = tree / GENERATOR
    if not script.is_file():
        raise SmokeError(f"{script}: no CK kernel generator in the flash-attn sdist (is TREE the unpacked sdist?)")
    cmd = [sys.executable, str(script), "-d", "fwd", "--output_dir", str(out), "--receipt", "2", "--optdim", optdim]
    result = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SmokeError(f"the CK kernel generator failed ({' '.join(cmd)}):\n{result.stderr.strip()}", FAILED)
    return sorted(out.glob("*.cpp"))


def pick(sources: list[Path]) -> Path:
    """The one forward kernel to compile (KERNEL, the first match by name). Raises SmokeError if none matches."""
    for source in sources:
        if fnmatch.fnmatch(source.name, KERNEL):
            return source
    raise SmokeError(
        f"the generator made {len(sources)} forward kernels but none named {KERNEL}: the CK sources changed; "
        "update KERNEL in docker/steps/flash_attn_ck_smoke.py"
    )


def hip_flags(hip_version: str) -> list[str]:
    """setup.py v2.8.3 lines 395-406 (imitating CK's CMakeLists.txt): extra flags by the HIP version torch was
    built with, parsed as get_hip_version does (lines 97-98). Raises SmokeError on a version it cannot parse."""
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(hip_version.split()[-1].rstrip("-").replace("-", "+"))
    except (InvalidVersion, IndexError):
        message = f"HIP version {hip_version!r}: not a version (expected torch.version.hip, e.g. 7.2.26015)"
        raise SmokeError(message) from None
    flags = []
    if version > Version("5.5.00000"):
        flags += ["-mllvm", "--lsr-drop-solution=1"]
    if version > Version("5.7.23302"):
        flags += ["-fno-offload-uniform-block"]
    if version > Version("6.1.40090"):
        flags += ["-mllvm", "-enable-post-misched=0"]
    if version > Version("6.2.41132"):
        flags += ["-mllvm", "-amdgpu-early-inline-all=true", "-mllvm", "-amdgpu-function-calls=false"]
    if Version("6.2.41133") < version < Version("6.3.00000"):
        flags += ["-mllvm", "-amdgpu-coerce-illegal-types=1"]
    return flags


def check_archs(archs: list[str]) -> None:
    """Raises SmokeError for an empty list or a target setup.py v2.8.3 would refuse (ALLOWED_ARCHS)."""
    unsupported = [a for a in archs if a not in ALLOWED_ARCHS]
    if not archs or unsupported:
        raise SmokeError(
            f"GPU targets {';'.join(archs)!r}: flash-attn's CK build supports {', '.join(ALLOWED_ARCHS)} "
            "(setup.py validate_and_update_archs); set PYTORCH_ROCM_ARCH or FLASH_ATTN_BACKEND in "
            "docker/arch/<ARCH>.env"
        )


def nvcc_flags(archs: list[str], hip_version: str) -> list[str]:
    """The `nvcc` compile arguments setup.py v2.8.3 gives the CK extension: --offload-arch per target (lines
    345-346), the CK defines (377-392, CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT from the environment as there) and the
    HIP-version flags (hip_flags). Raises SmokeError for a target setup.py would refuse."""
    check_archs(archs)
    flags = [f"--offload-arch={arch}" for arch in archs]
    flags += ["-O3", "-std=c++17", "-DCK_TILE_FMHA_FWD_FAST_EXP2=1", "-fgpu-flush-denormals-to-zero"]
    flags += [f"-DCK_ENABLE_{t}" for t in ("BF16", "BF8", "FP16", "FP32", "FP64", "FP8", "INT8")]
    flags += ["-DCK_USE_XDL", "-DUSE_PROF_API=1", "-D__HIP_PLATFORM_HCC__=1"]
    flags += [f"-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT={os.environ.get('CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT', 3)}"]
    return flags + hip_flags(hip_version)


def torch_side(hip_version: str | None) -> tuple[str, list[str], str]:
    """(hipcc, the flags torch's BuildExtension puts before the extension's nvcc arguments, the HIP version).
    torch/utils/cpp_extension.py (v2.11.0, the unix ninja compile): hipcc is ROCM_HOME/bin/hipcc and each HIP
    compile gets COMMON_HIP_FLAGS + COMMON_HIPCC_FLAGS first. Without ROCM_HOME (a torch without HIP), hipcc is
    the one on PATH, as torch's _find_rocm_home would pick. Raises SmokeError without hipcc or a HIP version."""
    import torch
    from torch.utils import cpp_extension

    hip_version = hip_version or torch.version.hip
    if not hip_version:
        raise SmokeError(f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None): "
                         "the CK build needs the ROCm torch of the torch stage")  # fmt: skip
    hip_flags(hip_version)  # a version setup.py could not read fails before anything runs
    home = cpp_extension.ROCM_HOME
    hipcc = os.path.join(home, "bin", "hipcc") if home else shutil.which("hipcc")
    if not hipcc or not os.access(hipcc, os.X_OK):
        raise SmokeError(f"no hipcc ({hipcc or 'not on PATH'}): the base image must be ROCm's -complete image")
    return hipcc, cpp_extension.COMMON_HIP_FLAGS + cpp_extension.COMMON_HIPCC_FLAGS, hip_version


def first_error(output: str) -> str:
    """The compiler's first error line (clang's `file:line:col: error: ...`), else its last non-empty line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line or line.startswith("error"):
            return line
    return lines[-1] if lines else "(no output)"


def compile_one(tree: Path, archs: list[str], hip_version: str | None, timeout: float, work: Path) -> str:
    """Generate, pick and compile one forward kernel; returns the line for the build log. Raises SmokeError
    (status 1) when the compile fails or runs past `timeout` seconds, naming the compiler's first error."""
    check_archs(archs)
    hipcc, torch_flags, hip_version = torch_side(hip_version)
    flags = nvcc_flags(archs, hip_version)
    source = pick(generate(tree, work / "build", os.environ.get("OPT_DIM", "32,64,128,256")))
    includes = [f"-I{tree / d}" for d in INCLUDE_DIRS]
    # setup.py lines 367-375 copy each source to .cu for torch's hipify, which makes it HIP: -x hip says the same
    cmd = [hipcc, "-c", "-x", "hip", str(source), "-o", str(work / "smoke.o"), *includes, *torch_flags, *flags]
    what = f"CK smoke compile of {source.name} for {';'.join(archs)} (HIP {hip_version})"
    start = time.monotonic()
    # its own process group: hipcc runs clang, which a timeout must stop too, not leave compiling
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as process:  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            message = (f"{what}: still compiling after {timeout:.0f} s (the limit, --timeout): at that rate the "
                       "full build (~2,775 kernels) would take days; check the builder's CPU and memory")  # fmt: skip
            raise SmokeError(message, FAILED) from None
    seconds = time.monotonic() - start
    if process.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-20:])
        raise SmokeError(
            f"{what} failed (exit {process.returncode}, {seconds:.0f} s): {first_error(output)}\n"
            "The full CK build would fail the same way, hours later. Check hipcc and the ROCm version against "
            "torch's HIP version, the CK headers in the sdist, and docker/patches/flash-attn-*.patch; "
            f"the command was:\n  {' '.join(cmd)}\nlast lines of its output:\n{tail}",
            FAILED,
        )
    return f"{what} passed in {seconds:.0f} s; the full build follows"


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module's docstring); returns the exit status, never raises for bad input."""
    parser = argparse.ArgumentParser(prog="flash_attn_ck_smoke.py", description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path)
    parser.add_argument("archs")
    parser.add_argument("--hip-version", help="default: torch.version.hip, as setup.py's get_hip_version")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds (default {TIMEOUT_S})")
    parser.add_argument("--work", type=Path, help="keep the generated sources and object here (default: a temp dir)")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="ck-smoke-") as temp:
            work = args.work or Path(temp)
            work.mkdir(parents=True, exist_ok=True)
            archs = [a for a in args.archs.split(";") if a]
            print(f"[build] flash-attn: {compile_one(args.tree, archs, args.hip_version, args.timeout, work)}")
    except SmokeError as error:
        print(f"[build] flash-attn: {error}", file=sys.stderr)
        return error.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
