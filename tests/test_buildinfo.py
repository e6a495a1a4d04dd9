"""The image build's check (rocmft.image.buildinfo, rocmft.image.codeobjects) on real artefacts: PyPI's bitsandbytes
wheel (installed in .venv by `make venv`, its `gpu` extra), this environment's DeepSpeed and triton, and
flash-attention's own source. Nothing here restates a profile: each test reads a library, a record or an import."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocmft.image import buildinfo
from rocmft.image.buildinfo import FAIL, PASS, SKIPPED, bitsandbytes_library, read_profile
from rocmft.image.codeobjects import CodeObjectError, bundle_ids, gfx_targets

REPO = Path(__file__).resolve().parents[1]
ROCM_ARCHS = sorted(p.stem for p in (REPO / "docker" / "arch").glob("gfx*.env"))
BNB = buildinfo._package_dir("bitsandbytes")
FLASH_ATTN_SDIST = "https://files.pythonhosted.org/packages/3b/b2/8d76c41ad7974ee264754709c22963447f7f8134613fd9ce80984ed0dab7/flash_attn-2.8.3.tar.gz"


def profile(arch: str) -> dict[str, str]:
    return read_profile(REPO / "docker" / "arch" / f"{arch}.env")


@pytest.mark.parametrize("arch", ROCM_ARCHS)
def test_the_library_bitsandbytes_loads_for_the_profiles_rocm_has_its_gfx_target(arch):
    """Finding 4: PyPI's wheel is what every ROCm image installs; the library bitsandbytes picks for the image's
    ROCm version holds the profile's target once its compressed bundles are read."""
    values = profile(arch)
    library = bitsandbytes_library(BNB, buildinfo.hip_version_of(values["ROCM_VERSION"]))
    assert library.name == f"libbitsandbytes_rocm{values['ROCM_VERSION'].replace('.', '')}.so"
    assert values["PYTORCH_ROCM_ARCH"] in gfx_targets(library)
    checks = buildinfo.check_bitsandbytes(values, (7, 2), "test")
    assert checks[0].status == PASS, checks


def test_a_plain_text_search_finds_no_target_in_the_compressed_bundles():
    """Why the code objects must be decompressed: the old check's needle is not in the file at all."""
    data = (BNB / "libbitsandbytes_rocm72.so").read_bytes()
    assert b"CCOB" in data and b"amdgcn-amd-amdhsa--gfx942" not in data


def test_a_target_the_library_lacks_fails_and_names_what_it_has():
    """bitsandbytes' ROCm 6.4 library predates gfx950 (measured in the 0.50.2 wheel)."""
    checks = buildinfo.check_bitsandbytes(profile("gfx950"), (6, 4), "test")
    assert checks[0].status == FAIL and "libbitsandbytes_rocm64.so has no gfx950 code" in checks[0].detail
    assert "gfx942" in checks[0].detail


def test_a_bitsandbytes_without_its_hip_libraries_fails(tmp_path, monkeypatch):
    """What the old source recipe packed once scikit-build-core was present (finding 3): bitsandbytes with only
    its CPU library. The wheel's own files, less the HIP libraries, are refused."""
    copy = tmp_path / "bitsandbytes"
    shutil.copytree(BNB, copy, ignore=shutil.ignore_patterns("libbitsandbytes_rocm*.so", "libbitsandbytes_cuda*.so"))
    assert (copy / "libbitsandbytes_cpu.so").is_file()
    monkeypatch.setattr(buildinfo, "_package_dir", lambda name: copy)
    checks = buildinfo.check_bitsandbytes(profile("gfx942"), (7, 2), "test")
    assert checks[0].status == FAIL and "no library for ROCm 7.2 (libbitsandbytes_rocm*.so: none)" in checks[0].detail


def test_a_rocm_major_without_any_library_fails():
    checks = buildinfo.check_bitsandbytes(profile("gfx942"), (8, 0), "test")
    assert checks[0].status == FAIL and "no library for ROCm 8.0" in checks[0].detail


@settings(max_examples=60, deadline=None)
@given(major=st.integers(5, 9), minor=st.integers(0, 20))
def test_the_library_choice_is_bitsandbytes_own(major, minor):
    """rocmft's copy of the choice (it must work where bitsandbytes cannot be imported) against bitsandbytes'
    own get_cuda_bnb_library_path, under a torch made to report HIP major.minor."""
    import torch
    from bitsandbytes import cextension
    from bitsandbytes.cuda_specs import CUDASpecs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.version, "hip", f"{major}.{minor}.0", raising=False)
        theirs = cextension.get_cuda_bnb_library_path(CUDASpecs((9, 4), f"{major}{minor}", (major, minor)))
    ours = bitsandbytes_library(BNB, (major, minor))
    assert (ours or "missing") == (theirs if theirs.is_file() else "missing")


def test_an_uncompressed_bundle_in_an_elf_section_is_read(tmp_path):
    """The other bundle form (hipcc without --offload-compress): the wheel's first bundle, decompressed and put
    into a real ELF file's .hip_fatbin section with objcopy, twice (a library holds one bundle per source file)."""
    import struct

    import zstandard

    data = (BNB / "libbitsandbytes_rocm72.so").read_bytes()
    start = data.index(b"CCOB")
    version, method = struct.unpack_from("<HH", data, start + 4)
    total, size, _hash = struct.unpack_from("<QQQ", data, start + 8)
    assert (version, method) == (3, 1)
    plain = zstandard.ZstdDecompressor().decompress(data[start + 32 : start + total], max_output_size=size)
    assert plain.startswith(b"__CLANG_OFFLOAD_BUNDLE__")
    (tmp_path / "fatbin").write_bytes(plain + b"\0" * (-len(plain) % 4096) + plain)
    (tmp_path / "k.c").write_text("int k(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "k.so", tmp_path / "k.c"], check=True)
    subprocess.run(["objcopy", "--add-section", f".hip_fatbin={tmp_path / 'fatbin'}", tmp_path / "k.so"], check=True)
    ids = bundle_ids(tmp_path / "k.so")
    assert len(ids) % 2 == 0 and ids[: len(ids) // 2] == ids[len(ids) // 2 :]
    assert {"gfx90a", "gfx942", "gfx950", "gfx1100"} <= gfx_targets(tmp_path / "k.so")


def test_mixed_bundles_and_magic_bytes_inside_a_bundles_code_are_read_in_file_order(tmp_path):
    """Finding 3's one-pass scan keeps each magic's next occurrence between bundles: the wheel's real compressed
    bundle and its decompressed (plain) form alternate in one section, and the plain ones' device code is made to
    hold both magics (code is opaque bytes; the reader must skip it, not take it for a bundle). The IDs come back in
    file order, each bundle's once."""
    import struct

    import zstandard

    data = (BNB / "libbitsandbytes_rocm72.so").read_bytes()
    start = data.index(b"CCOB")
    total, size, _hash = struct.unpack_from("<QQQ", data, start + 8)
    compressed = data[start : start + total]
    plain = bytearray(zstandard.ZstdDecompressor().decompress(data[start + 32 : start + total], max_output_size=size))
    (count,) = struct.unpack_from("<Q", plain, 24)
    entries, position = [], 32
    for _ in range(count):
        entries.append(struct.unpack_from("<QQQ", plain, position))
        position += 24 + entries[-1][2]
    offset, length, _id_length = max(entries, key=lambda entry: entry[1])  # the largest entry's code
    assert count > 1 and length > 100
    middle = offset + length // 2
    plain[middle : middle + 28] = b"__CLANG_OFFLOAD_BUNDLE__CCOB"
    section = b"".join(b + b"\0" * (-len(b) % 4096) for b in (compressed, plain, plain, compressed, plain))
    (tmp_path / "fatbin").write_bytes(section)
    (tmp_path / "k.c").write_text("int k(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / "k.so", tmp_path / "k.c"], check=True)
    subprocess.run(["objcopy", "--add-section", f".hip_fatbin={tmp_path / 'fatbin'}", tmp_path / "k.so"], check=True)
    ids = bundle_ids(tmp_path / "k.so")
    one = ids[:count]
    assert len(set(one)) == count and "hipv4-amdgcn-amd-amdhsa--gfx942" in one
    assert ids == one * 5


def test_a_library_without_device_code_is_a_clear_error():
    with pytest.raises(CodeObjectError, match=r"libbitsandbytes_cpu.so: no .hip_fatbin section"):
        gfx_targets(BNB / "libbitsandbytes_cpu.so")
    with pytest.raises(CodeObjectError, match="not a readable ELF file"):
        gfx_targets(REPO / "README.md")


def test_a_library_cut_short_is_a_clear_error(tmp_path):
    cut = tmp_path / "libbitsandbytes_rocm72.so"
    cut.write_bytes((BNB / "libbitsandbytes_rocm72.so").read_bytes()[:1_200_000])
    with pytest.raises(CodeObjectError, match="cut short"):
        gfx_targets(cut)


def test_pypi_triton_in_a_rocm_image_fails_the_build():
    """Finding 8: this environment has PyPI's triton (PyPI's torch brings it); the ROCm rule sees it."""
    assert buildinfo.check_triton(profile("gfx942")).status == FAIL
    assert "PyPI's triton" in buildinfo.check_triton(profile("gfx942")).detail
    assert buildinfo.check_triton(profile("cpu")).status == PASS


def test_no_cuda_wheels_rule_reads_the_installed_distributions():
    """This environment holds PyPI torch's nvidia-* and cuda-* wheels: allowed by the cpu profile, refused by a
    ROCm one, both kinds named."""
    assert buildinfo.check_cuda_wheels(profile("cpu")).status == PASS
    refused = buildinfo.check_cuda_wheels(profile("gfx90a"))
    assert refused.status == FAIL and "nvidia-cublas" in refused.detail
    assert "cuda-bindings" in refused.detail and "cuda-toolkit" in refused.detail


def test_a_cuda_distribution_without_any_nvidia_one_is_refused(tmp_path, monkeypatch):
    """Finding 8: cuda-bindings alone (what a package requiring cuda-python would bring) is CUDA's too. The
    environment seen is a folder holding only this .venv's real cuda_bindings and cuda_pathfinder records."""
    from importlib import metadata

    for name in ("cuda-bindings", "cuda-pathfinder"):
        distribution = metadata.distribution(name)
        record = Path(distribution.locate_file(next(f for f in distribution.files if f.name == "METADATA"))).parent
        shutil.copytree(record, tmp_path / record.name)
    only_here = metadata.distributions
    monkeypatch.setattr(metadata, "distributions", lambda: only_here(path=[str(tmp_path)]))
    refused = buildinfo.check_cuda_wheels(profile("gfx942"))
    assert refused.status == FAIL and refused.detail.endswith("cuda-bindings, cuda-pathfinder")


def test_deepspeed_installed_without_ds_accelerator_is_refused_for_a_gpu_image():
    """Finding 6: `make venv` installed DeepSpeed here with no GPU and no DS_ACCELERATOR, so DeepSpeed recorded
    its CPU accelerator (its own install record): right for the cpu profile, wrong for a ROCm one."""
    record = buildinfo._deepspeed_record(buildinfo._package_dir("deepspeed"))
    assert record["accelerator_name"] == "cpu"
    assert buildinfo.check_deepspeed(profile("cpu"), rehearsal=False)[0].status == PASS
    refused = buildinfo.check_deepspeed(profile("gfx942"), rehearsal=True)[0]
    assert refused.status == FAIL and "installed for the 'cpu' accelerator, not DS_ACCELERATOR=cuda" in refused.detail


def test_deepspeed_cpu_ops_prebuilt_fail_the_build(tmp_path, monkeypatch):
    """This environment's DeepSpeed install record, with CPU_ADAM marked prebuilt (what the old
    DS_BUILD_OPS_LIST=CPU_ADAM recorded), is refused; the record as installed passes."""
    source = buildinfo._package_dir("deepspeed") / "git_version_info_installed.py"
    assert buildinfo.check_deepspeed(profile("cpu"), rehearsal=False)[1].status == PASS
    text = source.read_text().replace("'cpu_adam': False", "'cpu_adam': True")
    assert "'cpu_adam': True" in text
    (tmp_path / "deepspeed").mkdir()
    (tmp_path / "deepspeed" / "git_version_info_installed.py").write_text(text)
    monkeypatch.setattr(buildinfo, "_package_dir", lambda name: tmp_path / name)
    refused = buildinfo.check_deepspeed(profile("cpu"), rehearsal=False)[1]
    assert refused.status == FAIL and "cpu_adam" in refused.detail and "-march=native" in refused.detail


@pytest.fixture(scope="session")
def flash_attn_source(tmp_path_factory) -> Path:
    """flash-attention 2.8.3's own source (its sdist from PyPI), unpacked: its import picks the backend."""
    cache = Path(os.environ.get("ROCMFT_TEST_CACHE", REPO / ".cache" / "tests"))
    archive = cache / "flash_attn-2.8.3.tar.gz"
    if not archive.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(FLASH_ATTN_SDIST, timeout=120) as response:
            archive.with_suffix(".part").write_bytes(response.read())
        archive.with_suffix(".part").rename(archive)
    target = tmp_path_factory.mktemp("flash-attn")
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target / "flash_attn-2.8.3"


@pytest.mark.slow  # imports flash-attn's Triton backend in a fresh Python
@pytest.mark.parametrize(("switch", "status"), [("TRUE", PASS), (None, FAIL)])
def test_the_triton_backend_imports_only_with_its_switch_in_the_environment(flash_attn_source, tmp_path, switch,
                                                                             status):  # fmt: skip
    """Finding 5, on flash-attention's real code: the build check imports flash_attn in the environment the image
    gives every process. With FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE the Triton backend imports (on this CPU,
    with this environment's triton); without it the import falls through to the CUDA extension, which a Triton
    image does not have, and the environment rule says so first. No shipped profile uses the Triton backend since
    issue 31 (gfx1100.env says why); a gfx1100 profile that opts back in is checked here."""
    text = (REPO / "docker/arch/gfx1100.env").read_text()
    assert "FLASH_ATTN_BACKEND=none\n" in text
    (tmp_path / "gfx1100.env").write_text(text.replace("FLASH_ATTN_BACKEND=none\n", "FLASH_ATTN_BACKEND=triton\n"))
    code = (
        "import json, sys; from rocmft.image import buildinfo; "
        f"p = buildinfo.read_profile(buildinfo.Path({str(tmp_path / 'gfx1100.env')!r})); "
        "print(json.dumps([c.__dict__ for c in buildinfo.check_flash_attn(p, rehearsal=False)]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "FLASH_ATTENTION_TRITON_AMD_ENABLE"}
    env["PYTHONPATH"] = f"{flash_attn_source}{os.pathsep}{env.get('PYTHONPATH', '')}"
    if switch:
        env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] = switch
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)

    checks = {c["name"]: c for c in json.loads(result.stdout.splitlines()[-1])}
    if status == PASS:
        assert checks["flash-attn-env"]["status"] == PASS and checks["flash-attn"]["status"] == PASS, checks
        assert "flash_attn 2.8.3 imports (triton)" in checks["flash-attn"]["detail"]
    else:
        assert checks["flash-attn-env"]["status"] == FAIL and "flash-attn" not in checks, checks
    env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] = ""
    unswitched = subprocess.run([sys.executable, "-c", "import flash_attn"], env=env, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
    assert "No module named 'flash_attn_2_cuda'" in unswitched.stderr


def test_the_hipify_v2_patch_applies_to_the_real_sdist_and_guards_every_hip_stream_call(flash_attn_source, tmp_path):
    """Issue 31: flash-attn 2.8.3's CK bindings call at::cuda::getCurrentHIPStream(), which torch's hipify v2 (torch
    2.11) no longer provides. docker/steps/flash-attn.sh applies docker/patches/flash-attn-2.8.3-*.patch (upstream's
    fix, Dao-AILab/flash-attention 48ecd149) with git apply, as here, to the real sdist: every such call is then
    behind #ifdef HIPIFY_V2's #else, and the patched setup.py's condition holds for this torch 2.11."""
    import torch.utils.hipify
    from packaging.version import Version

    patches = sorted((REPO / "docker" / "patches").glob("flash-attn-2.8.3-*.patch"))
    assert patches, "no flash-attn 2.8.3 patch in docker/patches"
    tree = tmp_path / "flash_attn-2.8.3"
    shutil.copytree(flash_attn_source, tree)
    for patch in patches:
        subprocess.run(["git", "-C", str(tree), "apply", "--verbose", str(patch)], check=True, capture_output=True)
    calls = 0
    for source in sorted((tree / "csrc" / "flash_attn_ck").glob("*.cpp")):
        lines = source.read_text().splitlines()
        for number, line in enumerate(lines):
            if "getCurrentHIPStream" in line:
                calls += 1
                guard = [lines[number - 3].strip(), lines[number - 1].strip()]
                assert guard == ["#ifdef HIPIFY_V2", "#else"], f"{source.name}:{number + 1} is not guarded"
                assert "getCurrentCUDAStream" in lines[number - 2]
    assert calls == 3  # mha_fwd, mha_bwd, mha_varlen_fwd (the three call sites)
    setup = (tree / "setup.py").read_text()
    assert '"-DHIPIFY_V2"' in setup and "from torch.utils.hipify import __version__" in setup
    assert Version(torch.utils.hipify.__version__) >= Version("2.0.0")  # so the flag is set for this torch


@pytest.mark.parametrize(("available_gib", "limit_gib", "cores", "jobs"), [
    (100, None, 64, 11),  # setup.py's rule: min(cores / 2, GiB / 9)
    (100, 40, 64, 4),  # a builder limited to 40 GiB (4 in use): 36 / 9, not the host's 100 / 9
    (100, None, 8, 4),  # cores bound it
    (5, None, 64, 1),  # never below one
])  # fmt: skip
def test_flash_attn_build_jobs_follow_the_builders_memory(tmp_path, available_gib, limit_gib, cores, jobs):
    """Issue 31: MAX_JOBS for the CK build from the memory the build container may use (~9 GB a job, flash-attn
    2.8.3's setup.py), not the host's, which setup.py's psutil reads."""
    gib = 1024**3
    (tmp_path / "meminfo").write_text(f"MemTotal: 1 kB\nMemAvailable: {available_gib * gib // 1024} kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    if limit_gib is not None:
        (cgroup / "memory.max").write_text(f"{limit_gib * gib}\n")
        (cgroup / "memory.current").write_text(f"{4 * gib}\n")
    else:
        (cgroup / "memory.max").write_text("max\n")
    result = subprocess.run(["bash", str(REPO / "docker/steps/flash-attn.sh"), "--jobs", str(tmp_path / "meminfo"),
                             str(cgroup), str(cores)], capture_output=True, text=True, check=True)  # fmt: skip
    assert result.stdout.strip() == str(jobs)


def test_a_rehearsal_skips_what_needs_torch_and_says_why():
    """The rehearsal's checks that cannot run here are skipped by name with the reason; the rest run."""
    checks = {c.name: c for c in buildinfo.check(profile("gfx1100"), rehearsal=True, steps=[])}
    assert checks["torch"].status == SKIPPED and "torch step was skipped" in checks["torch"].detail
    assert checks["imports"].status == SKIPPED
    assert checks["bitsandbytes"].status == PASS and "the profile's ROCM_VERSION" in checks["bitsandbytes"].detail
    assert checks["triton"].status == FAIL  # this environment has PyPI's triton: a rehearsal would refuse it too


def test_a_real_build_with_a_skipped_step_fails():
    steps = [{"step": "torch", "status": "skipped", "detail": "x", "seconds": 0}]
    checks = {c.name: c for c in buildinfo.check(profile("cpu"), rehearsal=False, steps=steps)}
    assert checks["steps"].status == FAIL and "torch" in checks["steps"].detail


@pytest.mark.parametrize(("args", "words"), [
    (["--report", "/nonexistent"], "/nonexistent: not a readable build record"),
    (["--report", "{empty}"], "not a build record (no checks in it)"),
    (["/nonexistent.env", "{out}"], "/nonexistent.env: cannot read it"),
    (["{empty}", "{out}"], "ARCH is missing"),
])  # fmt: skip
@pytest.mark.light_process  # the build check's own command line, on files that stop it at once (< 1 s)
def test_bad_input_to_the_build_check_is_a_message_not_a_traceback(tmp_path, args, words):
    (tmp_path / "empty").write_text("{}\n")
    argv = [a.format(empty=tmp_path / "empty", out=tmp_path / "out.json") for a in args]
    result = subprocess.run([sys.executable, "-m", "rocmft.image.buildinfo", *argv], capture_output=True, text=True)
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "out.json").exists()


def test_ldd_reports_a_library_that_does_not_resolve():
    """This machine has no ROCm: the wheel's HIP library's hipBLAS dependencies are reported missing."""
    if not shutil.which("ldd"):
        pytest.skip("no ldd")
    missing = buildinfo.unresolved_libraries(BNB / "libbitsandbytes_rocm72.so")
    assert {"libhipblas.so.3", "libhipblaslt.so.1"} <= set(missing)


def _ck_smoke():
    """docker/steps/flash_attn_ck_smoke.py, the CK smoke compile flash-attn.sh runs, loaded as a module."""
    spec = importlib.util.spec_from_file_location("flash_attn_ck_smoke", REPO / "docker/steps/flash_attn_ck_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stand_in_hipcc(tmp_path, body: str) -> Path:
    """A stand-in `hipcc` (this machine has none) in tmp_path/rocm/bin: it records its arguments, then runs body."""
    bin_dir = tmp_path / "rocm" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "hipcc").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/hipcc-args"\n{body}\n')
    (bin_dir / "hipcc").chmod(0o755)
    return bin_dir


def _flash_attn_step(flash_attn_source, tmp_path, hipcc_body: str):
    """The whole of docker/steps/flash-attn.sh for gfx942 (its real build, not the rehearsal), moved under tmp_path:
    its image paths (the profile, /opt/rocmft/build, /wheels) rewritten, a stand-in `rocmft-pip` that hands over the
    real sdist and writes an empty wheel, a stand-in hipcc, this venv's python (with torch), and the HIP version
    given to the smoke compile, as this torch has none. Returns the result, its seconds and the stand-in pip's log."""
    build, steps, bin_dir = tmp_path / "build", tmp_path / "steps", _stand_in_hipcc(tmp_path, hipcc_body)
    shutil.copytree(REPO / "docker" / "patches", build / "patches")
    steps.mkdir()
    (build / "pins-flash-attn.txt").write_text("ninja==1.13.0\npackaging==25.0\n")
    (tmp_path / "profile.env").write_text("ARCH=gfx942\nFLASH_ATTN_BACKEND=ck\nPYTORCH_ROCM_ARCH=gfx942\n")
    moves = {"/etc/rocmft/build-profile.env": str(tmp_path / "profile.env"), "/opt/rocmft/build": str(build),
             "/wheels": str(tmp_path / "wheels"), 'ck_smoke "$tree" "$GPU_ARCHS"': 'ck_smoke "$tree" "$GPU_ARCHS" '
             "--hip-version 7.2.26015"}  # fmt: skip
    for name in ("lib.sh", "flash-attn.sh", "flash_attn_ck_smoke.py"):
        text = (REPO / "docker" / "steps" / name).read_text()
        for old, new in moves.items():
            text = text.replace(old, new)
        (steps / name).write_text(text)
    assert str(tmp_path / "profile.env") in (steps / "lib.sh").read_text()
    sdist = Path(os.environ.get("ROCMFT_TEST_CACHE", REPO / ".cache" / "tests")) / "flash_attn-2.8.3.tar.gz"
    (bin_dir / "rocmft-pip").write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/pip.log
case "$1" in
  download) while [ "$1" != -d ]; do shift; done; cp {sdist} "$2" ;;
  wheel) touch {tmp_path}/wheels/flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl ;;
esac
""")
    (bin_dir / "rocmft-pip").chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    start = time.monotonic()
    result = subprocess.run(["bash", str(steps / "flash-attn.sh")], env={**os.environ, "PATH": path,
                            "FLASH_ATTN_VERSION": "2.8.3"}, capture_output=True, text=True, timeout=300)  # fmt: skip
    return result, time.monotonic() - start, (tmp_path / "pip.log").read_text().splitlines()


@pytest.mark.slow  # flash-attn.sh runs the smoke script, which imports torch
def test_a_broken_toolchain_stops_the_ck_build_in_seconds_naming_the_first_error(flash_attn_source, tmp_path):
    """Issue 31, finding 1: a hipcc that cannot compile the CK kernels stops flash-attn.sh at its smoke compile of
    one generated kernel, non-zero, with the compiler's first error and what to check, before `pip wheel` starts
    the hours-long build."""
    body = ("echo 'In file included from k.cpp:5:' >&2\n"
                    "echo \"ck_tile/core.hpp:12:10: fatal error: 'hip/hip_runtime.h' file not found\" >&2\n"
                    "echo '1 error generated.' >&2\nexit 1")  # fmt: skip
    result, seconds, pip = _flash_attn_step(flash_attn_source, tmp_path, body)
    assert result.returncode == 1, result.stdout + result.stderr
    assert seconds < 60
    assert "failed (exit 1" in result.stderr
    assert ": ck_tile/core.hpp:12:10: fatal error: 'hip/hip_runtime.h' file not found\n" in result.stderr
    assert "The full CK build would fail the same way" in result.stderr and "docker/patches" in result.stderr
    assert [verb.split()[0] for verb in pip] == ["install", "download"]  # pins, the sdist; never `wheel`
    assert not list((tmp_path / "wheels").glob("*.whl"))


@pytest.mark.slow  # flash-attn.sh runs the smoke script, which imports torch
def test_a_sound_toolchain_passes_the_ck_smoke_compile_and_the_build_goes_on(flash_attn_source, tmp_path):
    """The stand-in compiles (checks its include paths, keeps the source, writes the object): the smoke compile
    passes and flash-attn.sh goes on to `pip wheel`; hipcc got a generated forward kernel of the patched sdist, the
    CK include paths and the profile's target, as setup.py would give them."""
    body = f"""for a; do case "$a" in -I*) [ -d "${{a#-I}}" ] || exit 9 ;; esac; done
cp "$4" {tmp_path}/kernel.cpp
while [ "$1" != -o ]; do shift; done
echo obj > "$2"
"""
    result, _, pip = _flash_attn_step(flash_attn_source, tmp_path, body)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "passed" in out and "the full build follows" in out
    assert out.index("the full build follows") < out.index("ran: built flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl")
    assert pip[-1].startswith("wheel ")
    args = (tmp_path / "hipcc-args").read_text().splitlines()
    assert Path(args[args.index("hip") + 1]).name.startswith("fmha_fwd_d128_bf16_")
    assert '#include "fmha_fwd.hpp"' in (tmp_path / "kernel.cpp").read_text()
    assert [a for a in args if a.endswith("/csrc/composable_kernel/include") and a.startswith("-I")]
    assert {"--offload-arch=gfx942", "-D__HIP_PLATFORM_AMD__=1", "-DCK_TILE_FMHA_FWD_FAST_EXP2=1"} <= set(args)


@pytest.mark.light_process  # the sdist's kernel generator (the standard library only, < 1 s)
def test_a_compile_past_the_limit_fails_and_says_so(flash_attn_source, tmp_path, monkeypatch, capsys):
    """The limit holds when hipcc's compiler child outlives it (hipcc runs clang, which keeps the output pipes)."""
    bin_dir = _stand_in_hipcc(tmp_path, f"sleep 60 &\necho $! > {tmp_path}/child\nwait")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    start = time.monotonic()
    status = _ck_smoke().main([str(flash_attn_source), "gfx942", "--hip-version", "7.2.26015", "--timeout", "1"])
    assert status == 1 and time.monotonic() - start < 30
    assert "still compiling after 1 s" in capsys.readouterr().err
    child = Path("/proc") / (tmp_path / "child").read_text().strip()
    for _ in range(50):  # the compiler's child is killed with it, not left compiling (reaped within moments)
        if not child.exists() or "State:\tZ" in (child / "status").read_text():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the compiler's child {child.name} still runs after the limit")


@pytest.mark.light_process  # the sdist's kernel generator (the standard library only, < 1 s each)
def test_the_smoke_kernel_is_one_setup_py_compiles(flash_attn_source, tmp_path):
    """The kernel the smoke step compiles is in the set setup.py v2.8.3 builds: the sdist's generator run for its
    four APIs (setup.py lines 329-332), listed, then globbed as setup.py does (build/fmha_*wd*.cpp, line 364)."""
    smoke = _ck_smoke()
    picked = smoke.pick(smoke.generate(flash_attn_source, tmp_path / "smoke", "32,64,128,256"))
    listed = set()
    for api in ("fwd", "fwd_appendkv", "fwd_splitkv", "bwd"):
        listing = tmp_path / f"{api}.txt"
        command = [sys.executable, str(flash_attn_source / smoke.GENERATOR), "-d", api, "--receipt", "2",
                   "--optdim", "32,64,128,256", "-l", str(listing)]  # fmt: skip
        subprocess.run(command, cwd=flash_attn_source, check=True)
        listed |= {Path(line).name for line in listing.read_text().split()}
    compiled = {name for name in listed if fnmatch.fnmatch(name, "fmha_*wd*.cpp")}
    assert picked.name in compiled, picked.name
    assert len(compiled) > 2000  # the ~2,775 kernels of issue 31 that the smoke step stands in front of


@pytest.mark.parametrize(("archs", "hip_version", "words"), [
    ("gfx1100", "7.2.26015", "flash-attn's CK build supports gfx90a, gfx942, gfx950"),
    ("", "7.2.26015", "set PYTORCH_ROCM_ARCH or FLASH_ATTN_BACKEND"),
    ("gfx942", None, "is not a ROCm build (torch.version.hip is None)"),
    ("gfx942", "seven", "'seven': not a version"),
])  # fmt: skip
def test_bad_input_to_the_smoke_step_is_a_message_and_status_2(flash_attn_source, archs, hip_version, words, capsys):
    args = [str(flash_attn_source), archs] + (["--hip-version", hip_version] if hip_version else [])
    assert _ck_smoke().main(args) == 2
    assert words in capsys.readouterr().err
