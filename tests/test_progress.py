"""Progress lines of a running job: the records a micro-batch read, from its source offsets; warnings once."""

import json

from rich.console import Console

from ctiflow.jobs.driver.progress import printer, progress_line, records_read


def batch(start, end) -> dict:
    return {"batchId": 5, "durationMs": {"triggerExecution": 2000},
            "sources": [{"startOffset": json.dumps(start), "endOffset": json.dumps(end)}]}


def test_records_read_counts_partitions_only_not_the_idle_and_flushed_markers():
    # An offset of the Kafka source carries the idle partitions (a list) and the final flush
    # (ctiflow.jobs.datapath.source.reader.latestOffset); a batch after a partition went idle crashed the progress line.
    p = batch({"0": 10, "1": 4}, {"0": 25, "1": 4, "idle": ["1"], "flushed": True})
    assert records_read(p) == 15
    assert "records      15" in progress_line(p, {"received": 29})


def test_records_read_is_none_for_a_first_batch():
    assert records_read({"sources": [{"startOffset": None, "endOffset": json.dumps({"0": 3})}]}) is None


def test_the_printer_prints_each_batch_and_each_late_warning_once():
    console = Console(record=True, width=400)
    show = printer(console, indent="  ")
    late = {"late@tx/0": 50, "received@tx/0": 100}
    show(batch({"0": 0}, {"0": 100}), {"received": 100, **late})
    show(batch({"0": 100}, {"0": 200}), {"received": 200, **late})
    lines = console.export_text().splitlines()
    assert [line[:12] for line in lines] == ["  batch    5", "  warning: s", "  batch    5"]


def test_a_batch_whose_task_attempts_failed_is_warned_about_with_where_to_look():
    """``failedTaskAttempts``: the driver's count of the batch's failed task attempts (Spark ran
    each again): a warning line after the batch's, none for a batch without."""
    console = Console(record=True, width=400)
    show = printer(console)
    show(batch({"0": 0}, {"0": 100}), {"received": 100})
    show({**batch({"0": 100}, {"0": 200}), "failedTaskAttempts": 2}, {"received": 200})
    lines = console.export_text().splitlines()
    assert [line[:10] for line in lines] == ["batch    5", "batch    5", "warning: b"]
    assert "batch 5: 2 task attempt(s) failed and ran again" in lines[2] and "Spark's log" in lines[2]
