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
    "numbers"}`` of a :meth:`MatchOperator.snapshot` (version 5; its caps are settings, not
    content): the keys' order in the bytes (the order the operator last packed them) is not part of
    the content, and each key's state is unpickled (a state decoded and pickled again may share its
    strings differently)."""
    version, fingerprint, plain, numbers, _caps = pickle.loads(snapshot)
    held = {key: (due, pickle.loads(state), n) for key, (due, state, n) in packed_rows(plain).items()}
    return {"version": version, "fingerprint": fingerprint, "keys": held, "numbers": numbers}


def packed_rows(plain: tuple) -> dict:
    """``{key: (due CTI, pickled state, runs in flight)}`` of a ``PackedStates.to_plain()`` tuple
    ``(keys, dues, runs, offsets, blob)``, read by hand (the keys distinct, the columns aligned)."""
    keys, dues, runs, offsets, blob = plain
    dues, runs, offsets = (np.frombuffer(b, np.int64).tolist() for b in (dues, runs, offsets))
    assert len(keys) == len(set(keys)) == len(dues) == len(runs) == len(offsets) - 1
    return {k: (d, blob[a:b], r) for k, d, r, a, b in zip(keys, dues, runs, offsets, offsets[1:])}
