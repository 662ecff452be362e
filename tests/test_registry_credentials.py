"""Registry credentials reach a real HTTP registry that checks them (a basic-auth double,
:class:`ctiflow.jobs.testing.registry.RegistryDouble`, not ``mock://``), in both forms a job file
may give them — ``https://user:password@host`` and ``basic.auth.user.info`` — through the client
construction the job uses, on the driver and on an executor. The job end to end:
integration_tests/test_secrets_cmdline.py."""

from __future__ import annotations

import pytest

from ctiflow.jobs.avro.serde import AvroDeserializer, AvroSerializer, registry_client
from ctiflow.jobs.driver.check import config_errors
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.testing.registry import RegistryDouble

PASSWORD = "s3cr3t-registry-pw"
T0 = 1_767_225_600_000
TX = {"id": "tx-1", "account": "acct-1", "event_time": T0, "type": "purchase", "amount": 12.5,
      "currency": "EUR", "country": "DE", "merchant": None}


@pytest.fixture
def registry():
    with RegistryDouble({"alice": PASSWORD}) as double:
        yield double


def job(registry_section: dict) -> dict:
    return {"job": "r", "kafka": {"schema_registry": registry_section},
            "sources": [{"name": "tx", "topic": "t", "schema": "transaction", "key_field": "account",
                         "time_field": "event_time"}],
            "operators": [{"kind": "passthrough", "output": "o"}]}


def forms(registry: RegistryDouble) -> dict[str, dict]:
    return {"userinfo in the url": {"url": registry.url_with("alice")},
            "basic.auth.user.info": {"url": registry.url,
                                     "config": {"basic.auth.user.info": f"alice:{PASSWORD}"}}}


@pytest.mark.parametrize("form", ["userinfo in the url", "basic.auth.user.info"])
def test_the_job_s_registry_client_writes_and_reads_with_either_form_of_credentials(registry, form,
                                                                                     monkeypatch):
    monkeypatch.delenv("CTIFLOW_SCHEMA_REGISTRY_URL", raising=False)
    cfg = parse(job(forms(registry)[form]))
    section = cfg.kafka.schema_registry
    assert config_errors(cfg, checkpoint_too=False) == []
    client = registry_client(section.url, section.client_config())  # as the driver's tools build it
    framed = AvroSerializer("transaction", framing="confluent", registry=client, subject="t-value")(TX)
    decode = AvroDeserializer("transaction", registry=registry_client(section.url, section.client_config()),
                              subject="t-value")
    assert decode(framed) == TX
    assert registry.refused == 0
    assert {user for _, _, user in registry.requests} == {"alice"}
    assert {(m, p) for m, p, _ in registry.requests} >= {
        ("POST", "/subjects/t-value/versions"), ("GET", "/subjects/t-value/versions"),
        ("GET", "/schemas/ids/1")}


@pytest.mark.parametrize("form", ["userinfo in the url", "basic.auth.user.info"])
def test_an_executor_s_registry_client_authenticates_with_what_the_driver_gives_it(registry, form, monkeypatch):
    """Executors get the model's dump (no secrets) in their options and the secrets in their
    environment (:func:`ctiflow.jobs.driver.pipeline.executor_credentials`)."""
    from ctiflow.jobs.driver.pipeline import executor_credentials

    monkeypatch.delenv("CTIFLOW_SCHEMA_REGISTRY_URL", raising=False)
    cfg = parse(job(forms(registry)[form]))
    dumped = cfg.kafka.schema_registry.model_dump()
    assert PASSWORD not in repr(dumped)
    for var, value in executor_credentials(cfg).items():
        monkeypatch.setenv(var, value)
    client = registry_client(dumped["url"], dumped["config"])
    assert client.register_schema("t-value", _schema()) == 1
    assert registry.refused == 0 and registry.requests == [("POST", "/subjects/t-value/versions", "alice")]


def test_the_double_refuses_a_wrong_password_so_the_tests_above_can_fail(registry):
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = registry_client(registry.url, {"basic.auth.user.info": "alice:wrong"})
    with pytest.raises(SchemaRegistryError) as caught:
        client.register_schema("t-value", _schema())
    assert caught.value.http_status_code == 401 and registry.refused == 1 and registry.requests == []


def test_settings_the_python_client_refuses_are_one_error_naming_the_field_before_spark(registry, monkeypatch):
    """The Java client's ``basic.auth.credentials.source`` (which ctiflow itself used to add to
    a url's credentials) made the job die on an executor ≈ 30 s after Spark started."""
    monkeypatch.delenv("CTIFLOW_SCHEMA_REGISTRY_URL", raising=False)
    cfg = parse(job({"url": registry.url, "config": {"basic.auth.credentials.source": "USER_INFO",
                                                      "basic.auth.user.info": f"alice:{PASSWORD}"}}))
    errors = config_errors(cfg, checkpoint_too=False)
    assert len(errors) == 1 and errors[0].startswith("kafka.schema_registry: ")
    assert "Unrecognized properties: basic.auth.credentials.source" in errors[0] and PASSWORD not in errors[0]
    assert "basic.auth.user.info" in errors[0]  # the fix


def _schema():
    from confluent_kafka.schema_registry import Schema

    from ctiflow.jobs.avro.serde import default_store

    return Schema(default_store().get("transaction").text, "AVRO")
