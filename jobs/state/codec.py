"""How state values are compressed: a zstd frame behind a marker and the sizes.

zstd level 3: a header, a reorder buffer's part (pickled NumPy columns and strings) or a state
chunk (pickled operator snapshots) shrinks 5-8x in a few ms a MB; every byte not stored is not
copied by the state server, the state store's write batch, its changelog and memtable
(measured: docs/changelog.md#after-the-compressed-header, docs/performance.md#latency).

A value of at least :data:`SHUFFLE_FROM` bytes is *byte-shuffled* first (:data:`SHUFFLED_MARK`):
its bytes as rows of :data:`SHUFFLE_WIDTH`, stored column by column — the first byte of every
8, then the second, … — so the like bytes of the 8-byte numbers an operator's snapshot is mostly
made of (NumPy columns of keys' ids, times, counts and sums) sit side by side. Chunks and frames
of count and match take 30–60 % fewer bytes, the binner's 3–40 % (its sums of amounts in cents
gain least), each compressed in less time (changelog, "State bytes shuffled"). Not every value
gains: floats of few distinct values (prices in cents) repeat whole 8-byte patterns, which plain
zstd finds and the shuffle splits (2.8x the bytes, measured) — so a value shuffled to more than
1/:data:`SHUFFLE_GAIN` of its bytes is compressed as it is too and the smaller kept. Blosc's
shuffle filter does this; a NumPy transpose here spares a dependency for one reshape. A smaller
value (a header: pickled Python, a few hundred bytes) compresses better as it is.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

#: a compressed state value (a header, a part, a chunk) starts with this, then its size and the
#: zstd frame's (little-endian uint64 each), then the frame (after a header, its token follows).
#: Stored bytes: never change it (checkpoints hold it). Every value until 2026-12-05; since, the
#: values below :data:`SHUFFLE_FROM` bytes.
ZSTD_MARK = b"ctiflow:zstd"
#: as :data:`ZSTD_MARK`, the frame's content the value's bytes shuffled (module docstring)
SHUFFLED_MARK = b"ctiflow:zsh8"
#: the fewest bytes of a value that is shuffled before it is compressed
SHUFFLE_FROM = 16384
#: a shuffled value's frame at most 1/SHUFFLE_GAIN of its bytes is kept without trying the value as
#: it is (measured: chunks and frames of count, match and bins shrink 6–47x shuffled; the values the
#: shuffle grows, 2x or less)
SHUFFLE_GAIN = 4
#: the bytes of a shuffled row: a value's length past a multiple of it stays at the end as it is
SHUFFLE_WIDTH = 8
_SIZES = struct.Struct("<QQ")
_AT = len(ZSTD_MARK) + _SIZES.size
_ZSTD = pa.Codec("zstd", compression_level=3)


def compressed(value: bytes) -> bytes:
    """``value`` (a header, a part, a chunk) as the state store holds it: :data:`ZSTD_MARK` or,
    from :data:`SHUFFLE_FROM` bytes, :data:`SHUFFLED_MARK` (the module docstring says when); the
    value's size and the frame's; a zstd frame."""
    mark = frame = None
    if len(value) >= SHUFFLE_FROM:
        mark, frame = SHUFFLED_MARK, _ZSTD.compress(_shuffled(value), asbytes=True)
    if frame is None or len(frame) * SHUFFLE_GAIN > len(value):
        plain = _ZSTD.compress(value, asbytes=True)
        if frame is None or len(plain) <= len(frame):
            mark, frame = ZSTD_MARK, plain
    return mark + _SIZES.pack(len(value), len(frame)) + frame


def expanded(stored: bytes | None) -> bytes | None:
    """The value of a stored one (:func:`compressed`, or a pickled header as written before
    2026-11-26, returned as it is); bytes after the frame (a header's token) are ignored."""
    if stored is None:
        return None
    shuffled = stored.startswith(SHUFFLED_MARK)
    if not shuffled and not stored.startswith(ZSTD_MARK):
        return stored
    size, length = _SIZES.unpack_from(stored, len(ZSTD_MARK))
    value = _ZSTD.decompress(memoryview(stored)[_AT:_AT + length], decompressed_size=size, asbytes=True)
    return _unshuffled(value) if shuffled else value


def _shuffled(value: bytes) -> bytes:
    return _transposed(value, (-1, SHUFFLE_WIDTH))


def _unshuffled(value: bytes) -> bytes:
    return _transposed(value, (SHUFFLE_WIDTH, -1))


def _transposed(value: bytes, shape: tuple[int, int]) -> bytes:
    """``value``'s whole rows of :data:`SHUFFLE_WIDTH` bytes read as ``shape`` and transposed, the
    bytes past them as they are (a shuffle and its inverse differ only in ``shape``)."""
    whole = len(value) - len(value) % SHUFFLE_WIDTH
    return np.frombuffer(value, np.uint8, whole).reshape(shape).T.tobytes() + value[whole:]
