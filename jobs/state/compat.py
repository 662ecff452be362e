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
========================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from ctiflow.operators import snapshots
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
        runs = {name: (lambda b_cti, held: (b_cti, [held]))(*legacy_buffer(blob)) for name, blob in rows.items()}
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
