"""``ctiflow status``'s model of the samples: jobs and partitions from the metric names, input
rates from two reads, and the two layouts (table per job; one line per job when narrow)."""

from rich.console import Console

from jobs.status import jobs_of, render

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
