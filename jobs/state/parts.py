"""The time layer's buffered rows in the state store, part by part.

The reorder buffer holds everything a ``cti.delay`` holds back — minutes of input. Kept in the
key group's header, every micro-batch would read and write all of it (≈ 15 MiB a batch at a
6-minute delay and 500 events/s). Instead each :class:`ctiflow.operators.columns.Part` (the rows one
batch admitted, or what a release left of them; never changed once made) is one entry of the
group's state under :data:`PART_KEYS` + its id: a batch writes the parts it made and deletes
the parts it released, and reads a part only when a release reaches it; a part is stored
compressed (:mod:`ctiflow.jobs.state.codec`). The header keeps the layer's index (CTIs, parts by id,
``lo``, rows) and each stored part's size.
"""

from __future__ import annotations

import pickle
from collections.abc import MutableMapping

from ctiflow.jobs.state.codec import compressed, expanded
from ctiflow.operators import snapshots
from ctiflow.operators.columns import ColumnTimeLayer, EventColumns

#: A part's entry number in the group's state: chunks are numbered from 0, their deltas from
#: :data:`DELTA_KEYS`, parts from here (Spark's key column is a 32-bit int; no key group has 2**29
#: chunks).
PART_KEYS = 1 << 30
#: chunk ``c``'s delta (:mod:`ctiflow.jobs.state.chunks`) is a log of frames, frame ``n`` entry
#: :func:`frame_entry` ``(c, n)``: frame 0 is ``DELTA_KEYS + c`` (where a chunk's one delta was before
#: 2026-12-02)
DELTA_KEYS = 1 << 29
#: frames of one chunk are this far apart: a chunk from here on keeps no delta (its frames would meet
#: another chunk's; 2**24 chunks of a key group are more keys than any group holds)
FRAME_STRIDE = 1 << 24
#: the most frames a chunk's delta holds (frame entries stay below :data:`PART_KEYS`)
MAX_FRAMES = 32


def frame_entry(c: int, n: int) -> int:
    """The entry number of frame ``n`` of chunk ``c``'s delta (``c`` below :data:`FRAME_STRIDE`,
    ``n`` below :data:`MAX_FRAMES`)."""
    return DELTA_KEYS + n * FRAME_STRIDE + c


def is_chunk(entry: int) -> bool:
    """Whether a state entry number is a keyed-state chunk's base (not its delta, not a part's,
    not the header's)."""
    return 0 <= entry < DELTA_KEYS


class StoredParts:
    """The parts of one key group's time layer in ``store`` (entry number → bytes); ``sizes``:
    each stored part's bytes (from the header)."""

    def __init__(self, store: MutableMapping, sizes: dict[int, int] | None = None) -> None:
        self.store = store
        self.sizes = {} if sizes is None else sizes

    def load(self, part: int) -> EventColumns:
        blob = self.store.get(PART_KEYS + part)
        if blob is None:
            raise RuntimeError(f"part {part} of the time layer is missing from the state store (a bug)")
        return snapshots.loads(expanded(blob))

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values())

    def commit(self, layer: ColumnTimeLayer) -> int:
        """Store the parts ``layer`` made since its last commit, delete those it released;
        → bytes written."""
        made, gone = layer.commit()
        written = 0
        for part in made:
            blob = compressed(pickle.dumps(layer.stored(part), protocol=5))
            self.store[PART_KEYS + part.id] = blob
            self.sizes[part.id] = len(blob)
            written += len(blob)
        for part in gone:
            if self.sizes.pop(part, None) is not None:
                del self.store[PART_KEYS + part]
        return written
