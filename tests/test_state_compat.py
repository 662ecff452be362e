"""State written by an earlier ctiflow restores and goes on as that version would have.

``tests/data/state/main-2026-11-27.pkl.gz`` was written by ``tests/data/state/record.py`` run on
main of 2026-11-27 (the row time layer; a reference job's time layer, join output buffer and
count chunks; a one-stream match job's column buffer and runs), each snapshotted mid-stream with
events still buffered, plus the records that version produced from the snapshot to the end of
its input. This version restores each snapshot and must produce the same records (the late
topic's in any order: the runtime now offers each stream's packs in partition order).
``main-2026-11-28.pkl.gz``: the same jobs recorded at ``61c15c7`` (state chunks zstd-compressed,
the match operator's untouched keys a dict of pickled states, snapshot version 3).
``rules-2026-11-28.pkl.gz``: recorded at ``61c15c7`` too, with a third job: a match operator with
its own pattern and a rules stream (rule book format 1, ruled match operator format 1 holding
match operator snapshots of format 3), rules put, replaced, adjusted, refused and deleted on either side of the snapshot."""

from __future__ import annotations

import dataclasses
import gzip
import pickle
from pathlib import Path

import pytest

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.rows import Control, GroupInput
from ctiflow.jobs.core.runtime import GroupRuntime
from ctiflow.operators.columns import EventColumns

RECORDED = Path(__file__).parent / "data" / "state"


def group_input(batch, streams: tuple[str, ...], last: bool) -> GroupInput:
    """The batch as the source ships it: packs per stream and partition, frontiers, control rows
    (``streams``: the event streams and side inputs)."""
    got = GroupInput([], [], [(s, Control([0, 1] if s == "s" else [0], [], last)) for s in streams], [])
    for slot in sorted({(e.stream, e.partition) for e in batch}):
        mine = [e for e in batch if (e.stream, e.partition) == slot]
        got.columns.append(EventColumns.from_events(mine))
        got.frontiers.append((*slot, max(e.start for e in mine)))
    return got


@pytest.mark.parametrize(("version", "name"), [
    *((v, n) for v in ("main-2026-11-27", "main-2026-11-28") for n in ("reference-count", "one-stream-match")),
    ("rules-2026-11-28", "ruled-match")])
def test_a_snapshot_of_an_earlier_main_restores_and_goes_on_as_it_did(version, name):
    with gzip.open(RECORDED / f"{version}.pkl.gz") as f:
        recorded = pickle.load(f)[name]
    p = plan_job(parse(recorded["spec"], recorded["spec"]["job"]))
    rt = GroupRuntime(p, recorded["snapshot"])
    for i, (batch, want) in enumerate(zip(recorded["batches"], recorded["outputs"])):
        streams = (*p.streams, *(s.stream for s in p.side_inputs))
        out = rt.run_batch(group_input(batch, streams, i == len(recorded["batches"]) - 1)).outputs
        got = [(topic, o.role, o.record, key) for topic, o, key in out]
        late = p.late_topic
        assert [r for r in got if r[0] != late] == [r for r in want if r[0] != late]
        assert sorted(repr(r) for r in got if r[0] == late) == sorted(repr(r) for r in want if r[0] == late)
    assert rt.keys() == set()


def test_snapshots_of_earlier_versions_name_classes_where_they_were():
    """A pickle naming ``operators.columns.EventColumns`` (before the ``ctiflow`` package),
    ``operators.cep.recognize.Timestamp`` (before the SQL modules split),
    ``ctiflow.operators.cep.sql.Timestamp`` or ``ctiflow.operators.cep.shared_buffer.DeweyNumber``
    (before ``operators/cep/`` had rooms) reads as today's class."""
    import pickle

    from ctiflow.operators import snapshots
    from ctiflow.operators.cep.expr.vocabulary import Timestamp
    from ctiflow.operators.cep.nfa.shared_buffer import DeweyNumber
    from ctiflow.operators.events import Event

    now = pickle.dumps((Event("k", 1, 2, {"a": 1}), Timestamp(5), DeweyNumber((1, 2))), protocol=2)  # (names as text)
    assert b"cctiflow.operators.cep.expr.vocabulary\n" in now and b"cctiflow.operators.cep.nfa.shared_buffer\n" in now
    for events, stamp, dewey in [(b"coperators.events\n", b"coperators.cep.recognize\n", b"coperators.cep.shared_buffer\n"),
                                 (b"cctiflow.operators.events\n", b"cctiflow.operators.cep.sql\n",
                                  b"cctiflow.operators.cep.shared_buffer\n")]:
        old = now.replace(b"cctiflow.operators.events\n", events)
        old = old.replace(b"cctiflow.operators.cep.expr.vocabulary\n", stamp)
        old = old.replace(b"cctiflow.operators.cep.nfa.shared_buffer\n", dewey)
        assert b"vocabulary" not in old and b"nfa." not in old
        event, when, number = snapshots.loads(old)
        assert type(event) is Event and event.fields == {"a": 1}
        assert type(when) is Timestamp and when == 5
        assert type(number) is DeweyNumber and number == DeweyNumber((1, 2))


def test_the_operators_read_their_current_format_only_and_compat_reads_the_earlier_ones():
    """The recorded ruled job's book (format 1) and operator (format 1, its versions' snapshots
    of match operator format 3): each reader alone refuses them as an earlier format (``operators/``
    holds no reader of one); through ``compat.restored`` they restore, and a snapshot of the result
    is in the current formats."""
    from ctiflow.jobs.state import compat
    from ctiflow.jobs.state.codec import expanded
    from ctiflow.jobs.state.header import GroupHeader, read_whole_state
    from ctiflow.operators import snapshots
    from ctiflow.operators.cep.operator import SNAPSHOT_FORMAT, MatchOperator
    from ctiflow.operators.cep.rules import BOOK_FORMAT
    from ctiflow.operators.snapshots import EarlierFormat

    with gzip.open(RECORDED / "rules-2026-11-28.pkl.gz") as f:
        recorded = pickle.load(f)["ruled-match"]
    p = plan_job(parse(recorded["spec"], recorded["spec"]["job"]))
    header, entries = read_whole_state(recorded["snapshot"], "")
    (book_bytes,) = GroupHeader.from_bytes(header, with_shared=True).shared
    (op_bytes,) = snapshots.loads(expanded(entries[0]))[1]
    (side,), (spec,) = p.side_inputs, p.operators
    subs = snapshots.loads(op_bytes)[2]
    assert {snapshots.loads(data)[0] for data, _ in subs.values()} == {3}
    static_settings = spec.settings.static
    for read, data in [(side.shared.restore, book_bytes), (spec.build, op_bytes),
                       (lambda d: MatchOperator.restore(static_settings, d), subs[("", 0)][0])]:
        with pytest.raises(EarlierFormat):
            read(data)
    book = compat.restored(side.shared.restore, book_bytes)
    assert snapshots.loads(book.snapshot())[0] == BOOK_FORMAT and not book.forgets  # a format 1 book kept all
    op = compat.restored(spec.build, op_bytes)
    op.use_shared(book)
    now = snapshots.loads(op.snapshot())
    assert {snapshots.loads(data)[0] for data, _ in now[2].values()} == {SNAPSHOT_FORMAT}
    assert op.live_keys() and op.live_keys() == {key for sub in subs.values() for key in MatchOperator.snapshot_summary(
        compat.upgrade("match operator", sub[0]))[0]}


def test_a_count_operator_of_format_1_is_refused_alone_and_read_through_compat_key_by_key():
    """The recorded count job's chunks hold count operator snapshots of format 1 (every histogram in
    one run of integers): CountOperator refuses them as an earlier format; through compat each key
    reads back the histogram the format-1 layout holds for it (read here with the histogram's own
    reader, in order), its touched keys kept, and a snapshot of the result is of format 2."""
    from array import array

    from ctiflow.jobs.state import compat
    from ctiflow.jobs.state.codec import expanded
    from ctiflow.jobs.state.header import read_whole_state
    from ctiflow.jobs.state.parts import is_chunk
    from ctiflow.operators import count, snapshots
    from ctiflow.operators.histogram import ExponentialHistogram
    from ctiflow.operators.snapshots import EarlierFormat

    with gzip.open(RECORDED / "main-2026-11-28.pkl.gz") as f:
        recorded = pickle.load(f)["reference-count"]
    p = plan_job(parse(recorded["spec"], recorded["spec"]["job"]))
    (spec,) = p.operators
    _, entries = read_whole_state(recorded["snapshot"], "")
    blobs = [snapshots.loads(expanded(b)) for c, b in entries.items() if is_chunk(c)]
    datas = [(got[3] if got[0] == "chunk" else got[1])[0] for got in blobs]
    assert datas and all(count._STATE_HEADER.unpack_from(d)[1] == 1 for d in datas)
    seen = 0
    for data in datas:
        with pytest.raises(EarlierFormat):
            spec.build(data)
        _, _, _, window, epsilon, _, nkeys, blob_len = count._STATE_HEADER.unpack_from(data)
        keys, pos = compat._count_keys(data, nkeys, blob_len)
        ints = array("q")
        ints.frombytes(data[pos:])
        i = 1 + ints[0]
        want = {}
        for key in keys:
            h, i = ExponentialHistogram._load(window, epsilon, ints, i)
            want[key] = (h.now, h.buckets())
        op = compat.restored(spec.build, data)
        assert {k: (op.histogram(k).now, op.histogram(k).buckets()) for k in op.keys} == want
        assert count._STATE_HEADER.unpack_from(op.snapshot())[1] == 3
        seen += len(want)
    assert seen >= 5  # (the recorded job's live keys)


def test_the_header_and_the_chunks_carry_their_format_and_a_later_one_is_refused(monkeypatch):
    """Today's header, chunks and chunk deltas name their format in their bytes; a header, chunk
    or delta of a later format (a checkpoint a newer ctiflow wrote) fails with a StateError naming
    it, never read as something else. (The recorded checkpoint's chunks, restored, are written
    whole at a ``delta_share`` of 0, as deltas at 100: their base stays the recorded chunk.)"""
    from ctiflow.jobs.state import chunks as chunk_module
    from ctiflow.jobs.state.chunks import CHUNK_FORMAT, DELTA_FORMAT
    from ctiflow.jobs.state.codec import compressed, expanded
    from ctiflow.jobs.state.header import HEADER_FORMAT, read_whole_state
    from ctiflow.jobs.state.parts import DELTA_KEYS, PART_KEYS, is_chunk
    from ctiflow.operators import snapshots
    from ctiflow.operators.errors import StateError

    with gzip.open(RECORDED / "main-2026-11-28.pkl.gz") as f:
        recorded = pickle.load(f)["one-stream-match"]
    p = dataclasses.replace(plan_job(parse(recorded["spec"], recorded["spec"]["job"])), delta_share=0.0)
    rt = GroupRuntime(p, recorded["snapshot"])
    rt.run_batch(group_input(recorded["batches"][0], tuple(p.streams), False))
    header, entries = read_whole_state(rt.snapshot(), "")
    assert snapshots.loads(header)[:2] == ("header", HEADER_FORMAT) == ("header", 7)
    chunks = {c: blob for c, blob in entries.items() if is_chunk(c)}
    assert chunks and all(snapshots.loads(expanded(b))[:2] == ("chunk", CHUNK_FORMAT) == ("chunk", 3)
                          for b in chunks.values())
    monkeypatch.setattr(chunk_module, "DELTA_FROM", 0)  # (deltas of any base)
    rt = GroupRuntime(dataclasses.replace(p, delta_share=100.0), recorded["snapshot"])  # (any size)
    rt.run_batch(group_input(recorded["batches"][0], tuple(p.streams), False))
    delta_header, delta_entries = read_whole_state(rt.snapshot(), "")
    deltas = {c: blob for c, blob in delta_entries.items() if DELTA_KEYS <= c < PART_KEYS}
    assert deltas and all(snapshots.loads(expanded(b))[:2] == ("delta", DELTA_FORMAT) == ("delta", 2)
                          for b in deltas.values())
    later_header = pickle.dumps(("header", 8, *snapshots.loads(header)[2:]), protocol=5)
    with pytest.raises(StateError, match="key group header snapshot of format 8"):
        GroupRuntime(p, header=later_header, chunks=dict(entries))
    # format 4 (2026-11-29 → 12-01): the chunks' index without the last commit; read, and the
    # batch after it gives the results it gives after today's header
    *fields, index, operators, shared = snapshots.loads(header)[2:]
    assert len(index) == 5 and len(index[4]) == 1 and index[4][0][0] is None  # (one commit; no worker's token)
    earlier = pickle.dumps(("header", 4, *fields, index[:4], operators, shared), protocol=5)
    outs = [GroupRuntime(p, header=h, chunks=dict(entries)).run_batch(
        group_input(recorded["batches"][1], tuple(p.streams), True)).outputs for h in (header, earlier)]
    assert outs[0] == outs[1] and outs[0]
    # format 5 (2026-12-01 → 12-02): a chunk's delta one entry, the index its bytes: read as its one
    # frame, the batch after it gives the same results
    *fields, index, operators, shared = snapshots.loads(delta_header)[2:]
    assert index[3] and all(len(frames) == 1 for frames in index[3].values())
    earlier = pickle.dumps(("header", 5, *fields, (*index[:3], {c: f[0] for c, f in index[3].items()}, index[4][0]),
                            operators, shared), protocol=5)
    # format 6 (2026-12-02): the last commit only, not a list of the last few
    sixth = pickle.dumps(("header", 6, *fields, (*index[:4], index[4][0]), operators, shared), protocol=5)
    outs = [GroupRuntime(p, header=h, chunks=dict(delta_entries)).run_batch(
        group_input(recorded["batches"][1], tuple(p.streams), True)).outputs for h in (delta_header, earlier, sixth)]
    assert outs[0] == outs[1] == outs[2] and outs[0]
    # a frame of format 1 (until 2026-12-02): every key changed named, not only those dropped; the
    # batch after it gives the same results
    def first_format(blob: bytes) -> bytes:
        _, _, cti, dropped, blobs, seen, keys, op_keys, tallies, _named = snapshots.loads(expanded(blob))
        changed = [sorted({*gone, *spec.build(part).live_keys()})  # (a match without PARTITION BY: job keys)
                   for spec, gone, part in zip(p.operators, dropped, blobs)]
        assert any(changed) and changed != dropped
        return compressed(pickle.dumps(("delta", 1, cti, changed, blobs, seen, keys, op_keys, tallies), protocol=5))

    firsts = {c: first_format(b) for c, b in deltas.items()}
    outs = [GroupRuntime(p, header=delta_header, chunks={**delta_entries, **frames}).run_batch(
        group_input(recorded["batches"][1], tuple(p.streams), True)).outputs for frames in ({}, firsts)]
    assert outs[0] == outs[1] and outs[0]
    d, delta = next(iter(deltas.items()))
    later_delta = compressed(pickle.dumps(("delta", 3, *snapshots.loads(expanded(delta))[2:]), protocol=5))
    rt = GroupRuntime(p, header=delta_header, chunks={**delta_entries, d: later_delta})
    with pytest.raises(StateError, match="state chunk delta snapshot of format 3"):
        rt.run_batch(group_input(recorded["batches"][1], tuple(p.streams), True))
    c, blob = next(iter(chunks.items()))
    later_chunk = compressed(pickle.dumps(("chunk", 4, *snapshots.loads(expanded(blob))[2:]), protocol=5))
    rt = GroupRuntime(p, header=header, chunks={**entries, c: later_chunk})
    with pytest.raises(StateError, match="state chunk snapshot of format 4"):
        rt.run_batch(group_input(recorded["batches"][1], tuple(p.streams), True))
