"""The NFA Flink CEP runs, in plain Python.

* :mod:`~ctiflow.operators.cep.nfa.compiler` — a :class:`~ctiflow.operators.cep.pattern.Pattern` →
  NFA states (TAKE / IGNORE / PROCEED edges), once.
* :mod:`~ctiflow.operators.cep.nfa.nfa` — the NFA run against a small serialisable state.
* :mod:`~ctiflow.operators.cep.nfa.shared_buffer`, :mod:`~ctiflow.operators.cep.nfa.contiguous_buffer`,
  :mod:`~ctiflow.operators.cep.nfa.heap` — partial matches, Dewey numbers, their order.
* :mod:`~ctiflow.operators.cep.nfa.skip_strategy` — after-match skip strategies.
"""
