"""The count benchmark runs end to end on a small stream; only its correctness figures count."""

from __future__ import annotations

from ctiflow.bench.count_operator import run


def test_count_bench_small_run_keeps_epsilon_and_agrees_with_every_baseline():
    r = run(events=30_000, window=5_000, epsilon=0.05, batch=4_096, queries=200)
    assert r["max_relative_error"] <= 0.05
    assert r["bounds_hold"]
    assert r["batched_equals_checked"]
    assert r["scalar_equals_batched"]
    assert r["deque_exact_matches"]
    assert r["max_buckets"] <= r["bucket_bound"]
    assert r["final_bounds"][0] <= r["final_exact"] <= r["final_bounds"][1]
