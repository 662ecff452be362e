"""Patterns declared in a job file (a dict loaded from YAML) instead of Python code.

    name: large-after-small
    within_ms: 600000                 # first-and-last window (optional)
    skip: skip_past_last_event        # or {skip_to_first: a}, {skip_to_last: a, throw_on_miss: true}
    stages:
      - name: small
        where: "amount < 10"
      - name: large
        contiguity: followed_by       # next | followed_by | followed_by_any
        where: "amount > 1000 and country != 'DE'"
        or: ["flagged == true"]       # OR-ed after where
        quantifier: {times: [1, 3]}   # one | optional | one_or_more | zero_or_more |
                                      # {times: n} | {times: [n, m]} | {times_or_more: n}
        window_ms: 5000               # per-loop window (previous-and-current) of a loop
        consecutive: true             # or allow_combinations: true
        greedy: false
        optional: false
      - name: refund
        negation: not_followed_by     # not_next | not_followed_by
        where: "kind == 'refund'"

Conditions are :mod:`~ctiflow.operators.cep.expr.expression` expressions over the record's fields;
``first('small').amount``, ``count('large')``, ``avg_of('large', 'amount')`` … make a stage
condition iterative. A stage with ``group: [stages…]`` is a group stage. ``within_ms`` /
``within_type`` may also be given per stage. Every error is a
:class:`~ctiflow.operators.errors.PatternError` that names the stage and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctiflow.operators.cep.conditions import Condition, IterativeCondition, SimpleCondition
from ctiflow.operators.cep.expr.expression import CompiledExpression, ExpressionError, compile_expression
from ctiflow.operators.cep.pattern import Pattern, WithinType
from ctiflow.operators.cep.nfa.skip_strategy import AfterMatchSkipStrategy
from ctiflow.operators.errors import PatternError, invalid_choice

PATTERN_KEYS = {"name", "stages", "within_ms", "within_type", "skip"}
STAGE_KEYS = {
    "name", "contiguity", "negation", "where", "or", "until", "subtype", "quantifier",
    "greedy", "consecutive", "allow_combinations", "optional", "window_ms", "within_ms",
    "within_type", "group",
}
CONTIGUITY = {
    "next": "next", "strict": "next",
    "followed_by": "followed_by", "relaxed": "followed_by",
    "followed_by_any": "followed_by_any", "non_deterministic_relaxed": "followed_by_any",
}
NEGATION = {"not_next": "not_next", "not_followed_by": "not_followed_by"}
SKIPS = ("no_skip", "skip_to_next", "skip_past_last_event", "skip_to_first", "skip_to_last")
#: The deepest groups may nest (a ``group:`` inside a group's stage): building and compiling a
#: pattern recurse once per level. (A YAML text reaches about half of ``MAX_YAML_DEPTH``.)
MAX_GROUP_DEPTH = 50


def pattern_from_dict(spec: Mapping[str, Any]) -> Pattern:
    """Build the :class:`Pattern` (its last stage) described by ``spec``."""
    if not isinstance(spec, Mapping):
        raise PatternError(f"a pattern must be a mapping, got {type(spec).__name__}")
    _check_keys(spec, PATTERN_KEYS, "pattern")
    name = spec.get("name", "pattern")
    skip = skip_from_spec(spec.get("skip"))
    stages = spec.get("stages")
    check_nesting(stages)
    problems = condition_problems(stages)
    if problems:
        raise PatternError(problems=problems)
    pattern = _sequence(stages, skip, where=f"pattern {name!r}")
    within = spec.get("within_ms")
    if within is not None:
        pattern.within(_non_negative_int(within, "pattern", "within_ms"),
                       _within_type(spec.get("within_type"), "pattern"))
    return pattern


def check_nesting(stages: Any, unique_names: bool = False) -> None:
    """A :class:`PatternError` if groups nest deeper than :data:`MAX_GROUP_DEPTH` or (with
    ``unique_names``) a stage name, not a group's, comes twice, as the compiler would say —
    walked without recursion, before anything reads the stages: a rule's stage repeated by YAML
    aliases ten thousand times is refused here, not after its conditions compiled as often."""
    todo, names = [(stages, 1)], set()
    while todo:
        items, depth = todo.pop()
        if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
            continue
        for stage in items:
            name = stage.get("name") if isinstance(stage, Mapping) and "group" not in stage else None
            if unique_names and isinstance(name, str):
                if name in names:
                    raise PatternError(f"duplicate stage name {name!r}: stage names must be unique")
                names.add(name)
            if isinstance(stage, Mapping) and "group" in stage:
                if depth > MAX_GROUP_DEPTH:
                    raise PatternError(f"stage {stage.get('name')!r}: groups nest more than "
                                       f"{MAX_GROUP_DEPTH} levels deep; write the pattern flatter")
                todo.append((stage["group"], depth + 1))


def condition_problems(stages: Any) -> list[str]:
    """Every stage condition (``where``, ``or``, ``until``) that does not compile, or whose
    ``first('x')`` / ``count('x')`` / … names no stage of the pattern, at once (an empty list
    when the stages are not a list of named stages: :func:`_sequence` says what is wrong)."""
    named: list[Mapping[str, Any]] = []

    def walk(items: Any) -> None:
        if isinstance(items, Sequence) and not isinstance(items, (str, bytes)):
            for stage in items:
                if isinstance(stage, Mapping) and isinstance(stage.get("name"), str):
                    named.append(stage)
                    walk(stage.get("group"))

    walk(stages)
    names = [stage["name"] for stage in named]
    problems = []
    for stage in named:
        for key in ("where", "or", "until"):
            texts = stage.get(key)
            for text in ([texts] if isinstance(texts, str) else texts if isinstance(texts, list) else []):
                try:
                    references = compile_expression(text, match_functions=True).stage_references
                except ExpressionError as exc:
                    problems.append(f"stage {stage['name']!r}: {key!r}: {exc}")
                    continue
                for ref in sorted(references - set(names)):
                    problems.append(f"stage {stage['name']!r}: {key!r}: {text!r} reads stage {ref!r}, which "
                                    f"the pattern does not have (its stages: {', '.join(names)})")
    return problems


def pattern_name(spec: Mapping[str, Any], default: str = "pattern") -> str:
    name = spec.get("name", default)
    if not isinstance(name, str) or not name:
        raise PatternError(f"pattern name must be a non-empty string, got {name!r}")
    return name


def skip_from_spec(spec: Any) -> AfterMatchSkipStrategy:
    """``"no_skip"``, ``"skip_to_next"``, ``"skip_past_last_event"``, ``{"skip_to_first": s}``,
    ``{"skip_to_last": s, "throw_on_miss": true}`` (``None``: no skip)."""
    if spec is None or spec == "no_skip":
        return AfterMatchSkipStrategy.no_skip()
    if spec == "skip_to_next":
        return AfterMatchSkipStrategy.skip_to_next()
    if spec == "skip_past_last_event":
        return AfterMatchSkipStrategy.skip_past_last_event()
    if isinstance(spec, Mapping):
        kinds = [k for k in ("skip_to_first", "skip_to_last") if k in spec]
        extra = set(spec) - {"skip_to_first", "skip_to_last", "throw_on_miss"}
        if len(kinds) == 1 and not extra:
            stage = spec[kinds[0]]
            strategy = getattr(AfterMatchSkipStrategy, kinds[0])(stage)
            return strategy.throw_exception_on_miss() if spec.get("throw_on_miss") else strategy
    raise PatternError(
        f'invalid "skip" value: {spec!r}. Valid choices are: no_skip, skip_to_next, '
        "skip_past_last_event, {skip_to_first: <stage>}, {skip_to_last: <stage>} "
        "(optionally with throw_on_miss: true)."
    )


def _sequence(stages: Any, skip: AfterMatchSkipStrategy | None, where: str, key: str = "stages") -> Pattern:
    if not isinstance(stages, Sequence) or isinstance(stages, (str, bytes)) or not stages:
        raise PatternError(f"{where}: {key!r} must be a non-empty list of stages, got {stages!r}")
    pattern: Pattern | None = None
    for index, stage in enumerate(stages):
        if not isinstance(stage, Mapping):
            raise PatternError(f"{where}: stage #{index + 1} must be a mapping, got {stage!r}")
        _check_keys(stage, STAGE_KEYS, f"stage #{index + 1}")
        name = stage.get("name")
        if not isinstance(name, str) or not name:
            raise PatternError(f"{where}: stage #{index + 1} needs a non-empty 'name'")
        label = f"stage {name!r}"
        target: str | Pattern = name
        if "group" in stage:
            for key in ("where", "or", "subtype", "greedy"):
                if key in stage:
                    raise PatternError(f"{label}: a group stage does not take {key!r}")
            target = _sequence(stage["group"], None, where=label, key="group")
        negation = stage.get("negation")
        contiguity = stage.get("contiguity")
        if index == 0:
            if negation is not None:
                raise PatternError(f"{label}: the first stage cannot be negated")
            if contiguity not in (None, "begin"):
                raise PatternError(f"{label}: the first stage has no contiguity")
            pattern = Pattern.begin(target, skip)
        else:
            assert pattern is not None
            if negation is not None:
                method = NEGATION.get(negation)
                if method is None:
                    raise invalid_choice("negation", negation, ("not_next", "not_followed_by"), PatternError,
                                         label)
                if not isinstance(target, str):
                    raise PatternError(f"{label}: a group stage cannot be negated")
                pattern = getattr(pattern, method)(target)
            else:
                method = CONTIGUITY.get(contiguity if contiguity is not None else "followed_by")
                if method is None:
                    raise PatternError(
                        f'{label}: invalid "contiguity" value: {contiguity!r}. Valid choices '
                        "are: next, followed_by, followed_by_any."
                    )
                pattern = getattr(pattern, method)(target)
        _apply_stage_options(pattern, stage, label)
    assert pattern is not None
    return pattern


def _apply_stage_options(pattern: Pattern, stage: Mapping[str, Any], label: str) -> None:
    if "subtype" in stage:
        subtype = stage["subtype"]
        if not isinstance(subtype, str) or not subtype:
            raise PatternError(f"{label}: 'subtype' must be a type name (the 'type' field)")
        pattern.subtype(subtype)
    if "where" in stage:
        pattern.where(stage_condition(stage["where"], label, "where"))
    if "or" in stage:
        alternatives = stage["or"]
        if isinstance(alternatives, str):
            alternatives = [alternatives]
        if not isinstance(alternatives, Sequence) or not alternatives:
            raise PatternError(f"{label}: 'or' must be an expression or a list of expressions")
        for text in alternatives:
            pattern.or_(stage_condition(text, label, "or"))
    window_ms = stage.get("window_ms")
    if window_ms is not None:
        window_ms = _non_negative_int(window_ms, label, "window_ms")
    _apply_quantifier(pattern, stage.get("quantifier"), window_ms, label)
    if stage.get("consecutive"):
        pattern.consecutive()
    if stage.get("allow_combinations"):
        pattern.allow_combinations()
    if stage.get("optional") and not _is_optional(pattern):
        pattern.optional()
    if stage.get("greedy"):
        pattern.greedy()
    if "until" in stage:
        pattern.until(stage_condition(stage["until"], label, "until"))
    within = stage.get("within_ms")
    if within is not None:
        pattern.within(_non_negative_int(within, label, "within_ms"),
                       _within_type(stage.get("within_type"), label))
    elif stage.get("within_type") is not None:
        raise PatternError(f"{label}: 'within_type' needs 'within_ms'")


def _apply_quantifier(pattern: Pattern, spec: Any, window_ms: int | None, label: str) -> None:
    valid = (
        'Valid choices are: one, optional, one_or_more, zero_or_more, {times: n}, '
        '{times: [n, m]}, {times_or_more: n}.'
    )
    if spec is None or spec == "one":
        if window_ms is not None:
            raise PatternError(f"{label}: 'window_ms' applies to looping/times stages only")
        return
    if spec == "optional":
        pattern.optional()
        return
    if spec in ("one_or_more", "zero_or_more"):
        pattern.one_or_more(window_ms)
        if spec == "zero_or_more":
            pattern.optional()
        return
    if isinstance(spec, Mapping) and len(spec) == 1:
        (kind, value), = spec.items()
        if kind == "times":
            if isinstance(value, int) and not isinstance(value, bool):
                pattern.times(value, window=window_ms)
                return
            if (isinstance(value, Sequence) and len(value) == 2
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
                pattern.times(value[0], value[1], window_ms)
                return
        if kind == "times_or_more" and isinstance(value, int) and not isinstance(value, bool):
            pattern.times_or_more(value, window_ms)
            return
    raise PatternError(f'{label}: invalid "quantifier" value: {spec!r}. {valid}')


def stage_condition(text: Any, label: str, key: str) -> Condition:
    """A stage condition from an expression (iterative if it uses first()/count()/…)."""
    try:
        expression: CompiledExpression = compile_expression(text, match_functions=True)
    except ExpressionError as exc:
        raise PatternError(f"{label}: '{key}': {exc}") from None
    if expression.uses_match_context:
        return IterativeCondition(lambda event, ctx: bool(expression(event, ctx)), expression)
    return SimpleCondition(lambda event: bool(expression(event)), expression)


def _is_optional(pattern: Pattern) -> bool:
    from ctiflow.operators.cep.pattern import QuantifierProperty

    return pattern.quantifier.has(QuantifierProperty.OPTIONAL)


def _within_type(value: Any, label: str) -> WithinType:
    if value is None:
        return WithinType.FIRST_AND_LAST
    try:
        return WithinType(value)
    except ValueError:
        raise invalid_choice("within_type", value, ("first_and_last", "previous_and_current"), PatternError,
                             label) from None


def _non_negative_int(value: Any, label: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PatternError(f"{label}: {key!r} must be a non-negative integer (ms), got {value!r}")
    return value


def _check_keys(spec: Mapping[str, Any], valid: set[str], label: str) -> None:
    unknown = sorted(set(spec) - valid)
    if unknown:
        name = spec.get("name")
        is_named_stage = isinstance(name, str) and label.startswith("stage")
        where = f"stage {name!r}" if is_named_stage else label
        raise PatternError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}. Valid keys are: "
            f"{', '.join(sorted(valid))}."
        )
