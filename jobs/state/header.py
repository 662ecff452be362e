"""A key group's header — what the runtime keeps group-wide besides the chunks and parts — as one
declared record, written and read here only; and the whole state of a group in one blob (tests,
tools). Spark's state store keeps the header's bytes (:mod:`ctiflow.jobs.state.store`).

Format ``HEADER_FORMAT`` (7, from 2026-12-02): a pickled tuple ``("header", 7, layer, join,
enriched, ended, clocks, ops_cti, keyed, operators, shared)`` — ``keyed`` the chunks' index
(:meth:`ctiflow.jobs.state.chunks.KeyedState.index`, with the bytes of each chunk's delta frames and
what the last few commits read and wrote), ``shared`` None without side inputs. Formats 6 (the
last commit only), 5 (one delta a chunk: its bytes), 4 (no last commit) and 3 (no deltas either)
and the positional headers before them (format 2, no number in the bytes, their index spread and
grown over time) are read by
:func:`ctiflow.jobs.state.compat.header_fields`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from ctiflow.jobs.state import compat
from ctiflow.operators import snapshots
from ctiflow.operators.errors import StateError

#: the header's format (module docstring)
HEADER_FORMAT = 7
#: the whole-state blob's layout: ``(WHOLE_LAYOUT, header bytes, {entry: bytes})``
WHOLE_LAYOUT = 2


@dataclass
class GroupHeader:
    """``layer``: the time layer's ``(index, part sizes)`` (before 2026-11-27: its bytes);
    ``join``, ``enriched``: the reference join's state (None without one); ``ended``: the streams
    of a bounded input that ended; ``clocks``: stream → its partitions' CTIs; ``ops_cti``: the CTI
    every chunk's operators are at or will be caught up to; ``keyed``: the chunks' index;
    ``operators``: ``(name, class name)`` of each operator whose state the chunks hold;
    ``shared``: the operators' shared states (:mod:`ctiflow.jobs.core.broadcast`), or None."""

    layer: Any
    join: Any
    enriched: Any
    ended: set[str]
    clocks: dict
    ops_cti: int
    keyed: tuple
    operators: list
    shared: tuple[bytes, ...] | None = None

    def to_bytes(self) -> bytes:
        return pickle.dumps(("header", HEADER_FORMAT, self.layer, self.join, self.enriched, self.ended,
                             self.clocks, self.ops_cti, self.keyed, self.operators, self.shared), protocol=5)

    @classmethod
    def from_bytes(cls, data: bytes, with_shared: bool) -> "GroupHeader":
        """The header of ``data`` (``with_shared``: the plan has side inputs — what a header of
        format 2 needs to be read)."""
        got = snapshots.loads(data)
        if got[0] != "header" or got[1] < HEADER_FORMAT:
            return cls(*compat.header_fields(got, with_shared))
        snapshots.check_format("key group header", got[1], HEADER_FORMAT)
        return cls(*got[2:])


def whole_state(header: bytes, entries: dict) -> bytes:
    """A group's whole state in one blob: its header and every entry (tests and tools)."""
    return pickle.dumps((WHOLE_LAYOUT, header, entries), protocol=5)


def read_whole_state(data: bytes, fix: str) -> tuple[bytes, dict]:
    """``(header, entries)`` of a :func:`whole_state` blob (a :class:`StateError` ending with ``fix``
    for another layout)."""
    layout, header, entries = snapshots.loads(data)
    if layout != WHOLE_LAYOUT:
        raise StateError(f"the key group's state has layout {layout}, this ctiflow reads "
                         f"{WHOLE_LAYOUT}: {fix}")
    return header, entries
