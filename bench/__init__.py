"""Benchmarks: figures for people, printed as tables; every figure is compared in the same run
against a baseline. Tests never assert wall-clock times; they only smoke-test correctness."""

from __future__ import annotations

from rich.console import Console

BENCHES = ("source", "adapter", "count", "bins", "match", "rules", "reliability", "scale", "peers", "latency")
#: Run only when named (not part of ``all``): the soak takes ``minutes`` (30 by default).
LONG_BENCHES = ("soak",)


def run_benchmarks(which: str, events: int | None = None, out: Console | None = None,
                   trigger: int | None = None, minutes: float | None = None, cti_delay: bool = False) -> None:
    out = out or Console(width=200)
    names = BENCHES if which == "all" else (which,)
    # A run at a benchmark's defaults writes its rows of bench/figures.yaml (ctiflow.bench.figures).
    rec = events is None and trigger is None
    for name in names:
        if name not in BENCHES + LONG_BENCHES:
            raise SystemExit(f'Invalid benchmark "{name}". Valid choices are: all, '
                             f'{", ".join(BENCHES + LONG_BENCHES)}.')
        if name == "soak":
            from ctiflow.bench.soak import main as soak_main

            result = soak_main(out, minutes=30.0 if minutes is None else minutes,
                               record_figures=rec and minutes is None)
            if not result["ok"]:
                raise SystemExit("soak: the results do not match the oracle (see above)")
        if name == "source":
            from ctiflow.bench.source import main as source_main

            source_main(out, events=events or 1_000_000, record_figures=rec)
        elif name == "adapter":
            from ctiflow.bench.spark_jobs import bench_adapter

            bench_adapter(events or 2_400_000, out, trigger or 200_000, record_figures=rec)  # 12 batches, 6 measured (WARM_UP)
        elif name == "count":
            from ctiflow.bench.count_operator import main as count_main

            count_main([] if events is None else ["--events", str(events)])
            from ctiflow.bench.spark_jobs import bench_count_e2e

            bench_count_e2e(events or 500_000, out)
        elif name == "bins":
            from ctiflow.bench.bins_spark import bench_bins

            bench_bins(events or 200_000, out, trigger or 50_000)
        elif name == "match":
            from ctiflow.bench.match_operator import main as match_main

            match_main(events, record_figures=rec)
        elif name == "scale" and cti_delay:
            from ctiflow.bench.state_scale import delay_main

            delay_main(out, record_figures=rec)
        elif name == "scale":
            from ctiflow.bench.state_scale import delay_main, main as scale_main, spark_main as scale_spark

            scale_spark(out, per_batch=trigger or 200_000, record_figures=rec)
            scale_main(out)
            delay_main(out, record_figures=rec)
        elif name == "peers":
            from ctiflow.bench.peers import main as peers_main

            peers_main(out, events=events, trigger=trigger, record_figures=rec)
        elif name == "latency":
            from ctiflow.bench.latency import main as latency_main

            latency_main(out, record_figures=rec)
        elif name == "rules":
            from ctiflow.bench.rules import main as rules_main

            rules_main(out, events_n=events or 100_000, record_figures=rec)
        elif name == "reliability":
            from ctiflow.bench.reliability import main as reliability_main

            reliability_main(out, events=events or 20_000)
