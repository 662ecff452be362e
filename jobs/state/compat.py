"""Readers of the state formats earlier ctiflows wrote, in one place: they turn an earlier form
into today's objects, so the operators (``operators/``) read only their current formats. Every
checkpoint recorded so far restores through here (``tests/test_state_compat.py``).

========================  ==================================================================
earlier form              read as
========================  ==================================================================
time layer, layout 2      ``("columns", 2, cti, pending, {stream: (cti, held, arrived)})``:
                          several streams, rows kept in the header (until 2026-11-27)
time layer, layout 1      ``("columns", 1, cti, pending, held, arrived)``: one stream
row time layer            ``(buffers, generators, own CTIs, pending, CTI)``: each buffer a
                          row reorder buffer's snapshot (:func:`legacy_buffer`)
join output, row buffer   a row reorder buffer's snapshot (the enriched stream's)
match operator, 2–3       ``(format, fingerprint, {key: (due, pickled state[, runs])}[, numbers])``:
                          each key's state apart (until 2026-11-29)
match operator, 4         ``(4, fingerprint, packed keys, numbers)``: no caps (until 2026-12-01);
                          these and 2–3 restore with every key due at once
match operator, 5         ``(5, fingerprint, packed keys, numbers, caps)``: 4 and 5's packed keys
                          hold the keys as a list of strings (until 2026-12-01)
ruled match operator, 1–3 ``(format, CTI, {version key: (match operator snapshot, closed)})``:
                          its versions' snapshots in earlier match operator formats (2: in 4,
                          3: in 5)
count operator, 1         header, keys, then every key's histogram in one run of integers (until
                          2026-11-29)
count operator, 2         each key a row of its own; the keys as their lengths and UTF-8 (until
                          2026-12-01)
rule book, 1              ``(1, timeline, counts)``: a book that keeps every version (before
                          it could forget those no chunk holds)
group header, 2           ``(layer, join, enriched, ended, clocks, ops_cti, *index, operators[,
                          shared])``: no number in the bytes; the shared states there only when
                          the plan has side inputs; the chunks' index without its tallies
                          (before 2026-11-28) or its per-operator totals (before 2026-11-27)
group header, 3           ``("header", 3, …)`` as format 7, the chunks' index without deltas
                          (until 2026-11-29)
group header, 4           ``("header", 4, …)`` as format 7, the chunks' index without the last
                          commits' read tokens and written chunks (until 2026-12-01)
group header, 5           ``("header", 5, …)`` as format 7, each chunk's delta one entry (its
                          bytes, not its frames' bytes; until 2026-12-02): its frame 0; the last
                          commit only
group header, 6           ``("header", 6, …)`` as format 7, the last commit only, not the last
                          few (until 2026-12-02)
state chunk, 1–2          ``(cti, snapshots, last seen, keys[, keys per operator[, tallies]])``:
                          no number in the bytes
========================  ==================================================================

An operator or shared state reads its current format only, and raises
:class:`~ctiflow.operators.snapshots.EarlierFormat` on an earlier one; :func:`restored` is how
the key group restores each (:func:`upgrade` the bytes, then read them again).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

import numpy as np

from ctiflow.operators import count, snapshots
from ctiflow.operators.cep import operator as match, rules
from ctiflow.operators.packed import RUNS_UNKNOWN, PackedStates, names_of
from ctiflow.operators.columns import ColumnTimeLayer, EventColumns
from ctiflow.operators.time import CTI_NONE, AdvanceTimeSettings, Event


def time_layer(settings: Mapping[str, AdvanceTimeSettings], data, handles_adjust: bool = False,
               keep_fields: Collection[str] | None = None,
               needs_records: Callable[[EventColumns], bool] | None = None,
               load: Callable[[int], EventColumns] | None = None) -> ColumnTimeLayer:
    """The time layer of ``data``: today's layout (an index or a snapshot, ``ColumnTimeLayer.restore``)
    or an earlier one (the table above), whose rows become parts made now."""
    args = (handles_adjust, keep_fields, needs_records, load)
    got = snapshots.loads(data) if isinstance(data, bytes) else data
    if (len(got) == 2 and isinstance(got[0], tuple)) or tuple(got[:2]) == ("columns", 3):
        return ColumnTimeLayer.restore(settings, got, *args)
    if got[0] == "columns" and got[1] == 2:  # several streams, parts not apart
        _, _, cti, pending, buffers = got
        runs = {name: (b_cti, [held, *arrived]) for name, (b_cti, held, arrived) in buffers.items()}
    elif got[0] == "columns":  # one stream
        (name,) = settings
        _, _, cti, pending, held, arrived = got
        runs = {name: (cti, [held, *arrived])}
    else:  # a row time layer's: (buffers, generators, own CTIs, pending, merged CTI)
        rows, _generators, _own, pending_of, cti = got
        pending = max(pending_of.values(), default=CTI_NONE)
        runs = {name: (lambda b_cti, held: (b_cti, [held]))(*legacy_buffer(blob))
                for name, blob in rows.items()}
    return ColumnTimeLayer.of_runs(settings, cti, pending, runs, *args)


def legacy_buffer(data: bytes) -> tuple[int, EventColumns | None]:
    """A row reorder buffer's snapshot (``(cti, events in order, events arrived since)`` as
    :class:`Event` tuples; before 2026-11-27) as ``(its CTI, its events as sorted columns)``."""
    cti, *parts = snapshots.loads(data)
    events = [Event(*t) for part in parts for t in part]
    if any(e.edge_end for e in events):
        raise ValueError("the old reorder buffer holds end edges, which columns do not")
    if not events:
        return cti, None
    cols = EventColumns.from_events(events)
    return cti, cols.take(cols.release_order())


T = TypeVar("T")


def restored(restore: Callable[[bytes], T], data: bytes) -> T:
    """``restore(data)``, or, when ``data`` is in an earlier format of its reader, ``restore`` of
    the bytes :func:`upgrade` rewrote in the current one."""
    try:
        return restore(data)
    except snapshots.EarlierFormat as earlier:
        return restore(upgrade(earlier.what, data))


def upgrade(what: str, data: bytes) -> bytes:
    """``data``, a snapshot of ``what`` (an :class:`~ctiflow.operators.snapshots.EarlierFormat`'s
    name) in an earlier format, in the current one."""
    return _UPGRADES[what](data)


def _dumps(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _match_operator(data: bytes) -> bytes:
    """Formats 2–5 (2–3: each key's state pickled on its own, 3 added the runs in flight and the
    MATCH_NUMBER counts; 4: the keys packed in columns, the keys themselves a list of strings;
    5: with the caps) as the current one (the keys a sorted string column). Before 5
    no caps are known: the operator restores every key due at once (a key past a cap is due at
    once since format 5, so that its events are all taken and refused). Today's bytes pass."""
    version, fingerprint, keyed, *rest = snapshots.loads(data)
    if version == match.SNAPSHOT_FORMAT:
        return data
    if version in (4, 5):
        keys, *columns = keyed
        dues, runs, offsets = (np.frombuffer(b, np.int64) for b in columns[:3])
        keyed = PackedStates(names_of(keys), dues, runs, offsets, columns[3], ordered=0).to_plain()
        return _dumps((match.SNAPSHOT_FORMAT, fingerprint, keyed, rest[0], rest[1] if version == 5 else None))
    packed = PackedStates.from_rows((key, raw[0], raw[1], raw[2] if len(raw) > 2 else RUNS_UNKNOWN)
                                    for key, raw in keyed.items())
    return _dumps((match.SNAPSHOT_FORMAT, fingerprint, packed.to_plain(), rest[0] if rest else {}, None))


def _ruled_match_operator(data: bytes) -> bytes:
    """Formats 1–3 (its versions' snapshots in earlier match operator formats) as the current one."""
    _, at, subs = snapshots.loads(data)
    return _dumps((rules.SNAPSHOT_FORMAT, at, {key: (_match_operator(sub), closed)
                                               for key, (sub, closed) in subs.items()}))


def _rule_book(data: bytes) -> bytes:
    """Format 1 as the current one: a book that keeps every version (``forgets`` False)."""
    _, timeline, counts = snapshots.loads(data)
    return _dumps((rules.BOOK_FORMAT, timeline, counts, False))


def _count_keys(data: bytes, nkeys: int, blob_len: int) -> tuple[list[str], int]:
    """A count snapshot's keys in formats 1–2 (after its header: their lengths as uint32, then
    their UTF-8); → (keys, position after)."""
    pos = count._STATE_HEADER.size
    lengths = np.frombuffer(data, "<u4", nkeys, pos).tolist() if nkeys else []
    pos += 4 * nkeys
    raw = data[pos:pos + blob_len]
    if len(raw) != blob_len or sum(lengths) != blob_len:
        raise ValueError("count operator snapshot is truncated")
    ends = np.cumsum(lengths).tolist()
    return [raw[end - n:end].decode() for n, end in zip(lengths, ends)], pos + blob_len


def _count_operator(data: bytes) -> bytes:
    """Formats 1 (every key's histogram in one run of integers, read whole) and 2 (each key a row
    of its own, with the clock at which a CTI drops it; the keys a list of lengths and UTF-8) as
    the current one (the keys a sorted string column)."""
    _, version, by_time, window, epsilon, clock, nkeys, blob_len = count._STATE_HEADER.unpack_from(data)
    keys, pos = _count_keys(data, nkeys, blob_len)
    ints = np.frombuffer(data, "<i8", offset=pos)
    ntouched = int(ints[0])
    touched = ints[1:1 + ntouched].astype(np.int64)
    first = i = 1 + ntouched
    if version == 2:
        dues, offsets = ints[first:first + nkeys], ints[first + nkeys:first + 2 * nkeys + 1]
        rows = data[pos + 8 * (first + 2 * nkeys + 1):]
    else:
        starts, due_list = [], []
        for _ in keys:
            now, levels = int(ints[i]), int(ints[i + 1])
            sizes = ints[i + 2:i + 2 + levels].tolist()
            at = i + 2 + levels
            newest = None
            for size in sizes:
                at += size
                if size:
                    newest = int(ints[at - 1]) if newest is None else max(newest, int(ints[at - 1]))
            empty_at = now + 1 if newest is None else newest + window
            starts.append(i)
            due_list.append(max(empty_at, now + 1) if by_time else count._NEVER)
            i = at
        if i != len(ints):
            raise ValueError("count operator snapshot (format 1) has trailing data or is truncated")
        dues, offsets, rows = np.array(due_list, np.int64), 8 * (np.array([*starts, i], np.int64) - first), \
            ints[first:i].tobytes()
    packed = PackedStates(names_of(keys), np.asarray(dues, np.int64), None, np.asarray(offsets, np.int64),
                          rows, ordered=0).packed(())  # (sorted)
    rows_touched = packed.find([keys[t] for t in touched.tolist()])
    return count.pack_state(bool(by_time), window, epsilon, clock, packed.to_plain(), rows_touched)


_UPGRADES: dict[str, Callable[[bytes], bytes]] = {
    "match operator": _match_operator, "ruled match operator": _ruled_match_operator, "rule book": _rule_book,
    "count operator": _count_operator}


def header_fields(got: tuple, with_shared: bool) -> tuple:
    """A header of format 2–6 (the table above) as the fields of today's
    :class:`~ctiflow.jobs.state.header.GroupHeader`, in its order (``with_shared``: the plan has
    side inputs, so a header of format 2 ends with their states). Their chunks have no deltas
    (before 4) or one frame each (5); they name the last commit only (5, 6) or none (before 5:
    no worker catches up from them)."""
    if got[0] == "header":  # format 3: the chunks' index without deltas; 4: without the last commit's
        *fields, index, operators, shared = got[2:]
        if got[1] in (5, 6):
            *index, deltas, commit = index
            if got[1] == 5:  # each chunk's delta as its bytes: its one frame
                deltas = {c: (size,) for c, size in deltas.items()}
            return (*fields, (*index, deltas, (commit,)), operators, shared)
        return (*fields, (*index, {}, NO_COMMITS) if got[1] == 3 else (*index, NO_COMMITS), operators, shared)
    layer, join, enriched, ended, clocks, ops_cti, *index, operators = got
    shared = None
    if with_shared:
        shared, operators, index = operators, index[-1], index[:-1]
    due, level_split, (keys, size, *per_operator) = index
    n = len(operators)
    totals = per_operator[0] if per_operator else [[0, 0] for _ in range(n)]
    tallies = per_operator[1] if len(per_operator) > 1 else [{} for _ in range(n)]
    index = (due, level_split, (keys, size, totals, tallies), {}, NO_COMMITS)
    return layer, join, enriched, ended, clocks, ops_cti, index, operators, shared


#: the chunks' index's last commits when a header does not name them (each ``(read token, chunks
#: written as a frame, written whole)``: :meth:`ctiflow.jobs.state.chunks.KeyedState.index`)
NO_COMMITS = ()


def chunk_fields(got: tuple) -> tuple:
    """A state chunk of format 1–2 (the table above) as ``(cti, snapshots, last seen, keys, keys
    per operator, tallies per operator)``."""
    cti, blobs, last_seen, keys, *per_operator = got
    op_keys = per_operator[0] if per_operator else [0] * len(blobs)
    tallies = per_operator[1] if len(per_operator) > 1 else [{} for _ in blobs]
    return cti, blobs, last_seen, keys, op_keys, tallies
