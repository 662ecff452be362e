"""``MATCH_RECOGNIZE``, as Flink's SQL accepts it.

* :mod:`~ctiflow.operators.cep.sql.parse` — the query parsed (errors with line, column and caret).
* :mod:`~ctiflow.operators.cep.sql.check` — Flink's validator: types, constant folding, what is refused.
* :mod:`~ctiflow.operators.cep.sql.translate` — ``DEFINE`` and ``MEASURES`` onto the Pattern API, and
  the query run over rows.
"""
