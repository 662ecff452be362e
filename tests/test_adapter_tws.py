"""The adapter's behaviour through PySpark's own ``TwsTester`` (transformWithStateInPandas
without a cluster): what every key group receives each micro-batch — its packs, the frontier
rows of every partition read and the batch's control row — and what it must do with them."""

import json
import random

import pytest

pytest.importorskip("pyspark")

import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
from pyspark.sql.streaming import TwsTester  # noqa: E402

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.datapath.adapter import OperatorProcessor  # noqa: E402
from ctiflow.jobs.state.store import STATE_LAYOUT  # noqa: E402
from ctiflow.jobs.driver.config import parse  # noqa: E402
from ctiflow.jobs.core.rows import pack_events  # noqa: E402
from ctiflow.jobs.avro.serde import AvroDeserializer  # noqa: E402
from ctiflow.jobs.core.rows import output_records as records  # noqa: E402

T0 = 1_767_225_600_000
BASE = {"meta_error": None, "meta_value": None, "meta_raw_key": None, "meta_kafka_ts": None, "meta_control": None,
        "meta_start": None, "meta_pack": None}


def tx(i: int, t: int, account: str = "a") -> dict:
    return {"id": f"t{i}", "account": account, "event_time": t, "type": "purchase", "amount": 1.0,
            "currency": "EUR", "country": "DE", "merchant": None}


def pack(stream: str, partition: int, first: int, recs: list[dict], time_field: str = "event_time") -> dict:
    rows = [(r["account"], r[time_field], r[time_field] if time_field == "event_time" else 2**62, r, first + i, None)
            for i, r in enumerate(recs)]
    return {**BASE, "meta_stream": stream, "meta_partition": partition, "meta_offset": first,
            "meta_start": max(r[time_field] for r in recs), "meta_pack": pack_events(rows)}


def frontier(stream: str, partition: int, start: int) -> dict:
    return {**BASE, "meta_stream": stream, "meta_partition": partition, "meta_offset": -1, "meta_control": "frontier",
            "meta_start": start}


def control(stream: str, partitions: list[int], flush: bool = False, idle: list[int] = ()) -> dict:
    return {**BASE, "meta_stream": stream, "meta_partition": -1, "meta_offset": -1,
            "meta_control": json.dumps({"partitions": partitions, "idle": list(idle), "flush": flush})}


def make_tester(spec: dict, layout: int = STATE_LAYOUT) -> tuple[TwsTester, dict]:
    cfg = parse({"job": "t", "kafka": {"bootstrap_servers": "x:1"}, **spec}, "t")
    proc = OperatorProcessor(plan_job(cfg), cfg.result_topics(), cfg.kafka.effective_framing, None, state_layout=layout)
    return TwsTester(proc), cfg.result_topics()


#: each state layout's variables: (name, kind)
VARIABLES = {3: [("state", "map")], 2: [("header", "value"), ("header_parts", "list"), ("chunks", "map")]}


def snapshot(t: TwsTester, key, layout: int = STATE_LAYOUT) -> list:
    """Everything the group has in the state store (to roll back to: :func:`roll_back`)."""
    peek = {"value": t.peekValueState, "list": t.peekListState, "map": t.peekMapState}
    return [(name, kind, peek[kind](name, key)) for name, kind in VARIABLES[layout]]


def roll_back(t: TwsTester, key, snap: list) -> None:
    """The state store goes back to ``snap``: a micro-batch is replayed."""
    update = {"value": t.updateValueState, "list": t.updateListState, "map": t.updateMapState}
    for name, kind, value in snap:
        update[kind](name, key, value)


def results(frame: pd.DataFrame, topics: dict[str, str]) -> list[tuple[str, dict]]:
    got = list(records(iter([pa.RecordBatch.from_pandas(frame, preserve_index=False)]), {}))
    return [(t, AvroDeserializer(topics[t])(v)) for t, _, v in got]


TX = {"name": "tx", "topic": "t", "schema": "transaction", "key_field": "account", "time_field": "event_time",
      "cti": {"delay": 1000}}
PASS = [{"kind": "passthrough", "output": "out"}]


def test_a_group_with_no_records_of_its_own_is_advanced_by_another_partitions_frontier():
    t, topics = make_tester({"sources": [TX], "operators": PASS})
    # batch 0: group g gets its records from partition 0; partition 1 (other groups' keys) lags
    first = t.testInPandas(7, pd.DataFrame([pack("tx", 0, 0, [tx(0, T0), tx(1, T0 + 5000)]),
                                            frontier("tx", 0, T0 + 5000), frontier("tx", 1, T0),
                                            control("tx", [0, 1])]))
    assert [r["id"] for _, r in results(first, topics)] == []  # CTI = min(5000, 0) − 1000: nothing yet
    # batch 1: no records for g at all — only partition 1's progress and the control row
    second = t.testInPandas(7, pd.DataFrame([frontier("tx", 1, T0 + 9000), control("tx", [0, 1])]))
    assert [r["id"] for _, r in results(second, topics)] == ["t0"]  # CTI = min(5000, 9000) − 1000


@pytest.mark.parametrize("layout", [3, 2])
def test_a_replayed_batch_yields_the_same_records_in_the_same_order(layout):
    t, topics = make_tester({"sources": [TX], "operators": PASS}, layout)
    t.testInPandas(3, pd.DataFrame([pack("tx", 0, 0, [tx(i, T0 + i * 100) for i in range(20)]),
                                    frontier("tx", 0, T0 + 1900), frontier("tx", 1, T0), control("tx", [0, 1])]))
    before = snapshot(t, 3, layout)
    batch = pd.DataFrame([pack("tx", 1, 0, [tx(100 + i, T0 + 50 + i * 100, "b") for i in range(20)]),
                          pack("tx", 0, 20, [tx(20 + i, T0 + 2000 + i * 100) for i in range(20)]),
                          frontier("tx", 0, T0 + 3900), frontier("tx", 1, T0 + 1950), control("tx", [0, 1])])
    once = results(t.testInPandas(3, batch), topics)
    roll_back(t, 3, before)  # the state store rolls back to the last commit
    again = results(t.testInPandas(3, batch.iloc[::-1].reset_index(drop=True)), topics)  # any row order
    assert once == again
    starts = [r["event_time"] for topic, r in once if topic == "out"]
    assert starts and starts == sorted(starts)
    assert [topic for topic, _ in once if topic != "out"] == []  # nothing late: within the delay of its partition


def test_the_final_cti_flushes_only_after_every_stream_has_ended():
    accounts = {"name": "accounts", "topic": "acc", "schema": "account", "key_field": "account",
                "time_field": "valid_from", "shape": "edge"}
    t, topics = make_tester({"sources": [TX, accounts], "operators": PASS,
                        "reference": {"source": "accounts", "fast": "tx", "join_field": "account"}})
    version = {"account": "a", "valid_from": T0, "home_country": "DE", "risk_threshold": 1.0, "tier": "gold"}
    rows = [pack("accounts", 0, 0, [version], "valid_from"), frontier("accounts", 0, T0), control("accounts", [0]),
            pack("tx", 0, 0, [tx(0, T0 + 100), tx(1, T0 + 200)]), frontier("tx", 0, T0 + 200),
            control("tx", [0], flush=True)]  # the transactions have ended, the reference stream has not
    out = results(t.testInPandas(1, pd.DataFrame(rows)), topics)
    assert [r["id"] for topic, r in out if topic == "out"] == []  # CTI 200 − 1000: nothing final yet
    out = results(t.testInPandas(1, pd.DataFrame([control("tx", [0]), control("accounts", [0], flush=True)])), topics)
    assert [r["id"] for topic, r in out if topic == "out"] == ["t0", "t1"]  # now every stream has ended: +∞


COUNT_PER_KEY = [{"kind": "count", "name": "last_10", "window": {"events": 10}, "emit": "per_event", "output": "c"}]


def metrics_of(frame: pd.DataFrame) -> dict:
    metrics: dict = {}
    list(records(iter([pa.RecordBatch.from_pandas(frame, preserve_index=False)]), metrics))
    return metrics


def count_batch(first: int, n: int, t0: int) -> pd.DataFrame:
    recs = [tx(first + i, t0 + i * 10, "ab"[i % 2]) for i in range(n)]
    return pd.DataFrame([pack("tx", 0, first, recs), frontier("tx", 0, t0 + n * 10 + 5000), control("tx", [0])])


@pytest.mark.parametrize("layout", [3, 2])
def test_the_next_batch_uses_the_chunks_this_worker_committed_decoded_and_a_replay_reads_the_store(layout):
    """ctiflow.jobs.state.warm.WarmChunks: a batch after a commit of this worker takes its chunks decoded
    (no state-store read); a replay of that batch after the store rolled back must not see the
    chunks the first attempt changed (a count per key would count its events twice)."""
    t, topics = make_tester({"sources": [TX], "operators": COUNT_PER_KEY}, layout)
    first = t.testInPandas(5, count_batch(0, 20, T0))
    assert metrics_of(first)["chunks_cached"] == 0
    before = snapshot(t, 5, layout)
    batch = count_batch(20, 20, T0 + 10_000)
    once = t.testInPandas(5, batch)
    assert metrics_of(once)["chunks_cached"] > 0
    roll_back(t, 5, before)  # the store rolls back: the micro-batch is replayed
    again = t.testInPandas(5, batch)
    assert metrics_of(again)["chunks_cached"] == 0
    # the reference: a worker that keeps nothing decoded (state.cache_chunks = 0)
    ref, _ = make_tester({"sources": [TX], "operators": COUNT_PER_KEY, "state": {"cache_chunks": 0}}, layout)
    ref.testInPandas(5, count_batch(0, 20, T0))
    expected = ref.testInPandas(5, batch)
    assert metrics_of(expected)["chunks_cached"] == 0
    assert results(once, topics) == results(again, topics) == results(expected, topics)
    assert [r["upper"] for _, r in results(once, topics)][-2:] == [10, 10]  # a, b: 20 events each, window 10


def spread_batch(first: int, n: int, t0: int, accounts: int) -> pd.DataFrame:
    """``n`` transactions over ``accounts`` accounts, every account's in turn (sparse keys)."""
    recs = [tx(first + i, t0 + i * 10, f"acct-{(first + i) % accounts:03d}") for i in range(n)]
    return pd.DataFrame([pack("tx", 0, first, recs), frontier("tx", 0, t0 + n * 10 + 5000), control("tx", [0])])


@pytest.mark.parametrize("cache_chunks", [0, None])
def test_a_batch_that_touches_most_chunks_reads_the_state_at_once_and_computes_what_reads_one_by_one_do(
        monkeypatch, cache_chunks):
    """ctiflow.jobs.state.chunks.KeyedState.read_ahead: with sparse keys (every account in every
    batch, 8 keys a chunk) and no decoded chunks at hand, a batch reads every entry in one pass —
    bases, then bases and deltas — and writes through it; its results, and those of a replay after
    the store rolled back, are those of the same job reading entry by entry."""
    from ctiflow.jobs.state import chunks as chunk_module

    state = {"chunk_keys": 8, **({} if cache_chunks is None else {"cache_chunks": cache_chunks})}
    spec = {"sources": [TX], "operators": COUNT_PER_KEY, "state": state}
    batches = [spread_batch(i * 240, 240, T0 + i * 10_000, 120) for i in range(4)]  # 2 events an account

    def run(tester) -> tuple[list, list]:
        got, read_all = [], []
        for i, batch in enumerate([batches[0], batches[1], batches[2], None, batches[2], batches[3]]):
            if batch is None:
                roll_back(tester, 5, before)  # the store rolls back: batch 2 is replayed
                continue
            if i == 2:
                before = snapshot(tester, 5)
            frame = tester.testInPandas(5, batch)
            got.append(results(frame, topics))
            read_all.append(metrics_of(frame)["state_read_all"])
        return got, read_all

    t, topics = make_tester(spec)
    got, read_all = run(t)
    monkeypatch.setattr(chunk_module, "READ_ALL_FROM", 10**9)
    one_by_one, none = run(make_tester(spec)[0])
    assert got == one_by_one and set(none) == {0}
    assert read_all[0] == 0  # nothing stored yet
    # every batch but the first reads at once, or with the cache only the replay (the rest are warm)
    assert read_all == ([0, 1, 1, 1, 1] if cache_chunks == 0 else [0, 0, 0, 1, 0])
    assert got[2] == got[3]  # the replay
    uppers = [r["upper"] for _, r in got[4]]
    assert len(uppers) == 240 and set(uppers) == {7, 8}  # each account's 7th and 8th events (window 10)


def sparse_two_partitions(b: int, accounts: int = 400) -> pd.DataFrame:
    """Batch ``b``: ~15 events on partition 0 and ~5 on partition 1 (behind it by up to 3 s, out of
    order by pairs), accounts drawn at random from ``accounts`` (a few keys of every chunk); batch 0:
    every account once, on partition 0."""
    rnd = random.Random(b)
    t0 = T0 + b * 10_000
    if b == 0:  # every account once
        fast = [tx(i, t0 - 5000 + i * 10, f"acct-{i:03d}") for i in range(accounts)]
        return pd.DataFrame([pack("tx", 0, 0, fast), frontier("tx", 0, fast[-1]["event_time"]), control("tx", [0])])
    fast = [tx(b * 1000 + i, t0 + i * 150, f"acct-{rnd.randrange(accounts):03d}") for i in range(rnd.randint(12, 18))]
    slow = [tx(b * 1000 + 500 + i, t0 - 3000 + i * 500 + (200 if i % 2 == 0 else -200),
               f"acct-{rnd.randrange(accounts):03d}") for i in range(rnd.randint(3, 6))]
    return pd.DataFrame([pack("tx", 0, b * 100, fast), pack("tx", 1, b * 100, slow),
                         frontier("tx", 0, max(r["event_time"] for r in fast)),
                         frontier("tx", 1, max(r["event_time"] for r in slow)), control("tx", [0, 1])])


def take_turns(monkeypatch, plan: list, workers: int) -> tuple[list[int], list[int], list[int]]:
    """Count per key over :func:`sparse_two_partitions`, run batch by batch as ``plan`` says: ``(batch,
    worker)`` runs the batch with that worker's cache (:class:`~ctiflow.jobs.state.warm.WarmChunks`),
    ``("back", worker)`` rolls the store back to before the previous batch and replays it there.
    Every batch's results must be a worker's that keeps nothing decoded; → per step, the chunks
    caught up, taken from the cache, and used."""
    from ctiflow.jobs.datapath import adapter
    from ctiflow.jobs.state import chunks as chunk_module
    from ctiflow.jobs.state.warm import WarmChunks

    monkeypatch.setattr(chunk_module, "DELTA_FROM", 0)  # (chunks of 32 small keys: deltas from the first base)
    spec = {"sources": [TX], "operators": COUNT_PER_KEY, "state": {"chunk_keys": 32, "delta_share": 1.0}}
    caches = [WarmChunks() for _ in range(workers)]
    t, topics = make_tester(spec)
    ref, _ = make_tester({**spec, "state": {**spec["state"], "cache_chunks": 0}})
    caught, cached, loaded, saved = [], [], [], None
    for b, w in plan:
        if b == "back":
            roll_back(t, 5, saved)
            b = last
        else:
            expected = results(ref.testInPandas(5, sparse_two_partitions(b)), topics)
            saved, last = snapshot(t, 5), b
        monkeypatch.setattr(adapter, "WARM", caches[w])
        frame = t.testInPandas(5, sparse_two_partitions(b))
        m = metrics_of(frame)
        assert results(frame, topics) == expected, (b, w)
        caught.append(m.get("chunks_caught_up", 0))
        cached.append(m.get("chunks_cached", 0))
        loaded.append(m["chunks_loaded"])
    return caught, cached, loaded


def test_two_workers_taking_turns_catch_up_with_each_others_deltas_and_a_replay_reads_the_store(monkeypatch):
    """The stateful stage's two Python workers swap the key group every batch (Spark hands a task
    the worker idle longest): each finds its own chunks one commit behind the store and absorbs
    the delta the other wrote, instead of reading and decoding them (the chunks it wrote whole are
    read). Results per batch are those of a worker that keeps nothing decoded, through a replay on
    either worker after the store rolled back (a worker's chunks from the rolled-back commit must
    never be used)."""
    # batch, worker; "back": the store rolls back to before the previous batch, which is replayed
    plan = [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0), (5, 1), ("back", 0), (6, 1), (7, 0), ("back", 1), (8, 0),
            (9, 1)]
    caught, cached, loaded = take_turns(monkeypatch, plan, 2)
    assert caught[:2] == [0, 0] and all(c > 0 for c in caught[2:6])  # taking turns: every batch from the third
    assert all(c <= n for c, n in zip(cached, loaded)) and all(c >= u for c, u in zip(cached, caught))
    # a replay on the worker that committed the state it reads: its chunks as they are; the other
    # worker next holds chunks of the rolled-back commit only, and reads the store
    assert cached[6] > 0 and caught[6] == 0 and cached[7] == 0 and caught[8] > 0
    assert cached[9] > 0 and caught[9] == 0 and cached[10] == 0 and caught[11] > 0


def test_three_workers_in_turn_catch_up_over_the_commits_since_theirs(monkeypatch):
    """Three Python workers run the key group in turn (Spark's pool serves the source's stage too,
    so a group's worker is often two or more commits behind): each finds its chunks in the header's
    last commits and absorbs every frame written since, reading only the chunks a commit in between
    wrote whole. Results per batch are those of a worker that keeps nothing decoded; a worker whose
    commits fell out of the header's history (:data:`~ctiflow.jobs.state.chunks.HISTORY`) reads the
    store, as does one after a rollback."""
    from ctiflow.jobs.state import chunks as chunk_module

    monkeypatch.setattr(chunk_module, "_spread", lambda c, size: 1000.0)  # (compacted at MAX_FRAMES only)
    # a fourth worker runs batch 0 and then only batch 10: its state is ten commits old
    plan = [(0, 3), (1, 0), (2, 1), (3, 2), (4, 0), (5, 1), (6, 2), (7, 0), ("back", 1), (8, 2), (9, 0),
            (10, 3), (11, 1)]
    caught, cached, _ = take_turns(monkeypatch, plan, 4)
    assert caught[:4] == [0, 0, 0, 0] and all(c > 0 for c in caught[4:8])  # two commits behind, from batch 4
    # the replay of batch 7 on worker 1: its state is from batch 5, behind the rolled-back store by one
    # commit (batch 6); worker 2 next (batch 8) is behind by batch 7 as replayed, then worker 0 holds
    # batch 7's first attempt only (never in a header): it reads the store
    assert caught[8] > 0 and caught[9] > 0 and cached[10] == 0
    assert cached[11] == 0  # worker 3: its commit is ten commits old, past the header's history
    assert caught[12] > 0  # worker 1: three commits behind (the replay of batch 7, then 8, 9 and 10)


def test_a_batch_that_fails_after_changing_chunks_leaves_nothing_decoded_behind(monkeypatch):
    from ctiflow.operators.count import CountOperator as Counter
    t, topics = make_tester({"sources": [TX], "operators": COUNT_PER_KEY})
    t.testInPandas(5, count_batch(0, 6, T0))
    batch = count_batch(6, 6, T0 + 10_000)
    real = Counter.advance_to

    def fails(self, cti):  # a bug, after the batch's events went into the chunks
        raise RuntimeError("a bug")

    monkeypatch.setattr(Counter, "advance_to", fails)
    with pytest.raises(RuntimeError, match="a bug"):
        t.testInPandas(5, batch)
    monkeypatch.setattr(Counter, "advance_to", real)
    # the failed attempt committed nothing; its retry must count each key's events once
    out = [r for _, r in results(t.testInPandas(5, batch), topics)]
    assert [(r["key"], r["upper"]) for r in out] == [("a", 4), ("b", 4), ("a", 5), ("b", 5), ("a", 6), ("b", 6)]


SLOW = {**TX, "cti": {"delay": 20_000}}  # 20 s of events wait in the reorder buffer: a header of several parts


def uneven_batches(n: int = 3) -> tuple[list[pd.DataFrame], list[dict]]:
    """Two partitions at uneven rates (10 ms and 37 ms apart, the slower one out of order by
    pairs), a slice of each per micro-batch, the last batch flushing; → frames and all records."""
    fast = [tx(i, T0 + i * 10, "ab"[i % 2]) for i in range(1500 * n)]
    slow = [tx(100_000 + i, T0 + i * 37 + (37 if i % 2 == 0 else -37), "cd"[i % 2]) for i in range(500 * n)]
    frames, seen = [], {0: 0, 1: 0}
    for b in range(n):
        mine0, mine1 = fast[b * 1500:(b + 1) * 1500], slow[b * 500:(b + 1) * 500]
        seen[0] = max(seen[0], *(r["event_time"] for r in mine0))
        seen[1] = max(seen[1], *(r["event_time"] for r in mine1))
        frames.append(pd.DataFrame([pack("tx", 0, b * 1500, mine0), pack("tx", 1, b * 500, mine1),
                                    frontier("tx", 0, seen[0]), frontier("tx", 1, seen[1]),
                                    control("tx", [0, 1], flush=b == n - 1)]))
    return frames, fast + slow


def expected_releases(n: int = 3) -> list[list[str]]:
    """The oracle: after batch b the CTI is min(partition frontiers) − 20 s (+∞ after the flush);
    a batch releases the events before its CTI not released yet, by (time, partition, offset)."""
    fast = [(T0 + i * 10, 0, i, f"t{i}") for i in range(1500 * n)]
    slow = [(T0 + i * 37 + (37 if i % 2 == 0 else -37), 1, i, f"t{100_000 + i}") for i in range(500 * n)]
    out, done = [], 0
    for b in range(n):
        top = min(max(t for t, *_ in fast[:(b + 1) * 1500]), max(t for t, *_ in slow[:(b + 1) * 500]))
        cti = 2**62 if b == n - 1 else top - 20_000
        ready = sorted(e for e in fast[:(b + 1) * 1500] + slow[:(b + 1) * 500] if e[0] < cti)
        out.append([e[3] for e in ready[done:]])
        done = len(ready)
    return out


def stored_header(t: TwsTester, key, layout: int) -> tuple[bytes, list[bytes]]:
    """(the header's stored value, its stored parts in order) as the state store holds them."""
    if layout == 2:
        return t.peekValueState("header", key)[0], [p for (p,) in t.peekListState("header_parts", key)]
    entries = {k[0]: v[0] for k, v in t.peekMapState("state", key).items()}
    return entries[-1], [entries[k] for k in sorted((k for k in entries if k < -1), reverse=True)]


@pytest.mark.parametrize("layout", [3, 2])
def test_a_large_header_is_stored_in_parts_and_read_back_on_the_next_batch_and_on_a_replay(monkeypatch, layout):
    """A header above PACK_BYTES (lowered to 64 bytes here: the header is a few hundred bytes
    now that the reorder buffer's ~3,000 events are stored apart, entries from PART_KEYS on) is
    stored in parts of at most PACK_BYTES (a single large value — a reference join of many keys —
    is a G1 humongous object in the state server): in layout 3 as map entries -2, -3, … (the
    value names their count), in layout 2 in the ``header_parts`` list. The next batch, a replay
    after the store rolled back, and a worker that keeps no chunks decoded release what the
    oracle says, batch by batch; once the buffer is flushed its entries and the header's parts
    are gone."""
    from ctiflow.jobs.core import rows
    from ctiflow.jobs.state.store import HEADER_IN_PARTS
    from ctiflow.jobs.state.parts import PART_KEYS

    PACK_BYTES, real = 64, rows.PACK_BYTES
    monkeypatch.setattr(rows, "PACK_BYTES", PACK_BYTES)

    frames, _ = uneven_batches()
    expected = expected_releases()
    assert expected[0] == [] and expected[1] and sum(map(len, expected)) == 6000  # batch 0: all wait
    t, topics = make_tester({"sources": [SLOW], "operators": PASS}, layout)
    cold, _ = make_tester({"sources": [SLOW], "operators": PASS, "state": {"cache_chunks": 0}}, layout)
    first = t.testInPandas(3, frames[0])
    assert [r["id"] for _, r in results(first, topics)] == expected[0]
    value, parts = stored_header(t, 3, layout)
    assert value.startswith(HEADER_IN_PARTS) and len(parts) >= 2
    assert all(len(p) <= PACK_BYTES for p in parts)
    entries = "state" if layout == 3 else "chunks"
    assert any(k[0] >= PART_KEYS for k in t.peekMapState(entries, 3))  # the buffer, apart
    before = snapshot(t, 3, layout)
    second = t.testInPandas(3, frames[1])
    assert [r["id"] for _, r in results(second, topics)] == expected[1]
    roll_back(t, 3, before)  # the store rolls back: batch 1 is replayed
    again = t.testInPandas(3, frames[1])
    assert [r["id"] for _, r in results(again, topics)] == expected[1]
    for b, frame in enumerate(frames):
        assert [r["id"] for _, r in results(cold.testInPandas(3, frame), topics)] == expected[b]
    monkeypatch.setattr(rows, "PACK_BYTES", real)  # the header fits one value again: its parts go
    last = t.testInPandas(3, frames[2])  # the flush: nothing stays buffered, the buffer's entries are removed
    assert [r["id"] for _, r in results(last, topics)] == expected[2]
    value, parts = stored_header(t, 3, layout)
    assert not value.startswith(HEADER_IN_PARTS) and parts == []
    assert not any(k[0] >= PART_KEYS for k in t.peekMapState(entries, 3))


def test_the_adapter_reads_every_state_layout_the_checkpoint_accepts_and_no_other():
    from ctiflow.jobs.state.store import LAYOUTS as GROUP_STATES
    from ctiflow.jobs.driver.checkpoint import STATE_LAYOUTS_READ

    assert sorted(GROUP_STATES) == sorted(STATE_LAYOUTS_READ) and STATE_LAYOUT in GROUP_STATES
    with pytest.raises(ValueError, match="state layout 1"):
        make_tester({"sources": [TX], "operators": PASS}, 1)


def test_a_header_needing_fewer_parts_leaves_no_stale_part_behind(monkeypatch):
    """Layout 3: parts beyond the count the value names are removed when a header shrinks, and
    a header read joins exactly the parts the value names."""
    from ctiflow.jobs.core import rows
    from ctiflow.jobs.state.store import HEADER_IN_PARTS, GroupState

    frames, _ = uneven_batches()
    t, _ = make_tester({"sources": [SLOW], "operators": PASS})
    monkeypatch.setattr(rows, "PACK_BYTES", 32)
    t.testInPandas(3, frames[0])
    _, many = stored_header(t, 3, 3)
    monkeypatch.setattr(rows, "PACK_BYTES", 128)
    t.testInPandas(3, frames[1])  # the header is about as large, the parts four times as large
    value, fewer = stored_header(t, 3, 3)
    count = int.from_bytes(value[len(HEADER_IN_PARTS):len(HEADER_IN_PARTS) + 4], "little")
    assert 2 <= count == len(fewer) < len(many)
    keys = sorted(k[0] for k in t.peekMapState("state", 3))
    assert [k for k in keys if k < 0] == list(range(GroupState.HEADER - count, GroupState.HEADER + 1))


def test_the_stored_header_is_compressed_and_a_header_stored_uncompressed_still_loads():
    """The header goes to the state store as a zstd frame (ZSTD_MARK, its sizes, the frame,
    the token); a checkpoint written before (a plain pickled header + token, in the value state
    or in parts, the reorder buffer's rows in it as one column layer) loads as it is: the next
    batch releases what the oracle says."""
    import pickle

    from ctiflow.jobs.state.codec import ZSTD_MARK, expanded
    from ctiflow.jobs.state.store import HEADER_IN_PARTS
    from ctiflow.jobs.state.warm import WarmChunks
    from ctiflow.jobs.state.parts import PART_KEYS
    from ctiflow.operators.columns import EventColumns

    frames, _ = uneven_batches()
    expected = expected_releases()
    t, topics = make_tester({"sources": [SLOW], "operators": PASS})
    t.testInPandas(3, frames[0])
    value, parts = stored_header(t, 3, STATE_LAYOUT)
    stored = b"".join(parts) if value.startswith(HEADER_IN_PARTS) else value
    assert stored.startswith(ZSTD_MARK)
    header = expanded(stored)
    got = pickle.loads(header)  # a whole pickled header came back
    assert got[:2] == ("header", 7)
    (index, _sizes), join, enriched, ended, clocks, ops_cti, keyed, operators, _shared = got[2:]
    assert keyed[3] == {}  # no chunk has a delta after one batch
    rest = (join, enriched, ended, clocks, ops_cti, *keyed[:3], operators)  # as the positional header format 2
    assert expanded(stored + b"t" * WarmChunks.TOKEN_BYTES) == header  # the token after the frame is ignored
    assert expanded(header) == header and expanded(None) is None
    # the header as main wrote it before 2026-11-27: the buffer's rows in it (one column layer)
    _, _, cti, pending, _, buffers = index
    ((buffer_cti, parts),) = buffers.values()
    entries = {k[0]: v[0] for k, v in t.peekMapState("state", 3).items()}
    held = EventColumns.concat([pickle.loads(expanded(entries[PART_KEYS + i])) for i, _, _ in parts])
    held = held.take(held.release_order())
    header = pickle.dumps((pickle.dumps(("columns", 1, cti, pending, held, []), protocol=5), *rest), protocol=5)
    for old in ("in the value state", "in parts"):  # what the code before compression stored (layout 2)
        before, _ = make_tester({"sources": [SLOW], "operators": PASS}, 2)
        if old == "in parts":
            before.updateValueState("header", 3, (HEADER_IN_PARTS + b"t" * WarmChunks.TOKEN_BYTES,))
            before.updateListState("header_parts", 3, [(header[at:at + 4096],) for at in range(0, len(header), 4096)])
        else:
            before.updateValueState("header", 3, (header + b"t" * WarmChunks.TOKEN_BYTES,))
        assert [r["id"] for _, r in results(before.testInPandas(3, frames[1]), topics)] == expected[1], old
        assert before.peekValueState("header", 3)[0].startswith((ZSTD_MARK, HEADER_IN_PARTS))


def test_a_calls_time_in_the_state_store_is_counted_and_is_part_of_its_python_time():
    """``store_us``: the call's time in Spark's state store (here TwsTester's) — every call that
    keeps state makes some, and it is a part of the call's own time (``python_us``)."""
    t, _ = make_tester({"sources": [TX], "operators": COUNT_PER_KEY, "state": {"chunk_keys": 32}})
    for b in range(3):
        m = metrics_of(t.testInPandas(7, count_batch(b * 20, 20, T0 + b * 1000)))
        assert 0 < m["store_us"] <= m["python_us"], m


def test_a_hosted_calls_wait_beyond_its_hosts_python_time_is_counted_as_forwarding():
    """``forward_us``: none where the worker runs the call itself (here: no host server); for a call
    its host ran, the worker's time for the call beyond the host's ``python_us``, in the metrics row the
    sink reads — every other counter as the host reported it."""
    from ctiflow.jobs.datapath.adapter import _count_forwarding

    t, _ = make_tester({"sources": [TX], "operators": COUNT_PER_KEY})
    frame = t.testInPandas(7, count_batch(0, 20, T0))
    ran = metrics_of(frame)
    assert ran["python_us"] > 0 and ran["forward_us"] == 0, ran
    _count_forwarding(frame, ran["python_us"] + 1234)
    assert metrics_of(frame) == {**ran, "forward_us": 1234}


def test_the_store_clock_times_each_call_and_an_iterators_fetches_not_the_work_between():
    """A state variable's calls and the items its iterators fetch are timed; what the caller
    does between two items is not; keyword arguments and plain attributes pass through. (A clock
    of the test's own, moved by the fake store and by the caller: no wall-clock time asserted.)"""
    from ctiflow.jobs.state.store import StoreClock

    ns = [0]

    class Store:
        schema = "plain attribute"

        def getValue(self, key, *, default=None):
            ns[0] += 20_000
            return (key, default)

        def iterator(self):
            for i in range(3):
                ns[0] += 1_500 + i  # (fractions of a µs add up)
                yield i
            ns[0] += 700  # (finding there is no more: a fetch too)

    clock = StoreClock(now=lambda: ns[0])
    var = clock.timed(Store(), ("iterator",))
    assert var.schema == "plain attribute" and clock.take() == 0
    assert var.getValue(5, default=1) == (5, 1)
    assert clock.take() == 20 and clock.take() == 0
    got = []
    for item in var.iterator():
        got.append(item)
        ns[0] += 50_000  # the caller's work: not the store's
    assert got == [0, 1, 2]
    assert clock.take() == (3 * 1_500 + 0 + 1 + 2 + 700) // 1000  # 5,203 ns


def test_a_global_per_event_count_keys_every_record_with_the_global_key():
    """A per-event count without ``per_key`` emits its records as columns with one key shared by
    all (``*``): each record is the count of the last 3 events, whichever account, in event order."""
    t, topics = make_tester({"sources": [TX], "operators": [
        {"kind": "count", "name": "last_3", "per_key": False, "window": {"events": 3}, "emit": "per_event",
         "output": "c"}]})
    frame = t.testInPandas(2, count_batch(0, 6, T0))
    got = list(records(iter([pa.RecordBatch.from_pandas(frame, preserve_index=False)]), {}))
    counts = [(k, AvroDeserializer(topics[topic])(v)) for topic, k, v in got if topic == "c"]
    assert [(k, r["key"], r["time"], r["estimate"]) for k, r in counts] == [
        (b"*", "*", T0 + 10 * i, float(min(i + 1, 3))) for i in range(6)]
