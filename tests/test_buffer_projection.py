"""The reorder buffer stores only the fields its operators read (bins: the measures) and that is
invisible: a bins job fed Arrow packs and restored from its committed header after every
micro-batch emits the same records as the same job storing every field — including the records
that carry a whole event (the late share of an ADJUSTed flow, the dead letter of a flow whose
measure is NaN, held across micro-batches) — while its header is smaller. The oracle is the
same job with the projection switched off, and the flows' own ids."""

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import Control, GroupInput, pack_columns, unpack_columns
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.jobs.avro.serde import AvroSerializer
from ctiflow.jobs.testing import workload
from ctiflow.operators.bins import Binner
from ctiflow.operators.columns import EventColumns

pytest.importorskip("pyspark")


def _plan():
    return plan_job(parse({
        "job": "p", "kafka": {"bootstrap_servers": "x:1"},
        "sources": [{"name": "flows", "topic": "t", "schema": "flow", "key_field": "device", "time_field": "start_time",
                     "end_field": "end_time", "shape": "interval", "cti": {"delay": "1m", "policy": "adjust"}}],
        "operators": [{"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes", "packets"],
                       "outputs": {"incremental": "bi", "final": "bf"}}]}, "p"))


def _columns(records: list[dict], first_offset: int) -> EventColumns:
    """Records → Avro → the source's bulk decode → one pack → its columns (as the adapter gets them)."""
    from ctiflow.jobs.datapath.source.decoder import RecordDecoder
    from ctiflow.jobs.datapath.source.options import SourceOptions

    options = SourceOptions(bootstrap="127.0.0.1:9", topic="t", schema="flow", stream="flows",
                            keep_values=False, key_field="device", time_field="start_time", end_field="end_time",
                            shape="interval").to_options()
    got = RecordDecoder(options).decoded([AvroSerializer("flow")(r) for r in records])
    assert not got.errors
    n = len(records)
    pack = pack_columns(got.fields, got.keys, got.starts, got.ends, first_offset + np.arange(n), pa.nulls(n, pa.binary()))
    return unpack_columns(pack, "flows", 0)


def _run(plan, batches: list[list[dict]]) -> tuple[list, list[int]]:
    """Every result in emission order, and the buffer's stored size (its parts) after each
    batch; the group is restored from its committed header (and store) after every batch, as in
    Spark."""
    rt, results, sizes, offset = GroupRuntime(plan), [], [], 0
    for b, records in enumerate(batches):
        cols = _columns(records, offset)
        offset += len(records)
        got = GroupInput([cols], [("flows", 0, int(cols.start.max()))],
                         [("flows", Control([0], [], b == len(batches) - 1))], [])
        out = rt.run_batch(got).outputs
        results += [(b, topic, o.role, o.record) for topic, o, _ in out]
        header = rt.commit()
        sizes.append(rt.parts.bytes)
        rt = GroupRuntime(plan, header=header, chunks=rt.chunks)
    return results, sizes


def test_the_buffer_keeps_only_the_fields_read_and_every_record_is_the_same(monkeypatch):
    flows = workload.flows(900, devices=4, seed=11, rate_per_s=2.0, late_fraction=0.04, late_by_ms=20_000)
    # the latest flow of the fifth batch is still held when it ends: refused by the binner when
    # released, a batch later, from a restored buffer
    held = max(range(400, 500), key=lambda i: flows[i]["start_time"])
    nan_id = flows[held]["id"]
    flows[held]["bytes"] = float("nan")
    batches = [flows[i:i + 100] for i in range(0, len(flows), 100)]

    plan = _plan()
    assert plan.fields_read == ("bytes", "packets")
    projected, small = _run(plan, batches)
    traits = Binner.traits
    monkeypatch.setattr(Binner, "traits", classmethod(  # every field stored: the oracle
        lambda cls, settings: dataclasses.replace(traits(settings), fields_read=None)))
    assert _plan().fields_read is None
    full, big = _run(_plan(), batches)

    assert projected == full
    assert sum(small) < 0.8 * sum(big), (small, big)
    dead = [r for _, _, role, r in projected if role == "dead_letter"]
    assert len(dead) == 1 and json.loads(dead[0]["value"])["id"] == nan_id
    arrived = [b for b, batch in enumerate(batches) if any(f["id"] == nan_id for f in batch)][0]
    assert [b for b, _, role, _ in projected if role == "dead_letter"][0] > arrived  # it was held, then refused
    adjusted = [r for _, _, role, r in projected if role == "late" and r["reason"].startswith("adjust")]
    assert adjusted and all(set(json.loads(r["fields_json"])) == set(flows[0]) for r in adjusted)
