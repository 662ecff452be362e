"""The docs' worked examples (jobs/tools/docs_examples.py, rendered into the pages at build time) run
through the real runtime; here their outputs are checked against small independent oracles, so
a page cannot show a wrong result, and every example a page names exists."""

import re
from pathlib import Path

from ctiflow.jobs.tools.docs_examples import EXAMPLES, run
from ctiflow.operators.events import CTI_INFINITY

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _records(name: str) -> list[tuple[int, int, str, dict]]:
    return [(b, cti, topic, r) for b, cti, out in run(EXAMPLES[name]) for topic, r in out]


def _inputs(name: str, stream: str | None = None) -> list[dict]:
    ex = EXAMPLES[name]
    got = []
    for batch in ex.batches:
        parts = batch if all(isinstance(k, int) for k in batch) else batch.get(stream, {})
        for records in parts.values():
            got.extend(records)
    return got


def test_every_example_a_page_names_exists_and_every_example_is_shown():
    named = {m for p in DOCS.rglob("*.md") for m in re.findall(r"<!-- example: ([\w-]+) -->", p.read_text())}
    assert named == set(EXAMPLES)


def test_the_bins_example_prorates_as_the_definition_says():
    flows = _inputs("bins")
    expected: dict[tuple, float] = {}
    for f in flows:  # bins (k·10 s, (k+1)·10 s]; a zero-length flow lands in the bin that contains it
        s, e = f["start_time"], f["end_time"]
        if s == e:
            k = -(-s // 10000) - 1
            expected[k] = expected.get(k, 0.0) + f["bytes"]
            continue
        for k in range(s // 10000, -(-e // 10000)):
            lo, hi = max(s, k * 10000), min(e, (k + 1) * 10000)
            if hi > lo:
                expected[k] = expected.get(k, 0.0) + f["bytes"] * (hi - lo) / (e - s)
    finals = {r["bin_start"] // 10000: r["measures"]["bytes"] for _, _, t, r in _records("bins") if t == "bins-final"}
    assert finals.keys() == expected.keys()
    for k, v in expected.items():
        assert abs(finals[k] - v) < 1e-9, k
    assert abs(sum(finals.values()) - sum(f["bytes"] for f in flows)) < 1e-9  # conserved


def test_the_count_example_bounds_hold_the_exact_count():
    events = _inputs("count")
    rows = [r for _, _, t, r in _records("count") if t == "counts"]
    assert rows
    for r in rows:
        exact = sum(1 for e in events if e["account"] == r["key"] and r["time"] - 10000 < e["event_time"] <= r["time"]
                    and e["amount"] > 100)
        assert r["lower"] <= exact <= r["upper"], r
        assert abs(r["estimate"] - exact) <= 0.5 * exact


def test_the_match_example_matches_a_then_large_within_10_s_and_times_out_the_rest():
    recs = _records("match")
    matches = [(r["key"], [[e["id"] for e in s["events"]] for s in r["stages"]]) for _, _, t, r in recs if t == "matches"]
    timed_out = [(r["key"], r["timed_out_at"]) for _, _, t, r in recs if t == "matches-timed-out"]
    assert matches == [("a", [["t1000"], ["t5000"]])]
    assert timed_out == [("b", 2000 + 10000)]


def test_the_time_example_sends_only_the_event_behind_the_job_cti_to_late():
    recs = _records("time")
    late = [r for _, _, t, r in recs if t.endswith(".late")]
    assert [(r["key"], r["cti"]) for r in late] == [("h", 6000)]
    assert [cti for cti in dict.fromkeys((b, cti) for b, cti, _, _ in recs).keys()] == [(2, 6000), (3, CTI_INFINITY)]


def test_the_reference_example_joins_the_version_valid_at_each_event():
    recs = [r for _, _, t, r in _records("reference") if t == "enriched"]
    versions = sorted((a["valid_from"], a["risk_threshold"]) for a in _inputs("reference", "accounts"))
    for r in recs:
        valid = [v for v in versions if v[0] <= r["time"]] if r["key"] == "a" else []
        assert r["reference_missing"] == (not valid)
        assert r["reference_valid_from"] == (valid[-1][0] if valid else None)
