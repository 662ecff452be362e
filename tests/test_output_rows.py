"""The sink reads the adapter's output rows as (topic, keys, values) columns: packs, runs of
one-record rows and metrics rows mixed, in row order, whatever the batching."""

from __future__ import annotations

import random

import pyarrow as pa

from ctiflow.jobs.core import rows


def _rows(seed: int) -> tuple[list[pa.RecordBatch], list[tuple], dict]:
    rng = random.Random(seed)
    expected: list[tuple] = []
    metrics: dict[str, int] = {}
    table = []  # (topic, key, value, kind)
    for _ in range(rng.randrange(1, 40)):
        what = rng.choice(("pack", "plain", "plain", "plain", "metrics"))
        topic = rng.choice(("a", "b"))
        if what == "pack":
            items = [(rng.choice((None, f"k{j}".encode())), f"v{rng.random()}".encode(), "match")
                     for j in range(rng.randrange(0, 5))]
            table.append((topic, None, rows.result_pack(items), rows.PACK))
            expected += [(topic, k, v) for k, v, _ in items]
        elif what == "plain":
            key, value = rng.choice((None, b"", b"key")), f"p{rng.random()}".encode()
            table.append((topic, key, value, "passthrough"))
            expected.append((topic, key, value))
        else:
            table.append((None, None, b'{"received": 3}', rows.METRICS))
            metrics["received"] = metrics.get("received", 0) + 3
    schema = pa.schema([("topic", pa.string()), ("key", pa.binary()), ("value", pa.binary()), ("kind", pa.string())])
    batches, at = [], 0
    while at < len(table):  # Spark hands the rows over in batches of any size
        n = rng.randrange(1, 8)
        part = table[at:at + n]
        batches.append(pa.RecordBatch.from_pylist([dict(zip(schema.names, r)) for r in part], schema=schema))
        at += n
    return batches, expected, metrics


def test_output_rows_come_out_as_every_record_in_order_and_metrics_summed():
    for seed in range(200):
        batches, expected, metrics = _rows(seed)
        got_metrics: dict[str, int] = {}
        got = [(topic, k, v) for topic, keys, values in rows.output_columns(batches, got_metrics)
               for k, v in zip(keys.to_pylist(), values.to_pylist())]
        assert got == expected, seed
        assert got_metrics == metrics, seed
        assert list(rows.output_records(batches, {})) == expected, seed


def test_one_record_rows_of_a_topic_come_as_one_slice():
    batches, _, _ = _rows(0)
    plain = pa.RecordBatch.from_pylist([{"topic": "a", "key": b"k", "value": b"%d" % i, "kind": "passthrough"}
                                        for i in range(1000)], schema=batches[0].schema)
    assert [(t, len(v)) for t, _, v in rows.output_columns([plain], {})] == [("a", 1000)]


def test_a_packs_partitions_are_each_records_partition():
    """The sink hashes a pack's keys as one column; each record must still land where
    ``partition_for`` (the definition a replay relies on) puts it: by its key, or by its value
    when the key is null or empty."""
    import pytest

    pytest.importorskip("pyspark")
    from ctiflow.jobs.datapath.sink import partition_for, partitions_for

    rng = random.Random(5)
    for n in (1, 7, 300):
        keys = [rng.choice((None, b"", rng.randbytes(rng.randrange(1, 40)))) for _ in range(n)]
        values = [rng.randbytes(rng.randrange(1, 120)) for _ in range(n)]
        for parts in (1, 3, 8):
            got = partitions_for(pa.array(keys, pa.binary()), pa.array(values, pa.binary()), parts)
            assert got == [partition_for(k, v, parts) for k, v in zip(keys, values)]
