"""Credentials never travel in Spark options, plans or error messages."""

from __future__ import annotations

import json
import os

from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.datapath.kafka import base_config, public_client, redact
from ctiflow.jobs.driver.pipeline import source_options

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
    from ctiflow.jobs.driver.pipeline import executor_credentials

    assert executor_credentials(cfg) == {"CTIFLOW_SASL_USERNAME": "alice", "CTIFLOW_SASL_PASSWORD": SECRET,
                                         "CTIFLOW_CLIENT_SECRETS": json.dumps({"ssl.key.password": "k3y-" + SECRET})}


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
    from ctiflow.operators.errors import ConfigError

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


def registry_spec() -> dict:
    raw = spec(**{"ssl.key.password": "k3y-" + SECRET, "ssl.ca.location": "/etc/ca.pem"})
    raw["kafka"]["schema_registry"] = {"url": "http://registry:8081", "config": {
        "ssl.ca.location": "/etc/registry-ca.pem", "basic.auth.user.info": f"alice:{SECRET}"}}
    return raw


def test_registry_credentials_are_kept_apart_and_reach_executors_only_through_their_environment(monkeypatch):
    from ctiflow.jobs.driver.pipeline import executor_credentials

    monkeypatch.delenv("CTIFLOW_SASL_PASSWORD", raising=False)
    cfg = parse(registry_spec())
    registry = cfg.kafka.schema_registry
    assert SECRET not in repr(cfg) and SECRET not in json.dumps(cfg.model_dump()) and SECRET not in repr(registry)
    assert SECRET not in json.dumps(source_options(cfg, cfg.sources[0], True).to_options())
    assert registry.client_config() == {"ssl.ca.location": "/etc/registry-ca.pem",
                                        "basic.auth.user.info": f"alice:{SECRET}"}
    env = executor_credentials(cfg)
    assert json.loads(env["CTIFLOW_REGISTRY_SECRETS"]) == {"basic.auth.user.info": f"alice:{SECRET}"}
    # librdkafka counts sasl.username as sensitive; without a password it travels with the other secrets
    assert json.loads(env["CTIFLOW_CLIENT_SECRETS"]) == {"ssl.key.password": "k3y-" + SECRET, "sasl.username": "alice"}


def test_an_executor_s_clients_take_the_secrets_from_its_environment(monkeypatch):
    """``ssl.key.password`` used to stop at the driver: executors' Kafka clients (source, sink)
    and registry clients now read what ``spark.executorEnv`` gives them."""
    import ctiflow.jobs.avro.serde
    from ctiflow.jobs.datapath.kafka import env_credentials
    from ctiflow.jobs.driver.pipeline import executor_credentials

    monkeypatch.delenv("CTIFLOW_SASL_PASSWORD", raising=False)
    for var, value in executor_credentials(parse(registry_spec())).items():
        monkeypatch.setenv(var, value)
    assert env_credentials()["ssl.key.password"] == "k3y-" + SECRET
    assert base_config("b:1", {"security.protocol": "SSL"})["ssl.key.password"] == "k3y-" + SECRET
    seen = {}

    class Recording:
        def __init__(self, conf):
            seen.update(conf)

    monkeypatch.setattr("confluent_kafka.schema_registry.SchemaRegistryClient", Recording)
    ctiflow.jobs.avro.serde.registry_client("http://registry:8081", {"ssl.ca.location": "/etc/registry-ca.pem"})
    assert seen == {"url": "http://registry:8081", "ssl.ca.location": "/etc/registry-ca.pem",
                    "basic.auth.user.info": f"alice:{SECRET}"}


def test_the_tools_connect_as_the_job_does_with_config(tmp_path, monkeypatch):
    import yaml

    from ctiflow.jobs.cli.parameters import connection

    monkeypatch.delenv("CTIFLOW_SASL_PASSWORD", raising=False)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(registry_spec()))
    conn = connection(None, None, path)
    assert conn.bootstrap == "127.0.0.1:19092" and conn.registry_url == "http://registry:8081"
    assert conn.client["ssl.key.password"] == "k3y-" + SECRET and conn.client["ssl.ca.location"] == "/etc/ca.pem"
    assert conn.registry_config["basic.auth.user.info"] == f"alice:{SECRET}"
    assert connection("b:9", "http://other:1", path).bootstrap == "b:9"  # flags win
    assert connection(None, None, None).client == {}


def test_the_broker_port_variable_is_checked_and_used_by_jobs_too(monkeypatch):
    from typer.testing import CliRunner

    from ctiflow.jobs.cli import app

    monkeypatch.setenv("CTIFLOW_BROKER_PORT", "19555")
    assert parse(spec()).kafka.bootstrap_servers == "127.0.0.1:19555"
    monkeypatch.setenv("CTIFLOW_BROKER_PORT", "abc")
    result = CliRunner().invoke(app, ["consume", "-t", "x"])
    assert result.exit_code != 0 and "CTIFLOW_BROKER_PORT='abc' is not a port" in str(result.exception)
    result = CliRunner().invoke(app, ["broker"])
    assert result.exit_code == 2 and "CTIFLOW_BROKER_PORT" in result.output


def test_a_registry_url_with_userinfo_is_split_into_a_url_and_a_secret(monkeypatch):
    """``https://user:pw@host`` is basic auth to confluent-kafka's registry client: the password
    is a secret like ``basic.auth.user.info``, never in repr, dumps or Spark options."""
    monkeypatch.delenv("CTIFLOW_SCHEMA_REGISTRY_URL", raising=False)
    raw = spec()
    raw["kafka"]["schema_registry"] = {"url": f"https://alice:{SECRET}%21@registry.example:8081"}
    cfg = parse(raw)
    registry = cfg.kafka.schema_registry
    assert registry.url == "https://registry.example:8081"
    assert registry.client_config() == {"basic.auth.user.info": f"alice:{SECRET}!"}  # nothing else added
    assert SECRET not in repr(cfg) and SECRET not in json.dumps(cfg.model_dump())
    assert SECRET not in json.dumps(source_options(cfg, cfg.sources[0], True).to_options())
    monkeypatch.setenv("CTIFLOW_SCHEMA_REGISTRY_URL", f"http://bob:{SECRET}@other:8081")
    assert parse(spec()).kafka.schema_registry.client_config()["basic.auth.user.info"] == f"bob:{SECRET}"


def test_every_property_librdkafka_marks_sensitive_is_a_secret(monkeypatch):
    """Not a hand-kept list: librdkafka's own redaction decides (it names this passphrase, which
    the old list lacked)."""
    from ctiflow.jobs.core.secrets import SECRET_KEYS
    from ctiflow.jobs.datapath.librdkafka import sensitive_properties

    monkeypatch.delenv("CTIFLOW_SASL_PASSWORD", raising=False)
    assert SECRET_KEYS == sensitive_properties()  # else: python -m ctiflow.jobs.datapath.librdkafka, and copy its list
    assert {"sasl.password", "ssl.key.password", "sasl.oauthbearer.assertion.private.key.passphrase"} \
        <= sensitive_properties()
    assert "bootstrap.servers" not in sensitive_properties() and "acks" not in sensitive_properties()
    secrets = {name: f"{SECRET}-{i}" for i, name in enumerate(sorted(sensitive_properties() - {"sasl.username"}))}
    cfg = parse(spec(**secrets))
    for value in secrets.values():
        assert value not in repr(cfg) and value not in json.dumps(cfg.model_dump())
        assert value not in json.dumps(source_options(cfg, cfg.sources[0], True).to_options())
    assert {k: cfg.kafka.client_config()[k] for k in secrets} == secrets
