"""The match benchmark runs end to end on a small workload; only its correctness figures count.

Never a wall-clock assertion: timing targets live in ``bench/match_operator.py``. Flink is not
run here (it needs the separate PyFlink venv); only the SQL rendering of the patterns is checked.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ctiflow.bench.match_flink import NotExpressible, load_patterns, match_recognize, sql_condition
from ctiflow.bench.match_operator import PATTERNS, notes, run, tables


@pytest.fixture(scope="module")
def small():
    # 50 accounts, one event every 20 ms: each account sees about one event per second of
    # application time, as with the default 1,000 accounts at one event per millisecond.
    return run(events=5000, keys=50, step_ms=20, cti_every=500, flink=False, hot_key=(60, 180))


def test_the_hot_key_rows_compare_the_sql_form_with_the_pattern_api_form(small):
    rows = small["hot_key"]
    assert [r["events"] for r in rows] == [60, 180]
    for r in rows:  # every row started a run that waits for a large purchase
        assert r["sql"]["partial_matches"] == r["pattern_api"]["partial_matches"] == r["events"]
        assert r["sql"]["buffered"] == r["events"]
    assert rows[1]["sql"]["state_bytes"] < 3.6 * rows[0]["sql"]["state_bytes"]


def test_every_pattern_matches_and_end_to_end_agrees_with_the_operator(small):
    assert set(small["patterns"]) == set(PATTERNS)
    for name, row in small["patterns"].items():
        op, e2e = row["operator"], row["end_to_end"]
        assert op["events"] == 5000
        assert op["matches"] > 0, name
        assert e2e["matches"] == op["matches"], name
        assert e2e["late"] == 0, name
        assert op["timed_out"] == 0, name


def test_state_figures_are_present_and_consistent(small):
    for name, row in small["patterns"].items():
        peak, at_peak = row["operator"]["peak"], row["operator"]["at_peak"]
        assert row["operator"]["state_samples"] >= 1
        for key in ("snapshot_bytes", "partial_matches", "shared_events", "unshared_events",
                    "event_bytes", "run_bytes", "buffer_nodes"):
            assert key in peak and key in at_peak, (name, key)
            assert at_peak[key] <= peak[key]
        assert peak["snapshot_bytes"] > 0, name
        # every stored event belongs to some partial match: unshared storage is never smaller
        assert at_peak["unshared_events"] >= at_peak["shared_events"], name
        assert row["end_to_end"]["peak_state_bytes"] > 0


def test_overlapping_runs_share_their_events(small):
    fba = small["patterns"]["followed_by_any"]["operator"]["at_peak"]
    assert fba["partial_matches"] > 2 * fba["shared_events"]
    assert fba["unshared_events"] > 2 * fba["shared_events"]


def test_tables_render_and_say_flink_was_skipped(small):
    out = Console(file=io.StringIO(), width=200)
    for table in tables(small):
        out.print(table)
    text = out.file.getvalue()
    assert "followed_by_any" in text and "skipped" in text
    assert any("Flink: skipped" in line for line in notes(small))


def test_flink_not_installed_is_a_note_not_an_error():
    r = {"events": 1, "keys": 1, "cti_every": 1, "sample_every": 1, "key_groups": 8,
         "flink": {"installed": False, "python": None, "parallelism": 1}, "patterns": {}}
    assert "Flink: not installed — run bench/setup_flink.sh" in notes(r)


def test_patterns_render_as_match_recognize():
    assert load_patterns() == PATTERNS  # read without importing, as the Flink venv does
    sql, _ = match_recognize(PATTERNS["strict_sequence"])
    assert "PATTERN (A B C)" in sql and "AFTER MATCH SKIP PAST LAST ROW" in sql
    sql, notes_ = match_recognize(PATTERNS["relaxed_one_or_more"])
    assert "PATTERN (A NOT_B*? B NOT_C*? C)" in sql and "SKIP TO NEXT ROW" in sql and notes_
    sql, _ = match_recognize(PATTERNS["within"])
    assert "WITHIN INTERVAL '30' SECOND" in sql
    with pytest.raises(NotExpressible, match="followed_by_any"):
        match_recognize(PATTERNS["followed_by_any"])
    assert sql_condition("type == 'x' and amount >= 5", "A") == "A.`type` = 'x' AND A.`amount` >= 5"
    with pytest.raises(NotExpressible):
        sql_condition("first('a').amount > 5", "B")
