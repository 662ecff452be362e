"""A job's match and timed-out records carry their events as typed records of the input's schema
(a schema the job derives), not JSON text: through the runtime, encoded and decoded as Avro."""

import json

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.recognize import derived_schemas
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.jobs.avro.serde import AvroDeserializer, AvroSerializer
from ctiflow.operators.time import CTI_INFINITY, Event

T0 = 1_767_225_600_000
BRUTE_FORCE = {"within": "5m", "skip": "skip_past_last_event",
               "stages": [{"name": "failures", "where": "type == 'login_failed'", "quantifier": {"times": 2},
                           "consecutive": True},
                          {"name": "success", "contiguity": "next", "where": "type == 'login_ok'"}]}


def job(**extra):
    return parse({"job": "m", "kafka": {"bootstrap_servers": "x:1"},
                  "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                               "time_field": "event_time"}],
                  "operators": [{"kind": "match", "name": "brute", "pattern": BRUTE_FORCE, "output": "found",
                                 "timed_out": "gave-up", **extra}]}, "t")


def tx(i, account, t, kind, amount=1.0, merchant=None):
    return {"id": f"t{i}", "account": account, "event_time": t, "type": kind, "amount": amount, "currency": "EUR",
            "country": "DE", "merchant": merchant}


def test_match_events_are_typed_records_of_the_input():
    cfg = job()
    assert cfg.result_topics()["found"] == "match_tx" and cfg.result_topics()["gave-up"] == "timed_out_match_tx"
    schemas = derived_schemas(cfg)
    event_type = json.loads(schemas["match_tx"])["fields"][-1]["type"]["items"]["fields"][-1]["type"]["items"]
    assert event_type["name"] == "Transaction" and [f["name"] for f in event_type["fields"]][:3] == \
        ["id", "account", "event_time"]
    inputs = [tx(0, "a", T0, "login_failed"), tx(1, "a", T0 + 1, "login_failed", merchant="m"),
              tx(2, "a", T0 + 2, "login_ok", amount=2.5),
              tx(3, "b", T0, "login_failed"), tx(4, "b", T0 + 1, "login_failed")]  # b's run times out
    plan = plan_job(cfg)
    store = plan.schema_store()
    rt = GroupRuntime(plan)
    rt.offer_many([Event(r["account"], r["event_time"], r["event_time"], r, 0, i, "tx") for i, r in enumerate(inputs)])
    out = rt.advance(CTI_INFINITY)
    by_topic = {}
    for topic, o, _ in out:
        encoded = AvroSerializer(cfg.result_topics()[topic], store=store)(o.record)
        by_topic.setdefault(topic, []).append(AvroDeserializer(cfg.result_topics()[topic], store=store)(encoded))
    (match,) = by_topic["found"]
    assert [(s["stage"], s["events"]) for s in match["stages"]] == [("failures", inputs[:2]), ("success", [inputs[2]])]
    timed_out = next(r for r in by_topic["gave-up"] if r["key"] == "b")
    assert timed_out["key"] == "b" and timed_out["stages"][0]["events"] == inputs[3:5]


def test_with_a_reference_join_events_carry_the_reference_record():
    import yaml
    from pathlib import Path

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "demo-transactions.yaml").read_text())
    cfg = parse(spec, "demo")
    topics = cfg.result_topics()
    assert topics["matches"] == "match_transactions_enriched"  # both match operators share it
    schema = json.loads(derived_schemas(cfg)["match_transactions_enriched"])
    event = schema["fields"][-1]["type"]["items"]["fields"][-1]["type"]["items"]
    fields = {f["name"]: f["type"] for f in event["fields"]}
    assert fields["reference"][1]["name"] == "Account" and fields["reference_missing"] == "boolean"
    assert {"id", "account", "amount", "reference_valid_from"} <= set(fields)
