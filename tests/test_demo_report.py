"""The demo's report groups dead letters by a reason of whole words (never cut mid-word) and
shows one whole example of each."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ctiflow.jobs.ops.demo import _report, reason_code


@pytest.mark.parametrize("error, code", [
    ("decode: Avro body does not decode with schema 'transaction': int varint at byte 9",
     "decode: Avro body does not decode with schema"),
    ("validate: 'event_time': missing", "validate: missing"),
    ("validate: absurd event time event_time=12 (expected ms since 1970, before 2500)", "validate: absurd event time"),
    ("validate: missing key field 'account'", "validate: missing key field"),
    ("decode: not Avro: unknown magic byte 0x17", "decode: not Avro"),
    ("operator brute-force: key 'a1' holds 10001 partial matches", "operator brute-force: key holds partial matches"),
])
def test_a_reason_code_is_whole_words_without_the_details(error, code):
    assert reason_code(error) == code


def test_the_report_counts_each_reason_and_shows_one_whole_example():
    errors = ["decode: Avro body does not decode with schema 'transaction': int varint at byte 9"] * 3 + [
        "validate: missing key field 'account'"]
    dead = [{"source_topic": "t", "partition": i % 2, "offset": i, "key": None, "value": b"", "error": e,
             "stage": e.split(":")[0], "kafka_timestamp": 0} for i, e in enumerate(errors)]
    buf = io.StringIO()
    _report({"dlq": dead}, Console(file=buf, width=400))
    text = buf.getvalue()
    assert "decode: Avro body does not decode with schema ×3, validate: missing key field ×1" in text
    assert "partition 0 offset 0: " + errors[0] in text and "offset 3: " + errors[3] in text
