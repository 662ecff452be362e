"""Each benchmark writes its rows of bench/figures.yaml itself: fed a result of the shape its run
produces (made up here, so the expected figures are computed from the inputs, not read from the
code), every row it owns gets every value its cells name, the ratios and verdicts follow from the
inputs, its table is the table it printed, and the README block renders. The real file is not
touched (the module's paths point into a temporary copy)."""

import re
import shutil

import pytest
from rich.table import Table

from ctiflow.bench import figures


@pytest.fixture
def data(tmp_path, monkeypatch):
    path, readme = tmp_path / "figures.yaml", tmp_path / "README.md"
    shutil.copy(figures.DATA, path)
    shutil.copy(figures.README, readme)
    real, before = figures.DATA, figures.DATA.read_text()
    monkeypatch.setattr(figures, "DATA", path)
    monkeypatch.setattr(figures, "README", readme)
    yield path
    assert real.read_text() == before, "the repository's figures were written"


def _rows(path, ids):
    got = {r["id"]: r for r in figures.load(path)["rows"]}
    out = {}
    for rid in ids:
        row = got[rid]
        text = " ".join(str(row.get(n, "")) for n in ("what", "ours", "baseline", "target", "bound"))
        missing = set(re.findall(r"\{(\w+)\}", text)) - set(row.get("values", {}))
        assert not missing, f"{rid}: no value for {sorted(missing)}"
        assert row["date"] == figures.datetime.date.today().isoformat() and row["machine"] == figures.machine()
        out[rid] = row
    figures.block(figures.load(path))  # renders without a missing field
    return out


def _table(*cols_rows):
    cols, *rows = cols_rows
    t = Table()
    for c in cols:
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    return t


def test_rules_row(data):
    from ctiflow.bench.rules import record_rules

    rates = {1: (400e3, 410e3), 10: (100e3, 300e3), 100: (10e3, 150e3), 1000: (1e3, 20e3)}
    t = _table(("patterns", "rules events/s"), ("1", "410,000"))
    record_rules({n: {"static": s, "rules": r} for n, (s, r) in rates.items()}, t)
    row = _rows(data, ["rules"])["rules"]
    v = row["values"]
    assert (v["r1"], v["r1000"], v["x10"], v["x1000"]) == ("410.0k", "20.0k", "3.00", "20.00")
    assert v["cost"] == f"{410 / 150:.2f}" and v["met_cost"] == "met" and v["met_static"] == "met"
    assert row["table"] == [{"patterns": "1", "rules events/s": "410,000"}]


def test_rules_row_says_missed_when_a_rule_is_slower_than_static(data):
    from ctiflow.bench.rules import record_rules

    rates = {1: (400e3, 300e3), 10: (100e3, 300e3), 100: (10e3, 50e3), 1000: (1e3, 20e3)}
    record_rules({n: {"static": s, "rules": r} for n, (s, r) in rates.items()}, _table(("a",), ("b",)))
    v = _rows(data, ["rules"])["rules"]["values"]
    assert v["met_static"] == "**missed**" and v["met_cost"] == "**missed**"  # 0.75× static; 6× one


def _figures(name, events, seconds, **kw):
    from ctiflow.bench.spark_jobs import Figures

    return Figures(name, events, seconds, 10, 500.0, 900.0, 1000.0, kw.pop("mb", 2500.0), **kw)


def test_adapter_row(data):
    from ctiflow.bench.spark_jobs import record_adapter

    ident, base, limit = _figures("id", 1_000_000, 5.0), _figures("pass", 1_000_000, 4.0), _figures("lim", 1_000_000, 2.5)
    record_adapter(ident, base, limit, _table(("variant", "events/s"), ("id", "200,000")))
    v = _rows(data, ["adapter"])["adapter"]["values"]
    assert (v["ours"], v["base"], v["limit"]) == ("200.0k", "250.0k", "400.0k")
    assert (v["ratio"], v["limit_ratio"], v["met"], v["limit_met"]) == ("0.80", "0.50", "**missed**", "met")


def test_peers_rows(data):
    from ctiflow.bench.peers import Ladder, Peer, paired, record_peers

    f = _figures
    # seconds per 100k events: source 0.40, plumbing 0.50, ours 0.75; the peer's noop 0.60, native 0.80
    bins = Ladder(f("src", 100_000, 0.40), f("noop", 100_000, 0.60), f("native", 100_000, 0.80),
                  f("plumb", 100_000, 0.50), [])
    count = Ladder(f("src", 100_000, 0.42), f("noop", 100_000, 1.0), f("native", 100_000, 1.8),
                   f("plumb", 100_000, 0.49), [])
    # three rounds: ratios 1.00, 0.80/0.75 and 1.20 — the median round is the second
    final = paired("bins, final only", [f("r1", 100_000, 0.80), f("ours", 100_000, 0.75), f("r3", 100_000, 0.60)],
                   [f("p1", 100_000, 0.80), bins.native, f("p3", 100_000, 0.72)], 1.5,
                   ours_alone=f("a", 1, 1.0, mb=2400.0), peer_alone=f("b", 1, 1.1, mb=3000.0))
    three = Peer("bins, all three outputs", f("ours3", 100_000, 0.85), bins.native, 1.2,
                 ours_alone=f("a", 1, 1.0, mb=3300.0), peer_alone=f("b", 1, 1.1, mb=3000.0))
    cnt = Peer("count per key, last hour", f("ours", 100_000, 0.70), count.native, 2.0, checked=30_000,
               error_max=0.0099, ours_alone=f("a", 1, 1.0, mb=2600.0), peer_alone=f("b", 1, 2.0, mb=3100.0))
    record_peers([final, three, cnt], {"bins": bins, "count": count}, _table(("result",), ("bins",)))
    rows = _rows(data, ["peers-bins-final", "peers-bins-all", "peers-count", "peers-memory"])
    b = rows["peers-bins-final"]["values"]
    assert (b["ratio"], b["alone"], b["met"]) == (f"{0.80 / 0.75:.2f}", "1.10", "**missed**")
    assert (b["spread"], b["rounds"]) == ("1.00–1.20", "the median of 3 rounds, the sides' order reversed each round")
    assert (b["source"], b["plumbing"], b["ours_s"], b["rest"], b["share"]) == ("0.40", "0.10", "0.75", "0.25", "67 %")
    assert (b["peer_state"], b["peer_sink"], b["peer_s"]) == ("0.20", "0.20", "0.80")
    assert b["need"] == f"{0.80 / 1.5:.2f}" and "need_rest" not in b
    assert b["need_said"].startswith(f"i.e. the operator, state, encode and produce at {0.80 / 1.5 - 0.50:.2f} s")
    # a peer fast enough that the source and plumbing alone (0.50) take longer than 1.5× allows (0.70 / 1.5)
    record_peers([paired("bins, final only", [f("ours", 100_000, 0.75)], [f("fast", 100_000, 0.70)], 1.5,
                         ours_alone=final.ours_alone, peer_alone=final.peer_alone), three, cnt],
                 {"bins": bins, "count": count}, _table(("result",), ("bins",)))
    b = _rows(data, ["peers-bins-final"])["peers-bins-final"]["values"]
    assert b["need_said"] == "less than the source and the plumbing alone take (0.50): out of reach for any operator"
    c = rows["peers-count"]["values"]
    assert (c["ratio"], c["met"], c["error"], c["checked"]) == (f"{1.8 / 0.7:.2f}", "met", "0.99%", "30,000")
    assert (c["spread"], c["rounds"]) == (f"{1.8 / 0.7:.2f}", "one round")  # one round: its own ratio
    m = rows["peers-memory"]["values"]
    assert (m["final"], m["three"], m["peer_bins"], m["final_d"], m["three_d"]) == ("2.40", "3.30", "3.00", "−20 %",
                                                                                      "+10 %")
    assert m["met"] == "**missed**"  # all three outputs took more than the peer


def test_scale_rows(data):
    from ctiflow.bench.state_scale import DelayRow, Row, record_delay, record_scale

    def row(kind, live, seconds, share):
        return Row(kind, live, 1_000_000, seconds, 1.0, 2.0, 10.0, share, 1.0, 1, 2000.0, 10.0)

    rows = [row("identity", 10_000, 5.0, 0.0)] + [
        row(k, live, s, sh) for k, base in (("count", 10.0), ("match", 12.0), ("bins", 4.0))
        for live, s, sh in ((10_000, base, 0.05), (3_000_000, base * 1.25, 0.12 if k != "bins" else 0.2))] + [
        row("bins, cache_chunks 0", 3_000_000, 9.0, 0.3)]
    record_scale(rows, _table(("operator",), ("count",)))
    v = _rows(data, ["scale"])["scale"]["values"]
    assert (v["count_lo"], v["count_hi"], v["count_x"], v["bins_x"]) == ("100.0k", "80.0k", "0.80", "0.80")
    assert (v["share_cm"], v["share_bins"], v["met"], v["state_met"]) == ("5–12 %", "5–20 %", "met", "**missed**")
    record_delay([DelayRow(10, 18_000, 30.0, 40.0, 1.0, 1.0, 1), DelayRow(600, 1_200_000, 39.0, 50.0, 1.0, 1.0, 1)],
                 _table(("cti.delay",), ("10 s",)))
    d = _rows(data, ["scale-cti-delay"])["scale-cti-delay"]["values"]
    assert (d["ratio"], d["met"], d["buffered_lo"], d["buffered_hi"]) == ("1.30", "**missed**", "18k", "1.2M")


def test_sparse_spark_row(data):
    from ctiflow.bench.state_scale import Row, record_sparse

    def row(kind, live, seconds):
        return Row(kind, live, 1_000_000, seconds, 1.0, 2.0, 10.0, 0.1, 1.0, 1, 2000.0, 10.0)

    rows = [row("identity", 10_000, 5.0)] + [
        row(f"{k}, chunk_keys 2048", live, base * f) for k, base in (("count", 10.0), ("match", 12.0), ("bins", 4.0))
        for live, f in ((3_000_000, 1.6 if k == "bins" else 1.2), (10_000, 1.0), (1_000_000, 1.1))]
    record_sparse([rows], _table(("operator",), ("count",)), "scale-sparse-spark")
    v = _rows(data, ["scale-sparse-spark"])["scale-sparse-spark"]["values"]
    assert (v["identity"], v["count_rate"], v["count_1m"], v["count_3m"]) == ("200.0k", "100.0k", "0.91", "0.83")
    assert (v["bins_rate"], v["bins_3m"], v["met"]) == ("250.0k", "0.62", "**missed**")
    record_sparse([[row(k, live, base) for k, base in (("count", 10.0), ("match", 12.0), ("bins", 4.0))
                    for live in (10_000, 1_000_000, 3_000_000)]], _table(("operator",), ("count",)))  # one process
    v = _rows(data, ["scale-sparse"])["scale-sparse"]["values"]
    assert (v["count_rate"], v["match_1m"], v["bins_3m"], v["met"]) == ("100.0k", "1.00", "1.00", "met")


def test_sparse_rows_over_several_runs_record_each_ratios_median_and_meet_only_if_every_run_does(data):
    """Three runs: a ratio recorded is the median of its three (each against its own run's 10k row),
    the target met only if every run's every ratio is ≥ 0.8; the spread table shows each run."""
    from rich.console import Console

    from ctiflow.bench.state_scale import Row, record_sparse, spread_table

    def run(identity_s, count, match, bins):  # seconds a million events take at 10k, 1M, 3M keys
        def row(kind, live, seconds):
            return Row(kind, live, 1_000_000, seconds, 1.0, 2.0, 10.0, 0.1, 1.0, 1, 2000.0, 10.0)
        return [row("identity", 0, identity_s)] + [row(k, live, s) for k, times in
                                                   (("count", count), ("match", match), ("bins", bins))
                                                   for live, s in zip((3_000_000, 10_000, 1_000_000), times)]

    every = [run(5.0, (12.5, 10.0, 11.0), (15.0, 12.0, 12.0), (5.0, 4.0, 4.0)),   # count 0.91 / 0.80
             run(4.0, (10.0, 10.0, 10.0), (24.0, 12.0, 12.0), (4.0, 4.0, 4.0)),   # match 3M 0.50 here
             run(6.0, (20.0, 16.0, 16.0), (12.0, 12.0, 12.0), (4.4, 4.0, 4.0))]
    table = spread_table(every)
    out = Console(file=open("/dev/null", "w"), width=300, record=True)
    out.print(table)
    text = out.export_text()
    assert "0.50×" in text and "83,333 (1.00×)" in text  # (match at 3M in run 2; match at 10k in run 1)
    record_sparse(every, table, "scale-sparse-spark")
    v = _rows(data, ["scale-sparse-spark"])["scale-sparse-spark"]["values"]
    assert v["identity"] == "200.0k"  # median of 200k, 250k, 166.7k
    assert (v["count_rate"], v["count_1m"], v["count_3m"]) == ("100.0k", "1.00", "0.80")  # 0.91/1/1, 0.80/1/0.80
    assert (v["match_1m"], v["match_3m"], v["bins_3m"], v["met"]) == ("1.00", "0.80", "0.91", "**missed**")
    record_sparse([every[0], every[2]], table, "scale-sparse-spark")
    assert _rows(data, ["scale-sparse-spark"])["scale-sparse-spark"]["values"]["met"] == "met"


def test_soak_row(data):
    from ctiflow.bench.soak import record_soak

    state = [3.0, 8.0, 14.0, 15.0, 15.1, 15.0, 15.1, 15.0]
    rows = [{"minute": i + 1, "pss_mb": 2000.0 + 10 * i, "state_mb": s, "p50": 0.5 + i / 100, "p99": 1.0 + i / 10}
            for i, s in enumerate(state)]
    record_soak(rows, {"produced": 240_000, "final_bins": 1_234}, True, _table(("minute",), ("1",)))
    v = _rows(data, ["soak"])["soak"]["values"]
    assert (v["flat_from"], v["state"], v["p50"], v["p99"]) == ("4", "15.0", "0.53–0.57", "1.70")
    assert (v["pss"], v["minutes"], v["flows"], v["met"]) == ("2.04–2.07", "4", "240,000", "met")


def test_match_rows(data):
    from ctiflow.bench.match_operator import record_match

    def pattern(rate, flink=None, sql=None):
        row = {"operator": {"events_per_s": rate}, "flink": flink}
        if sql:
            row["sql"] = {"events_per_s": sql}
        return row

    r = {"flink": {"installed": True}, "patterns": {
        "strict_sequence": pattern(300e3, {"net_events_per_s": 150e3, "events_per_s": 100e3, "matches": 1}, sql=270e3),
        "within": pattern(60e3, {"net_events_per_s": 50e3, "events_per_s": 40e3, "matches": 1}),
        "followed_by_any": pattern(90e3, {"expressible": False})},
        "hot_key": [{"events": 200, "sql": {"seconds": 0.1, "state_bytes": 1}, "pattern_api": {"seconds": 0.1, "state_bytes": 1},
                     "flink": {"seconds": 7.0, "scan_seconds": 2.0}},
                    {"events": 1_800, "sql": {"seconds": 6.0, "state_bytes": 300_000},
                     "pattern_api": {"seconds": 5.0, "state_bytes": 400_000}, "flink": {"error": "timed out after 600 s"}}]}
    record_match(r)
    rows = _rows(data, ["match-patterns", "match-sql", "match-hot-key"])
    p = rows["match-patterns"]["values"]
    assert (p["lo"], p["hi"], p["ratio_lo"], p["ratio_hi"], p["strict"], p["met"]) == (
        "60.0k", "300.0k", "1.20", "2.00", "2.00", "met")  # the pattern Flink cannot express has no ratio
    assert rows["match-sql"]["values"]["ratio"] == "0.90"
    h = rows["match-hot-key"]["values"]
    assert (h["time_x"], h["state_x"], h["sql_kb"], h["met"]) == ("1.20", "0.75", "300", "met")
    assert h["flink"] == "200 rows in 5 s (ours 0.10 s), 1,800 not done"


def _latency_rows(trigger, floor_p99, job_p99, run=0):
    base = {"trigger": trigger, "sent": 1000, "measured": 900, "p50": 100.0, "p95": 150.0, "batch_p50": 200.0,
            "batch_p99": 300.0, "run": run}
    return [{**base, "query": "stateless pass-through (the floor)", "kind": "floor", "p99": floor_p99},
            {**base, "query": "stateful pass-through", "kind": "stateful", "p99": floor_p99 * 1.6, "batch_p50": 320.0},
            {**base, "query": "transactions job: counts", "kind": "counts", "p99": job_p99},
            {**base, "query": "transactions job: matches", "kind": "matches", "p99": job_p99 - 10}]


def test_latency_row(data):
    from ctiflow.bench.latency import _record

    rows = (_latency_rows("100ms", 400.0, 1600.0) + _latency_rows("250ms", 500.0, 2000.0)
            + _latency_rows("1s", 1000.0, 2500.0))
    stages = [{"trigger": "250ms", "stateful_ms": 321.4, "python_ms": 212.6, "forward_ms": 24.4, "state_ms": 118.2,
               "written_mb": 21.96, "cached": 0.5}]
    _record(rows, stages)
    row = _rows(data, ["latency"])["latency"]
    v = row["values"]
    assert (v["p99_250"], v["floor_250"], v["ratio_250"], v["p99_1000"]) == ("2.00", "0.50", "4.00", "2.50")
    # the stateful floor is a floor, not the job: against the stateless one, never the job's worst
    assert (v["plumbing_250"], v["plumbing_ratio_250"], v["plumbing_batch_250"]) == ("0.80", "1.60", "320")
    at_250 = [r for r in row["table"] if r["trigger"] == "250ms"]
    assert [r["state written MB"] for r in at_250] == ["", "", "21.96", "21.96"]  # the floors have no stages
    assert [r["p99 / the floor's"] for r in at_250] == ["1.00×", "1.60×", "4.00×", "3.98×"]
    assert at_250[2]["stateful / Python / forwarding / state ms"] == "321 / 213 / 24 / 118"
    assert at_250[2]["chunks from the cache"] == "50%"
    assert all(r["state written MB"] == "" for r in row["table"] if r["trigger"] != "250ms")  # no stages measured
    assert (v["stateful_250"], v["python_250"], v["forward_250"], v["state_250"], v["written_250"], v["cached_250"]) == (
        "321", "213", "24", "118", "21.96", "50%")


def test_the_latency_row_is_the_last_runs_with_each_runs_p99_and_the_goal_judged_in_every_run(data):
    from ctiflow.bench.latency import _record

    def run(n, job_250):  # the stateful plumbing's p99 at 250 ms: 500 × 1.6 = 800 ms
        return (_latency_rows("100ms", 400.0, 600.0, n) + _latency_rows("250ms", 500.0, job_250, n)
                + _latency_rows("1s", 1000.0, 1200.0, n))

    # 700 ms: ≤ 850 and ≤ 1.5 × 800 · 900 ms: over 850 · 650 ms
    _record(run(0, 700.0) + run(1, 900.0) + run(2, 650.0), [])
    row = _rows(data, ["latency"])["latency"]
    v = row["values"]
    assert v["p99_250"] == "0.65" and v["p99_250_runs"] == "0.70 / 0.90 / 0.65"
    assert v["plumbing_250_runs"] == "0.80 / 0.80 / 0.80" and v["job_plumbing_250_runs"] == "0.88 / 1.12 / 0.81"
    assert (v["met_250"], v["met_runs_250"], v["runs"]) == ("**missed**", "2 of 3", "3")
    at_250 = [r for r in row["table"] if r["trigger"] == "250ms"]
    assert len(row["table"]) == 12 and [r["p99 ms"] for r in at_250] == ["500", "800", "650", "640"]
    assert at_250[2]["p99 ms, each run"] == "700 / 900 / 650" and at_250[2]["p95 ms"] == "150"
    _record(run(0, 700.0) + run(1, 640.0), [])
    assert _rows(data, ["latency"])["latency"]["values"]["met_250"] == "met"


def test_latency_row_waits_for_every_trigger(data):
    from ctiflow.bench.latency import _record

    before = data.read_text()
    _record(_latency_rows("250ms", 500.0, 2000.0), [])
    assert data.read_text() == before


def test_latency_stages_are_medians_of_the_measured_batches():
    from ctiflow.bench.latency import _stages

    def progress(batch, ts, rows=5, updates=100):
        return {"batchId": batch, "timestamp": ts, "numInputRows": rows,
                "stateOperators": [{"allUpdatesTimeMs": updates}]}

    progress_list = [progress(0, "2026-01-01T00:00:01.000Z", updates=9999),  # before the measured window
                     progress(1, "2026-01-01T00:00:30.000Z", updates=100),
                     progress(2, "2026-01-01T00:00:31.000Z", updates=300),
                     progress(3, "2026-01-01T00:00:32.000Z", rows=0, updates=9999),  # an idle batch
                     progress(4, "2026-01-01T00:00:33.000Z", updates=200)]
    counted = {b: {"python_us": 1000 * b, "forward_us": 100 * b, "state_us": 500 * b, "state_written": 2_000_000 * b,
                   "chunks_loaded": 10, "chunks_cached": 2 * b} for b in range(5)}
    got = _stages(progress_list, counted, "2026-01-01T00:00:20.000Z")
    assert got == {"stateful_ms": 200, "python_ms": 2.0, "forward_ms": 0.2, "state_ms": 1.0, "written_mb": 4.0,
                   "cached": pytest.approx((2 + 4 + 8) / 30)}  # over all measured batches, not a median
    assert _stages(progress_list[:1], counted, "2026-01-01T00:00:20.000Z") == {}


def test_a_run_records_at_the_defaults_and_runs_typed_as_its_default_is_one():
    """``ctiflow bench latency --runs 3`` is the default run (it records); any other count, an
    ``--events`` or a ``--trigger`` is not."""
    from rich.console import Console

    from ctiflow.bench import Options

    out = Console()
    assert Options(out).record and Options(out, runs=3).record
    assert not Options(out, runs=2).record and not Options(out, runs=4).record
    assert not Options(out, events=10).record and not Options(out, trigger=5).record
    assert Options(out, sparse=True, runs=2).record  # (the sparse-keys table records the median of its runs)


def test_peers_rounds_alternate_the_sides_order_and_tag_every_round_after_the_first():
    from ctiflow.bench.peers import rounds

    calls = []

    def side(name):
        def run(tag):
            calls.append(name + tag)
            return _figures(name + tag, 100_000, 1.0)
        return run

    got = rounds(3, {"peer": side("peer"), "final": side("final"), "three": side("three")})
    assert calls == ["peer", "final", "three", "three-r2", "final-r2", "peer-r2", "peer-r3", "final-r3", "three-r3"]
    assert [f.name for f in got["final"]] == ["final", "final-r2", "final-r3"]
