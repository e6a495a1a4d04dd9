"""How the image build's code-object scan (rocmft.facts.codeobjects.bundle_ids) grows with the bundle count.

Run from the repository root (CPU only, about a minute on two idle cores; gcc and objcopy on PATH)::

    python bench/codeobjects_scan.py [--bundles 250] [--old-rev 6c16f24] [--repeat 5]

It builds ELF libraries whose ``.hip_fatbin`` section holds N and 2N offload bundles, once all compressed (``CCOB``
version 3, zstd: what ROCm 7 and bitsandbytes 0.50 ship) and once all plain (``__CLANG_OFFLOAD_BUNDLE__``: hipcc
without --offload-compress), put into a real shared object with objcopy as tests/test_buildinfo.py does. Each
bundle holds the IDs of a host entry and four gfx entries over 80 KB of random code (random bytes do not
compress, so a compressed bundle is about as large as a plain one; issue 31 measured 250 bundles in 26 MB). It
times ``bundle_ids`` of this tree and of the file at ``--old-rev`` (read with ``git show``; 6c16f24 is the last
commit with the scan that searched both magics afresh at every bundle; timed once, its times are seconds) and of
this tree (the best of --repeat calls: its times are tens of milliseconds, noisy on a shared machine), checks both
return the same IDs, and prints the time for 2N bundles over the time for N: about 2 for a linear scan, about 4 for a
quadratic one.
The bundle layouts are LLVM's (clang/lib/Driver/OffloadBundler.cpp, as rocmft/facts/codeobjects.py cites them).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "entrypoint"))

IDS = ("host-x86_64-unknown-linux-gnu-", "hipv4-amdgcn-amd-amdhsa--gfx90a", "hipv4-amdgcn-amd-amdhsa--gfx942",
       "hipv4-amdgcn-amd-amdhsa--gfx950", "hipv4-amdgcn-amd-amdhsa--gfx1100")  # fmt: skip
CODE_BYTES = 20_000  # per gfx entry: four of them make a bundle of about 80 KB


def plain_bundle(rng: random.Random) -> bytes:
    """One uncompressed bundle: magic, entry count, per entry offset/size/ID length and the ID, then the code."""
    header_size = 24 + 8 + sum(24 + len(i) for i in IDS)
    codes = [b"" if i.startswith("host-") else rng.randbytes(CODE_BYTES) for i in IDS]
    header, offset = [b"__CLANG_OFFLOAD_BUNDLE__", struct.pack("<Q", len(IDS))], header_size
    for entry, code in zip(IDS, codes, strict=True):
        header += [struct.pack("<QQQ", offset, len(code), len(entry)), entry.encode()]
        offset += len(code)
    return b"".join(header + codes)


def compressed_bundle(plain: bytes) -> bytes:
    """``plain`` as a version-3 compressed bundle: magic, version 3, method 1 (zstd), total and uncompressed size
    (8 bytes each), an 8-byte hash (not checked by the reader), then the zstd payload."""
    import zstandard

    payload = zstandard.ZstdCompressor().compress(plain)
    return b"CCOB" + struct.pack("<HHQQQ", 3, 1, 32 + len(payload), len(plain), 0) + payload


def library(folder: Path, name: str, bundles: list[bytes]) -> Path:
    """A shared object built with gcc whose ``.hip_fatbin`` section (added with objcopy) holds ``bundles``."""
    fatbin, source, out = folder / f"{name}.fatbin", folder / "k.c", folder / f"{name}.so"
    fatbin.write_bytes(b"".join(b + b"\0" * (-len(b) % 4096) for b in bundles))
    source.write_text("int k(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", out, source], check=True)
    subprocess.run(["objcopy", "--add-section", f".hip_fatbin={fatbin}", out], check=True)
    fatbin.unlink()
    return out


def old_module(rev: str, folder: Path):
    """rocmft/facts/codeobjects.py as it was at ``rev``, imported under another name."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:entrypoint/rocmft/facts/codeobjects.py"],
                          check=True, capture_output=True, text=True).stdout  # fmt: skip
    path = folder / "codeobjects_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("codeobjects_old", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_time(function, path: Path, repeat: int) -> tuple[float, list[str]]:
    """The fastest of ``repeat`` calls of ``function(path)``, in CPU seconds of this process (time.process_time:
    other work on a shared machine does not inflate it as it does wall time), and its result."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        result = function(path)
        times.append(time.process_time() - started)
    return min(times), result


def main(argv: list[str] | None = None) -> int:
    from rocmft.facts import codeobjects as new

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=int, default=250, help="N: the smaller library's bundle count")
    parser.add_argument("--old-rev", default="6c16f24", help="the commit whose bundle_ids is the 'before'")
    parser.add_argument("--repeat", type=int, default=5, help="timings of this tree per library (the best is kept)")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        old = old_module(args.old_rev, folder)
        print(f"| bundles | form | section MB | {args.old_rev} CPU s | this tree CPU s |")
        print("|---|---|---|---|---|")
        ratios = {}
        for form in ("compressed", "plain"):
            times = {}
            for count in (args.bundles, 2 * args.bundles):
                plains = [plain_bundle(rng) for _ in range(count)]
                bundles = [compressed_bundle(p) for p in plains] if form == "compressed" else plains
                path = library(folder, f"{form}{count}", bundles)
                size = sum(len(b) + (-len(b) % 4096) for b in bundles) / 1e6
                new.bundle_ids(path)  # untimed: the first call pays for importing pyelftools and zstandard
                old_s, old_ids = best_time(old.bundle_ids, path, 1)
                new_s, new_ids = best_time(new.bundle_ids, path, args.repeat)
                if old_ids != new_ids or len(new_ids) != count * len(IDS):
                    print(f"{form} {count}: the two versions disagree", file=sys.stderr)
                    return 1
                times[count] = (old_s, new_s)
                print(f"| {count} | {form} | {size:.1f} | {old_s:.3f} | {new_s:.3f} |")
                path.unlink()
            small, large = times[args.bundles], times[2 * args.bundles]
            ratios[form] = (large[0] / small[0], large[1] / small[1])
        print()
        for form, (old_ratio, new_ratio) in ratios.items():
            print(f"{form}: time for {2 * args.bundles} bundles / {args.bundles}: "
                  f"{args.old_rev} {old_ratio:.2f}, this tree {new_ratio:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
