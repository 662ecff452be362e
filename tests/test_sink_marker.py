"""A replay marker that failed delivery (not only one still queued) stops the task: writing a
batch's records without its marker landed would break exactly-once on a replay."""

import socket

import pytest
from confluent_kafka import Producer

from ctiflow.jobs.datapath.sink import leave_marker


def test_a_marker_whose_delivery_failed_is_an_error():
    with socket.socket() as s:  # a loopback port nothing listens on: delivery times out
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prod = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "message.timeout.ms": 300,
                     "socket.connection.setup.timeout.ms": 1000, "log_level": 0})
    with pytest.raises(RuntimeError, match="did not land in markers: .*[Tt]imed out"):
        leave_marker(prod, "markers", 2, "q", 0, 1)
