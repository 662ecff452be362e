"""``ctiflow bench bins``: the binner alone, end to end, and the best Spark-native formulation.

Spark-native: each flow is exploded into the bins it overlaps with its fractional weight in
Spark SQL (``sequence`` + ``explode``), then summed per (device, bin) by a windowed aggregation
with a watermark — ``append`` mode (final bins only) and ``update`` mode (revisions). It has no
incremental mode and silently drops late rows (no late topic, no ADJUST). Its results go to the
``noop`` sink (writing Avro to Kafka would need a Python UDF), which favours the baseline; ours
go to three Avro result topics in Kafka. Two ceilings run in the same session: a stateless
pass-through of the flows to a topic (no operator), and the adapter's stateful plumbing with no
operator and no output (what any stateful job on this source costs at least).
"""

from __future__ import annotations

from rich.console import Console

from ctiflow.bench.spark_jobs import (Figures, PeakMemory, bench_stack, figures, passthrough_to_kafka, plumbing_ceiling,
                              run_job, table)


def produce_flows(bootstrap: str, topic: str, n: int) -> None:
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.testing import workload

    kafka.create_topics(bootstrap, {topic: 2})
    kafka.produce(bootstrap, topic, workload.flows(n, devices=1000, seed=1, rate_per_s=200.0),
                  AvroSerializer("flow"), "device")


def flow_source(topic: str, limit: int) -> dict:
    from ctiflow.bench.peers import flow_spec

    return flow_spec(topic, limit)


def spark_native(spark, bootstrap: str, topic: str, limit: int, home: str, mode: str) -> Figures:
    """The Spark SQL proration of :func:`ctiflow.bench.peers.native_bins` → ``noop``."""
    from ctiflow.bench.peers import native_bins

    agg = native_bins(spark, bootstrap, flow_source(topic, limit))[0]
    with PeakMemory() as mem:
        q = (agg.writeStream.format("noop").outputMode(mode).option("checkpointLocation", f"{home}/ck-native-{mode}")
             .trigger(availableNow=True).start())
        q.awaitTermination()
    return figures(f"Spark-native explode + window agg ({mode} mode) → noop", q.recentProgress, mem.peak)


def bench_bins(events: int, out: Console, limit: int = 50_000) -> None:
    from ctiflow.bench.bins_operator import run as operator_run

    alone = operator_run(events=min(events, 1_000_000))
    out.print(f"binner alone (pure Python, no Spark, all three outputs): {alone['events_per_s']:,.0f} events/s, "
              f"{alone['records_per_event']:.2f} records/event, conservation error {alone['max_relative_error']:.1e}")
    with bench_stack() as (bootstrap, spark, home):
        produce_flows(bootstrap, "bench-flows", events)
        native_append = spark_native(spark, bootstrap, "bench-flows", limit, home, "append")
        native_update = spark_native(spark, bootstrap, "bench-flows", limit, home, "update")
        # No operator at all: a job that reads this topic and writes each record to Kafka, and the
        # adapter's stateful plumbing with no operator and no output (the least any bins job costs).
        ceiling = passthrough_to_kafka(spark, bootstrap, flow_source("bench-flows", limit), home, "bench-flows-pass")
        floor = plumbing_ceiling(spark, bootstrap, flow_source("bench-flows", limit), home, forward=False)

        def bins_job(outputs: dict, name: str) -> Figures:
            return run_job(spark, {"job": f"bins-{len(outputs)}", "sources": [flow_source("bench-flows", limit)],
                                   "operators": [{"kind": "bins", "name": "per_minute", "bin_size": "1m",
                                                  "measures": ["bytes", "packets"], "outputs": outputs}],
                                   "spark": {"key_groups": 8}}, bootstrap, home, name)

        final_only = bins_job({"final": "bench-bins-final-only"},
                              "ctiflow bins, final only (what append mode gives; ADJUST, late topic) → Kafka")
        ours = bins_job({"incremental": "bench-bins-inc", "updated": "bench-bins-upd", "final": "bench-bins-final"},
                        "ctiflow bins (incremental+updated+final, ADJUST, late topic) → Kafka")
        table(f"ctiflow bench bins: {events:,} flows, 1,000 devices, 1-minute bins, {limit:,} flows a micro-batch",
              [native_append, native_update, ceiling, floor, final_only, ours], native_append, out)
