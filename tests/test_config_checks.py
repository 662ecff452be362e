"""Misconfiguration is refused before anything runs, with one clear error naming the field and
the fix: colliding and looping topics, fields the schemas do not have or have with the wrong type."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from jobs.config import parse
from jobs.fields import check_fields, field_errors
from operators.errors import ConfigError

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
