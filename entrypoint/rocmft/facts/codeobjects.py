"""Which GPU targets a HIP binary carries: the code-object bundles in its ``.hip_fatbin`` section.

A HIP shared library (torch's ``libtorch_hip.so``, bitsandbytes' ``libbitsandbytes_rocm72.so``, a
flash-attention or DeepSpeed extension) holds its device code as clang offload bundles in the ELF section
``.hip_fatbin``, one bundle per translation unit. Each bundle lists its entries by ID, e.g.
``hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-``; the HIP runtime loads the entry whose processor is the
GPU's. A library without an entry for the card's gfx target fails at the first kernel launch
("invalid device function"), which is why the image build checks the target here.

Bundles come in two forms (LLVM ``clang/lib/Driver/OffloadBundler.cpp``, llvm/llvm-project at
000390203c87508e7d1bbf2002bb9ce819cef1b8):

* uncompressed: the magic ``__CLANG_OFFLOAD_BUNDLE__``, an 8-byte entry count, then per entry its offset,
  size and ID length (8 bytes each, little-endian) and the ID;
* compressed (``--offload-compress``, what bitsandbytes 0.50 and ROCm 7 builds ship): the magic ``CCOB``,
  a 2-byte version and a 2-byte method (0 zlib, 1 zstd: ``llvm::compression::Format``), then for version 1
  a 4-byte uncompressed size; version 2 a 4-byte total size and 4-byte uncompressed size; version 3 an
  8-byte total size and 8-byte uncompressed size; then an 8-byte hash; the compressed payload is an
  uncompressed bundle. Plain-text searches for ``amdgcn-amd-amdhsa--<gfx>`` find nothing in these, so a
  checker must decompress.

Written here, not taken from a library, because no Python package reads offload bundles; LLVM's
``clang-offload-bundler --list`` does, but it is not in every image and lists one bundle per call. The ELF
section is found with pyelftools and the payloads are decompressed with zstandard and zlib.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

_PLAIN_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
_COMPRESSED_MAGIC = b"CCOB"
# How much of a compressed bundle is decompressed: only its header (entry IDs) is read, and a header of
# 64 KiB holds over a thousand entries; decompressing whole bundles of a 1 GB libtorch_hip.so takes minutes.
_HEADER_BYTES = 1 << 16
# The compressed header's size fields after magic, version and method (OffloadBundler.cpp's V1-V3 headers).
_COMPRESSED_LAYOUT = {1: ("<IQ", 20), 2: ("<IIQ", 24), 3: ("<QQQ", 32)}


class CodeObjectError(ValueError):
    """A file that is not a HIP binary, or whose offload bundles cannot be read (the message names it)."""


def _entry_ids(bundle: bytes, where: str) -> list[str]:
    """The entry IDs of one uncompressed bundle (its header may be all that is given)."""
    try:
        (count,) = struct.unpack_from("<Q", bundle, len(_PLAIN_MAGIC))
        position = len(_PLAIN_MAGIC) + 8
        ids = []
        for _ in range(count):
            _offset, _size, length = struct.unpack_from("<QQQ", bundle, position)
            position += 24
            if position + length > len(bundle):
                raise struct.error("entry ID beyond the header")
            ids.append(bundle[position : position + length].decode("ascii"))
            position += length
    except (struct.error, UnicodeDecodeError) as err:
        raise CodeObjectError(f"{where}: malformed offload bundle header ({err})") from None
    return ids


def _bundle_end(bundle: bytes, start: int) -> int:
    """Where an uncompressed bundle that begins at ``start`` ends (its furthest entry)."""
    (count,) = struct.unpack_from("<Q", bundle, start + len(_PLAIN_MAGIC))
    position, end = start + len(_PLAIN_MAGIC) + 8, start + len(_PLAIN_MAGIC)
    for _ in range(count):
        offset, size, length = struct.unpack_from("<QQQ", bundle, position)
        position += 24 + length
        end = max(end, start + offset + size, position)
    return end


def _decompress_head(method: int, payload: bytes, where: str) -> bytes:
    """The first _HEADER_BYTES of a compressed bundle's payload."""
    try:
        if method == 1:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
                return reader.read(_HEADER_BYTES)
        if method == 0:
            return zlib.decompressobj().decompress(payload, _HEADER_BYTES)
    except Exception as err:  # zstandard.ZstdError, zlib.error
        raise CodeObjectError(f"{where}: cannot decompress an offload bundle ({type(err).__name__}: {err})") from None
    raise CodeObjectError(f"{where}: unknown offload bundle compression method {method} (0 zlib, 1 zstd)")


def fatbin_section(library: Path) -> bytes:
    """The bytes of ``library``'s ``.hip_fatbin`` ELF section.

    Raises:
        CodeObjectError: ``library`` is not an ELF file or has no ``.hip_fatbin`` section (no HIP device code).
    """
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with library.open("rb") as handle:
            section = ELFFile(handle).get_section_by_name(".hip_fatbin")
            if section is None:
                raise CodeObjectError(f"{library}: no .hip_fatbin section (no HIP device code in this file)")
            return section.data()
    except (ELFError, OSError) as err:
        raise CodeObjectError(f"{library}: not a readable ELF file, or cut short ({err})") from None


def bundle_ids(library: Path) -> list[str]:
    """Every entry ID of every offload bundle in ``library``, in file order (duplicates kept).

    Returns:
        IDs like ``hipv4-amdgcn-amd-amdhsa--gfx942`` and ``host-x86_64-unknown-linux-gnu-``.

    Raises:
        CodeObjectError: no ``.hip_fatbin`` section, or a bundle that cannot be read.
    """
    data = fatbin_section(library)
    where = str(library)
    ids: list[str] = []
    position = 0
    # Each magic's next occurrence at or after ``position`` is kept and searched for again only once ``position``
    # has passed it, so each magic is searched for once over the section: linear in its size. Searching both afresh
    # at every bundle scanned to the section's end for the absent one each time, quadratic in the bundle count
    # (issue 31, finding 3; bench/codeobjects_scan.py measures both). Two bytes.find passes rather than one regex
    # alternation: the regex scans random bytes about 8 times slower than find (50 MB: 0.46 s against 0.05 s).
    plain, compressed = data.find(_PLAIN_MAGIC), data.find(_COMPRESSED_MAGIC)
    while True:
        if 0 <= plain < position:
            plain = data.find(_PLAIN_MAGIC, position)
        if 0 <= compressed < position:
            compressed = data.find(_COMPRESSED_MAGIC, position)
        starts = [s for s in (plain, compressed) if s >= 0]
        if not starts:
            break
        start = min(starts)
        if start == compressed:
            if start + _COMPRESSED_LAYOUT[1][1] > len(data):
                raise CodeObjectError(f"{where}: an offload bundle header is cut short at the section's end")
            version, method = struct.unpack_from("<HH", data, start + 4)
            if version not in _COMPRESSED_LAYOUT:
                raise CodeObjectError(f"{where}: compressed offload bundle of unknown version {version}")
            layout, header = _COMPRESSED_LAYOUT[version]
            if version == 1:  # no total size: the bundle runs to the next magic (ROCm <= 6.1 wrote this version)
                following = data.find(_COMPRESSED_MAGIC, start + 4)
                total = (following if following >= 0 else len(data)) - start
            else:
                total = struct.unpack_from(layout, data, start + 8)[0]
            if not header < total <= len(data) - start:
                raise CodeObjectError(f"{where}: compressed offload bundle at {start} has a bad size ({total})")
            ids += _entry_ids(_decompress_head(method, data[start + header : start + total], where), where)
            position = start + total
        else:
            ids += _entry_ids(data[start : start + _HEADER_BYTES], where)
            position = max(_bundle_end(data, start), start + len(_PLAIN_MAGIC))
    if not ids:
        raise CodeObjectError(f"{where}: .hip_fatbin holds no offload bundle")
    return ids


def gfx_targets(library: Path) -> set[str]:
    """The GPU processors ``library`` has device code for, without target features.

    ``hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-`` counts as ``gfx90a``: an entry's features (xnack, sramecc)
    narrow which configurations of that GPU load it, but the processor is what a missing target lacks.

    Raises:
        CodeObjectError: as :func:`bundle_ids`.
    """
    targets = set()
    for entry in bundle_ids(library):
        _kind, separator, target_id = entry.partition("-amdgcn-amd-amdhsa-")
        processor = target_id.lstrip("-").split(":")[0]
        if separator and processor:
            targets.add(processor)
    return targets
