"""Throughput of the proration binner alone (no Spark, no Kafka, no decoding).

Workload: network flows of ``keys`` hosts, flow starts spread evenly over application time
(``events_per_second`` flows per second of application time, all keys), each flow lasting
a uniform random time in ``[0, max_span_bins · bin_size]`` (so it touches 1 to
``max_span_bins + 1`` bins), with measures ``bytes`` and ``packets``. Events are created up
front and fed in application-time order; a CTI follows every ``cti_every`` events, then a
final CTI at +∞. Timed: ``process_columns`` (each CTI step's events as
:class:`~ctiflow.operators.columns.EventColumns`, built before the clock starts, as the source hands
them over) plus ``advance_to`` (building every output column), i.e. prorated events per second
of the operator itself. The pre-built
input is frozen out of the cyclic garbage collector (``gc.freeze``): a streaming job never
holds a million events at once, and scanning them would be charged to the operator.

Run ``python -m ctiflow.bench.bins_operator`` for the table; timing targets live here, never in tests.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

from ctiflow.operators.bins import Binner, BinSettings
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.time import CTI_INFINITY, Event, ViolationPolicy

MEASURES = ("bytes", "packets")


def make_events(events: int, bin_size: int, keys: int, max_span_bins: float,
                events_per_second: float, seed: int) -> list[Event]:
    """Flows in application-time order (start, partition, offset)."""
    rng = random.Random(seed)
    step_ms = 1000.0 / events_per_second
    longest = int(max_span_bins * bin_size)
    names = [f"host-{i:05d}" for i in range(keys)]
    out = []
    for i in range(events):
        start = int(i * step_ms)
        packets = rng.randint(1, 2000)
        out.append(Event(
            key=names[rng.randrange(keys)],
            start=start,
            end=start + rng.randint(0, longest),
            fields={"bytes": packets * rng.randint(40, 1500), "packets": packets},
            partition=0,
            offset=i,
            stream="flows",
        ))
    return out


def run(events: int = 1_000_000, bin_size: int = 60_000, keys: int = 1_000, cti_every: int = 10_000,
        max_span_bins: float = 5, outputs: frozenset[str] = frozenset({"incremental", "updated", "final"}),
        events_per_second: float = 1_000.0, seed: int = 1,
        flows: list[Event] | None = None) -> dict[str, Any]:
    """Feed the workload through one binner; return throughput and conservation figures."""
    if flows is None:
        flows = make_events(events, bin_size, keys, max_span_bins, events_per_second, seed)
    binner = Binner(BinSettings("flows", bin_size, measures=MEASURES, outputs=outputs,
                                policy=ViolationPolicy.ADJUST))
    counts = {"bin_incremental": 0, "bin_updated": 0, "bin_final": 0, "late": 0}
    final_sums = dict.fromkeys(MEASURES, 0.0)

    def consume(results: list) -> None:
        for o in results:
            if type(o) is tuple:  # (row, late records | refusal) of process_columns
                if isinstance(o[1], Exception):
                    raise o[1]
                counts["late"] += len(o[1])
                continue
            counts[o.role] += len(o)
            if o.role == "bin_final":
                measures = o.columns["measures"]
                for m, v in zip(measures.names, measures.values.sum(axis=1).tolist()):
                    final_sums[m] += v

    steps = [flows[lo: lo + cti_every] for lo in range(0, len(flows), cti_every)]
    columns = [EventColumns.from_events(step) for step in steps]

    gc.collect()
    gc.freeze()
    c0 = time.process_time()
    t0 = time.perf_counter()
    for i, cols in enumerate(columns):
        consume(binner.process_columns(cols))
        cti = steps[i + 1][0].start if i + 1 < len(steps) else steps[i][-1].start + 1
        consume(binner.advance_to(cti))
    t_stream = time.perf_counter() - t0
    t1 = time.perf_counter()
    snap = binner.snapshot()
    t_snapshot = time.perf_counter() - t1
    t2 = time.perf_counter()
    Binner.restore(binner.settings, snap)
    t_restore = time.perf_counter() - t2
    open_bins = binner.open_bins
    consume(binner.advance_to(CTI_INFINITY))
    elapsed = time.perf_counter() - t0 - t_snapshot - t_restore
    cpu = time.process_time() - c0 - t_snapshot - t_restore
    gc.unfreeze()
    input_sums = {m: float(sum(ev.fields[m] for ev in flows)) for m in MEASURES}
    return {
        "events": len(flows),
        "keys": keys,
        "bin_size": bin_size,
        "max_span_bins": max_span_bins,
        "outputs": ",".join(sorted(outputs)),
        "seconds": elapsed,
        "events_per_s": len(flows) / elapsed,
        "events_per_cpu_s": len(flows) / cpu,
        "records": counts,
        "records_per_event": sum(counts.values()) / len(flows),
        "open_bins_before_flush": open_bins,
        "snapshot_bytes": len(snap),
        "snapshot_ms": t_snapshot * 1e3,
        "restore_ms": t_restore * 1e3,
        "stream_seconds": t_stream,
        "input_sums": input_sums,
        "final_sums": final_sums,
        "max_relative_error": max(abs(final_sums[m] - input_sums[m]) / max(abs(input_sums[m]), 1.0)
                                  for m in MEASURES),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--bin-size", type=int, default=60_000)
    parser.add_argument("--cti-every", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per case (shared machines are noisy)")
    args = parser.parse_args()
    all3 = frozenset({"incremental", "updated", "final"})
    cases = [
        ("flows 0–5 bins, all outputs", dict(max_span_bins=5, outputs=all3)),
        ("flows 0–5 bins, final only", dict(max_span_bins=5, outputs=frozenset({"final"}))),
        ("flows 0–1 bin, all outputs", dict(max_span_bins=1, outputs=all3)),
        ("flows 0–0.1 bin, all outputs", dict(max_span_bins=0.1, outputs=all3)),
    ]
    print(f"{args.events:,} events, {args.keys:,} keys, bin {args.bin_size:,} ms, CTI every {args.cti_every:,} events, "
          f"best of {args.repeat}")
    print(f"{'case':<44} {'events/s':>10} {'events/CPU-s':>13} {'records/event':>14} "
          f"{'snapshot (size, ms)':>24} {'rel.err':>8}")
    for label, kw in cases:
        flows = make_events(args.events, args.bin_size, args.keys, kw["max_span_bins"], 1_000.0, 1)
        runs = [run(events=args.events, bin_size=args.bin_size, keys=args.keys, cti_every=args.cti_every,
                    flows=flows, **kw) for _ in range(args.repeat)]
        r = max(runs, key=lambda x: x["events_per_s"])
        cpu = max(x["events_per_cpu_s"] for x in runs)
        snap = f"{r['snapshot_bytes'] / 1024:,.0f} KiB {r['snapshot_ms']:.1f}/{r['restore_ms']:.1f}"
        print(f"{label:<44} {r['events_per_s']:>10,.0f} {cpu:>13,.0f} {r['records_per_event']:>14.2f} {snap:>24} "
              f"{r['max_relative_error']:>8.1e}")


if __name__ == "__main__":
    main()
