"""Keyed state in chunks: a micro-batch decodes and writes back only the chunks it has events for
or whose next change (a window emptying, a bin becoming final, a run timing out) its CTI reaches;
untouched keys stay bytes. (That results do not depend on the chunking: test_runtime_restore.)"""

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.time import Event

T0 = 1_767_225_600_000
MIN = 60_000


def job(operator, chunk_keys=1):
    return plan_job(parse({"job": "c", "kafka": {"bootstrap_servers": "x:1"},
                            "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                                         "time_field": "event_time", "measures": ["amount"]}],
                            "operators": [operator], "state": {"chunk_keys": chunk_keys}}, "t"))


def spread(rt):
    """64 chunks from the start, as after many keys (no state yet, so no key moves)."""
    rt.keyed.level = 6
    return rt


def other_than(rt, key):
    """A key in another chunk than ``key``."""
    return next(o for o in (f"o{i}" for i in range(1000)) if rt.keyed.address(o) != rt.keyed.address(key))


def batch(rt, events, cti):
    """One micro-batch as the adapter runs it: restore, offer, advance, commit; → (results, runtime)."""
    rt = GroupRuntime(rt.plan, header=rt.commit(), chunks=rt.chunks)
    rt.offer_many(events)
    out = rt.advance(cti)
    rt.commit()
    return out, rt


def where(rt, key):
    return rt.keyed.address(key)


def ev(key, t, i=0, **fields):
    return Event(key, t, t, {"type": "a", "amount": 1.0, **fields}, 0, i, "tx")


COUNT_EVENTS = {"kind": "count", "name": "last_5", "window": {"events": 5}, "emit": "per_event", "output": "c"}
COUNT_TIME = {"kind": "count", "name": "last_10m", "window": {"time": "10m"}, "output": "c"}


def test_a_batch_with_one_key_decodes_and_writes_one_chunk_of_many():
    rt = GroupRuntime(job(COUNT_EVENTS, chunk_keys=16))
    _, rt = batch(rt, [ev(f"k{i}", T0 + i, i) for i in range(2000)], T0 + 2000)
    assert rt.keyed.count == 125 and rt.live_keys() == 2000  # split as the keys arrived: 2000 / 16
    total = rt.counters.state_bytes
    _, rt = batch(rt, [ev("k7", T0 + 3000)], T0 + 3001)
    assert rt.counters.chunks_loaded == 1
    assert rt.counters.state_written < total / 20  # one chunk and the header, not the live state
    assert rt.live_keys() == 2000 and rt.keys() == {f"k{i}" for i in range(2000)}


def test_chunks_split_as_keys_arrive_and_keep_about_chunk_keys_keys_each():
    rt = GroupRuntime(job(COUNT_EVENTS, chunk_keys=8))
    for lo in range(0, 3000, 300):
        _, rt = batch(rt, [ev(f"k{i}", T0 + i, i) for i in range(lo, lo + 300)], T0 + lo + 300)
        assert rt.keyed.count == -(-(lo + 300) // 8)
    sizes = [len(rt.keyed.chunk(c).live_keys()) for c in range(rt.keyed.count)]
    assert sum(sizes) == 3000 and max(sizes) <= 4 * 8  # crc32 spreads them: no chunk far above the target
    assert all(rt.keyed.address(key) == c for c in range(rt.keyed.count) for key in rt.keyed.chunk(c).live_keys())


def test_an_untouched_chunk_is_decoded_when_its_window_empties_and_then_dropped():
    rt = spread(GroupRuntime(job(COUNT_TIME)))
    busy = other_than(rt, "quiet")
    _, rt = batch(rt, [ev("quiet", T0), ev(busy, T0 + 1, 1)], T0 + 2)
    assert rt.live_keys() == 2
    quiet = where(rt, "quiet")
    _, rt = batch(rt, [ev(busy, T0 + 5 * MIN, 2)], T0 + 5 * MIN + 1)  # quiet's window still holds its event
    assert quiet not in rt.keyed.loaded and rt.live_keys() == 2
    _, rt = batch(rt, [ev(busy, T0 + 11 * MIN, 3)], T0 + 11 * MIN)  # τ = T0 + 11 min − 1: quiet's window is empty
    assert quiet in rt.keyed.loaded and rt.live_keys() == 1 and quiet not in rt.chunks


def test_a_run_times_out_at_its_within_though_its_key_sees_no_more_events():
    pattern = {"within_ms": 60_000, "stages": [{"name": "a", "where": "type == 'a'"}, {"name": "b", "where": "type == 'b'"}]}
    rt = spread(GroupRuntime(job({"kind": "match", "name": "a_b", "output": "m", "timed_out": "m-late",
                                  "pattern": pattern})))
    other = other_than(rt, "k")
    _, rt = batch(rt, [ev("k", T0)], T0 + 1)
    out, rt = batch(rt, [ev(other, T0 + 30_000, 1, type="x")], T0 + 30_001)
    assert where(rt, "k") not in rt.keyed.loaded and not [o for _, o, _ in out if o.role == "timed_out"]
    out, rt = batch(rt, [ev(other, T0 + 70_000, 2, type="x")], T0 + 70_001)
    assert where(rt, "k") in rt.keyed.loaded
    assert [(o.role, o.record["key"]) for _, o, _ in out] == [("timed_out", "k")]
    assert rt.live_keys() == 0


def test_a_bin_is_final_when_the_cti_passes_its_end_though_its_key_sees_no_more_events():
    bins = {"kind": "bins", "name": "per_min", "bin_size": "1m", "measures": ["amount"], "outputs": {"final": "f"}}
    rt = spread(GroupRuntime(job(bins)))
    other = other_than(rt, "k")
    _, rt = batch(rt, [ev("k", T0 + 10)], T0 + 11)
    out, rt = batch(rt, [ev(other, T0 + 30_000, 1)], T0 + 30_001)
    assert [o for _, o, _ in out] == [] and where(rt, "k") not in rt.keyed.loaded
    out, rt = batch(rt, [ev(other, T0 + MIN + 30, 2)], T0 + MIN + 31)
    assert sorted(o.record["key"] for _, o, _ in out) == sorted(["k", other])  # both first-minute bins are final


def test_the_chunks_of_a_batch_s_keys_at_once_are_each_key_s_chunk():
    """:meth:`KeyedState.addresses` (a CRC-32 column, then linear hashing in arrays) names the
    chunk :meth:`KeyedState.address` names for each key (``zlib.crc32`` a key), at every level
    and split of the linear hashing, for key groups of 1 and 7, keys of any length and script."""
    import random
    import zlib

    from ctiflow.jobs.state.chunks import KeyedState

    rng = random.Random(5)
    alphabet = "ab0_-ÄöЖ日本\x00🙂"
    keys = ["", *(("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))) for _ in range(3_000))]
    for groups in (1, 7):
        state = KeyedState([], {}, None, key_groups=groups, chunk_keys=1, ttl=None, grows=True)
        for count in (1, 2, 3, 5, 8, 13, 100, 1_000, 4_097):
            state.level = count.bit_length() - 1
            state.split = count - (1 << state.level)
            want = []
            for key in keys:  # (linear hashing as its definition states it)
                h = zlib.crc32(key.encode()) // groups
                c = h % (1 << state.level)
                want.append(h % (2 << state.level) if c < state.split else c)
            assert state.addresses(keys).tolist() == want == [state.address(k) for k in keys]
            assert max(want) < count
