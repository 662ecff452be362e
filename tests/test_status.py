"""``ctiflow status``'s model of the samples: jobs and partitions from the metric names, input
rates from two reads, and the two layouts (table per job; one line per job when narrow)."""

from rich.console import Console

from ctiflow.jobs.ops.status import jobs_of, render

T = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def sample(job, **partitions):
    """Samples of one job whose partitions (name → received) are of stream ``tx``."""
    out = {("ctiflow_cti_timestamp_seconds", (("job", job),)): T,
           ("ctiflow_records_dead_letter_total", (("job", job),)): 3,
           ("ctiflow_records_refused_total", (("job", job),)): 1,
           ("ctiflow_state_bytes", (("job", job), ("operator", ""))): 2 * 2**20,
           ("ctiflow_state_keys", (("job", job), ("operator", ""))): 42,
           ("ctiflow_state_bytes", (("job", job), ("operator", "c"))): 2**20,
           ("ctiflow_records_written_total", (("job", job), ("topic", "a"))): 10,
           ("ctiflow_records_written_total", (("job", job), ("topic", "b"))): 5}
    for p, received in partitions.items():
        labels = (("job", job), ("partition", p.removeprefix("p")), ("stream", "tx"))
        out[("ctiflow_records_received_total", labels)] = received
        out[("ctiflow_records_late_total", labels)] = 2
        out[("ctiflow_partition_cti_timestamp_seconds", labels)] = T - 60
        out[("ctiflow_partition_idle", labels)] = 1 if p == "p10" else 0
    return out


def test_jobs_partitions_totals_and_rates():
    first = jobs_of({**sample("a", p0=100, p10=50, p2=0), **sample("b", p0=7)}, now=T + 10)
    assert list(first) == ["a", "b"]
    a = first["a"]
    assert [p.partition for p in a.partitions] == ["0", "2", "10"]  # numeric order
    assert a.written == 15 and a.dead_letter == 3 and a.state_bytes == 2 * 2**20 and a.state_keys == 42
    assert [p.idle for p in a.partitions] == [False, False, True] and a.rate is None
    second = jobs_of(sample("a", p0=300, p10=50, p2=40), previous=first, elapsed=4.0, now=T + 14)
    assert [p.rate for p in second["a"].partitions] == [50.0, 10.0, 0.0] and second["a"].rate == 60.0


def test_a_table_per_job_or_a_line_each_when_narrow():
    jobs = jobs_of(sample("fraud", p0=1234567, p1=5), now=T + 10)
    wide = Console(width=160, record=True)
    wide.print(render(jobs, 160, now=T + 10))
    text = wide.export_text()
    assert "fraud" in text and "2026-01-01T00:00:00.000Z" in text and "2.0 MiB, 42 keys" in text
    assert "1,234,567" in text and "2025-12-31T23:59:00.000Z" in text and "70.0 s" in text  # the lag, as of now
    narrow = Console(width=80, record=True)
    narrow.print(render(jobs, 80, now=T + 10))
    line, = narrow.export_text().strip().splitlines()
    assert line.startswith("fraud: CTI 2026-01-01T00:00:00.000Z lag 10.0 s") and "dead-letter 4" in line
    assert "late 4" in line
    empty = Console(width=80, record=True)
    empty.print(render({}, 80, source="http://x:1/metrics"))
    assert empty.export_text().strip() == "no ctiflow job reports metrics at http://x:1/metrics yet"


def test_rules_per_operator_are_shown():
    samples = sample("fraud", p0=5)
    for figure, n in (("active", 3), ("versions", 7), ("scheduled", 1), ("applied", 8), ("adjusted", 1),
                      ("rejected", 2)):
        samples[(f"ctiflow_rules_{figure}", (("job", "fraud"), ("operator", "big")))] = n
    for rule, n in (("a", 5), ("b", 7)):
        samples[("ctiflow_rule_partial_matches", (("job", "fraud"), ("operator", "big"), ("rule", rule)))] = n
    jobs = jobs_of(samples, now=T + 10)
    assert jobs["fraud"].rules == {"big": {"active": 3, "versions": 7, "scheduled": 1, "applied": 8, "adjusted": 1,
                                           "rejected": 2, "partial_matches": 12}}
    wide = Console(width=160, record=True)
    wide.print(render(jobs, 160, now=T + 10))
    assert ("rules of big: 3 active, 7 versions (1 scheduled); records applied 8, adjusted 1, rejected 2; "
            "partial matches 12" in wide.export_text())


# -- reading Prometheus and job endpoints: a local HTTP server answering as each does ----------------
import contextlib  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

import pytest  # noqa: E402

from ctiflow.jobs.ops.status import Watch, fetch, from_prometheus  # noqa: E402


@contextlib.contextmanager
def serving(answer):
    """``answer(path, query) → (status, bytes)`` or a generator of byte chunks sent slowly."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            url = urllib.parse.urlsplit(self.path)
            got = answer(url.path, urllib.parse.parse_qs(url.query).get("query", [""])[0])
            if isinstance(got, tuple):
                status, body = got
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.end_headers()
            try:
                for chunk in got:
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def vector(rows):
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [T, str(value)]} for labels, value in rows]}}).encode()


def prometheus(path, query):
    """What a Prometheus scraping one job (honor_labels) holds: empty label values are dropped,
    so the all-operators state series has no ``operator`` label; a rate query has no name."""
    if query.startswith("rate("):
        return 200, vector([({"job": "flows", "partition": "0", "stream": "tx", "instance": "j:9464"}, 12.5),
                            ({"job": "flows", "partition": "1", "stream": "tx", "instance": "j:9464"}, 2.5)])
    return 200, vector([
        ({"__name__": "ctiflow_state_bytes", "job": "flows", "instance": "j:9464"}, 3 * 2**20),
        ({"__name__": "ctiflow_state_keys", "job": "flows", "instance": "j:9464"}, 77),
        ({"__name__": "ctiflow_state_keys", "job": "flows", "operator": "c", "instance": "j:9464"}, 70),
        ({"__name__": "ctiflow_cti_timestamp_seconds", "job": "flows", "instance": "j:9464"}, "NaN"),
        ({"__name__": "ctiflow_records_received_total", "job": "flows", "partition": "0", "stream": "tx"}, 500),
        ({"__name__": "ctiflow_records_received_total", "job": "flows", "partition": "1", "stream": "tx"}, 90)])


def test_status_from_prometheus_shows_state_keys_and_rates_in_one_read():
    with serving(prometheus) as base:
        jobs = jobs_of(from_prometheus(base), now=T + 10)
    flows = jobs["flows"]
    assert flows.state_bytes == 3 * 2**20 and flows.state_keys == 77
    assert [p.rate for p in flows.partitions] == [12.5, 2.5] and flows.rate == 15.0
    assert flows.cti is None  # a NaN gauge is no value, not a crash
    console = Console(width=160, record=True)
    console.print(render(jobs, 160, now=T + 10))
    text = console.export_text()
    assert "3.0 MiB, 77 keys" in text and "12/s" in text  # 12.5 rounds to even
    narrow = Console(width=80, record=True)
    narrow.print(render(jobs, 80, now=T + 10))
    line = narrow.export_text()
    assert "in 15/s" in line and "state 3.0 MiB" in line


def test_labels_with_markup_are_shown_as_written():
    samples = {("ctiflow_state_keys", (("job", "odd[/b]job"),)): 1,
               ("ctiflow_records_received_total", (("job", "odd[/b]job"), ("partition", "0"),
                                                   ("stream", "[red]s[/red]"))): 5}
    console = Console(width=160, record=True)
    console.print(render(jobs_of(samples, now=T), 160, now=T))
    text = console.export_text()
    assert "odd[/b]job" in text and "[red]s[/red]" in text


@pytest.mark.parametrize("answer, fragment", [
    (lambda p, q: (200, b'{"status": "success", "data": {"result": [{"metric": 3}]}}'), "not an instant vector"),
    (lambda p, q: (200, b'{"status": "success", "data": 7}'), "not an instant vector"),
    (lambda p, q: (200, b"[1, 2]"), "Prometheus at"),
    (lambda p, q: (200, b"<html>not json</html>"), "Expecting value"),
])
def test_an_answer_of_another_shape_is_one_failed_source_not_a_crash(answer, fragment):
    with serving(answer) as base:
        samples, failed = Watch([], base).read()
    assert samples == {} and len(failed) == 1 and fragment in failed[0]


def test_a_server_that_trickles_bytes_is_given_up_on_at_the_deadline():
    def trickle(path, query):
        def chunks():
            for _ in range(600):  # a byte every 50 ms: minutes in all, never a socket timeout
                yield b"#"
                time.sleep(0.05)
        return chunks()

    with serving(trickle) as base:
        started = time.monotonic()
        with pytest.raises(OSError, match="no whole answer within 1 s"):
            fetch(base + "/metrics", timeout=1.0)
        assert time.monotonic() - started < 10  # bounded (not the minutes the server would take)
        with pytest.raises(OSError, match="larger than"):
            fetch(base + "/metrics", timeout=30.0, limit=5)


def test_failed_task_attempts_are_shown_when_some_failed():
    samples = sample("fraud", p0=5)
    calm = Console(width=160, record=True)
    calm.print(render(jobs_of(samples, now=T + 10), 160, now=T + 10))
    assert "failed task attempts 0" in calm.export_text()
    samples[("ctiflow_task_attempts_failed_total", (("job", "fraud"),))] = 3
    jobs = jobs_of(samples, now=T + 10)
    assert jobs["fraud"].failed_attempts == 3
    wide = Console(width=160, record=True)
    wide.print(render(jobs, 160, now=T + 10))
    assert "failed task attempts 3" in wide.export_text()
    narrow = Console(width=80, record=True)
    narrow.print(render(jobs, 80, now=T + 10))
    assert narrow.export_text().strip().startswith("fraud: failed task attempts 3 CTI")  # (before the cut)

