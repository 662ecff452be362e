"""A key group's state, as the runtime keeps it between micro-batches.

* :mod:`ctiflow.jobs.state.compat` — readers of the formats earlier ctiflows wrote (the time
  layer's layouts 1–2, row buffers), so ``operators/`` reads only its current ones.
* :mod:`ctiflow.jobs.state.header` — the group's header as one declared record (its format), and a
  group's whole state in one blob (tests, tools).
* :mod:`ctiflow.jobs.state.parts` — the time layer's buffered rows, part by part (a batch reads and
  writes what it admits and releases, whatever the ``cti.delay``).
* :mod:`ctiflow.jobs.state.store` — the layouts in Spark's state store (one table, ``LAYOUTS``), the
  header and its parts.
* :mod:`ctiflow.jobs.state.codec` — the zstd frame headers and parts are stored in.
* :mod:`ctiflow.jobs.state.warm` — decoded chunks a Python worker keeps between micro-batches.

Every stored thing declares its format, a number in its bytes; each reader reads its current
format only, and :mod:`~ctiflow.jobs.state.compat` rewrites or reads the earlier ones:

=============================  ======  ====================================================
stored thing                   format  written and read by
=============================  ======  ====================================================
key group header               7       :mod:`ctiflow.jobs.state.header` (``HEADER_FORMAT``)
a stored value, compressed     zsh8    :mod:`ctiflow.jobs.state.codec` (``SHUFFLED_MARK``; ``ZSTD_MARK``)
state chunk                    3       :mod:`ctiflow.jobs.state.chunks` (``CHUNK_FORMAT``)
state chunk delta              2       :mod:`ctiflow.jobs.state.chunks` (``DELTA_FORMAT``)
store layout (Spark state)     3       :mod:`ctiflow.jobs.state.store` (``STATE_LAYOUT``; 2 read)
time layer                     3       ``ColumnTimeLayer`` (``operators/columns.py``)
match operator snapshot        6       ``MatchOperator`` (``SNAPSHOT_FORMAT``)
ruled match operator snapshot  4       ``RuledMatchOperator`` (``SNAPSHOT_FORMAT``)
rule book                      2       ``RuleBook`` (``BOOK_FORMAT``)
count operator snapshot        3       ``CountOperator`` (magic and version in its header)
exponential histogram          1       ``ExponentialHistogram`` (magic and version)
=============================  ======  ====================================================
"""
