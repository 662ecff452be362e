"""A key group's snapshot that cannot be restored fails with a StateError naming whose state
it is and what to do, never with a bare unpickling error (and never dead-lettered)."""

import pickle

import pytest

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.jobs.state.codec import ZSTD_MARK, expanded
from ctiflow.jobs.state.parts import is_chunk
from ctiflow.operators.errors import StateError
from ctiflow.operators.time import Event

T0 = 1_767_225_600_000


def job(*operators):
    return plan_job(parse({"job": "s", "kafka": {"bootstrap_servers": "x:1"},
                            "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                                         "time_field": "event_time"}],
                            "operators": list(operators)}, "t"))


COUNT = {"kind": "count", "name": "per_account", "window": {"time": "1h"}, "output": "c"}
BINS = {"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["amount"], "outputs": {"final": "b"}}


def snapshot_with_events(plan) -> bytes:
    rt = GroupRuntime(plan)
    rt.offer_many([Event("a", T0 + i, T0 + i, {"amount": 1.0}, 0, i, "tx") for i in range(5)])
    rt.advance(T0 + 3)
    return rt.snapshot()


def test_a_damaged_operator_state_names_the_operator_and_the_fix():
    plan = job(COUNT, BINS)
    layout, header, chunks = pickle.loads(snapshot_with_events(plan))
    (c, blob), = ((c, blob) for c, blob in chunks.items() if is_chunk(c))  # one key: one chunk (and buffer parts)
    assert blob.startswith(ZSTD_MARK)  # stored compressed
    _, _, cti, ops, last_seen, keys, op_keys, _tallies = pickle.loads(expanded(blob))  # ("chunk", 3, …)
    # (written as earlier versions stored chunks, uncompressed: read as they are)
    chunks[c] = pickle.dumps((cti, [ops[0], b"\x00not a snapshot"], last_seen, keys, op_keys))
    damaged = pickle.dumps((layout, header, chunks), 5)
    rt = GroupRuntime(plan, damaged)  # chunks are decoded when a batch needs them
    with pytest.raises(StateError, match=r"operator 'per_minute' \(Binner\).*new spark.checkpoint"):
        rt.advance(T0 + 10)
    assert GroupRuntime(plan, snapshot_with_events(plan)).cti == T0 + 3  # the intact one restores


def test_a_chunk_stored_uncompressed_by_an_earlier_version_restores_and_a_damaged_frame_is_a_state_error():
    plan = job(COUNT, BINS)
    layout, header, chunks = pickle.loads(snapshot_with_events(plan))
    (c, blob), = ((c, blob) for c, blob in chunks.items() if is_chunk(c))
    old = dict(chunks)
    old[c] = expanded(blob)  # the pickle earlier versions stored
    before = GroupRuntime(plan, snapshot_with_events(plan))
    after = GroupRuntime(plan, pickle.dumps((layout, header, old), 5))
    assert before.advance(T0 + 10) == after.advance(T0 + 10) != []
    chunks[c] = blob[: len(blob) - 8]  # the zstd frame cut short
    rt = GroupRuntime(plan, pickle.dumps((layout, header, chunks), 5))
    with pytest.raises(StateError, match=rf"state chunk {c}: .*new spark.checkpoint"):
        rt.advance(T0 + 10)


def test_truncated_bytes_and_a_changed_operator_list_are_state_errors():
    data = snapshot_with_events(job(COUNT))
    with pytest.raises(StateError, match="key group's state"):
        GroupRuntime(job(COUNT), data[: len(data) // 2])
    with pytest.raises(StateError, match=r"holds the state of operators \[\('per_account', 'CountOperator'\)\], "
                                         r"the job configures \[\('per_account', 'CountOperator'\), "
                                         r"\('per_minute', 'Binner'\)\]"):
        GroupRuntime(job(COUNT, BINS), data)


@pytest.mark.parametrize("damage", ["a commit of two fields", "an index a field short", "chunk ids not int64s"])
def test_a_header_whose_index_of_chunks_is_of_another_shape_is_a_state_error(damage):
    plan = job(COUNT, BINS)
    layout, header, chunks = pickle.loads(snapshot_with_events(plan))
    got = list(pickle.loads(expanded(header)))
    assert got[:2] == ["header", 7]
    due, level_split, totals, deltas, history = got[8]
    assert len(history) == 1 and len(history[0]) == 3  # (read token, chunks written as a frame, whole)
    if damage == "a commit of two fields":
        got[8] = (due, level_split, totals, deltas, (history[0][:2],))
    elif damage == "an index a field short":
        got[8] = (due, level_split, totals, deltas)
    else:
        got[8] = (due, level_split, totals, deltas, ((None, b"\x01\x02\x03", b""),))
    damaged = pickle.dumps((layout, pickle.dumps(tuple(got), 5), chunks), 5)
    with pytest.raises(StateError, match=r"index of its state chunks.*new spark.checkpoint"):
        GroupRuntime(plan, damaged)
