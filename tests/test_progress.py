"""Progress lines of a running job: the records a micro-batch read, from its source offsets."""

import json

from jobs.progress import progress_line, records_read


def batch(start, end) -> dict:
    return {"batchId": 5, "durationMs": {"triggerExecution": 2000},
            "sources": [{"startOffset": json.dumps(start), "endOffset": json.dumps(end)}]}


def test_records_read_counts_partitions_only_not_the_idle_and_flushed_markers():
    # An offset of the Kafka source carries the idle partitions (a list) and the final flush
    # (jobs.source.latestOffset); a batch after a partition went idle crashed the progress line.
    p = batch({"0": 10, "1": 4}, {"0": 25, "1": 4, "idle": ["1"], "flushed": True})
    assert records_read(p) == 15
    assert "records      15" in progress_line(p, {"received": 29})


def test_records_read_is_none_for_a_first_batch():
    assert records_read({"sources": [{"startOffset": None, "endOffset": json.dumps({"0": 3})}]}) is None
