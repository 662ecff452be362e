"""``ctiflow.jobs.datapath.kafka``'s client settings: the fetch size a consumer gets, and the admin
client kept per process and settings. No broker: librdkafka makes clients without connecting."""

from __future__ import annotations

import os

import pytest
from confluent_kafka import KafkaException

from ctiflow.jobs.datapath import kafka

BOOTSTRAP = "127.0.0.1:1"  # nothing listens: these clients are made, never used


def test_a_message_max_bytes_above_the_default_fetch_size_raises_the_fetch_size_instead_of_failing():
    big = {"message.max.bytes": str(4 << 20)}
    kafka.consumer(BOOTSTRAP, big).close()  # librdkafka refuses fetch.max.bytes < message.max.bytes
    with pytest.raises(KafkaException, match="fetch.max.bytes"):  # what the rule spares the user
        kafka.consumer(BOOTSTRAP, {**big, "fetch.max.bytes": str(1 << 20)}).close()


def test_one_admin_client_is_kept_per_process_and_settings():
    first = kafka.admin(BOOTSTRAP)
    assert kafka.admin(BOOTSTRAP) is first
    assert kafka.admin(BOOTSTRAP, {"client.id": "another"}) is not first
    assert kafka.admin("127.0.0.1:2") is not first
    assert all(key[0] == os.getpid() for key in kafka._ADMINS)  # a forked child makes its own
