"""Allocation-heavy work in the Python workers runs with the cyclic garbage collector paused.

A micro-batch allocates hundreds of thousands of small containers (a decoded record's dict, an
event, a result record) that are freed by reference counting: none of them is in a cycle. But
CPython's cyclic collector counts allocations, and every 700 of them (its default threshold)
scans the young objects, and every so often all objects (the operators' decoded state too):
about a third of a batch's Python time (``./dev bench peers`` measures it; README, Performance).
So the source's
decode, the adapter's key group and the sink's write each run inside :func:`cyclic_gc_paused`;
the collector runs as usual between them, so a cycle made during one is still collected.
(``gc.freeze`` alone does not help: the cost is the young objects of the batch itself.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0  # nesting (a test may run a source, adapter and sink in one process)
_was_enabled = False


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block; restore its state when the outermost block ends."""
    global _depth, _was_enabled
    if _depth == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()
