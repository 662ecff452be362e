"""PySpark's accumulator server (pure Python: no JVM here) with ctiflow's handler for dropped
connections: a drop mid-request goes to Spark's log file, never to the console."""
import socket
import time

import pytest

accumulators = pytest.importorskip("pyspark.accumulators")

from ctiflow.jobs.driver.pipeline import accumulator_drops_to_log  # noqa: E402


def drop_mid_request(server, token: str) -> None:
    """What the JVM does when it goes down between updates: authenticate, then close."""
    with socket.create_connection(server.server_address[:2]) as conn:
        conn.sendall(token.encode())


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize("ours", [True, False], ids=["ctiflow's handler", "PySpark's own"])
def test_a_connection_dropped_mid_request_goes_to_the_log_not_the_console(tmp_path, capfd, ours):
    token = "t0ken"
    log = tmp_path / "spark.log"
    server = accumulators._start_update_server(token, False)
    handled = []
    try:
        if ours:
            accumulator_drops_to_log(server, log)
        inner = server.handle_error
        server.handle_error = lambda *a: (inner(*a), handled.append(a))
        drop_mid_request(server, token)
        assert wait_for(lambda: handled), "the server never saw the dropped connection"
    finally:
        server.shutdown()
    err = capfd.readouterr().err
    if ours:
        assert "Traceback" not in err and "EOFError" not in err
        text = log.read_text()
        assert "lost its connection" in text and "EOFError" in text
    else:  # the console noise the handler exists for (the control: PySpark prints it)
        assert "Traceback" in err and "EOFError" in err
