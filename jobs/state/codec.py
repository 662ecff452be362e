"""How state values are compressed: a zstd frame behind a marker and the sizes.

zstd level 3: a header, a reorder buffer's part (pickled NumPy columns and strings) or a state
chunk (pickled operator snapshots) shrinks 5-8x in a few ms a MB; every byte not stored is not
copied by the state server, the state store's write batch, its changelog and memtable
(measured: docs/changelog.md#after-the-compressed-header, docs/performance.md#latency)."""

from __future__ import annotations

import struct

import pyarrow as pa

#: a compressed state value (a header, a part, a chunk) starts with this, then its size and the
#: zstd frame's (little-endian uint64 each), then the frame (after a header, its token follows).
#: Stored bytes: never change it (checkpoints hold it).
ZSTD_MARK = b"ctiflow:zstd"
_SIZES = struct.Struct("<QQ")
_ZSTD = pa.Codec("zstd", compression_level=3)


def compressed(header: bytes) -> bytes:
    """``header`` (or any state value) as the state store holds it: :data:`ZSTD_MARK`, the
    sizes, a zstd frame."""
    frame = _ZSTD.compress(header, asbytes=True)
    return ZSTD_MARK + _SIZES.pack(len(header), len(frame)) + frame


def expanded(stored: bytes | None) -> bytes | None:
    """The header of a stored value (:func:`compressed`, or a pickled header as written before
    2026-11-26, returned as it is); bytes after the frame (the token) are ignored."""
    if stored is None or not stored.startswith(ZSTD_MARK):
        return stored
    at = len(ZSTD_MARK) + _SIZES.size
    size, length = _SIZES.unpack_from(stored, len(ZSTD_MARK))
    return _ZSTD.decompress(memoryview(stored)[at:at + length], decompressed_size=size, asbytes=True)
