"""A match operator's snapshot read as content, for tests that compare two operators' state.

Decodes the stored form by hand (numpy over the columns, :mod:`pickle` for each key's state), not
through :class:`ctiflow.operators.cep.packed.PackedStates`, so a test of the packing does not read
its bytes back with the code it checks.
"""

from __future__ import annotations

import pickle

import numpy as np


def match_state(snapshot: bytes) -> dict:
    """``{"version", "fingerprint", "keys": {key: (due CTI, unpickled state, runs in flight)},
    "numbers"}`` of a :meth:`MatchOperator.snapshot` (version 4): the keys' order in the bytes
    (the order the operator last packed them) is not part of the content, and each key's state is
    unpickled (a state decoded and pickled again may share its strings differently)."""
    version, fingerprint, (keys, dues, runs, offsets, blob), numbers = pickle.loads(snapshot)
    dues, runs, offsets = (np.frombuffer(b, np.int64).tolist() for b in (dues, runs, offsets))
    held = {key: (due, pickle.loads(blob[a:b]), n) for key, due, n, a, b in zip(keys, dues, runs, offsets, offsets[1:])}
    return {"version": version, "fingerprint": fingerprint, "keys": held, "numbers": numbers}
