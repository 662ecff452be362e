"""The state codec (:mod:`ctiflow.jobs.state.codec`): every value reads back as written; a large one
is stored byte-shuffled (checked against a shuffle written here byte by byte) unless that takes
more bytes than one zstd frame of it; values stored before the shuffle (one zstd frame, any size)
still read; a header's token after the frame is ignored."""

import pickle
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.state import codec
from ctiflow.jobs.state.codec import SHUFFLE_FROM, SHUFFLED_MARK, ZSTD_MARK, compressed, expanded

ZSTD = pa.Codec("zstd", compression_level=3)  # the level the codec states
AT = len(ZSTD_MARK) + 16  # the mark, then two little-endian uint64 sizes


def frame_of(stored: bytes) -> bytes:
    """The content of a stored value's zstd frame, read from the layout the docstring states."""
    size = int.from_bytes(stored[len(ZSTD_MARK):len(ZSTD_MARK) + 8], "little")
    length = int.from_bytes(stored[len(ZSTD_MARK) + 8:AT], "little")
    return ZSTD.decompress(stored[AT:AT + length], decompressed_size=size, asbytes=True)


def shuffled_by_hand(value: bytes) -> bytes:
    """Byte ``j`` of every 8-byte row, for j = 0..7, then the bytes past the last whole row."""
    whole = len(value) // 8 * 8
    return bytes(value[row + j] for j in range(8) for row in range(0, whole, 8)) + value[whole:]


def plain_size(value: bytes) -> int:
    return AT + len(ZSTD.compress(value, asbytes=True))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3 * SHUFFLE_FROM), st.integers(0, 2**32 - 1), st.booleans())
def test_a_value_reads_back_as_written_small_ones_plain_large_ones_shuffled(size, seed, numeric):
    rng = random.Random(seed)
    if numeric:  # like a snapshot's NumPy columns: 8-byte numbers, a pickle around them
        value = pickle.dumps(np.cumsum([rng.randrange(1000) for _ in range(size // 8)]).astype(np.int64), 5)
        value = value[:size] if len(value) > size else value
    else:
        value = rng.randbytes(size)
    stored = compressed(value)
    assert expanded(stored) == value
    if len(value) < SHUFFLE_FROM:
        assert stored.startswith(ZSTD_MARK)
    assert stored.startswith((ZSTD_MARK, SHUFFLED_MARK))
    assert frame_of(stored) == (shuffled_by_hand(value) if stored.startswith(SHUFFLED_MARK) else value)
    plain = plain_size(value)
    if stored.startswith(SHUFFLED_MARK):  # shrunk to a quarter of the value, or smaller than one frame of it
        assert (len(stored) - AT) * 4 <= len(value) or len(stored) < plain
    else:
        assert len(stored) == plain


@pytest.mark.parametrize("size", [SHUFFLE_FROM, SHUFFLE_FROM + 5, 5 * SHUFFLE_FROM + 3])
def test_a_header_token_after_a_shuffled_frame_is_ignored(size):
    value = random.Random(size).randbytes(size)
    assert expanded(compressed(value) + b"t" * 16) == value


@pytest.mark.parametrize("size", [10, SHUFFLE_FROM, 4 * SHUFFLE_FROM + 1])
def test_values_stored_before_the_shuffle_read_as_they_were_written(size):
    """Until 2026-12-05 every value was one zstd frame of its bytes behind ZSTD_MARK, whatever its size
    (checkpoints hold them): built here from that layout, not by the codec."""
    value = random.Random(size).randbytes(size)
    frame = ZSTD.compress(value, asbytes=True)
    old = ZSTD_MARK + len(value).to_bytes(8, "little") + len(frame).to_bytes(8, "little") + frame
    assert expanded(old) == value
    assert expanded(old + b"token-16-bytes!!") == value
    assert expanded(pickle.dumps(("header", 1))) == pickle.dumps(("header", 1))  # before 2026-11-26: as is
    assert expanded(None) is None


def test_eight_byte_columns_take_fewer_bytes_shuffled():
    """What the shuffle is for: pickled NumPy columns of 8-byte numbers (keys' ids, counts, whole
    amounts) compress to fewer bytes than one zstd frame of them takes."""
    rng = np.random.default_rng(3)
    columns = (np.sort(rng.choice(3_000_000, 50_000, replace=False)), rng.integers(0, 40, 50_000),
               rng.integers(0, 2000, 50_000).astype(np.float64))
    value = pickle.dumps(columns, 5)
    stored = compressed(value)
    assert stored.startswith(SHUFFLED_MARK) and len(stored) < 0.9 * plain_size(value)
    assert codec.SHUFFLE_WIDTH == 8


@pytest.mark.parametrize("values", ["prices", "random"])
def test_a_value_the_shuffle_would_grow_is_stored_as_it_is(values):
    """Floats of few distinct values (prices in cents) repeat whole 8-byte patterns, which one zstd
    frame finds and the shuffle splits; random bytes gain nothing either way."""
    rng = np.random.default_rng(5)
    value = (pickle.dumps(rng.integers(0, 30_000, 60_000) / 100.0, 5) if values == "prices"
             else rng.bytes(300_000))
    stored = compressed(value)
    assert stored.startswith(ZSTD_MARK) and len(stored) == plain_size(value)
    assert expanded(stored) == value
