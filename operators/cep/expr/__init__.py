"""The two expression languages' one tree and one evaluator.

* :mod:`~ctiflow.operators.cep.expr.tree` — the intermediate form both languages lower to; the one
  bounds table.
* :mod:`~ctiflow.operators.cep.expr.expression` — a job file's Python-subset expressions (ast → tree).
* :mod:`~ctiflow.operators.cep.expr.evaluate` — the one row evaluator of any tree, and its lowering
  to :mod:`~ctiflow.operators.cep.expr.column_form`, the one column evaluator.
* :mod:`~ctiflow.operators.cep.expr.vocabulary` — the functions, types and values the evaluator
  knows (SQL's names, :class:`Row`, :class:`Timestamp`) and :class:`SqlError`.

Imports nothing of the rooms beside it (``sql``, ``nfa``) or of the pattern API.
"""
