"""A key group's state, as the runtime keeps it between micro-batches.

* :mod:`jobs.state.parts` — the time layer's buffered rows, part by part (a batch reads and
  writes what it admits and releases, whatever the ``cti.delay``).
"""
