"""Complex event processing with Flink CEP's semantics, in plain Python.

The split follows Flink: a :class:`Pattern` is a description; :func:`compile_pattern` turns it
once into an :class:`NfaPlan` (states with TAKE / IGNORE / PROCEED edges); :class:`Nfa` runs the
plan against a small serialisable :class:`NfaState` (computation states + a versioned
:class:`SharedBuffer`). :class:`MatchOperator` applies it per key under the project's Operator
contract; :func:`pattern_from_dict` builds patterns from job files, with conditions written in
the safe expression language of :mod:`ctiflow.operators.cep.expr.expression`.
"""

from ctiflow.operators.cep.nfa.compiler import NfaPlan, can_produce_empty_matches, compile_pattern
from ctiflow.operators.cep.conditions import IterativeCondition, SimpleCondition
from ctiflow.operators.cep.declarative import pattern_from_dict
from ctiflow.operators.cep.expr.expression import CompiledExpression, ExpressionError, compile_expression
from ctiflow.operators.cep.nfa.nfa import Nfa, NfaState
from ctiflow.operators.cep.operator import MatchOperator, MatchSettings
from ctiflow.operators.cep.pattern import GroupPattern, Pattern, WithinType
from ctiflow.operators.cep.nfa.shared_buffer import DeweyNumber, SharedBuffer
from ctiflow.operators.cep.nfa.skip_strategy import AfterMatchSkipStrategy, SkipStrategyError

__all__ = [
    "AfterMatchSkipStrategy",
    "CompiledExpression",
    "DeweyNumber",
    "ExpressionError",
    "GroupPattern",
    "IterativeCondition",
    "MatchOperator",
    "MatchSettings",
    "Nfa",
    "NfaPlan",
    "NfaState",
    "Pattern",
    "SharedBuffer",
    "SimpleCondition",
    "SkipStrategyError",
    "WithinType",
    "can_produce_empty_matches",
    "compile_expression",
    "compile_pattern",
    "pattern_from_dict",
]
