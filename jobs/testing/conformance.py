"""Conformance of the match operator with Flink CEP: replay recorded Flink test scenarios.

The case file (``flink-cep-cases.json``) holds scenarios from Flink's own CEP test suites,
recorded against flink-cep 2.3.0: each case has the pattern as neutral JSON stages, the input
events, the exact sequence of NFA calls (``advance_time`` / ``event``) and what Flink emitted at
each step (matches per stage, timed-out partial matches, or an expected exception).

For every case this module builds the pattern through the *public* Pattern API, replays the
steps on an :class:`~ctiflow.operators.cep.nfa.nfa.Nfa`, and compares per step: matches and timeouts as
unordered multisets of ``stage -> [event seq]`` maps (events inside a stage in Flink's order).
Conditions are evaluated from the neutral predicate tree; the case's truth table
(``condition_true_for_seq``, evaluated in Java) is checked against it, so a translation error
shows up as a failure instead of a silent pass.

Pure module: no Spark, no Kafka. ``main(path)`` prints a pass table per test class and per
feature and returns 0 only when every case passes.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ctiflow.operators.cep.nfa.compiler import compile_pattern
from ctiflow.operators.cep.nfa.nfa import Nfa
from ctiflow.operators.cep.pattern import Pattern, QuantifierProperty, WithinType
from ctiflow.operators.cep.nfa.skip_strategy import AfterMatchSkipStrategy, SkipStrategyError
from ctiflow.operators.errors import CtiflowError, PatternError

#: The recorded cases, shipped with the repository (origin: tests/data/README.md).
DEFAULT_CASES = Path(__file__).resolve().parents[2] / "tests" / "data" / "flink-cep-cases.json"

#: Flink's timestamp for records without one (Long.MIN_VALUE).
NO_TIMESTAMP = -(2**63)

#: Flink's exception (as recorded) -> the error ctiflow raises at the same point.
EXPECTED_ERRORS: dict[str, type[Exception]] = {
    "org.apache.flink.util.FlinkRuntimeException": SkipStrategyError,
    "org.apache.flink.cep.pattern.MalformedPatternException": PatternError,
    "java.lang.UnsupportedOperationException": PatternError,
    "java.lang.IllegalArgumentException": PatternError,
}

Predicate = Callable[[Mapping[str, Any]], bool]
CanonicalMatch = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass
class CaseResult:
    case_id: str
    test_class: str
    features: list[str]
    passed: bool
    problems: list[str] = field(default_factory=list)


@dataclass
class ConformanceReport:
    path: str
    results: list[CaseResult]

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> int:
        return sum(1 for r in self.results if r.passed)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if not r.passed]

    def by_test_class(self) -> dict[str, tuple[int, int]]:
        return _tally(self.results, lambda r: [r.test_class])

    def by_feature(self) -> dict[str, tuple[int, int]]:
        return _tally(self.results, lambda r: r.features or ["(none)"])


def _tally(
    results: Sequence[CaseResult], keys: Callable[[CaseResult], list[str]]
) -> dict[str, tuple[int, int]]:
    counts: dict[str, list[int]] = {}
    for result in results:
        for key in keys(result):
            entry = counts.setdefault(key, [0, 0])
            entry[1] += 1
            if result.passed:
                entry[0] += 1
    return {key: (p, t) for key, (p, t) in sorted(counts.items())}


# -- neutral predicates -------------------------------------------------------------------------
def predicate(tree: Mapping[str, Any]) -> Predicate:
    """A Python predicate over an event dict from a neutral predicate tree."""
    op = tree["op"]
    if op == "true":
        return lambda event: True
    if op == "and":
        parts = [predicate(arg) for arg in tree["args"]]
        return lambda event: all(p(event) for p in parts)
    if op == "or":
        parts = [predicate(arg) for arg in tree["args"]]
        return lambda event: any(p(event) for p in parts)
    if op == "not":
        inner = predicate(tree["arg"] if "arg" in tree else tree["args"][0])
        return lambda event: not inner(event)
    if op == "subtype":
        name = tree["type"]
        return lambda event: event.get("type") == name
    field_name, value = tree.get("field"), tree.get("value")
    if op == "eq":
        return lambda event: event.get(field_name) == value
    if op == "contains":
        return lambda event: isinstance(event.get(field_name), str) and value in event[field_name]
    if op == "startswith":
        return lambda event: (
            isinstance(event.get(field_name), str) and event[field_name].startswith(value)
        )
    if op in ("gt", "ge", "lt", "le"):
        compare = {
            "gt": lambda a, b: a > b,
            "ge": lambda a, b: a >= b,
            "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b,
        }[op]
        return lambda event: event.get(field_name) is not None and compare(event[field_name], value)
    if op == "ne":
        return lambda event: event.get(field_name) != value
    raise ValueError(f"unknown predicate op {op!r}")


def _apply_condition(stage: Pattern, tree: Mapping[str, Any] | None) -> None:
    """Translate a predicate tree into where / or_ / subtype calls on ``stage``."""
    if tree is None or tree["op"] == "true":
        return
    if tree["op"] == "subtype":
        stage.subtype(tree["type"])
        return
    if tree["op"] == "and" and any(arg["op"] == "subtype" for arg in tree["args"]):
        for arg in tree["args"]:
            if arg["op"] == "subtype":
                stage.subtype(arg["type"])
        for arg in tree["args"]:
            if arg["op"] != "subtype":
                stage.where(predicate(arg))
        return
    if tree["op"] == "or":
        first, *rest = tree["args"]
        stage.where(predicate(first))
        for arg in rest:
            stage.or_(predicate(arg))
        return
    stage.where(predicate(tree))


# -- pattern construction -----------------------------------------------------------------------
def skip_strategy(spec: Mapping[str, Any] | None) -> AfterMatchSkipStrategy:
    if not spec:
        return AfterMatchSkipStrategy.no_skip()
    kind = spec["strategy"]
    if kind == "no_skip":
        return AfterMatchSkipStrategy.no_skip()
    if kind == "skip_to_next":
        return AfterMatchSkipStrategy.skip_to_next()
    if kind == "skip_past_last_event":
        return AfterMatchSkipStrategy.skip_past_last_event()
    if kind in ("skip_to_first", "skip_to_last"):
        factory = getattr(AfterMatchSkipStrategy, kind)
        strategy = factory(spec["pattern_name"])
        if spec.get("throw_exception_on_miss"):
            return strategy.throw_exception_on_miss()
        return strategy
    raise ValueError(f"unknown skip strategy {kind!r}")


def build_pattern(
    stages: Sequence[Mapping[str, Any]], skip: AfterMatchSkipStrategy | None = None
) -> Pattern:
    """The pattern described by neutral ``stages`` (the last stage is returned)."""
    pattern: Pattern | None = None
    for index, spec in enumerate(stages):
        target: str | Pattern
        if spec["kind"] == "group":
            target = build_pattern(spec["group"])
        else:
            target = spec["name"]
        if index == 0:
            pattern = Pattern.begin(target, skip)
        else:
            assert pattern is not None
            negation = spec.get("negation")
            if negation == "notNext":
                pattern = pattern.not_next(spec["name"])
            elif negation == "notFollowedBy":
                pattern = pattern.not_followed_by(spec["name"])
            else:
                contiguity = spec.get("contiguity")
                if contiguity == "strict":
                    pattern = pattern.next(target)
                elif contiguity == "relaxed":
                    pattern = pattern.followed_by(target)
                elif contiguity == "non_deterministic_relaxed":
                    pattern = pattern.followed_by_any(target)
                else:
                    raise ValueError(f"stage {spec['name']!r}: unknown contiguity {contiguity!r}")
        _apply_options(pattern, spec)
    assert pattern is not None
    return pattern


def _apply_options(stage: Pattern, spec: Mapping[str, Any]) -> None:
    if spec["kind"] != "group":
        _apply_condition(stage, spec.get("condition"))
    raw_times = (spec.get("raw") or {}).get("times") or {}
    window = spec.get("loop_window_ms", raw_times.get("window_ms"))
    quantifier = spec.get("quantifier", "one")
    if quantifier == "oneOrMore":
        stage.one_or_more(window)
    elif quantifier.startswith("timesOrMore("):
        stage.times_or_more(int(quantifier[len("timesOrMore("):-1]), window)
    elif quantifier.startswith("times("):
        low, high = (int(x) for x in quantifier[len("times("):-1].split(","))
        stage.times(low, high, window)
    elif quantifier != "one":
        raise ValueError(f"stage {spec['name']!r}: unknown quantifier {quantifier!r}")
    inner = spec.get("inner_contiguity")
    if quantifier != "one":
        if inner == "strict":
            stage.consecutive()
        elif inner == "non_deterministic_relaxed":
            stage.allow_combinations()
    if spec.get("optional") and not stage.quantifier.has(QuantifierProperty.OPTIONAL):
        stage.optional()
    if spec.get("greedy"):
        stage.greedy()
    if spec.get("until") is not None:
        stage.until(predicate(spec["until"]))
    if spec.get("within_first_and_last_ms") is not None:
        stage.within(spec["within_first_and_last_ms"])
    if spec.get("within_previous_and_current_ms") is not None:
        stage.within(spec["within_previous_and_current_ms"], WithinType.PREVIOUS_AND_CURRENT)


# -- replay -------------------------------------------------------------------------------------
def _canonical(match: Mapping[str, Sequence[Any]]) -> CanonicalMatch:
    return tuple(sorted((stage, tuple(int(x) for x in seqs)) for stage, seqs in match.items()))


def _seqs(match: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, list[int]]:
    return {stage: [event["seq"] for event in events] for stage, events in match.items()}


def _check_truth_tables(
    stages: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]], problems: list[str]
) -> None:
    for spec in stages:
        if spec["kind"] == "group":
            _check_truth_tables(spec["group"], events, problems)
            continue
        for tree_key, table_key in (
            ("condition", "condition_true_for_seq"),
            ("until", "until_true_for_seq"),
        ):
            tree, table = spec.get(tree_key), spec.get(table_key)
            if tree is None or table is None:
                continue
            test = predicate(tree)
            ours = sorted(e["seq"] for e in events if test(e))
            if ours != sorted(table):
                problems.append(
                    f"stage {spec['name']!r}: {tree_key} tree is true for {ours}, "
                    f"truth table says {sorted(table)}"
                )


def run_case(case: Mapping[str, Any]) -> CaseResult:
    problems: list[str] = []
    spec = case["pattern"]
    events = {e["seq"]: dict(e) for e in case["events"]}
    _check_truth_tables(spec["stages"], case["events"], problems)
    expected_error = (case.get("verification") or {}).get("expected_exception")

    try:
        pattern = build_pattern(spec["stages"], skip_strategy(spec.get("skip")))
        plan = compile_pattern(pattern, timeout_handling=bool(spec.get("timeout_handling")))
    except CtiflowError as exc:
        if expected_error:
            _check_error(expected_error, exc, problems)
            return _result(case, problems)
        problems.append(f"pattern rejected: {exc}")
        return _result(case, problems)

    expected_windows = spec.get("compiled_previous_and_current_windows_ms") or {}
    if plan.state_windows_ms != expected_windows:
        problems.append(
            f"compiled per-state windows {plan.state_windows_ms} != Flink's {expected_windows}"
        )

    got_matches, got_timeouts, raised, index = _replay(Nfa(plan), case["steps"], events)
    if expected_error:
        if raised is None:
            problems.append(f"expected {expected_error}, but no error was raised")
        else:
            _check_error(expected_error, raised, problems)
        return _result(case, problems)
    if raised is not None:
        problems.append(f"unexpected error at step {index}: {raised}")
        return _result(case, problems)
    want_matches, want_timeouts = _expected(case)
    for label, got, want in (("matches", got_matches, want_matches),
                             ("timeouts", got_timeouts, want_timeouts)):
        for step_index in sorted(set(got) | set(want)):
            g, w = got.get(step_index, Counter()), want.get(step_index, Counter())
            if g != w:
                missing = list((w - g).elements())
                extra = list((g - w).elements())
                problems.append(
                    f"step {step_index} {case['steps'][step_index]}: {label} "
                    f"missing {missing} extra {extra}"
                )
    return _result(case, problems)


def _replay(nfa: Nfa, steps: list, events: dict) -> tuple[dict, dict, Exception | None, int]:
    """The case's steps through our NFA: matches and timeouts by step, the error that stopped it
    (if any) and the step it stopped at."""
    got_matches: dict[int, Counter[CanonicalMatch]] = {}
    got_timeouts: dict[int, Counter[tuple[CanonicalMatch, int]]] = {}
    index = 0
    for index, step in enumerate(steps):
        try:
            if "advance_time" in step:
                matches, timed_out = nfa.advance_time(step["advance_time"])
            else:
                event = events[step["event"]]
                ts = event["ts"] if event["ts"] is not None else NO_TIMESTAMP
                matches, timed_out = nfa.process(event, ts), []
        except CtiflowError as exc:
            return got_matches, got_timeouts, exc, index
        if matches:
            got_matches[index] = Counter(_canonical(_seqs(m)) for m in matches)
        if timed_out:
            got_timeouts[index] = Counter((_canonical(_seqs(m)), ts) for m, ts in timed_out)
    return got_matches, got_timeouts, None, index


def _expected(case: Mapping[str, Any]) -> tuple[dict, dict]:
    """What Flink recorded: matches and timed-out partial matches by step."""
    want_matches: dict[int, Counter[CanonicalMatch]] = {}
    for match, step_index in zip(case["expected_matches_by_stage"], case["emitted_at_step"]):
        want_matches.setdefault(step_index, Counter())[_canonical(match)] += 1
    want_timeouts: dict[int, Counter[tuple[CanonicalMatch, int]]] = {}
    for timeout in case.get("timed_out_partial_matches") or []:
        want_timeouts.setdefault(timeout["step"], Counter())[
            (_canonical(timeout["match_by_stage"]), timeout["timeout_ts"])
        ] += 1
    return want_matches, want_timeouts


def _check_error(expected: str, raised: Exception, problems: list[str]) -> None:
    wanted = EXPECTED_ERRORS.get(expected, CtiflowError)
    if not isinstance(raised, wanted):
        problems.append(
            f"expected {expected} ({wanted.__name__}), got {type(raised).__name__}: {raised}"
        )


def _result(case: Mapping[str, Any], problems: list[str]) -> CaseResult:
    return CaseResult(
        case_id=case["case_id"],
        test_class=case.get("test_class", "?"),
        features=list(case.get("features") or []),
        passed=not problems,
        problems=problems,
    )


def load_cases(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    return list(data["cases"])


def run_cases(path: str | Path) -> ConformanceReport:
    """Replay every case of the file; never raises for a failing case (it is reported)."""
    results = []
    for case in load_cases(path):
        try:
            results.append(run_case(case))
        except Exception as exc:  # a crash is a failure of that case, not of the run
            results.append(_result(case, [f"crashed: {type(exc).__name__}: {exc}"]))
    return ConformanceReport(path=str(path), results=results)


def main(path: str | Path) -> int:
    """Print pass tables (per test class, per feature) and the failures; 0 iff all pass."""
    console = Console()
    if not Path(path).is_file():
        console.print(f"[red]conformance case file not found: {path}[/red]")
        return 2
    report = run_cases(path)
    for title, rows in (("test class", report.by_test_class()), ("feature", report.by_feature())):
        table = Table(title=f"Flink CEP conformance by {title}")
        table.add_column(title)
        table.add_column("passed", justify="right")
        table.add_column("cases", justify="right")
        for key, (passed, total) in rows.items():
            style = "green" if passed == total else "red"
            table.add_row(key, f"[{style}]{passed}[/{style}]", str(total))
        console.print(table)
    for failure in report.failures:
        console.print(f"[red]FAIL[/red] {failure.case_id}")
        for problem in failure.problems:
            console.print(f"    {problem}", markup=False)
    style = "green" if report.passed == report.total else "red"
    console.print(f"[{style}]{report.passed}/{report.total} cases pass[/{style}]")
    return 0 if report.total and report.passed == report.total else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_CASES))
