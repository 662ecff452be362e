"""A match operator's snapshot read as content, for tests that compare two operators' state.

Decodes the stored form by hand (numpy over the columns, :mod:`pickle` for each key's state), not
through :class:`ctiflow.operators.packed.PackedStates`, so a test of the packing does not read
its bytes back with the code it checks.
"""

from __future__ import annotations

import pickle

import numpy as np


def match_state(snapshot: bytes) -> dict:
    """``{"version", "fingerprint", "keys": {key: (due CTI, unpickled state, runs in flight)},
    "numbers"}`` of a :meth:`MatchOperator.snapshot` (version 6; its caps are settings, not
    content): the keys' order in the bytes (the order the operator last packed them) is not part of
    the content, and each key's state is unpickled (a state decoded and pickled again may share its
    strings differently)."""
    version, fingerprint, plain, numbers, _caps = pickle.loads(snapshot)
    held = {key: (due, pickle.loads(state), n) for key, (due, state, n) in packed_rows(plain).items()}
    return {"version": version, "fingerprint": fingerprint, "keys": held, "numbers": numbers}


def packed_rows(plain: tuple) -> dict:
    """``{key: (due CTI, pickled state, runs in flight)}`` of a ``PackedStates.to_plain()`` tuple
    ``(names, their width, dues, runs, offsets, blob)``, read by hand (each name a key's UTF-8
    followed by ``b"\\x01"`` and NULs to the width, sorted and distinct; the columns aligned)."""
    names, width, dues, runs, offsets, blob = plain
    dues, runs, offsets = (np.frombuffer(b, np.int64).tolist() for b in (dues, runs, offsets))
    names = [names[i:i + width].rstrip(b"\x00") for i in range(0, len(names), width)]
    assert all(name.endswith(b"\x01") for name in names) and names == sorted(set(names))
    keys = [name[:-1].decode() for name in names]
    assert len(keys) == len(dues) == len(runs) == len(offsets) - 1
    return {k: (d, blob[a:b], r) for k, d, r, a, b in zip(keys, dues, runs, offsets, offsets[1:])}


def keys_as_list(plain: tuple) -> tuple:
    """A ``PackedStates.to_plain()`` tuple in the form of match snapshot formats 4–5 (until
    2026-12-01): ``(keys as a list of strings, dues, runs, offsets, blob)``, rebuilt by hand."""
    rows = packed_rows(plain)
    keys = list(rows)
    dues = np.array([rows[k][0] for k in keys], np.int64).tobytes()
    runs = np.array([rows[k][2] for k in keys], np.int64).tobytes()
    offsets = np.cumsum([0, *(len(rows[k][1]) for k in keys)]).astype(np.int64).tobytes()
    return keys, dues, runs, offsets, b"".join(rows[k][1] for k in keys)
