"""Conditions on events: simple (``cond(event)``) and iterative (``cond(event, ctx)``).

Flink distinguishes ``SimpleCondition`` (looks at the event only) from ``IterativeCondition``
(also sees the events the partial match has already accepted, through a context). Here every
condition is normalised to a :class:`Condition` with one call shape, ``test(event, ctx)``, so
the NFA never branches on the kind. How a user callable is classified:

* an instance of :class:`IterativeCondition` (or of :class:`Condition`) is used as is;
* a plain callable whose signature takes **two** positional parameters is iterative:
  ``lambda event, ctx: event["price"] > avg(ctx.get_events_for_pattern("a"))``;
* any other callable is simple: ``lambda event: event["name"] == "a"``.

``ctx`` (:class:`MatchContext`) is built lazily by the NFA only when some condition of the
pattern is iterative, so simple patterns pay nothing for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ctiflow.operators.cep.expr.column_form import AllOf, AnyOf, Const, Node, Not
from ctiflow.operators.errors import PatternError


class MatchContext(Protocol):
    """What an iterative condition may ask about the partial match it would extend."""

    def get_events_for_pattern(self, name: str) -> list[Any]:
        """The events already accepted by stage ``name`` (oldest first); ``[]`` if none."""
        ...

    @property
    def timestamp(self) -> int:
        """Application time of the event being tested."""
        ...


class Condition:
    """A predicate over an event (and, if iterative, the partial match so far)."""

    __slots__ = ("iterative",)

    def __init__(self, iterative: bool) -> None:
        self.iterative = iterative

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        raise NotImplementedError


class SimpleCondition(Condition):
    """Wraps ``predicate(event) -> bool``; ``expression``: the compiled expression it
    evaluates, when it came from one (its column form, :func:`condition_node`);
    ``column_form``: its column form when its compiler lowered it already (a
    :mod:`ctiflow.operators.cep.expr.column_form` node, e.g. a SQL ``DEFINE``'s)."""

    __slots__ = ("predicate", "expression", "column_form")

    def __init__(self, predicate: Callable[[Any], Any], expression: Any = None,
                 column_form: Any = None) -> None:
        super().__init__(False)
        self.predicate = predicate
        self.expression = expression
        self.column_form = column_form

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        return bool(self.predicate(event))

    def __repr__(self) -> str:
        return f"SimpleCondition({self.predicate!r})"


class IterativeCondition(Condition):
    """Wraps ``predicate(event, ctx) -> bool``; ``ctx.get_events_for_pattern(name)`` gives the
    events already matched by stage ``name`` in the partial match being extended;
    ``expression``: the compiled expression it evaluates, when it came from one (:func:`surely`)."""

    __slots__ = ("predicate", "expression")

    def __init__(self, predicate: Callable[[Any, MatchContext], Any], expression: Any = None) -> None:
        super().__init__(True)
        self.predicate = predicate
        self.expression = expression

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        return bool(self.predicate(event, ctx))

    def __repr__(self) -> str:
        return f"IterativeCondition({self.predicate!r})"


class _TrueCondition(Condition):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(False)

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        return True

    def __repr__(self) -> str:
        return "TRUE"


#: Flink's ``BooleanConditions.trueFunction()``: the condition of a stage without ``where``.
TRUE = _TrueCondition()


class _BinaryCondition(Condition):
    """Two conditions combined with short-circuit, left first (as Flink's ``RichAnd/OrCondition``)."""

    __slots__ = ("left", "right")
    _symbol = ""

    def __init__(self, left: Condition, right: Condition) -> None:
        super().__init__(left.iterative or right.iterative)
        self.left = left
        self.right = right

    def __repr__(self) -> str:
        return f"({self.left!r} {self._symbol} {self.right!r})"


class AndCondition(_BinaryCondition):
    """``left and right``."""

    __slots__ = ()
    _symbol = "AND"

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        return self.left.test(event, ctx) and self.right.test(event, ctx)


class OrCondition(_BinaryCondition):
    """``left or right``."""

    __slots__ = ()
    _symbol = "OR"

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        return self.left.test(event, ctx) or self.right.test(event, ctx)


class NotCondition(Condition):
    __slots__ = ("inner",)

    def __init__(self, inner: Condition) -> None:
        super().__init__(inner.iterative)
        self.inner = inner

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        return not self.inner.test(event, ctx)

    def __repr__(self) -> str:
        return f"NOT {self.inner!r}"


class SubtypeCondition(Condition):
    """Flink's ``subtype(Class)``: the event must be of the given type.

    * a Python class: ``isinstance(event, cls)``;
    * a string: for mapping events (the operator's events are field dicts) the ``"type"`` field
      must equal it; for other objects the name of the event's class or of one of its base
      classes must equal it (so ``"Event"`` also accepts a ``SubEvent(Event)`` object).
    """

    __slots__ = ("subtype",)

    def __init__(self, subtype: type | str) -> None:
        super().__init__(False)
        self.subtype = subtype

    def test(self, event: Any, ctx: MatchContext | None) -> bool:
        subtype = self.subtype
        if isinstance(subtype, str):
            if isinstance(event, Mapping):
                return event.get("type") == subtype
            return any(cls.__name__ == subtype for cls in type(event).__mro__)
        return isinstance(event, subtype)

    def __repr__(self) -> str:
        return f"Subtype({self.subtype!r})"


def _positional_arity(func: Callable[..., Any]) -> int | None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    count = 0
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return None
        if parameter.kind in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ) and parameter.default is inspect.Parameter.empty:
            count += 1
    return count


def as_condition(condition: Any, *, stage: str, what: str = "condition") -> Condition:
    """Normalise a user condition (see the module docstring for the classification rules)."""
    if condition is None:
        raise PatternError(f"stage {stage!r}: the {what} cannot be None")
    if isinstance(condition, Condition):
        return condition
    if not callable(condition):
        raise PatternError(
            f"stage {stage!r}: the {what} must be callable (event) -> bool or "
            f"(event, ctx) -> bool, got {type(condition).__name__}"
        )
    if _positional_arity(condition) == 2:
        return IterativeCondition(condition)
    return SimpleCondition(condition)



ALWAYS = object()
"""Marker returned by :func:`fast_predicate` for a condition that is always true."""


def fast_predicate(condition: Condition | None) -> Any:
    """A one-argument ``predicate(event)`` equivalent to a non-iterative condition.

    Returns :data:`ALWAYS` for ``None``/``TRUE``, ``None`` when the condition is iterative (it
    needs the match context), else a plain function. The NFA calls these on its hot path, where
    one Python call per condition instead of a chain of ``test`` methods matters.
    """
    if condition is None or condition is TRUE:
        return ALWAYS
    if condition.iterative:
        return None
    if isinstance(condition, SimpleCondition):
        return condition.predicate
    if isinstance(condition, NotCondition):
        inner = fast_predicate(condition.inner)
        if inner is ALWAYS:
            return lambda event: False
        return lambda event: not inner(event)
    if isinstance(condition, AndCondition):
        left, right = fast_predicate(condition.left), fast_predicate(condition.right)
        if left is ALWAYS:
            return right
        if right is ALWAYS:
            return left
        return lambda event: left(event) and right(event)
    if isinstance(condition, OrCondition):
        left, right = fast_predicate(condition.left), fast_predicate(condition.right)
        if left is ALWAYS or right is ALWAYS:
            return ALWAYS
        return lambda event: left(event) or right(event)
    test = condition.test
    return lambda event: test(event, None)


def condition_node(condition: Condition | None) -> Node | None:
    """The condition in the column form (:mod:`ctiflow.operators.cep.expr.column_form`), or None."""
    from ctiflow.operators.cep.expr.expression import column_node

    if condition is None or condition is TRUE:
        return Const(True)
    if condition.iterative:
        return None
    if isinstance(condition, SimpleCondition):
        if condition.column_form is not None:
            return condition.column_form
        return column_node(condition.expression) if condition.expression is not None else None
    if isinstance(condition, NotCondition):  # (a condition's truth is a bool: NOT of it is exact)
        inner = condition_node(condition.inner)
        return None if inner is None else Not(inner)
    if isinstance(condition, (AndCondition, OrCondition)):
        left, right = condition_node(condition.left), condition_node(condition.right)
        if left is None or right is None:
            return None
        return (AllOf if isinstance(condition, AndCondition) else AnyOf)((left, right))
    return None


def surely(condition: Condition | None, truth: bool) -> Node | None:
    """A column-form node true only on events where ``condition`` tests ``truth`` and its test
    raises nothing (None: no such events are known). Exact where :func:`condition_node` is;
    beyond it, ``and``/``or`` decide from their left side first, as their tests do (Flink's
    ``RichAndCondition``; Python's ``and``): ``a and x`` is surely false where ``a`` (exact) is
    false, whatever ``x`` (``first(...)``, a function) would do — it is never evaluated there."""
    from ctiflow.operators.cep.expr.evaluate import column_form

    exact = condition_node(condition)
    if exact is not None:
        return exact if truth else Not(exact)
    if isinstance(condition, NotCondition):
        return surely(condition.inner, not truth)
    if isinstance(condition, (AndCondition, OrCondition)):
        if isinstance(condition, AndCondition) != truth:  # and → false, or → true: the left side decides
            left, right = condition_node(condition.left), surely(condition.right, truth)
            if left is None:
                return surely(condition.left, truth)
            decides = left if truth else Not(left)
            return decides if right is None else AnyOf((decides, right))
        left, right = surely(condition.left, truth), surely(condition.right, truth)  # both sides decide
        return None if left is None or right is None else AllOf((left, right))
    tree = getattr(getattr(condition, "expression", None), "tree", None)
    if tree is None or tree.kind != "py_logic" or (tree.value == "and") != (not truth):
        return None
    parts = []  # the leading operands with a column form: the first that decides ends the test
    for arg in tree.args:
        node = column_form(arg)
        if node is None:
            break
        parts.append(node if truth else Not(node))
    return AnyOf(tuple(parts)) if parts else None
