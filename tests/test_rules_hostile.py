"""Rule records are untrusted input: whatever a rule's definition holds, the path a job takes it
through — the plan's :class:`ctiflow.jobs.core.definitions.RuleCompiler` (YAML or SQL parse, bounds, field
checks, compile) called by :meth:`ctiflow.operators.cep.rules.RuleBook.offer` — either compiles
it or refuses it with a reason (a ``rejected`` :class:`Decision`, the dead-letter path); never
another exception, and within :data:`TIME_BOUND_MS` per definition.

The jobs are ``examples/demo-transactions.yaml`` (its ruled operator ``large-after-abroad``, Pattern
API rules) and the same job with ``rules.language: sql`` (``MATCH_RECOGNIZE`` rules). The property
tests run with a fixed seed (``derandomize``) and a budget of examples; the regression tests are
the definitions of issue 59, each of which made the job end with "a bug in ctiflow"."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.core.text_forms import MAX_YAML_DEPTH, MAX_YAML_VALUES
from ctiflow.jobs.driver.planner import plan_job
from ctiflow.operators.cep.declarative import STAGE_KEYS
from ctiflow.operators.cep.rules import MAX_DEFINITION_BYTES, Decision, Rule, RuleBook
from ctiflow.operators.time import CTI_NONE

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = "large-after-abroad"
#: The most one definition may take from its record to its decision (a deadline per example).
TIME_BOUND_MS = 5_000
HOSTILE = settings(derandomize=True, max_examples=300, deadline=TIME_BOUND_MS,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def demo_job(language: str = "pattern"):
    raw = yaml.safe_load((ROOT / "examples/demo-transactions.yaml").read_text())
    for op in raw["operators"]:
        if op["name"] == OPERATOR and language == "sql":
            op["rules"]["language"] = "sql"
    return parse(raw, "demo-transactions.yaml")


SPECS = {language: plan_job(demo_job(language)).side_inputs[0].shared for language in ("pattern", "sql")}


def offer(definition: str, language: str = "pattern") -> Decision:
    """``definition`` as a rule record's, through the job's own path; asserts the contract."""
    spec = SPECS[language]
    started = time.perf_counter()
    decision = RuleBook(spec.settings).offer(Rule("r", OPERATOR, 1, 0, "put", definition), CTI_NONE, spec.compile)
    took = (time.perf_counter() - started) * 1000
    assert decision.outcome in ("applied", "rejected"), decision
    assert decision.outcome == "applied" or decision.reason, decision
    assert took < TIME_BOUND_MS, f"{took:.0f} ms for a {len(definition):,}-character definition"
    return decision


# -- strategies ---------------------------------------------------------------------------------
def huge_int():
    """Integers past every bound: up to 4,000 digits as values, and up to 6,000 as text
    (:func:`as_text` writes the placeholder out: Python makes no int of over 4,300 digits)."""
    return (st.integers(1, 4_000).map(lambda digits: 10 ** digits - 1) | st.integers(-2 ** 70, 2 ** 70)
            | st.integers(4_300, 6_000).map(lambda digits: f"@@HUGE{digits}@@"))


SCALARS = (st.none() | st.booleans() | st.integers(-10, 10) | huge_int() | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.sampled_from(["10m", "1s", "-5s", "99999999999d", "nan", "amount > 1",
                                                      "first('first').amount", "amount >> 3", "one_or_more"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(sorted(STAGE_KEYS | {"times", "times_or_more", "stages"}))
                                        | st.text(max_size=5), inner, max_size=4), max_leaves=12)
EXPRESSIONS = st.sampled_from(["type == 'purchase'", "amount > 1000", "country != first('first').country",
                               "count('first') > 2", "amount > ", "nosuchfield > 1", "amount ** 99999"])
QUANTIFIERS = (st.sampled_from(["one", "optional", "one_or_more", "zero_or_more", "many"])
               | st.fixed_dictionaries({"times": st.integers(0, 3) | huge_int() | st.lists(huge_int(), max_size=3)})
               | st.fixed_dictionaries({"times_or_more": st.integers(0, 3) | huge_int()}))
PLAUSIBLE = {"name": st.text(min_size=1, max_size=3), "where": EXPRESSIONS, "or": EXPRESSIONS | st.lists(EXPRESSIONS),
             "until": EXPRESSIONS, "quantifier": QUANTIFIERS, "contiguity": st.sampled_from(["next", "followed_by"]),
             "negation": st.sampled_from(["not_next", "not_followed_by"]), "greedy": st.booleans(),
             "within": st.sampled_from(["10s", "1m", "0s"]) | huge_int(), "window": st.sampled_from(["1s", "5m"]),
             "within_ms": huge_int(), "window_ms": huge_int(), "within_type": st.sampled_from(["first_and_last"])}


def stage(inner):
    """A stage: each key present or not, its value plausible or anything at all (a wrong type)."""
    keys = sorted(PLAUSIBLE)
    return st.fixed_dictionaries({}, optional={k: PLAUSIBLE[k] | VALUES for k in keys}
                                 | {"group": st.lists(inner, min_size=1, max_size=3) | VALUES})


STAGES = st.recursive(st.fixed_dictionaries({"name": st.sampled_from(["a", "b", "c"]), "where": EXPRESSIONS}),
                      stage, max_leaves=8)
PATTERNS = st.fixed_dictionaries({"stages": st.lists(STAGES, max_size=4) | VALUES}, optional={
    "within": PLAUSIBLE["within"] | VALUES, "within_ms": huge_int(), "name": VALUES,
    "skip": st.sampled_from(["skip_past_last_event", "skip_to_next", "nope"]) | VALUES})


def as_text(spec, style: str) -> str:
    if style == "json":
        text = json.dumps(spec, allow_nan=True, default=str)
    else:
        text = yaml.safe_dump(spec, default_flow_style=style == "flow")
    return re.sub(r"""['"]?@@HUGE(\d+)@@['"]?""", lambda m: "9" * int(m.group(1)), text)


# -- Pattern API rules (YAML) --------------------------------------------------------------------
@HOSTILE
@given(PATTERNS, st.sampled_from(["json", "flow", "block"]))
def test_a_fuzzed_pattern_definition_is_compiled_or_refused_with_a_reason(spec, style):
    offer(as_text(spec, style))


@HOSTILE
@given(VALUES, st.text(alphabet="[]{}-:,&*<ab !'\"\n #|>?", max_size=400))
def test_any_yaml_value_or_punctuation_as_a_definition_is_compiled_or_refused_with_a_reason(value, text):
    offer(as_text(value, "json"))
    offer(as_text(value, "block"))
    offer(text)


@HOSTILE
@given(st.integers(1, 3_000), st.sampled_from(["[", "{", "{a: ", "- ", "[{name: a, group: ", "groups"]))
def test_nesting_of_any_depth_is_compiled_or_refused_before_it_is_parsed(depth, opening):
    if opening == "groups":  # (written out: json.dumps recurses)
        inner = '{"name": "x", "where": "amount > 1"}'
        for i in range(depth):
            inner = f'{{"name": "g{i}", "group": [{inner}]}}'
        offer(f'{{"stages": [{{"name": "first", "where": "type == \'purchase\'"}}, {inner}]}}')
        return
    text = opening * depth if opening != "- " else "".join("  " * i + "- \n" for i in range(depth))
    assert offer("stages: " + text).outcome == "rejected"


@HOSTILE
@given(st.integers(2, 12), st.integers(2, 9), st.sampled_from(["or", "group", "stages", "merge"]))
def test_an_alias_bomb_is_refused_by_the_yaml_value_bound(fan_out, levels, where):
    text = alias_bomb(fan_out, levels, where)
    decision = offer(text)
    if fan_out ** levels > 2 * MAX_YAML_VALUES:
        assert decision.outcome == "rejected" and "100,000 values" in decision.reason


def alias_bomb(fan_out: int, levels: int, where: str) -> str:
    """``levels`` anchors, each ``fan_out`` aliases of the one before: fan_out ** levels values in a
    few hundred bytes — as groups of the stage before (``group``), merged into a mapping (``merge``),
    or as lists where the pattern reads stages or ``or`` expressions."""
    if where == "group":
        lines = ["stages:", "- &x0 {name: a}"]
        lines += [f"- &x{i} {{name: g{i}, group: [{', '.join([f'*x{i - 1}'] * fan_out)}]}}"
                  for i in range(1, levels + 1)]
        return "\n".join(lines)
    if where == "merge":
        lines = ["x0: &x0 {name: a, where: 'amount > 1'}"]
        lines += [f"x{i}: &x{i} {{<<: [{', '.join([f'*x{i - 1}'] * fan_out)}]}}" for i in range(1, levels + 1)]
        return "\n".join(lines) + f"\nstages: [*x{levels}]"
    leaf = {"or": "'amount > 1'", "stages": "{name: a}"}[where]
    lines = [f"- &x0 [{', '.join([leaf] * fan_out)}]"]
    lines += [f"- &x{i} [{', '.join([f'*x{i - 1}'] * fan_out)}]" for i in range(1, levels + 1)]
    anchors = "\n".join(lines)
    return f"stages:\n{anchors}" + (f"\n- {{name: b, or: *x{levels}}}" if where == "or" else "")


# -- MATCH_RECOGNIZE rules -------------------------------------------------------------------------
def query(pattern: str, define: str = "A AS A.amount > 1", within: str = "") -> str:
    return ("SELECT * FROM transactions MATCH_RECOGNIZE (PARTITION BY account ORDER BY event_time "
            f"MEASURES A.amount AS amount PATTERN ({pattern}){within} DEFINE {define})")


SQL_TOKENS = st.sampled_from(["A", "B", "(", ")", "{", "}", ",", "*", "+", "?", "|", "^", "9" * 30, "0", "-1",
                              "9" * 5000, "1e309", "'", "AND", "OR", "NOT", "A.amount", ">", "=", "SUM(", "CAST(",
                              "AS", "INT", "INTERVAL", "'1'", "SECOND", "WITHIN", "CASE", "WHEN", "END", "PREV("])


def fuzzed_query(tokens: list[str], where: str) -> str:
    text = " ".join(tokens)
    if where == "pattern":
        return query(text or "A")
    if where == "define":
        return query("A B", f"A AS {text}, B AS B.amount > 1")
    if where == "within":
        return query("A B", "B AS true", f" WITHIN {text}")
    return query("A").replace("A.amount AS amount", f"{text} AS m")


SQL = st.one_of(
    st.builds(fuzzed_query, st.lists(SQL_TOKENS, max_size=40), st.sampled_from(["pattern", "define", "within",
                                                                                 "measures"])),
    st.builds(lambda digits, shape: query("A" + shape % ("9" * digits)), st.integers(1, 6_000),
              st.sampled_from(["{%s}", "{%s,}", "{,%s}", "{1,%s}"])),
    st.builds(lambda depth: query("(" * depth + "A" + ")" * depth), st.integers(1, 5_000)),
    st.builds(lambda depth: query("A", "A AS " + "(" * depth + "A.amount > 1" + ")" * depth), st.integers(1, 5_000)),
    st.text(max_size=300))


@HOSTILE
@given(SQL)
def test_fuzzed_sql_is_compiled_or_refused_with_a_reason(definition):
    """Token soup in each clause, quantifiers of up to 6,000 digits, parentheses up to 5,000 deep
    in PATTERN and DEFINE, and any text at all."""
    offer(definition, "sql")


# -- the examples of issue 59 -----------------------------------------------------------------------
def test_a_stage_list_typo_or_5_is_refused_with_the_reason():
    decision = offer("stages: [{name: a, where: 'amount>1', or: 5}]")
    assert decision.outcome == "rejected" and "'or'" in decision.reason


def test_3000_nested_brackets_are_refused_as_too_deep():
    decision = offer("[" * 3000)
    assert decision.outcome == "rejected" and f"nested more than {MAX_YAML_DEPTH} levels" in decision.reason


def test_300_nested_pattern_groups_are_refused_as_too_deep():
    inner = '{"name": "x", "where": "amount > 1"}'
    for i in range(300):
        inner = f'{{"name": "g{i}", "group": [{inner}]}}'
    decision = offer(f'{{"stages": [{inner}]}}')
    assert decision.outcome == "rejected" and "levels" in decision.reason


def test_a_sql_quantifier_of_5000_digits_is_refused_with_the_bound():
    decision = offer(query("A{" + "9" * 5000 + "}"), "sql")
    assert decision.outcome == "rejected" and "repetitions" in decision.reason


def test_an_alias_bomb_of_a_few_hundred_bytes_is_refused_at_once():
    text = alias_bomb(10, 5, "group")
    assert len(text) < 600
    started = time.perf_counter()
    decision = offer(text)
    assert decision.outcome == "rejected" and "100,000 values" in decision.reason
    assert time.perf_counter() - started < 1.0
    started = time.perf_counter()  # under the value bound: a stage repeated 10,000 times
    decision = offer(alias_bomb(10, 4, "group"))
    assert decision.outcome == "rejected" and "duplicate stage name 'a'" in decision.reason
    assert time.perf_counter() - started < 1.0


def test_a_definition_over_the_size_bound_is_refused_before_it_is_parsed(monkeypatch):
    import ctiflow.jobs.core.definitions

    parsed = []
    monkeypatch.setattr(ctiflow.jobs.core.definitions, "load_yaml", lambda *a, **k: parsed.append(a))  # (must not be reached)
    text = "stages: [{name: a, where: 'amount > 1'}]\n" + "#" * MAX_DEFINITION_BYTES
    decision = offer(text)
    assert decision.outcome == "rejected" and f"more than {MAX_DEFINITION_BYTES:,}" in decision.reason
    assert parsed == []


@pytest.mark.parametrize("rule, reason", [
    (Rule("r", OPERATOR, 0, 0, "put", "stages: [{name: a}]"), "versions start at 1"),
    (Rule("r", OPERATOR, 1, -5, "put", "stages: [{name: a}]"), "effective_time -5 is negative"),
])
def test_the_book_refuses_a_version_below_1_and_a_negative_effective_time(rule, reason):
    spec = SPECS["pattern"]
    decision = RuleBook(spec.settings).offer(rule, CTI_NONE, spec.compile)
    assert decision.outcome == "rejected" and reason in decision.reason


def test_groups_nested_past_the_bound_are_refused_by_the_pattern_api_too():
    """The declarative form from a dict (no YAML bound before it): 3,000 nested groups are a
    PatternError naming the bound, not a RecursionError."""
    from ctiflow.operators.cep.declarative import MAX_GROUP_DEPTH, pattern_from_dict
    from ctiflow.operators.errors import PatternError

    def nested(depth: int) -> dict:
        spec = {"name": "x", "where": "amount > 1"}
        for i in range(depth):
            spec = {"name": f"g{i}", "group": [spec]}
        return {"stages": [spec]}

    pattern_from_dict(nested(MAX_GROUP_DEPTH))
    with pytest.raises(PatternError, match=f"groups nest more than {MAX_GROUP_DEPTH} levels"):
        pattern_from_dict(nested(3_000))
