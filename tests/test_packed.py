"""PackedStates against a dict of ``key → (due, bytes, runs)``: any sequence of takes, drops,
re-packs with new rows, splits and plain round trips holds the same keys with the same rows."""

from __future__ import annotations

import pickle

import numpy as np

from hypothesis import given, settings
from hypothesis import strategies as st

from ctiflow.jobs.testing.snapshots import packed_rows
from ctiflow.operators.packed import RUNS_UNKNOWN, NewRows, PackedStates

#: keys of every width, a key that is another's prefix, keys that differ only by trailing NULs (a
#: fixed-width string drops those) and non-ASCII ones
KEYS = [f"acct-{i:03d}" for i in range(40)] + ["", "ü-key", "k\x00json", "k", "k\x00", "k\x00\x00", "acct",
                                              "\x01"]

rows = st.tuples(st.sampled_from(KEYS), st.integers(-2**62, 2**62), st.binary(max_size=40),
                 st.integers(RUNS_UNKNOWN, 5))
steps = st.lists(st.one_of(
    st.tuples(st.just("take"), st.sampled_from(KEYS)),
    st.tuples(st.just("drop"), st.sampled_from(KEYS)),
    st.tuples(st.just("pack"), st.lists(rows, max_size=8)),
    st.tuples(st.just("plain"), st.none()),
    st.tuples(st.just("split"), st.integers(1, 4)),
    st.tuples(st.just("find"), st.lists(st.sampled_from(KEYS), max_size=6)),
    st.tuples(st.just("drop_many"), st.lists(st.sampled_from(KEYS), max_size=6)),
    st.tuples(st.just("take_many"), st.lists(st.sampled_from(KEYS), max_size=6, unique=True)),
    st.tuples(st.just("pack_columns"), st.lists(rows, max_size=8)),
    st.tuples(st.just("pack_other"), st.lists(rows, max_size=8)),
    st.tuples(st.just("keys"), st.none()),
    st.tuples(st.just("view"), st.none()),
    st.tuples(st.just("absent"), st.lists(st.sampled_from(KEYS), max_size=6, unique=True)),
), max_size=30)


def _rows(packed: PackedStates) -> dict:
    """The held keys' rows, read from :meth:`to_plain` (through pickle) by hand."""
    return packed_rows(pickle.loads(pickle.dumps(packed.to_plain())))


@settings(max_examples=300, deadline=None)
@given(st.lists(rows, max_size=12), steps, st.integers(-2**62, 2**62))
def test_packed_states_hold_what_a_dict_holds(first, script, cti) -> None:
    model = {}
    for key, due, data, runs in first:
        model.setdefault(key, (due, data, runs))
    packed = PackedStates.from_rows((k, *v) for k, v in model.items())
    views = []  # (a NumPy view of the blob as it was, a copy of its bytes)
    for op, arg in script:
        if op == "view":  # kept alive over the later steps (a count reads rows so): never changed
            view = np.frombuffer(packed.blob, np.uint8)
            views.append((view, view.tobytes()))
        elif op == "absent":  # neither held nor among the owner's decoded keys (here: every other key of KEYS)
            decoded = set(KEYS[::2])
            assert packed.absent(arg, decoded) == sorted(k for k in arg if k not in model and k not in decoded)
        elif op == "take":
            if arg in model:
                assert packed.take(arg) == model.pop(arg)[1]
            else:
                assert arg not in packed
        elif op == "drop":
            packed.drop(arg)
            model.pop(arg, None)
        elif op in ("pack", "pack_columns", "pack_other"):
            new = {}
            for key, due, data, runs in arg:
                if key not in model:
                    new.setdefault(key, (due, data, runs))
            if op == "pack":
                packed = packed.packed((k, *v) for k, v in new.items())
            elif op == "pack_other":  # another instance's rows, their names column passed through
                packed = packed.packed(PackedStates.from_plain(
                    PackedStates.from_rows((k, *v) for k, v in new.items()).to_plain()).columns())
            else:  # the same rows as columns, one buffer
                values = list(new.values())
                packed = packed.packed(NewRows(list(new), np.array([v[0] for v in values], np.int64),
                                               b"".join(v[1] for v in values),
                                               np.array([len(v[1]) for v in values], np.int64),
                                               np.array([v[2] for v in values], np.int64)))
            model.update(new)
        elif op == "take_many":  # the held ones, in the order asked, their bytes one after another
            held = [k for k in arg if k in model]
            taken, blob, ends = packed.take_many(arg)
            assert taken == held and ends.tolist() == np.cumsum([len(model[k][1]) for k in held]).tolist()
            assert blob == b"".join(model.pop(k)[1] for k in held)
        elif op == "find":  # a row found is the key's: taking it gives the key's bytes
            rows = packed.find(arg)
            assert [r >= 0 for r in rows.tolist()] == [k in model for k in arg]
            for key, row in zip(arg, rows.tolist()):
                if row >= 0:
                    assert packed.blob[packed.offsets[row]:packed.offsets[row + 1]] == model[key][1]
        elif op == "drop_many":
            packed.drop_many(arg)
            for key in arg:
                model.pop(key, None)
        elif op == "keys":  # every key a string: later questions answered from the dict
            assert set(packed.keys()) == set(model)
        elif op == "plain":
            packed = PackedStates.from_plain(pickle.loads(pickle.dumps(packed.to_plain())))
        else:  # split by a hash of the key, then put the parts back together
            parts = packed.split(lambda k: sum(map(ord, k)) % arg)
            assert set().union(*(set(p) for p in parts.values())) == set(model)
            for d, part in parts.items():
                assert all(sum(map(ord, k)) % arg == d for k in part)
            packed = PackedStates.from_rows(row for part in parts.values()
                                            for row in ((k, *v) for k, v in _rows(part).items()))
        # (the whole table checked on a copy: ``keys()`` makes every key a string and answers the
        # rest from the dict, so asking the instance itself would leave its searches untested)
        copy = PackedStates.from_plain(packed.to_plain())
        assert set(copy) == set(model) and len(packed) == len(model)
        assert set(copy.keys()) == set(model)
        assert _rows(packed) == model
        assert set(packed.due_keys(cti)) == {k for k, v in model.items() if v[0] <= cti}
        assert packed.next_due(7) == min((v[0] for v in model.values()), default=7)
        known, unknown = packed.runs_total()
        assert known == sum(v[2] for v in model.values() if v[2] != RUNS_UNKNOWN)
        assert sorted(unknown) == sorted(k for k, v in model.items() if v[2] == RUNS_UNKNOWN)
        assert all(view.tobytes() == was for view, was in views)


def test_a_few_keys_repacked_are_appended_and_a_snapshot_holds_no_dead_rows() -> None:
    """Re-packing after a few keys were taken appends their new rows (no instance, dict and list
    built anew for every key of the chunk) until the dead rows outnumber the held ones; the plain
    form never holds a dead row."""
    packed = PackedStates.from_rows((f"k{i}", i, bytes([i]) * 3, 0) for i in range(10))
    for key in ("k1", "k2"):
        packed.take(key)
    again = packed.packed([("k1", 100, b"new", 1), ("z", 5, b"zz", 0)])
    assert again is packed and len(again.alive) == 12  # appended: the two dead rows kept
    plain = again.to_plain()
    _, _, dues, runs, offsets, blob = plain
    keys = list(packed_rows(plain))
    assert sorted(keys) == sorted([f"k{i}" for i in range(10) if i != 2] + ["z"])
    assert _rows(again)["k1"] == (100, b"new", 1) and "k2" not in _rows(again)
    assert len(keys) == len(np.frombuffer(dues, np.int64)) == len(np.frombuffer(offsets, np.int64)) - 1
    assert len(blob) == sum(len(v[1]) for v in _rows(again).values())
    for i in range(10):
        again.drop(f"k{i}")
    compacted = again.packed([("y", 1, b"y", 0)])
    assert compacted is not again and sorted(compacted) == ["y", "z"] and len(compacted.alive) == 2


def test_a_restore_makes_no_key_a_string_and_finds_keys_by_the_sorted_column() -> None:
    """A restored instance has made no key a string until one is asked for; keys are found (all at
    once, or one) by the sorted names, keys differing only by trailing NULs told apart; rows
    appended since the sort are found too, and a re-pack merges them into the sorted column."""
    packed = PackedStates.from_rows([("k", 1, b"a", 0), ("k\x00", 2, b"b", 0), ("z", 3, b"c", 0)])
    restored = PackedStates.from_plain(packed.to_plain())
    assert restored._found == {} and not restored._complete and restored.ordered == 3
    assert restored.find(["k\x00", "k\x00\x00", "z", "k"]).tolist() == [0, -1, 2, 1]  # ("k\x00\x01" < "k\x01")
    assert restored.take("k\x00") == b"b" and "k\x00" not in restored and "k" in restored
    again = restored.packed([("k\x00", 9, b"new", 0), ("a", 0, b"first", 0)])
    assert again is restored and again.ordered == 3 and len(again.alive) == 5
    fresh = PackedStates.from_plain(restored.to_plain())  # (no dict: found by the column)
    assert fresh.find(["a", "k\x00", "k", "z"]).tolist() == [0, 1, 2, 3]
    assert fresh.take("k\x00") == b"new" and list(packed_rows(fresh.to_plain())) == ["a", "k", "z"]


def test_a_key_asked_for_once_is_not_searched_for_again(monkeypatch) -> None:
    """With sparse keys a batch asks for the keys it changed several times (to snapshot them,
    whether they are still held): only keys without an answer are searched for in the sorted
    column, held or not, and the answers stay right after takes and appends."""
    from ctiflow.operators import packed as packed_module

    restored = PackedStates.from_plain(PackedStates.from_rows(
        (f"k{i:03d}", i, bytes([i]), 0) for i in range(100)).to_plain())
    searched: list[list[str]] = []
    rows_in = packed_module.rows_in
    monkeypatch.setattr(packed_module, "rows_in", lambda names, keys: searched.append(list(keys))
                        or rows_in(names, keys))
    assert restored.find(["k005", "nope", "k007"]).tolist() == [5, -1, 7]
    assert restored.find(["k007", "k005", "nope", "k009"]).tolist() == [7, 5, -1, 9]
    assert searched == [["k005", "nope", "k007"], ["k009"]]
    assert restored.take("k005") == bytes([5])
    restored = restored.packed([("nope", 1, b"n", 0)])
    assert restored.find(["k005", "nope", "k007"]).tolist() == [-1, 100, 7]
    assert searched[2:] == [["k005"]]  # (a key taken is forgotten: asked again, its dead row is found)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(KEYS), st.text(max_size=6),
                          st.from_regex(r"acct-[0-9]{6}", fullmatch=True)), max_size=40))
def test_names_are_each_key_in_utf8_followed_by_the_end_mark(keys) -> None:
    """``names_of`` builds the column a key at a time's bytes would (the reference: each key encoded
    with END appended): for keys of one length in bytes (joined once) as for any others."""
    from ctiflow.operators.packed import END, names_of

    got = names_of(keys)
    if not keys:
        assert len(got) == 0
        return
    want = np.array([k.encode() + END for k in keys], dtype=bytes)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_names_of_one_length_are_viewed_only_where_the_end_marks_cut_equal_rows() -> None:
    """Keys of one length in bytes (joined once), of one length in characters but not in bytes, and
    keys of several lengths whose joined bytes look like equal rows: each one's bytes and END."""
    from ctiflow.operators.packed import END, names_of

    same = [f"acct-{i:06d}" for i in range(7)]
    assert names_of(same).tolist() == [k.encode() + END for k in same]
    assert names_of(["ab", "üx"]).tolist() == ["ab".encode() + END, "üx".encode() + END]  # one length, not ASCII
    # lengths that differ, summing to equal rows, END inside a key at a row's end (joined: END at
    # every row's end, but not only there)
    tricky = ["\x01", "", "\x01", "\x01\x01", "a"]
    assert names_of(tricky).tolist() == [k.encode() + END for k in tricky]
