"""ctiflow from Python (the docs' "Python API", docs/guide/jobs.md; a test runs this file as it is).

1. An operator alone — no Spark, no Kafka: three failed logins in a row, then a success.
2. A whole job: records produced to Kafka, the job run on Spark until the input is drained,
   the matches read back. Needs a broker: `ctiflow up` starts the embedded one.
"""

import uuid

import ctiflow
from ctiflow import CTI_INFINITY, Event, MatchOperator, MatchSettings, Pattern
from ctiflow.jobs.datapath import kafka

# -- 1. the CEP operator on its own ---------------------------------------------------------------
pattern = (Pattern.begin("failures").where(lambda e: e["type"] == "login_failed").times(3).consecutive()
           .next("success").where(lambda e: e["type"] == "login_ok"))
operator = MatchOperator(MatchSettings(pattern=pattern, name="brute-force"))
matches = []
for t, kind in enumerate(["login_failed"] * 3 + ["login_ok"]):
    matches += operator.process(Event("acct-1", 1_000 * t, 1_000 * t, {"type": kind}))
matches += operator.advance_to(CTI_INFINITY)  # the end of time: every result final
print("operator:", [(m.record["key"], m.record["pattern"]) for m in matches])

# -- 2. a job on Spark, configured as in a job YAML ----------------------------------------------
run_id = uuid.uuid4().hex[:6]
job = ctiflow.parse({
    "job": f"api-example-{run_id}",
    "sources": [{"name": "tx", "topic": f"api-logins-{run_id}", "schema": "transaction",
                 "key_field": "account", "time_field": "event_time", "cti": {"delay": "5s"}}],
    "operators": [{"kind": "match", "name": "brute-force", "output": f"api-matches-{run_id}",
                   "pattern": {"within": "5m", "stages": [
                       {"name": "failures", "where": "type == 'login_failed'", "quantifier": {"times": 3},
                        "consecutive": True},
                       {"name": "success", "contiguity": "next", "where": "type == 'login_ok'"}]}}],
    "spark": {"checkpoint": f"/tmp/ctiflow-api-example-{run_id}"},
})
assert ctiflow.check_config(job) == [], ctiflow.check_config(job)
bootstrap = job.kafka.bootstrap_servers  # the embedded broker unless CTIFLOW_BOOTSTRAP says otherwise
kafka.create_topics(bootstrap, {job.sources[0].topic: 2})
logins = [{"id": f"{a}-{i}", "account": a, "event_time": 1_767_225_600_000 + 1_000 * i, "type": kind,
           "amount": 0.0, "currency": "EUR", "country": "DE", "merchant": None}
          for a in ("acct-1", "acct-2") for i, kind in enumerate(["login_failed"] * 3 + ["login_ok"])]
kafka.produce(bootstrap, job.sources[0].topic, logins, ctiflow.AvroSerializer("transaction"), "account")
summary = ctiflow.run(job, until_end=True)
found = kafka.read_topic(bootstrap, job.operators[0].output)
print(f"job: {summary.records} records in, matches for", sorted(m["key"] for m in found))
