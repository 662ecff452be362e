"""The key-group hash over a whole Arrow column equals ``zlib.crc32`` of each key's UTF-8 bytes
(the group of a key is ``crc32(key) mod G``: checkpoints and the shuffle depend on it)."""

from __future__ import annotations

import zlib

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.state.keyhash import crc32_column


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=60), st.integers(0, 5))
def test_crc32_of_a_string_column_is_zlibs_per_string(keys, cut):
    column = pa.array(keys, pa.string())
    expected = [zlib.crc32(k.encode()) for k in keys]
    assert crc32_column(column).tolist() == expected
    assert crc32_column(column.slice(min(cut, len(keys)))).tolist() == expected[min(cut, len(keys)):]
    chunked = pa.chunked_array([column.slice(0, len(keys) // 2), column.slice(len(keys) // 2)], pa.string())
    assert crc32_column(chunked).tolist() == expected


def test_crc32_of_the_demo_accounts_and_of_long_multibyte_keys():
    keys = [f"acct-{i:05d}" for i in range(2000)] + ["", "ü" * 300, "鍵-" + "x" * 1000, "a"]
    assert crc32_column(pa.array(keys)).tolist() == [zlib.crc32(k.encode()) for k in keys]
    assert crc32_column(pa.array(keys, pa.large_string())).tolist() == [zlib.crc32(k.encode()) for k in keys]
    raw = [k.encode() for k in keys] + [bytes(range(256)), None]
    assert crc32_column(pa.array(raw, pa.binary())).tolist() == [zlib.crc32(k or b"") for k in raw]
