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


def test_a_password_in_the_file_stays_in_the_config_and_out_of_dumps_options_and_the_environment(monkeypatch):
    monkeypatch.delenv("CTIFLOW_SASL_PASSWORD", raising=False)
    monkeypatch.delenv("CTIFLOW_SASL_USERNAME", raising=False)
    cfg = parse(spec(**{"sasl.password": SECRET, "ssl.key.password": "k3y-" + SECRET}))
    assert SECRET not in json.dumps(cfg.model_dump()) and SECRET not in repr(cfg)
    assert "CTIFLOW_SASL_PASSWORD" not in os.environ  # parsing writes nothing to the environment
    assert SECRET not in json.dumps(source_options(cfg, cfg.sources[0], True).to_options())
    client = base_config("b:1", cfg.kafka.client_config())  # this process's clients get it explicitly
    assert client["sasl.password"] == SECRET and client["ssl.key.password"] == "k3y-" + SECRET
    assert client["sasl.username"] == "alice" and client["sasl.mechanism"] == "SCRAM-SHA-256"
    from jobs.pipeline import executor_credentials

    assert executor_credentials(cfg) == {"CTIFLOW_SASL_USERNAME": "alice", "CTIFLOW_SASL_PASSWORD": SECRET}


def test_credentials_from_the_environment_are_declared_overrides(monkeypatch):
    monkeypatch.setenv("CTIFLOW_SASL_USERNAME", "bob")
    monkeypatch.setenv("CTIFLOW_SASL_PASSWORD", SECRET)
    cfg = parse({**spec(), "kafka": {}})
    assert cfg.kafka.client_config() == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                                         "sasl.username": "bob", "sasl.password": SECRET}
    assert SECRET not in json.dumps(cfg.model_dump())


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
