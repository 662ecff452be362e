"""Chunk deltas (``state.delta_share``): a chunk a micro-batch changed is stored as its last whole
snapshot (its base) and a log of frames, each the state of the keys one batch changed, compacted
into a new base once those pass the share. Sparse keys over many micro-batches, the group restored from its store after every
one (so every chunk is read back as base + delta): the results per key are those of one
uninterrupted run that never reads its store, deltas were written and compacted, and the bytes
written follow the keys changed, not the chunks touched."""

import dataclasses
import random

import pytest

from ctiflow.jobs.core.rows import GroupInput
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.state import chunks
from ctiflow.jobs.state.parts import DELTA_KEYS, PART_KEYS, frame_entry
from ctiflow.operators.time import Event

OPERATORS = {
    "count": [{"kind": "count", "name": "c", "window": {"time": 10**7}, "output": "c1"}],
    "count per event, with a key TTL": [{"kind": "count", "name": "c", "window": {"events": 3}, "output": "c2",
                                         "emit": "per_event"}],
    "match": [{"kind": "match", "name": "ab", "output": "m", "timed_out": "mt",
               "pattern": {"within_ms": 3_000, "stages": [{"name": "a", "where": "type == 'a'"},
                                                          {"name": "b", "where": "type == 'b'"}]}}],
    # b events of amount ≤ 1 move no run (and not the start): rows skipped, chunks left unwritten —
    # unless a key TTL's clocks moved
    **{f"match, relaxed{ttl}": [{"kind": "match", "name": "ab", "output": "m", "timed_out": "mt",
                                 "pattern": {"within_ms": within, "stages": [
                                     {"name": "a", "where": "type == 'a'"},
                                     {"name": "b", "contiguity": "followed_by", "where": "type == 'b' and amount > 1"}]}}]
       for ttl, within in (("", 2_000), (", with a key TTL", 9_000))},  # (runs the TTL can end)
    "bins": [{"kind": "bins", "name": "b", "bin_size": 5_000, "measures": ["amount"],
              "outputs": {"incremental": "bi", "updated": "bu", "final": "bf"}}],
    "count and match": [{"kind": "count", "name": "c", "window": {"time": 5_000}, "output": "c1"},
                        {"kind": "match", "name": "abb", "output": "m",
                         "pattern": {"within_ms": 10**6, "stages": [
                             {"name": "a", "where": "type == 'a'"},
                             {"name": "b", "where": "type == 'b'", "quantifier": {"times": 2}}]}}],
}


@pytest.fixture(autouse=True)
def deltas_of_any_base(monkeypatch):
    """These groups' chunks start small: deltas from their first base on (the threshold has its own test)."""
    monkeypatch.setattr(chunks, "DELTA_FROM", 0)


def plan_for(kind: str, share: float):
    plan = plan_job(parse({"job": "d", "kafka": {"bootstrap_servers": "x:1"},
                           "sources": [{"name": "s", "topic": "t", "schema": "transaction", "key_field": "account",
                                        "time_field": "event_time", "measures": ["amount"], "cti": {"delay": 50}}],
                           "operators": OPERATORS[kind],
                           **({"state": {"ttl": 4_000}} if "TTL" in kind else {})}, "d"))
    return dataclasses.replace(plan, chunk_keys=512, delta_share=share)


def sparse_batches(seed: int, batches: int = 120, keys: int = 2_000) -> list[dict[int, list[Event]]]:
    """Three partitions at uneven rates (about 30, 12 and 3 events a batch), keys drawn uniformly
    from ``keys``, each partition in its own time order but behind the others by up to 40 ms."""
    rnd = random.Random(seed)
    clocks, out, i = [0, 0, 0], [], 0
    for _ in range(batches):
        batch: dict[int, list[Event]] = {0: [], 1: [], 2: []}
        for p, rate in enumerate((30, 12, 3)):
            for _ in range(rnd.randint(rate // 2, rate + rate // 2)):
                clocks[p] += rnd.randint(0, 20)
                t = max(clocks[p] - rnd.randint(0, 40), 0)
                i += 1
                batch[p].append(Event(f"acct-{rnd.randrange(keys)}", t, t, {
                    "i": i, "type": "ab"[rnd.randrange(2)], "amount": float(rnd.randrange(3)), "event_time": t},
                    p, i, "s"))
        out.append(batch)
    return out


def run(plan, batches, restore: bool, rewrite=None) -> tuple[list[dict], list[int], int, int]:
    """→ each batch's results by (topic, key), bytes written a batch, deltas written, and the
    times a chunk with a delta was written whole again (compactions); ``UNCHANGED``: the chunks
    left unwritten, nothing of theirs changed (added up). ``rewrite(store)``: after each commit."""
    rt = GroupRuntime(plan)
    results, written, deltas, compacted = [], [], 0, 0
    for b, batch in enumerate(batches):
        got = rt.run_batch(GroupInput.of("s", batch, [0, 1, 2], flush=b == len(batches) - 1))
        per_key: dict[tuple, list] = {}
        for topic, o, key in got.outputs:
            per_key.setdefault((topic, key), []).append(o.record)
        results.append(per_key)
        for chunk in rt.keyed.loaded.values():  # (the commit counts keys without building their sets)
            assert [op.key_count() for op in chunk.ops] == [len(op.live_keys()) for op in chunk.ops]
        had = set(rt.keyed.deltas)
        header = rt.commit()
        compacted += len(had - set(rt.keyed.deltas))
        written.append(rt.counters.state_written)
        deltas += rt.counters.chunk_deltas
        UNCHANGED[plan.delta_share] = UNCHANGED.get(plan.delta_share, 0) + rt.counters.chunks_unchanged
        if rewrite is not None:
            rewrite(rt.chunks)
        if restore:
            assert {frame_entry(c, n) for c, frames in rt.keyed.deltas.items() for n in range(len(frames))} == {
                c for c in rt.chunks if DELTA_KEYS <= c < PART_KEYS}  # (the header's frames; none left behind)
            rt = GroupRuntime(plan, header=header, chunks=rt.chunks)
    return results, written, deltas, compacted


UNCHANGED: dict[float, int] = {}


@pytest.mark.parametrize("kind", sorted(OPERATORS))
@pytest.mark.parametrize("seed", [1, 2])
def test_a_group_read_back_as_bases_and_deltas_after_every_batch_gives_the_uninterrupted_results(kind, seed):
    batches = sparse_batches(seed)
    reference, whole_written, _, _ = run(plan_for(kind, 0.0), batches, restore=False)
    UNCHANGED.clear()
    got, written, deltas, compacted = run(plan_for(kind, 0.2), batches, restore=True)
    assert got == reference
    assert deltas > 30 and compacted > 0
    if kind == "match, relaxed":  # chunks touched by events that moved nothing were left as stored
        assert UNCHANGED[0.2] > 0, UNCHANGED
    got_once, _, deltas_once, _ = run(plan_for(kind, 1.0), batches, restore=True)  # rarely compacted
    assert got_once == reference and deltas_once > deltas


@pytest.mark.parametrize("kind", ["count", "match", "bins"])
def test_the_bytes_a_batch_writes_follow_the_keys_it_changed(kind):
    """20,000 keys with state in 10 chunks of about 2,048, then about 45 events a batch: every
    batch touches nearly every chunk. Whole chunks rewrite all of them each batch; deltas write
    a frame of the keys each batch changed, and compact the chunk once its frames pass a fifth of
    its bytes (the header and the time layer's parts are written either way)."""
    keys, rnd = 20_000, random.Random(3)

    def batch(b: int, n: int, keyed) -> dict[int, list[Event]]:
        """``n`` events with times over [100 b, 100 b + 100), three partitions at uneven rates."""
        got: dict[int, list[Event]] = {0: [], 1: [], 2: []}
        for t, i in sorted((100 * b + rnd.randrange(100), i) for i in range(n)):
            p = rnd.choice((0, 0, 0, 1, 1, 2))
            got[p].append(Event(keyed(i), t, t, {"i": i, "type": "a", "amount": 1.0, "event_time": t},
                                p, 100_000 * b + len(got[p]), "s"))
        return got

    batches = [batch(0, keys, lambda i: f"acct-{i}")] + [
        batch(b, 45, lambda i: f"acct-{rnd.randrange(keys)}") for b in range(1, 60)]
    ops = {"count": {"kind": "count", "name": "c", "window": {"time": 10**7}, "output": "c1"},
           "match": {"kind": "match", "name": "ab", "output": "m", "pattern": {"within_ms": 10**7, "stages": [
               {"name": "a", "where": "type == 'a'"}, {"name": "b", "where": "type == 'c'"}]}},
           "bins": {"kind": "bins", "name": "b", "bin_size": 10**7, "measures": ["amount"],
                    "outputs": {"updated": "bu"}}}
    OPERATORS[f"{kind}, long"] = [ops[kind]]
    try:
        whole_plan, delta_plan = (dataclasses.replace(plan_for(f"{kind}, long", share), chunk_keys=2048)
                                  for share in (0.0, 0.2))
        _, whole, _, _ = run(whole_plan, batches, restore=True)
        _, delta, deltas, _ = run(delta_plan, batches, restore=True)
    finally:
        del OPERATORS[f"{kind}, long"]
    steady = slice(10, -1)  # (before the final flush)
    assert deltas > 300
    assert sum(delta[steady]) < 0.25 * sum(whole[steady]), (sum(delta[steady]), sum(whole[steady]))  # 0.20, 0.14


class Writes(dict):
    """A key group's store that notes the entries each commit writes and removes."""

    def __init__(self):
        super().__init__()
        self.written, self.removed = set(), set()

    def __setitem__(self, entry, blob):
        self.written.add(entry)
        super().__setitem__(entry, blob)

    def __delitem__(self, entry):
        self.removed.add(entry)
        super().__delitem__(entry)


def test_a_batch_writes_one_frame_of_the_keys_it_changed_and_no_frame_twice():
    """One chunk of 600 keys, then batches of a few keys each, a second apart (each released by the
    next batch's CTI, the keys counted from the events here): each commit adds one frame holding
    exactly the keys it released (named once: by its snapshot), writes no earlier frame again and no base, until the chunk has
    ``MAX_FRAMES`` frames: then it is written whole and every frame is removed, and frames start
    again; the results are an uninterrupted run's that never reads its store."""
    from ctiflow.jobs.state.codec import expanded
    from ctiflow.jobs.state.parts import MAX_FRAMES
    from ctiflow.operators import snapshots

    rnd = random.Random(11)
    batches = [{0: [Event(f"acct-{i}", 0, 0, {"i": i, "type": "a", "amount": 1.0, "event_time": 0}, 0, i, "s")
                    for i in range(600)]}]
    for b in range(1, MAX_FRAMES + 5):  # two partitions, a few keys each, out of order within the batch
        batch: dict[int, list[Event]] = {0: [], 1: []}
        for j in range(rnd.randint(3, 9)):
            t = 1_000 * b + rnd.randrange(40)  # (within the delay: none released by its own batch's CTI)
            batch[j % 2].append(Event(f"acct-{rnd.randrange(600)}", t, t, {"i": j, "type": "a", "amount": 1.0,
                                                                        "event_time": t}, j % 2, 1_000 * b + j, "s"))
        batches.append(batch)
    plan = dataclasses.replace(plan_for("count", 100.0), chunk_keys=2048)
    whole = GroupRuntime(dataclasses.replace(plan, delta_share=0.0))  # (never restored)
    store, header = Writes(), None
    for b, batch in enumerate(batches):
        rt = GroupRuntime(plan, header=header, chunks=store)
        got, expected = (g.run_batch(GroupInput.of("s", batch, [0, 1], flush=b == len(batches) - 1)).outputs
                         for g in (rt, whole))
        assert got == expected and got or b == 0
        store.written.clear(), store.removed.clear()
        header = rt.commit()
        entries = {e for e in store.written if e < PART_KEYS}  # (not the time layer's parts)
        removed = {e for e in store.removed if e < PART_KEYS}
        if b == 0 or b == len(batches) - 1:  # nothing released yet; the flush (not checked)
            assert entries == set() or b
        elif b in (1, MAX_FRAMES + 2):  # the first base; the compaction after MAX_FRAMES frames
            assert entries == {0}, (b, entries)
            assert removed == ({frame_entry(0, n) for n in range(MAX_FRAMES)} if b > 1 else set())
        else:
            n = b - 2 if b <= MAX_FRAMES + 1 else b - MAX_FRAMES - 3
            assert entries == {frame_entry(0, n)} and not removed, (b, entries)
            kind, _, _, dropped, (snap,), *_, named = snapshots.loads(expanded(store[frame_entry(0, n)]))
            released = sorted({e.key for p in batches[b - 1].values() for e in p})
            # (a key named once: the snapshot holds the keys changed, none was dropped)
            assert kind == "delta" and dropped == [[]] and named == len(released)
            assert sorted(plan.operators[0].build(snap).live_keys()) == released
        whole.commit()


@pytest.mark.parametrize("kind", ["count", "match"])
def test_a_delta_is_built_only_to_be_written_once_the_chunk_has_one(kind, monkeypatch):
    """Every chunk touched every batch, its delta growing until it passes the share: with a delta
    stored, the next one's bytes are foretold from it (bytes a key), so a compaction writes the chunk
    whole without first building the delta it throws away (estimated from the base's bytes alone,
    every compaction here built one first: a delta's bytes a key are more than the base's). Only a
    chunk's first delta after a base is estimated from the base."""
    rnd = random.Random(5)
    keys = 6_000
    batches = [{0: [Event(f"acct-{i}", 0, 0, {"i": i, "type": "a", "amount": 1.0, "event_time": 0}, 0, i, "s")
                    for i in range(keys)]}]
    for b in range(1, 40):  # 120 events a batch over three partitions at uneven rates, in time order each
        batch: dict[int, list[Event]] = {0: [], 1: [], 2: []}
        for j, t in enumerate(sorted(100 * b + rnd.randrange(100) for _ in range(120))):
            p = rnd.choice((0, 0, 0, 1, 1, 2))
            batch[p].append(Event(f"acct-{rnd.randrange(keys)}", t, t,
                                  {"i": j, "type": "a", "amount": 1.0, "event_time": t}, p, 1_000 * b + j, "s"))
        batches.append(batch)
    cls = plan_for(kind, 0.2).operators[0].cls
    built = []
    real = cls.delta
    monkeypatch.setattr(cls, "delta", lambda self, k: built.append(1) or real(self, k))
    plan = dataclasses.replace(plan_for(kind, 0.2), chunk_keys=2048)
    rt, compacted, thrown, deltas = GroupRuntime(plan), 0, 0, 0
    for batch in batches:
        rt.run_batch(GroupInput.of("s", batch, [0, 1, 2]))
        had = set(rt.keyed.deltas)
        built.clear()
        header = rt.commit()
        deltas += rt.counters.chunk_deltas
        thrown += len(built) - rt.counters.chunk_deltas
        compacted += len(had - set(rt.keyed.deltas))
        rt = GroupRuntime(plan, header=header, chunks=rt.chunks)  # (read back cold: the estimate too)
    assert deltas > 60 and compacted > 10
    assert thrown <= compacted // 4, (thrown, compacted, deltas)


def test_a_first_frame_is_foretold_from_the_frames_the_call_built_before(monkeypatch):
    """Keys built alike (one event each, in one batch) compress better in a base than in a frame;
    the first estimate of a chunk's first frame, from the base's bytes
    (:data:`~ctiflow.jobs.state.chunks.DELTA_PER_KEY`, here far too small: 0.5), says every frame
    fits. The state's next chunks are foretold from the frames it built (a fixed part and bytes a
    key), so with every chunk of 16 touched alike only the first ones build a frame they then throw
    away, and the frames that fit are still written."""
    monkeypatch.setattr(chunks, "DELTA_PER_KEY", 0.5)
    rnd = random.Random(11)
    keys = 32_768
    build = {p: [Event(f"acct-{i}", i, i, {"i": i, "type": "a", "amount": 1.0, "event_time": i}, p, i, "s")
                 for i in range(p, keys, 3)] for p in range(3)}
    later: dict[int, list[Event]] = {0: [], 1: [], 2: []}
    for j, t in enumerate(sorted(keys + rnd.randrange(7_000) for _ in range(7_000))):  # ≈ 19 % of the keys
        later[rnd.choice((0, 0, 0, 1, 1, 2))].append(
            Event(f"acct-{rnd.randrange(keys)}", t, t, {"i": j, "type": "a", "amount": 1.0, "event_time": t}, 0,
                  keys + j, "s"))
    monkeypatch.setitem(OPERATORS, "last 100", [{"kind": "count", "name": "c", "window": {"events": 100},
                                                 "output": "c", "emit": "per_event"}])
    plan = dataclasses.replace(plan_for("last 100", 0.5), chunk_keys=2048)
    cls = plan.operators[0].cls
    built = []
    real = cls.delta
    monkeypatch.setattr(cls, "delta", lambda self, k: built.append(1) or real(self, k))

    def frames() -> tuple[int, int, int, float]:
        """→ chunks the second batch touched, frames built, frames written, the call's last ratio."""
        rt = GroupRuntime(plan)
        rt.run_batch(GroupInput.of("s", build, [0, 1, 2]))
        header = rt.commit()
        rt = GroupRuntime(plan, header=header, chunks=rt.chunks)
        rt.run_batch(GroupInput.of("s", {p: sorted(e, key=lambda e: e.start) for p, e in later.items()}, [0, 1, 2]))
        built.clear()
        rt.commit()
        return len(rt.keyed.loaded), len(built), rt.counters.chunk_deltas, rt.keyed.frame_ratio

    touched, made, deltas, ratio = frames()
    with monkeypatch.context() as every:  # every chunk builds its frame: those that fit are written
        every.setattr(chunks, "_pays", lambda *args: True)
        _, made_all, fit, _ = frames()
    assert touched == made_all == 16 and 4 <= fit <= 12  # (the setup: frames near the limits)
    assert made - deltas <= 2 and deltas >= fit - 2, (made, deltas, fit)
    assert ratio > 3 * chunks.DELTA_PER_KEY  # (what the keys built alike cost a frame)


def test_the_whole_state_is_read_at_once_only_when_the_cold_chunks_are_most_of_its_bytes():
    """KeyedState.read_ahead: 16 chunks of about 1,000 bytes; 8 of them cold is half the chunks'
    bytes (read at once), unless the time layer's parts hold as many bytes again; 7 are too few."""
    from ctiflow.jobs.core.counters import Counters
    from ctiflow.jobs.state.chunks import KeyedState

    def reads_all(cold: int, parts_bytes: int) -> bool:
        called = []
        keyed = KeyedState([], {}, Counters(), key_groups=1, chunk_keys=8, ttl=None, grows=True,
                           read_all=lambda: called.append(1))
        keyed.level, keyed.stored_bytes = 4, 16_000
        keyed.read_ahead(list(range(cold)), parts_bytes)
        return bool(called) and keyed.counters.state_read_all == 1

    assert reads_all(8, 0) and reads_all(16, 0)
    assert not reads_all(7, 0)          # fewer reads than a pass is worth
    assert not reads_all(8, 16_000)     # the parts double what one pass would fetch
    assert reads_all(16, 16_000)


def test_a_chunk_smaller_than_the_threshold_is_always_written_whole(monkeypatch):
    """Chunks of 32 keys (the default ``state.chunk_keys`` until 2026-12-06) stay below ``DELTA_FROM``
    bytes: even a ``delta_share`` every delta fits under writes them whole, with the same results; the same
    group with the threshold at 0 writes deltas (so the first half is not vacuous)."""
    batches = sparse_batches(3, batches=40)
    small = dataclasses.replace(plan_for("count", 1.0), chunk_keys=32)
    reference, _, _, _ = run(dataclasses.replace(small, delta_share=0.0), batches, restore=False)
    monkeypatch.undo()  # the threshold as shipped
    got, _, deltas, _ = run(small, batches, restore=True)
    assert got == reference and deltas == 0
    monkeypatch.setattr(chunks, "DELTA_FROM", 0)
    got, _, deltas, _ = run(small, batches, restore=True)
    assert got == reference and deltas > 0


def test_a_chunk_whose_keys_changed_only_their_ttl_clock_is_written():
    """A key's run waits (within 9 s); an event that moves no run still renews the key's TTL clock
    (4 s, at 3 s), so its chunk is written; read back when another key's event (5 s) has the chunk
    swept at a CTI past 4 s, the key lives on to complete its match at 6 s (its clock left at
    0 s would have ended it). Each event is released by the next one's CTI."""
    plan = dataclasses.replace(plan_for("match, relaxed, with a key TTL", 0.2), chunk_keys=2048)

    def event(key: str, t: int, kind: str, amount: float) -> dict[int, list[Event]]:
        return {0: [Event(key, t, t, {"i": t, "type": kind, "amount": amount, "event_time": t}, 0, t, "s")]}

    rt, header, matches = GroupRuntime(plan), None, []
    for batch in (event("acct-1", 0, "a", 0.0), event("acct-1", 3_000, "b", 0.0), event("acct-2", 5_000, "b", 0.0),
                  event("acct-1", 6_000, "b", 2.0), event("acct-2", 7_000, "b", 0.0)):
        rt = GroupRuntime(plan, header=header, chunks=rt.chunks)
        got = rt.run_batch(GroupInput.of("s", batch, [0]))
        header = rt.commit()
        matches += [o.record for topic, o, _ in got.outputs if topic == "m"]
    assert [(m["first_time"], m["last_time"]) for m in matches] == [(0, 6_000)]


def _count_format_2(data: bytes) -> bytes:
    """A count snapshot of today's format (3) written as format 2 did (until 2026-12-01), by hand:
    the keys as uint32 lengths and UTF-8 instead of a column of names."""
    import struct

    import numpy as np

    head = struct.Struct("<4sBBqdqII")
    magic, version, by_time, window, epsilon, clock, nkeys, width = head.unpack_from(data)
    if version != 3:  # (rewritten already: a delta no batch since has written)
        return data
    pos = head.size
    names = data[pos:pos + width * nkeys]
    encoded = [names[i:i + width].rstrip(b"\x00")[:-1] for i in range(0, len(names), width)]
    rest = data[pos + width * nkeys:]
    return b"".join((head.pack(magic, 2, by_time, window, epsilon, clock, nkeys, sum(map(len, encoded))),
                     np.array(list(map(len, encoded)), "<u4").tobytes(), *encoded, rest))


def _match_format_5(data: bytes) -> bytes:
    """A match snapshot of today's format (6) as format 5 (until 2026-12-01): the keys a list."""
    import pickle

    from ctiflow.jobs.testing.snapshots import keys_as_list

    version, fingerprint, plain, numbers, caps = pickle.loads(data)
    if version != 6:  # (rewritten already)
        return data
    return pickle.dumps((5, fingerprint, keys_as_list(plain), numbers, caps))


@pytest.mark.parametrize("kind", ["count", "match, relaxed", "count and match"])
def test_deltas_an_earlier_version_wrote_are_read_through_compat(kind):
    """A checkpoint written by the version before 2026-12-01 holds chunk deltas whose operator
    snapshots are in its formats (match 5, count 2): every delta in the store rewritten so after
    each batch, the group read back from it gives the uninterrupted results."""
    import pickle

    from ctiflow.jobs.state.codec import compressed, expanded
    from ctiflow.operators import snapshots

    older = {"c": _count_format_2, "ab": _match_format_5, "abb": _match_format_5}
    batches = sparse_batches(3, batches=60)
    reference, _, _, _ = run(plan_for(kind, 0.0), batches, restore=False)
    plan = plan_for(kind, 1.0)
    names = [spec.name for spec in plan.operators]
    rewritten = []

    def rewrite(store) -> None:
        for c, stored in list(store.items()):
            if DELTA_KEYS <= c < PART_KEYS:
                kind_, version, cti, since, blobs, *rest = snapshots.loads(expanded(stored))
                earlier = [older[name](blob) for name, blob in zip(names, blobs)]
                if earlier != blobs:  # (a delta no batch since has written is in the earlier formats already)
                    store[c] = compressed(pickle.dumps((kind_, version, cti, since, earlier, *rest)))
                    rewritten.append(c)

    got, _, _, _ = run(plan, batches, restore=True, rewrite=rewrite)
    assert len(rewritten) > 30 and got == reference
