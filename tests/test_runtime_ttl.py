"""The key TTL (``state: {ttl: …}``): a key's state goes once the application time a CTI makes
final (CTI − 1) is the TTL past the key's latest event; its next event starts afresh. Without a TTL an
event-count window keeps every key forever."""

import pytest

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.errors import ConfigError
from ctiflow.operators.time import Event

T0 = 1_767_225_600_000
MIN = 60_000


def job(ttl=None, operators=None):
    spec = {"job": "ttl", "kafka": {"bootstrap_servers": "x:1"},
            "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                         "time_field": "event_time"}],
            "operators": operators or [{"kind": "count", "name": "last_3", "window": {"events": 3},
                                        "emit": "per_event", "output": "c"}]}
    if ttl is not None:
        spec["state"] = {"ttl": ttl}
    return plan_job(parse(spec, "t"))


def feed(rt, key: str, t: int, cti: int) -> list[dict]:
    rt.offer_many([Event(key, t, t, {"type": "a"}, 0, t, "tx")])
    return [o.record for _, o, _ in rt.advance(cti)]


def counts(plan) -> list[float]:
    """Events of key a at 0, 1, 2 min, then one after 10 min of silence (others keep the CTI moving)."""
    rt = GroupRuntime(plan)
    got = []
    for i, t in enumerate([0, MIN, 2 * MIN]):
        got += [r["estimate"] for r in feed(rt, "a", T0 + t, T0 + t + 1)]
    feed(rt, "b", T0 + 12 * MIN, T0 + 12 * MIN + 1)   # another key moves the CTI on
    rt = GroupRuntime(plan, rt.snapshot())           # the TTL's clock survives a restore
    got += [r["estimate"] for r in feed(rt, "a", T0 + 13 * MIN, T0 + 13 * MIN + 1)]
    return got, rt


def test_without_a_ttl_an_event_window_keeps_the_key():
    got, rt = counts(job())
    assert got == [1, 2, 3, 3]  # the last 3 events of key a, 10 minutes later too
    assert rt.counters.expired_keys == 0


def test_a_ttl_drops_a_silent_keys_count_and_its_next_event_starts_afresh():
    got, rt = counts(job(ttl="5m"))
    assert got == [1, 2, 3, 1]
    assert rt.counters.expired_keys == 0  # counters are per call: this call expired none
    plan = job(ttl="5m")
    rt = GroupRuntime(plan)
    feed(rt, "a", T0, T0 + 1)
    feed(rt, "b", T0 + 5 * MIN - 1, T0 + 5 * MIN)    # final up to T0 + 5 min − 1: a is within its TTL
    assert rt.counters.expired_keys == 0 and rt.keys() == {"a", "b"}
    feed(rt, "b", T0 + 5 * MIN, T0 + 5 * MIN + 1)    # final up to T0 + 5 min: a's TTL is over
    assert rt.counters.expired_keys == 1 and rt.keys() == {"b"}


def test_a_ttl_drops_partial_matches_of_a_pattern_without_within():
    pattern = {"stages": [{"name": "a", "where": "type == 'a'"}, {"name": "b", "where": "type == 'b'"}]}
    op = [{"kind": "match", "name": "a_b", "output": "m", "pattern": pattern}]
    for ttl, matched in ((None, 1), ("5m", 0)):
        rt = GroupRuntime(job(ttl, op))
        feed(rt, "k", T0, T0 + 1)                       # a partial match a…
        feed(rt, "other", T0 + 20 * MIN, T0 + 20 * MIN + 1)
        rt.offer_many([Event("k", T0 + 21 * MIN, T0 + 21 * MIN, {"type": "b"}, 0, 9, "tx")])
        out = rt.advance(T0 + 21 * MIN + 1)
        assert sum(o.role == "match" for _, o, _ in out) == matched


def test_the_ttl_must_be_positive():
    with pytest.raises(ConfigError, match="state.ttl"):
        job(ttl="0s")


def test_live_keys_counts_the_keys_with_state_and_falls_when_state_is_dropped():
    plan = job(ttl="5m")
    rt = GroupRuntime(plan)
    feed(rt, "a", T0, T0 + 1)
    feed(rt, "b", T0 + MIN, T0 + MIN + 1)
    assert rt.live_keys() == 2
    feed(rt, "b", T0 + 6 * MIN, T0 + 6 * MIN + 1)  # a's TTL is over
    assert rt.live_keys() == 1
    bins = [{"kind": "bins", "name": "per_min", "bin_size": "1m", "measures": ["amount"], "outputs": {"final": "f"}}]
    rt = GroupRuntime(job(operators=bins))
    rt.offer_many([Event(k, T0 + 10, T0 + 10, {"amount": 1.0}, 0, i, "tx") for i, k in enumerate("xyz")])
    rt.advance(T0 + 11)
    assert rt.live_keys() == 3  # each key's bin is open
    rt.advance(T0 + MIN + 1)
    assert rt.live_keys() == 0  # final: the bins are gone
