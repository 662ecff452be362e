"""CRC-32 of a column of keys at once: what picks a key's group, its chunk and a result record's
partition, computed as :func:`zlib.crc32` would, one NumPy step a byte position."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc_table()


def crc32_column(strings) -> np.ndarray:
    """``zlib.crc32`` of each value (uint32) of an Arrow string (UTF-8 bytes) or binary column,
    all at once: the table-driven CRC-32 stepped one byte position at a time over all values (as
    many NumPy steps as the longest value has bytes: meant for keys, not long values; a null
    hashes as whatever its slot spans, so callers hash non-null keys or replace the nulls' hashes).
    Written by hand because neither NumPy nor Arrow computes CRC-32 over a
    column, and a key's group (``crc32(key) mod G``: checkpoints and the shuffle depend on it)
    and a result record's partition (:func:`ctiflow.jobs.datapath.sink.partition_for`: replays depend on
    it) must stay what ``zlib.crc32`` gives."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    n = len(strings)
    crc = np.full(n, 0xFFFFFFFF, np.uint32)
    if not n:
        return crc
    if strings.type not in (pa.string(), pa.binary()):
        strings = strings.cast(pa.binary())
    _, offsets_buf, data_buf = strings.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, strings.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    table = _CRC_TABLE
    live = np.arange(n)
    for j in range(int(lengths.max())):
        if lengths[live].min() <= j:  # strings this short are done
            live = live[lengths[live] > j]
        c = crc[live]
        crc[live] = table[(c ^ data[starts[live] + j]) & 0xFF] ^ (c >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)
