"""``ctiflow rules test``'s pieces that need no broker: the comparison of two runs' records, the
tables' figures, and the job a trial runs (``integration_tests/test_rule_trial.py`` runs it)."""

from __future__ import annotations

import json

import pytest

from ctiflow.jobs.driver.config import load
from ctiflow.jobs.driver.rule_trial import RuleTrial, past_retention, trial_job
from ctiflow.operators.errors import ConfigError

H = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z


def match(key: str, first: int, last: int, events: list[str], version: int = 3) -> dict:
    return {"pattern": "fraud", "key": key, "match_id": f"big@{version}/{key}-{first}", "first_time": first,
            "last_time": last, "stages": [{"stage": "first", "events": events[:1]},
                                          {"stage": "large", "events": events[1:]}],
            "rule_id": "big", "rule_version": version, "rule_effective_time": T0}


def test_added_removed_and_unchanged_compare_what_was_matched_not_which_version_matched_it():
    a1 = match("a1", T0, T0 + 5, ["x", "y"])
    a1_again = match("a1", T0, T0 + 5, ["x", "y"])  # the same events matched twice (two runs)
    b2 = match("b2", T0 + H, T0 + H + 9, ["p", "q"])
    c3 = match("c3", T0 + 2 * H, T0 + 2 * H + 1, ["r", "s"])
    old_a1 = match("a1", T0, T0 + 5, ["x", "y"], version=1)
    old_d4 = match("d4", T0 + H, T0 + H + 3, ["u", "v"], version=2)
    trial = RuleTrial("big", "fraud", T0, T0 + 3 * H, "current", [a1, a1_again, b2, c3], [],
                      against_matches=[old_a1, old_d4])
    assert trial.added == [a1_again, b2, c3]  # one of the two a1 matches was there before
    assert trial.removed == [old_d4]
    assert trial.unchanged == 1
    assert trial.per_key(2) == [("a1", 2), ("b2", 1)]  # ties by key
    assert trial.period == "hour"
    assert trial.per_period() == [(T0, 2), (T0 + H, 1), (T0 + 2 * H, 1)]
    week = RuleTrial("big", "fraud", T0, T0 + 7 * 24 * H, None, [a1, c3], [])
    assert week.period == "day" and week.per_period() == [(T0, 2)]
    assert week.added == [a1, c3] and week.removed == []
    measures = {"key": "a1", "rule_id": "big", "rule_version": 3, "rule_effective_time": T0,
                "measures": [{"name": "a_id", "value": "t1"}]}
    assert RuleTrial("big", "fraud", T0, T0 + H, None, [measures], []).per_period() == []  # no event times


def test_the_trial_job_reads_the_range_into_topics_and_a_checkpoint_of_its_own():
    job = load("examples/demo-transactions.yaml")
    op = next(o for o in job.operators if o.ruled)
    starts = {"transactions": {0: 10, 1: 12}}
    ends = {"transactions": {0: 90, 1: 95}, "accounts": {0: 7, 1: 8}}
    cfg = trial_job(job, op, "f00d", starts, ends, "/tmp/x/checkpoint", compare=True)
    assert cfg.job == "demo-transactions.rules-test-f00d"
    tx, accounts = cfg.source("transactions"), cfg.source("accounts")
    assert json.loads(tx.starting_offsets) == {"transactions": {"0": 10, "1": 12}}
    assert json.loads(tx.ending_offsets) == {"transactions": {"0": 90, "1": 95}}
    assert accounts.starting_offsets == "earliest"  # the reference stream: its earlier versions too
    assert json.loads(accounts.ending_offsets) == {"accounts": {"0": 7, "1": 8}}
    assert cfg.reference is not None and cfg.reference.output is None
    assert [o.name for o in cfg.operators] == ["large-after-abroad.candidate", "large-after-abroad.against"]
    for o in cfg.operators:
        role = o.name.rsplit(".", 1)[1]
        assert o.pattern is None and o.sql is None and o.language == "pattern"
        assert o.rules.topic == f"{cfg.job}.{role}-rules" and o.rules.on_change == "drain"
        assert (o.output, o.timed_out) == (f"{cfg.job}.{role}", f"{cfg.job}.{role}-timed-out")
    written = set(cfg.written_topics()) | {o.rules.topic for o in cfg.operators}
    assert all(t.startswith(cfg.job) for t in written), sorted(written)  # none of the job's topics
    assert cfg.spark.checkpoint == "/tmp/x/checkpoint" and cfg.spark.key_groups == job.spark.key_groups
    alone = trial_job(job, op, "f00d", starts, ends, "/tmp/x/checkpoint", compare=False)
    assert [o.name for o in alone.operators] == ["large-after-abroad.candidate"]


def test_ending_offsets_end_a_bounded_run_only_and_say_so_before_spark(tmp_path):
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.config import parse

    spec = {"job": "j", "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                                     "time_field": "event_time", "ending_offsets": '{"tx": {"0": 5}}'}],
            "operators": [{"kind": "passthrough", "output": "out"}],
            "spark": {"checkpoint": str(tmp_path / "ck")}}
    with pytest.raises(ConfigError, match="sources tx: ending_offsets ends a bounded run only; run with --until-end"):
        pipeline.run(parse(spec, "j"), until_end=False)


def test_a_range_past_retention_names_each_partition_that_does_not_reach_back_and_from_when_it_holds():
    wanted = T0 + H
    held = {0: (40, T0 + 2 * H),  # lost its first 40 records: holds from 02:00 on
            1: (0, T0 + 3 * H),  # never had earlier records: nothing lost
            2: (12, T0),  # lost some, but still reaches back
            3: (7, None)}  # lost everything it had (empty now): nothing to read in the range anyway
    assert past_retention("tx", held, wanted) == [
        "tx[0] holds records from 2026-01-01T02:00:00.000Z on (offset 40), not from 2026-01-01T01:00:00.000Z: "
        "the earlier ones are past its retention"]


def test_records_kept_as_bytes_are_counted_without_decoding_and_decoded_once_when_looked_at():
    from ctiflow.jobs.driver.rule_trial import Decoded

    calls = []

    def decode(value: bytes) -> dict:
        calls.append(value)
        return {"n": int(value)}

    runs = Decoded([b"1", b"2", b"3"], decode)
    assert len(runs) == 3 and calls == []
    assert [r["n"] for r in runs] == [1, 2, 3] and runs[1:] == [{"n": 2}, {"n": 3}]
    assert calls == [b"1", b"2", b"3"]  # once each, however often looked at
