"""Credentials never travel in Spark options, plans or error messages."""

from __future__ import annotations

import json
import os

from jobs.config import parse
from jobs.kafka import base_config, public_client, redact
from jobs.pipeline import source_options

SECRET = "hunter2-very-secret"


def spec(**client) -> dict:
    return {"job": "s", "kafka": {"client": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                                             "sasl.username": "alice", **client}},
            "sources": [{"name": "tx", "topic": "t", "schema": "transaction", "key_field": "account",
                         "time_field": "event_time"}],
            "operators": [{"kind": "passthrough", "output": "o"}]}


def test_a_password_in_the_file_moves_to_the_environment_and_out_of_spark_options(monkeypatch):
    # Set first so monkeypatch restores the environment afterwards (parse() writes to it).
    monkeypatch.setenv("CTIFLOW_SASL_PASSWORD", "placeholder")
    monkeypatch.setenv("CTIFLOW_SASL_USERNAME", "placeholder")
    cfg = parse(spec(**{"sasl.password": SECRET}))
    assert SECRET not in json.dumps(cfg.model_dump())
    assert os.environ["CTIFLOW_SASL_PASSWORD"] == SECRET
    assert SECRET not in json.dumps(source_options(cfg, cfg.sources[0], True).to_options())
    assert base_config("b:1", cfg.kafka.client)["sasl.password"] == SECRET  # clients still authenticate


def test_public_client_drops_every_secret_and_redact_masks_them():
    client = {"sasl.password": SECRET, "ssl.key.password": "k3y", "acks": "all"}
    assert public_client(client) == {"acks": "all"}
    assert redact(f"failed to connect with {SECRET}", client) == "failed to connect with ***"


def test_config_errors_do_not_echo_the_password(monkeypatch):
    from operators.errors import ConfigError

    monkeypatch.setenv("CTIFLOW_SASL_PASSWORD", "placeholder")
    monkeypatch.setenv("CTIFLOW_SASL_USERNAME", "placeholder")
    bad = spec(**{"sasl.password": SECRET})
    bad["sources"][0]["topic"] = "not valid!"
    try:
        parse(bad)
    except ConfigError as exc:
        assert SECRET not in str(exc)
    else:
        raise AssertionError("an invalid topic name must be refused")
