"""Misconfiguration is refused before anything runs, with one clear error naming the field and
the fix: colliding and looping topics, fields the schemas do not have or have with the wrong type."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from ctiflow.jobs.driver.planner import plan_job
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.fields import check_fields, field_errors
from ctiflow.operators.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TRANSACTIONS = yaml.safe_load((EXAMPLES / "demo-transactions.yaml").read_text())
FLOWS = yaml.safe_load((EXAMPLES / "demo-flows.yaml").read_text())


def refused(raw: dict) -> str:
    with pytest.raises(ConfigError) as err:
        check_fields(parse(raw))
    return str(err.value)


def op(raw: dict, name: str) -> dict:
    return next(o for o in raw["operators"] if o["name"] == name)


@pytest.mark.parametrize("raw", [TRANSACTIONS, FLOWS], ids=["transactions", "flows"])
def test_the_examples_pass_every_check(raw):
    assert field_errors(parse(raw)) == []


def test_two_record_schemas_on_one_topic_are_refused_and_same_schema_sharing_is_not():
    raw = copy.deepcopy(TRANSACTIONS)  # two counts share `counts`, two matches `matches`: fine
    parse(raw)
    op(raw, "login-brute-force")["output"] = "counts"
    message = refused(raw)
    assert "operators.login-brute-force (match output): topic 'counts' already gets 'count' records" in message
    assert "give this output a topic of its own" in message


@pytest.mark.parametrize("where, set_to", [
    ("late", lambda raw: raw.setdefault("outputs", {}).update(late="matches")),
    ("dead_letter", lambda raw: raw.setdefault("outputs", {}).update(dead_letter="transactions-enriched")),
    ("timed_out", lambda raw: op(raw, "login-brute-force").update(timed_out="counts")),
])
def test_the_late_dead_letter_and_timed_out_topics_collide_with_nothing(where, set_to):
    raw = copy.deepcopy(TRANSACTIONS)
    set_to(raw)
    assert "one topic holds one record schema" in refused(raw)


@pytest.mark.parametrize("set_to", [
    lambda raw: op(raw, "high_value_last_10k").update(output="transactions"),
    lambda raw: raw.setdefault("outputs", {}).update(dead_letter="accounts"),
    lambda raw: raw["reference"].update(output="transactions"),
], ids=["operator output", "dead letter", "reference output"])
def test_an_output_that_is_an_input_is_a_feedback_loop_and_refused(set_to):
    raw = copy.deepcopy(TRANSACTIONS)
    set_to(raw)
    assert "the job would read its own output back (a feedback loop)" in refused(raw)


def test_bins_outputs_and_an_input_topic_are_kept_apart():
    raw = copy.deepcopy(FLOWS)
    raw["operators"][0]["outputs"]["final"] = "flows"
    assert "operators.bytes_per_minute (bin_final output): topic 'flows' is also the input" in refused(raw)


@pytest.mark.parametrize("change, expected", [
    (lambda raw: [s.update(key_field="acount") for s in raw["sources"]] and raw["reference"].update(join_field="acount"),
     "sources.transactions.key_field: schema 'transaction' has no field 'acount'; its fields: id, account,"),
    (lambda raw: raw["sources"][0].update(time_field="event_tme"),
     "sources.transactions.time_field: schema 'transaction' has no field 'event_tme'"),
    (lambda raw: raw["sources"][0].update(time_field="currency"),
     "field 'currency' of schema 'transaction' is string, an event time (ms since 1970) must be int/long; "
     "fields that are: event_time"),
    (lambda raw: raw["sources"][0].update(measures=["amount", "country"]),
     "sources.transactions.measures: field 'country' of schema 'transaction' is string, a measure must be"),
    (lambda raw: op(raw, "high_value_last_10k").update(predicate="amout > 1000"),
     "operators.high_value_last_10k.predicate: schema 'transaction' has no field 'amout'"),
    (lambda raw: op(raw, "over_threshold_per_account_1h").update(
        predicate="amount > coalesce(reference.risk_treshold, 1000)"),
     "operators.over_threshold_per_account_1h.predicate: schema 'account' has no field 'risk_treshold'; "
     "its fields: account, valid_from, home_country, risk_threshold, tier"),
    (lambda raw: op(raw, "high_value_last_10k").update(value_field="currency"),
     "operators.high_value_last_10k.value_field: field 'currency' of schema 'transaction' is string, "
     "a summed value must be int/long"),
    (lambda raw: op(raw, "two-countries-then-large")["pattern"]["stages"][1].update(
        where="type == 'purchase' and country != first('first').contry"),
     "operators.two-countries-then-large.pattern.stage 'abroad'.where: schema 'transaction' has no field 'contry'"),
    (lambda raw: op(raw, "login-brute-force")["pattern"]["stages"][0].update(where="typ == 'login_failed'"),
     "operators.login-brute-force.pattern.stage 'failures'.where: schema 'transaction' has no field 'typ'"),
], ids=["key", "time", "time type", "measure type", "predicate", "reference field", "value_field",
        "stage event field", "stage field"])
def test_a_field_the_schema_lacks_or_types_otherwise_is_refused_with_the_real_fields(change, expected):
    raw = copy.deepcopy(TRANSACTIONS)
    change(raw)
    with pytest.raises(ConfigError) as err:
        check_fields(parse(raw))
    assert expected in str(err.value)


def test_every_field_error_is_reported_at_once():
    raw = copy.deepcopy(FLOWS)
    raw["sources"][0]["measures"] = ["bytes", "device"]
    raw["operators"][0]["measures"] = ["byts", "packets"]
    raw["sources"][0]["end_field"] = "end"
    lines = [line for line in refused(raw).splitlines() if line.startswith("  - ")]
    assert [line.split(":")[0] for line in lines] == [
        "  - sources.flows.end_field", "  - sources.flows.measures", "  - operators.bytes_per_minute.measures"]


# -- bounded validation (issue 28, item 6) and the smaller refusals (item 11) ----------------------

MINIMAL = {"job": "x", "sources": [{"name": "tx", "topic": "tx", "schema": "transaction", "key_field": "account",
                                    "time_field": "event_time"}],
           "operators": [{"kind": "passthrough", "output": "o"}]}


def minimal(**changes) -> dict:
    raw = copy.deepcopy(MINIMAL)
    for path, value in changes.items():
        node = raw
        *parents, leaf = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[leaf] = value
    return raw


def parse_refused(raw: dict) -> str:
    with pytest.raises(ConfigError) as err:
        parse(raw)
    return str(err.value)


@pytest.mark.parametrize("times", [{"times": 1001}, {"times": 10 ** 7}, {"times": [2, 10 ** 9]}, {"times_or_more": 5000}])
def test_a_quantifier_beyond_a_thousand_repetitions_is_refused_at_once(times):

    raw = copy.deepcopy(TRANSACTIONS)
    op(raw, "login-brute-force")["pattern"]["stages"][0]["quantifier"] = times
    with pytest.raises(ConfigError, match="is more than 1000 .each repetition is a state"):
        plan_job(parse(raw))


@pytest.mark.parametrize("expression, reason", [
    ("((9**999)**999)**999 > amount", "would have more than 4096 bits"),
    ("amount > 0 and 'a' * 10**9 == type", "more than 1000000 items"),
    ("amount > 0 and '%02000000d' % 1 == type", "formatting a string with % is not allowed"),
    ("-" * 600 + "amount > 1", "nested too deeply"),
    ("(" * 300 + "amount" + ")" * 300 + " > 1", "too many nested parentheses"),
])
def test_expressions_that_would_take_minutes_or_gigabytes_are_refused_before_spark(expression, reason):
    for where in ("predicate", "where"):
        raw = copy.deepcopy(TRANSACTIONS)
        if where == "predicate":
            op(raw, "high_value_last_10k")["predicate"] = expression
        else:
            op(raw, "two-countries-then-large")["pattern"]["stages"][2]["where"] = expression
        with pytest.raises(ConfigError, match=reason):
            plan_job(parse(raw))


def test_arithmetic_on_fields_is_bounded_per_event():
    from ctiflow.operators.cep.expr.expression import ExpressionError, compile_expression

    with pytest.raises(ExpressionError, match="more than 4096 bits"):
        compile_expression("(amount ** 999) ** 999 > 1")({"amount": 9})
    with pytest.raises(ExpressionError, match="more than 1000000 items"):
        compile_expression("type * amount")({"type": "ab", "amount": 10 ** 6})
    assert compile_expression("amount ** 3 + 2 ** 10")({"amount": 2}) == 1032


def test_percent_on_a_field_formats_nothing_and_refuses_the_record():
    """``%`` is the remainder of numbers: a format string's width (``'%0*d'``) would build a string
    as long as a field says, per record."""
    from ctiflow.operators.cep.expr.expression import ExpressionFailed, compile_expression

    with pytest.raises(ExpressionFailed, match="formatting a string with % is not allowed"):
        compile_expression("type % (amount, 1) == 'x'")({"type": "%0*d", "amount": 2 * 10 ** 6})
    with pytest.raises(ExpressionFailed, match="formatting a string with % is not allowed"):
        compile_expression("'%0*d' % (amount, 1) == type")({"type": "x", "amount": 2 * 10 ** 6})
    assert compile_expression("amount % 7")({"amount": 23}) == 2
    assert compile_expression("amount % 0.5")({"amount": 1.75}) == 0.25


def test_a_yaml_alias_bomb_and_a_key_given_twice_are_refused(tmp_path):
    from ctiflow.jobs.driver.config import load

    text = yaml.safe_dump(MINIMAL) + 'x0: &a0 [{name: s, where: "amount > 1"}]\n'
    for i in range(1, 10):
        text += f"x{i}: &a{i} [" + ", ".join(f"{{name: g{j}, group: *a{i - 1}}}" for j in range(9)) + "]\n"
    (tmp_path / "bomb.yaml").write_text(text)
    with pytest.raises(ConfigError, match="expands to more than 100,000 values"):
        load(tmp_path / "bomb.yaml")
    (tmp_path / "twice.yaml").write_text(yaml.safe_dump(MINIMAL) + "job: y\n")
    with pytest.raises(ConfigError, match="key 'job' is given twice in one mapping"):
        load(tmp_path / "twice.yaml")


@pytest.mark.parametrize("changes, message", [
    ({"sources__0__starting_offsets": '{"tx": {0: 5'}, "starting_offsets: not JSON"),
    ({"sources__0__starting_offsets": '{"tx": {"0": "five"}}'}, "offset 'five' of partition 0 is not an offset"),
    ({"sources__0__starting_offsets": '{"other": {"0": 5}}'}, "starting_offsets names ['other'], but the source reads 'tx'"),
    ({"sources__0__ending_offsets": "earliest"}, "use 'latest' or JSON"),
    ({"sources__0__ending_offsets": '{"tx": {"0": -2}}'}, "offset -2 of partition 0 is not an offset"),
    ({"sources__0__ending_offsets": '{"other": {"0": 5}}'}, "ending_offsets names ['other'], but the source reads 'tx'"),
    ({"sources__0__cti": {"idle_timeout": "1ms"}}, "idle_timeout must be at least '1s'"),
    ({"sources__0__cti": {"delay": "99999999999d"}}, "'99999999999d' is longer than 100 years"),
    ({"sources__0__cti": {"delay": 86399999999913600000}}, "is longer than 100 years"),
    ({"kafka": {"client": {"linger.ms": [5]}}}, "linger.ms: give a string, number or boolean, not list"),
])
def test_small_mistakes_get_a_message_that_names_the_fix(changes, message):
    assert message in parse_refused(minimal(**changes))


def test_unquoted_numbers_and_booleans_in_client_and_spark_settings_are_their_text():
    cfg = parse(minimal(kafka={"client": {"linger.ms": 5, "enable.idempotence": True}},
                        spark={"conf": {"spark.sql.shuffle.partitions": 4}}))
    assert cfg.kafka.client == {"linger.ms": "5", "enable.idempotence": "true"}
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "4"}


def test_durations_are_accepted_with_units_everywhere_including_within():
    raw = copy.deepcopy(TRANSACTIONS)
    pattern = op(raw, "login-brute-force")["pattern"]
    del pattern["within_ms"]
    pattern["within"] = "5m"
    pattern["stages"][0]["window"] = "30s"
    got = next(o for o in parse(raw).operators if o.name == "login-brute-force").pattern
    assert got["within_ms"] == 300_000 and got["stages"][0]["window_ms"] == 30_000
    pattern["within_ms"] = 1
    assert "give within or within_ms, not both" in parse_refused(raw)


def test_the_json_schema_types_durations_as_ms_or_text():
    from ctiflow.jobs.driver.config import JobConfig

    schema = JobConfig.model_json_schema()
    delay = schema["$defs"]["CtiConfig"]["properties"]["delay"]
    kinds = {branch["type"] for branch in delay["anyOf"]}
    assert kinds == {"integer", "string"}


# -- CEP partial matches are bounded per key (issue 28, item 5) ------------------------------------

EXPLODING = {"within_ms": 10 ** 9, "stages": [
    {"name": "a", "where": "amount > 0", "quantifier": "one_or_more", "allow_combinations": True},
    {"name": "b", "contiguity": "followed_by_any", "where": "amount < 0"}]}


def test_a_pattern_whose_runs_double_per_event_stops_at_the_limit_and_refuses_the_key_s_next_events():
    """one_or_more + allow_combinations doubles the runs per event (2^14 after 14 events without
    a bound); with max_partial_matches the key's runs stop near the limit, the events that find
    it exceeded are refused (dead letters in a job), and another key still matches."""
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings, PartialMatchLimit
    from ctiflow.operators.time import Event

    limit = 100
    operator = MatchOperator(MatchSettings(pattern=EXPLODING, name="x", max_partial_matches=limit))
    refused = 0
    for t in range(40):
        try:
            operator.process(Event("hot", 1000 + t, 1000 + t, {"amount": 1.0}))
        except PartialMatchLimit as exc:
            refused += 1
            assert "key 'hot' holds" in str(exc) and "max_partial_matches 100" in str(exc)
        assert operator.partial_match_count() <= 2 * limit + 1
    assert refused >= 30
    operator.process(Event("calm", 2000, 2000, {"amount": 1.0}))
    out = operator.process(Event("calm", 2001, 2001, {"amount": -1.0}))
    assert [o.record["key"] for o in out] == ["calm"]


def test_match_operators_are_bounded_by_default_and_an_unbounded_pattern_is_warned_about():
    raw = copy.deepcopy(MINIMAL)
    raw["operators"] = [{"kind": "match", "name": "boom", "output": "m",
                         "pattern": {k: v for k, v in EXPLODING.items() if k != "within_ms"}}]
    cfg = parse(raw)
    assert cfg.operators[0].max_partial_matches == 10_000
    assert [w.split(":")[0] for w in cfg.warnings()] == ["operators.boom"]
    assert "no within and state.ttl is not set" in cfg.warnings()[0]
    raw["state"] = {"ttl": "1d"}
    assert parse(raw).warnings() == []
    assert parse(TRANSACTIONS).warnings() == []  # both patterns have a within


# -- MATCH_RECOGNIZE in jobs (issue 26) ----------------------------------------------------------------
SQL = """SELECT * FROM transactions MATCH_RECOGNIZE (
  PARTITION BY account ORDER BY event_time
  MEASURES FIRST(F.event_time) AS first_failure, COUNT(F.id) AS failures, S.amount AS amount,
           S.country AS login_country, MATCH_ROWTIME() AS matched_at
  AFTER MATCH SKIP PAST LAST ROW
  PATTERN (F{3,} S) WITHIN INTERVAL '10' MINUTE
  DEFINE F AS F.type = 'login_failed', S AS S.type = 'login_ok'
)"""


def sql_job(sql: str = SQL) -> dict:
    raw = copy.deepcopy(MINIMAL)
    raw["sources"][0]["name"] = "transactions"
    raw["operators"] = [{"kind": "match", "name": "brute-force", "sql": sql, "output": "brute-force"}]
    return raw


def test_a_sql_operator_derives_its_output_schema_from_the_measures():
    import json

    from ctiflow.jobs.driver.check import config_errors
    from ctiflow.jobs.driver.recognize import derived_schemas

    cfg = parse(sql_job())
    assert config_errors(cfg) == [] and cfg.warnings() == []
    assert cfg.result_topics()["brute-force"] == "recognize_brute_force"
    schema = json.loads(derived_schemas(cfg)["recognize_brute_force"])
    timestamp = {"type": "long", "logicalType": "timestamp-millis"}  # MATCH_ROWTIME(); event_time is a long
    assert [(f["name"], f["type"]) for f in schema["fields"]] == [
        ("account", ["null", "string"]), ("first_failure", ["null", "long"]), ("failures", "long"),
        ("amount", ["null", "double"]), ("login_country", ["null", "string"]), ("matched_at", timestamp)]


@pytest.mark.parametrize("change, message", [
    (lambda q: q.replace("PARTITION BY account", "PARTITION BY country"),
     "PARTITION BY must include the job's key field 'account'"),
    (lambda q: q.replace("ORDER BY event_time", "ORDER BY id, event_time"),
     "ORDER BY must start with the source's time field"),
    (lambda q: q.replace("COUNT(F.id)", "COUNT(F.idd)"), "column 'idd' is not in the input"),
    (lambda q: q.replace("S)", "S+)"), "greedy quantifier on the last variable"),
])
def test_a_sql_operator_that_does_not_fit_its_job_is_refused_with_a_caret(change, message):
    from ctiflow.jobs.driver.check import config_errors

    errors = config_errors(parse(sql_job(change(SQL))))
    assert len(errors) == 1 and message in errors[0] and errors[0].startswith("operators.brute-force.sql: line ")
    assert errors[0].splitlines()[-1].strip() == "^"


def test_a_match_operator_takes_a_pattern_or_a_query_not_both():
    raw = sql_job()
    raw["operators"][0]["pattern"] = {"stages": [{"name": "a"}]}
    assert "give exactly one of pattern" in parse_refused(raw)
    del raw["operators"][0]["pattern"], raw["operators"][0]["sql"]
    assert "give exactly one of pattern" in parse_refused(raw)


def test_the_job_files_validate_against_the_models_json_schema_as_an_editor_would():
    """``ctiflow schemas job`` is what editors validate YAML with: durations as text, patterns
    typed stage by stage (a misspelt stage key is caught there too)."""
    import jsonschema

    from ctiflow.jobs.driver.config import JobConfig

    schema = JobConfig.model_json_schema(by_alias=True)
    for raw in (TRANSACTIONS, FLOWS, sql_job()):
        jsonschema.validate(raw, schema)
    raw = copy.deepcopy(TRANSACTIONS)
    op(raw, "login-brute-force")["pattern"]["stages"][0]["quantifer"] = {"times": 3}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, schema)
    raw = copy.deepcopy(TRANSACTIONS)
    raw["sources"][0]["cti"]["delay"] = "thirty seconds"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, schema)


def test_a_key_that_keeps_too_many_events_for_its_runs_has_its_next_events_refused():
    """The second bound: events kept per key (the shared buffer, what its state bytes grow with),
    with relaxed contiguity and no within: every purchase is kept for a b that never comes."""
    from ctiflow.operators.cep.operator import MatchOperator, MatchSettings, PartialMatchLimit
    from ctiflow.operators.time import Event

    pattern = {"stages": [{"name": "a", "where": "amount > 0", "quantifier": "one_or_more"},
                          {"name": "b", "contiguity": "followed_by", "where": "amount < 0"}]}
    operator = MatchOperator(MatchSettings(pattern=pattern, name="x", max_buffered_events=50))
    refused = []
    for t in range(80):
        try:
            operator.process(Event("hot", 1000 + t, 1000 + t, {"amount": 1.0}))
        except PartialMatchLimit as exc:
            refused.append(str(exc))
    assert refused and "keeps 51 events" in refused[0] and "max_buffered_events 50" in refused[0]
    assert operator.buffered_event_count() <= 51
    assert parse(sql_job()).operators[0].max_buffered_events == 100_000


def test_every_error_of_one_query_and_one_pattern_is_shown_at_once():
    from ctiflow.jobs.driver.check import config_errors

    query = SQL.replace("COUNT(F.id)", "COUNT(F.idd)").replace("S.country AS", "SUM(S.country) AS") \
               .replace("F.type = 'login_failed'", "F.amount > 'x'")
    raw = sql_job(query)
    raw["operators"].append({"kind": "match", "name": "yaml", "output": "yaml-out", "pattern": {"stages": [
        {"name": "a", "where": "type == 'login_failed'"},
        {"name": "b", "contiguity": "next", "where": "amount > first('zz').amount"},
        {"name": "c", "contiguity": "next", "where": "amount >"}]}})
    errors = config_errors(parse(raw))
    sql = [e for e in errors if e.startswith("operators.brute-force.sql: line ")]
    assert len(sql) == 3 and all(e.splitlines()[-1].strip() == "^" for e in sql)
    assert [m for m in ("column 'idd'", "SUM needs numbers", "the types do not match") if any(m in e for e in sql)] \
        == ["column 'idd'", "SUM needs numbers", "the types do not match"]
    yaml_errors = [e for e in errors if e.startswith("operators.yaml.pattern: ")]
    assert len(yaml_errors) == 2
    assert "reads stage 'zz', which the pattern does not have (its stages: a, b, c)" in yaml_errors[0]
    assert "invalid expression 'amount >'" in yaml_errors[1]


@pytest.mark.parametrize("group", [5, "a", [], {"name": "x"}])
def test_a_group_that_is_not_a_list_of_stages_is_one_error(group):
    from ctiflow.jobs.driver.check import config_errors

    raw = sql_job()
    raw["operators"] = [{"kind": "match", "name": "g", "output": "g-out", "pattern": {
        "within_ms": 1000, "stages": [{"name": "a", "where": "type == 'x'"}, {"name": "b", "group": group}]}}]
    cfg = parse(raw)
    assert cfg.warnings() == []  # no traceback while looking for a within either
    errors = config_errors(cfg)
    assert len(errors) == 1 and "stage 'b': 'group' must be a non-empty list of stages" in errors[0]


def test_state_delta_share_takes_the_sparse_keys_advice_and_refuses_past_four():
    """``state.delta_share`` up to 4 (the sparse-keys advice is 1 to 2, the bench runs at 2); past
    it, one error naming the field before anything runs."""
    raw = copy.deepcopy(TRANSACTIONS)
    raw["state"] = {**raw.get("state", {}), "delta_share": 2}
    assert parse(raw).state.delta_share == 2.0
    raw["state"]["delta_share"] = 5
    with pytest.raises(ConfigError) as err:
        parse(raw)
    assert "delta_share" in str(err.value) and "4" in str(err.value)
