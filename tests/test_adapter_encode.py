"""The adapter writes an input record passed on unchanged as its original bytes — but only when
those bytes carry the result topic's schema; otherwise it encodes the record again."""

import pytest

from jobs import workload
from jobs.config import parse
from jobs.runtime import Counters, plan as make_plan
from jobs.serde import AvroDeserializer, AvroSerializer
from operators.operator import Output


class _Handle:
    """The one call ``init`` makes on PySpark's handle (no Spark needed to encode)."""

    def getValueState(self, name, schema):
        return None


def test_unchanged_records_keep_their_bytes_only_with_the_topics_schema():
    pytest.importorskip("pyspark")
    from jobs.adapter import OperatorProcessor

    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"},
                 "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time"}],
                 "operators": [{"kind": "passthrough", "output": "out"}]}, "t")
    proc = OperatorProcessor(make_plan(cfg), cfg.result_topics(), cfg.kafka.effective_framing, None, {"s": "t"})
    proc.init(_Handle())
    rec = workload.transactions(1, seed=3)[0]
    same = AvroSerializer("transaction")(rec)
    # An older writer's bytes (another fingerprint): readable, but not the topic's schema.
    foreign = AvroSerializer("flow")(workload.flows(1)[0])
    outs = [("out", Output("passthrough", rec, same), rec["account"]),
            ("out", Output("passthrough", rec, foreign), rec["account"]),
            ("out", Output("passthrough", rec), rec["account"])]
    frame = next(proc._encode(outs, [], Counters()))
    values = frame["value"].tolist()
    assert values[0] is same
    assert values[1] != foreign and values[1] == values[2] == same
    assert AvroDeserializer("transaction")(values[1]) == rec
    assert frame["kind"].tolist() == ["passthrough"] * 3 + ["metrics"]
