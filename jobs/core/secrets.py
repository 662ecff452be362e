"""Which librdkafka settings are secrets, for the configuration model (which takes them out of
a job's client settings) and the Kafka clients (which keep them out of errors and logs) alike."""

from __future__ import annotations

#: librdkafka settings that are secrets: never written to Spark options, plans, logs or errors.
#: Not chosen by hand: every property the librdkafka ctiflow runs on flags sensitive, as
#: ``python -m ctiflow.jobs.datapath.librdkafka`` prints it (the configuration model imports no
#: Kafka code, so the list is written here; tests/test_secrets.py fails when it and librdkafka's differ).
SECRET_KEYS = frozenset({
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
    "sasl.password", "sasl.username", "ssl.ca.pem", "ssl.key.location", "ssl.key.password", "ssl.key.pem",
    "ssl.keystore.password"})


def secret_keys() -> frozenset[str]:
    """:data:`SECRET_KEYS`."""
    return SECRET_KEYS
