"""Benchmark: the exponential histogram against the PyPI ``dgim`` package and an exact deque.

The seed article's experiment: a count-based window of the last N events, ε = 1%, a stream
whose events are interesting with probability 50%. One stream, all counters in the same run:

* ``ExponentialHistogram.update_many`` — the batched path (micro-batches of ``batch`` events);
* ``ExponentialHistogram.update`` — one call per event;
* ``dgim.Dgim`` (PyPI ``dgim``) — one call per event, its own error rate set to ε;
* a naive exact counter: a deque of the last N payloads and a running count.

Errors are checked at ``queries`` random positions against the exact count from prefix sums;
the batched and per-call histograms must end in the same state. Wall-clock figures are for
people; tests only look at the correctness figures.

    python -m ctiflow.bench.count_operator                   # the full run: 10M events, N = 1M
    python -m ctiflow.bench.count_operator --events 1000000  # a quick one
"""

from __future__ import annotations

import argparse
import math
import time
from collections import deque
from typing import Any

import numpy as np

from ctiflow.operators.histogram import ExponentialHistogram, buckets_per_size


def _segments(n: int, points: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) ranges ending at each query point (1-based counts of processed events)."""
    out, prev = [], 0
    for p in points.tolist():
        out.append((prev, p))
        prev = p
    if prev < n:
        out.append((prev, n))
    return out


def run(
    events: int = 10_000_000,
    window: int = 1_000_000,
    epsilon: float = 0.01,
    interesting: float = 0.5,
    *,
    batch: int = 100_000,
    queries: int = 1000,
    seed: int = 2013,
    baselines: bool = True,
) -> dict[str, Any]:
    """Run every counter over the same stream; return throughput, memory and error figures."""
    rng = np.random.default_rng(seed)
    payload = rng.random(events) < interesting
    stamps = np.arange(1, events + 1, dtype=np.int64)  # sequence numbers: count-based window
    prefix = np.concatenate(([0], np.cumsum(payload, dtype=np.int64)))
    points = np.unique(rng.integers(1, events + 1, size=min(queries, events)))
    point_set = set(points.tolist())

    def exact(p: int) -> int:  # interesting events among the first p, inside the last `window`
        return int(prefix[p] - prefix[max(0, p - window)])

    result: dict[str, Any] = {
        "events": events,
        "window": window,
        "epsilon": epsilon,
        "interesting": interesting,
        "batch": batch,
        "queries": len(points),
        "bucket_cap_per_size": buckets_per_size(epsilon),
    }

    # 1. batched path, timed on fixed micro-batches only
    eh = ExponentialHistogram(window, epsilon)
    t0 = time.perf_counter()
    for s in range(0, events, batch):
        eh.update_many(stamps[s : s + batch], payload[s : s + batch])
    elapsed = time.perf_counter() - t0
    result["eh_batched_s"] = elapsed
    result["eh_batched_updates_per_s"] = events / elapsed

    # 2. batched path again, cut at the query points, to check every query
    checked = ExponentialHistogram(window, epsilon)
    max_rel = 0.0
    max_buckets = 0
    bounds_hold = True
    seed_violations = 0
    for s, e in _segments(events, points):
        for b in range(s, e, batch):
            checked.update_many(stamps[b : min(e, b + batch)], payload[b : min(e, b + batch)])
        if e not in point_set:
            continue
        x = exact(e)
        est = checked.estimate()
        lower, upper = checked.bounds()
        bounds_hold &= lower <= x <= upper
        if x:
            max_rel = max(max_rel, abs(est - x) / x)
            seed_violations += abs(checked.seed_estimate() - x) > epsilon * x
        elif est:
            max_rel = math.inf
        max_buckets = max(max_buckets, checked.bucket_count)
    result["max_relative_error"] = max_rel
    result["bounds_hold"] = bool(bounds_hold)
    result["seed_estimate_violations"] = int(seed_violations)
    result["final_exact"] = exact(events)
    result["final_estimate"] = eh.estimate()
    result["final_bounds"] = eh.bounds()
    result["buckets"] = eh.bucket_count
    result["max_buckets"] = max(max_buckets, eh.bucket_count)
    result["interesting_in_window"] = exact(events)
    result["events_in_window"] = min(window, events)
    result["snapshot_bytes"] = len(eh.snapshot())
    result["batched_equals_checked"] = eh.buckets() == checked.buckets()
    result["bucket_bound"] = buckets_per_size(epsilon) * (math.log2(max(2, min(window, events))) + 1)

    if not baselines:
        return result

    bits = payload.tolist()
    seq = stamps.tolist()

    # 3. per-call path
    scalar = ExponentialHistogram(window, epsilon)
    update = scalar.update
    t0 = time.perf_counter()
    for s, e in _segments(events, points):
        for t, v in zip(seq[s:e], bits[s:e]):
            update(t, v)
    elapsed = time.perf_counter() - t0
    result["eh_scalar_updates_per_s"] = events / elapsed
    result["scalar_equals_batched"] = scalar.buckets() == eh.buckets()

    # 4. dgim (PyPI), same error rate, queried at the same points
    import dgim

    d = dgim.Dgim(window, epsilon)
    dgim_update = d.update
    dgim_rel = 0.0
    t0 = time.perf_counter()
    for s, e in _segments(events, points):
        for v in bits[s:e]:
            dgim_update(v)
        if e in point_set:
            x = exact(e)
            if x:
                dgim_rel = max(dgim_rel, abs(d.get_count() - x) / x)
    elapsed = time.perf_counter() - t0
    result["dgim_updates_per_s"] = events / elapsed
    result["dgim_buckets"] = d.nb_buckets
    result["dgim_max_relative_error"] = dgim_rel

    # 5. naive exact counter: the whole window in a deque
    window_bits: deque[bool] = deque()
    count = 0
    deque_ok = True
    t0 = time.perf_counter()
    for s, e in _segments(events, points):
        for v in bits[s:e]:
            if len(window_bits) == window:
                count -= window_bits.popleft()
            window_bits.append(v)
            count += v
        if e in point_set:
            deque_ok &= count == exact(e)
    elapsed = time.perf_counter() - t0
    result["deque_updates_per_s"] = events / elapsed
    result["deque_exact_matches"] = bool(deque_ok)
    result["speedup_vs_dgim"] = result["eh_batched_updates_per_s"] / result["dgim_updates_per_s"]
    result["scalar_speedup_vs_dgim"] = result["eh_scalar_updates_per_s"] / result["dgim_updates_per_s"]
    return result


def _table(r: dict[str, Any]) -> str:
    rows = [
        ("stream", f"{r['events']:,} events, window N = {r['window']:,}, ε = {r['epsilon']}, "
         f"{r['interesting']:.0%} interesting"),
        ("ExponentialHistogram.update_many", f"{r['eh_batched_updates_per_s'] / 1e6:8.1f} M updates/s "
         f"(batches of {r['batch']:,})"),
    ]
    if "dgim_updates_per_s" in r:
        rows += [
            ("ExponentialHistogram.update", f"{r['eh_scalar_updates_per_s'] / 1e6:8.2f} M updates/s"),
            ("dgim.Dgim.update (PyPI)", f"{r['dgim_updates_per_s'] / 1e6:8.2f} M updates/s"),
            ("exact deque counter", f"{r['deque_updates_per_s'] / 1e6:8.2f} M updates/s"),
            ("speed-up vs dgim", f"{r['speedup_vs_dgim']:8.1f}× batched, {r['scalar_speedup_vs_dgim']:.1f}× per call"),
        ]
    rows += [
        ("memory", f"{r['buckets']} buckets now, {r['max_buckets']} max (bound {r['bucket_bound']:.0f}), "
         f"{r['snapshot_bytes']:,} snapshot bytes; the window holds {r['events_in_window']:,} events, "
         f"{r['interesting_in_window']:,} interesting"),
        ("max relative error of estimate()", f"{r['max_relative_error']:.6f} over {r['queries']} queries "
         f"(ε = {r['epsilon']}); lower ≤ exact ≤ upper: {r['bounds_hold']}"),
        ("seed_estimate() beyond ε", f"{r['seed_estimate_violations']} of {r['queries']} queries"),
        ("final", f"estimate {r['final_estimate']}, exact {r['final_exact']}, bounds {r['final_bounds']}"),
    ]
    if "dgim_updates_per_s" in r:
        rows += [
            ("dgim", f"{r['dgim_buckets']} buckets, max relative error {r['dgim_max_relative_error']:.6f}"),
            ("cross-checks", f"per-call = batched state: {r['scalar_equals_batched']}; "
             f"deque = exact: {r['deque_exact_matches']}"),
        ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--window", type=int, default=1_000_000)
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--interesting", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--no-baselines", action="store_true", help="only the batched histogram")
    args = parser.parse_args(argv)
    r = run(
        args.events,
        args.window,
        args.epsilon,
        args.interesting,
        batch=args.batch,
        queries=args.queries,
        baselines=not args.no_baselines,
    )
    print(_table(r))


if __name__ == "__main__":
    main()
