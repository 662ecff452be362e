"""`ctiflow bench peers` compares like with like: its native Spark formulations compute the same
results as ours, through the same Kafka sink (figures are not asserted; speed lives in the bench).

The input is the bench's own: three partitions keyed by device/account (uneven by the key hash),
records in arrival order with disorder."""

import math

from rich.console import Console

from ctiflow.bench.peers import INTERESTING, bench_bins, bench_count
from integration_tests.harness import read


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"))


def test_native_bins_in_spark_sql_equal_ours_on_every_bin_spark_closed(stack, spark, tmp_path):
    # 5 flows a second: 20 minutes of event time, so Spark's 6-minute watermark closes bins.
    peers, ladder = bench_bins(spark, stack.bootstrap, str(tmp_path), 6_000, 2_000, _quiet(), rate_per_s=5.0)
    assert [p.what for p in peers] == ["bins, final only", "bins, all three outputs"]
    assert all(f.events > 0 for f in ladder.rungs())
    native = {(r["key"], r["bin_start"]): r for r in read(stack, "peers-bins-native")}
    ours = {(r["key"], r["bin_start"]): r for r in read(stack, "peers-bins-final-only")}
    assert all(r["kind"] == "final" for r in ours.values())
    # Spark's append mode holds back the bins its watermark has not passed at the end of the
    # input; ours flushes them. Up to the last bin Spark closed, both have the same bins, with the
    # same sums.
    closed = max(r["bin_end"] for r in native.values())
    assert len(native) > len(ours) // 2
    assert set(native) == {k for k, r in ours.items() if r["bin_end"] <= closed}
    for k, n in native.items():
        o = ours[k]
        assert n["events"] == o["events"] and n["bin_end"] == o["bin_end"], k
        for name in ("bytes", "packets"):
            assert math.isclose(n["measures"][name], o["measures"][name], rel_tol=1e-9, abs_tol=1e-9), (k, name)
        assert math.isclose(n["fraction_sum"], o["fraction_sum"], rel_tol=1e-9, abs_tol=1e-12), k


def test_count_peer_is_the_exact_sliding_count_and_ours_error_is_measured(stack, spark, tmp_path):
    peers, ladder = bench_count(spark, stack.bootstrap, str(tmp_path), 6_000, 2_000, _quiet(), n_rounds=2)
    (count,) = peers
    # two rounds, each query on topics and checkpoints of its own: both sides read events in each round
    assert len(count.ratios) == 2 and all(r > 0 for r in count.ratios)
    ours = read(stack, "peers-counts")
    # every count record of ours was checked against the oracle's exact count, and is within ε
    assert count.checked == len(ours) > 0 and count.error_max <= 0.01 and count.error_ok
    native = read(stack, "peers-count-native")
    assert native and all(r["estimate"] == r["exact"] == r["lower"] == r["upper"] for r in native)
    # Spark's sliding windows are exact: recount one account's last window from the input.
    tx = [r for r in read(stack, "peers-tx") if r["amount"] > INTERESTING]
    last = max(native, key=lambda r: (r["time"], r["key"]))
    inside = [r for r in tx if r["account"] == last["key"] and last["time"] - 3_600_000 < r["event_time"] <= last["time"]]
    latest = max(r["exact"] for r in native if r["key"] == last["key"] and r["time"] == last["time"])
    assert latest == len(inside)
