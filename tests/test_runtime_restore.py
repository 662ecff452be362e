"""Snapshot/restore is invisible: for count, match and bins, a key group's state snapshotted and
restored after any micro-batch, with any number of key groups and any chunk size (so chunks split
as keys arrive), gives the same results as one uninterrupted run in one group and one chunk that
never snapshots (what the state store and a restart do to a job must not change its results, nor
which keys share a chunk, when chunks split, or which chunks a batch leaves undecoded), nor
whether a chunk is stored whole or as its base and frames of the keys each batch changed
(``delta_share``: 0 always whole, 100 frames until there are 32 of them, 0.2 compacted often). The
reference run never restores, so it shares no state with the restored ones and never reads a delta."""

import dataclasses
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import GroupInput
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.jobs.state import chunks
from ctiflow.operators.time import Event
from tests.test_runtime_cti import partitioned_input

OPERATORS = {
    "count": [{"kind": "count", "name": "per_key_time", "window": {"time": 300}, "epsilon": 0.1, "output": "c1",
               "emit": "per_event"},
              {"kind": "count", "name": "per_key_events", "window": {"events": 4}, "output": "c2",
               "predicate": "type == 'a'"}],
    "match": [{"kind": "match", "name": "a_then_b", "output": "m", "timed_out": "m-timed-out",
               "pattern": {"within_ms": 400, "stages": [{"name": "a", "where": "type == 'a'"},
                                                          {"name": "b", "where": "type == 'b'"}]}}],
    "count with a key TTL": [{"kind": "count", "name": "last_4", "window": {"events": 4}, "output": "c3",
                              "emit": "per_event"}],
    # a global count keeps its one histogram in one chunk while the keyed operators' keys are chunked
    "a global count beside keyed operators": [
        {"kind": "count", "name": "all_a", "window": {"time": 250}, "per_key": False, "predicate": "type == 'a'",
         "output": "g1"},
        {"kind": "count", "name": "per_key_events", "window": {"events": 3}, "output": "c4", "emit": "per_event"},
        {"kind": "match", "name": "b_then_a", "output": "m2",
         "pattern": {"within_ms": 300, "stages": [{"name": "b", "where": "type == 'b'"},
                                                  {"name": "a", "where": "type == 'a'"}]}}],
    "a global count alone": [{"kind": "count", "name": "all", "window": {"events": 5}, "per_key": False,
                              "emit": "per_event", "output": "g2"}],
    "bins": [{"kind": "bins", "name": "per_100", "bin_size": 100, "measures": ["amount"],
              "outputs": {"incremental": "bi", "updated": "bu", "final": "bf"}}],
}


def plan_for(kind: str):
    return plan_job(parse({"job": "r", "kafka": {"bootstrap_servers": "x:1"},
                            "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                                         "time_field": "event_time", "measures": ["amount"],
                                         "cti": {"delay": 50}}],
                            "operators": OPERATORS[kind],
                            **({"state": {"ttl": 120}} if "TTL" in kind else {})}, "r"))


def with_fields(batches):
    """The generated events with fields of the transaction schema the operators read (a type, an
    amount, the event time)."""
    def dress(e: Event) -> Event:
        i = e.fields["i"]
        return Event(e.key, e.start, e.end, {"i": i, "type": "ab"[i % 3 % 2], "amount": float(i % 7) + 0.5,
                                                  "event_time": e.start},
                     e.partition, e.offset, e.stream)
    return [{p: [dress(e) for e in records] for p, records in batch.items()} for batch in batches]


def run(plan, batches, partitions: list[int], groups: int, restore_after: set[int], warm: str | None = None) -> dict:
    """Every result, per (micro-batch, topic, key) in emission order (a result must come out in
    the same micro-batch however the state is split: a chunk whose window closes, bin becomes
    final or run times out must be decoded in that batch, not at the next event or the flush)."""
    runtimes = [GroupRuntime(plan) for _ in range(groups)]
    results: dict[tuple, list] = {}
    for b, batch in enumerate(batches):
        last = b == len(batches) - 1
        for g in range(groups):
            rt = runtimes[g]
            out = rt.run_batch(GroupInput.of("s", batch, partitions, flush=last,
                                             mine=lambda e: zlib.crc32(e.key.encode()) % groups == g)).outputs
            for topic, o, key in out:
                results.setdefault((b, topic, key), []).append(o.record)
            if b in restore_after and warm is None:
                runtimes[g] = GroupRuntime(plan, rt.snapshot())
            elif b in restore_after:
                # as the adapter does: the header and the store, plus (some of) the chunks the
                # worker still holds decoded (ctiflow.jobs.state.warm.WarmChunks keeps the most recent ones)
                header = rt.commit()
                kept = {c: chunk for i, (c, chunk) in enumerate(rt.keyed.still_warm().items())
                        if warm == "all" or (warm == "some" and i % 2 == b % 2)}
                runtimes[g] = GroupRuntime(plan, header=header, chunks=rt.chunks, warm=kept)
    return results


DELTA_SHARES = [0.0, 0.2, 100.0]


@pytest.fixture(autouse=True, scope="module")
def deltas_of_any_base():
    """These groups' chunks are small: deltas of any base, or ``delta_share`` would change nothing."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunks, "DELTA_FROM", 0)
        yield


@settings(max_examples=150, deadline=None)
@given(partitioned_input(), st.integers(1, 5), st.sets(st.integers(0, 40)), st.sampled_from(sorted(OPERATORS)),
       st.sampled_from([1, 2, 3, 1_000_000]), st.sampled_from(DELTA_SHARES))
def test_restoring_after_any_batch_in_any_number_of_groups_changes_no_result(data, groups, restore_after, kind,
                                                                             chunk_keys, delta_share):
    events, batches = data
    batches = with_fields(batches)
    plan, partitions = plan_for(kind), sorted(events)
    reference = run(dataclasses.replace(plan, key_groups=1, chunk_keys=1_000_000), batches, partitions, 1, set())
    groups = 1 if "global" in kind else groups  # a global operator sees every event: one key group
    plan = dataclasses.replace(plan, key_groups=groups, chunk_keys=chunk_keys, delta_share=delta_share)
    assert run(plan, batches, partitions, groups, restore_after) == reference
    assert run(plan, batches, partitions, groups, set(range(len(batches)))) == reference


@settings(max_examples=100, deadline=None)
@given(partitioned_input(), st.integers(1, 3), st.sets(st.integers(0, 40)), st.sampled_from(sorted(OPERATORS)),
       st.sampled_from([1, 2, 1_000_000]), st.sampled_from(["all", "some", "none"]), st.sampled_from(DELTA_SHARES))
def test_chunks_kept_decoded_between_batches_change_no_result(data, groups, restore_after, kind, chunk_keys, warm,
                                                              delta_share):
    """The worker's cache (ctiflow.jobs.state.warm.WarmChunks): a restored group that takes all, some or
    none of the chunks its previous call left decoded, and reads the rest from the store, gives
    the results of one uninterrupted run."""
    events, batches = data
    batches = with_fields(batches)
    plan, partitions = plan_for(kind), sorted(events)
    reference = run(dataclasses.replace(plan, key_groups=1, chunk_keys=1_000_000), batches, partitions, 1, set())
    groups = 1 if "global" in kind else groups  # a global operator sees every event: one key group
    plan = dataclasses.replace(plan, key_groups=groups, chunk_keys=chunk_keys, delta_share=delta_share)
    assert run(plan, batches, partitions, groups, restore_after, warm) == reference
