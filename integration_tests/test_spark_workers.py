"""The Python workers of ctiflow's Spark session fork from ``ctiflow.jobs.datapath.spark_daemon``: pandas,
pyarrow and ctiflow are imported and frozen out of the cyclic collector before the fork, so
their pages are shared, not copied into every worker."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_python_workers_fork_from_the_daemon_with_ctiflows_modules_imported(spark):
    def probe(batches):  # (nested: cloudpickle ships it by value)
        import gc
        import os
        import sys

        import pandas as pd

        for batch in batches:
            yield pd.DataFrame({"pid": [os.getpid()] * len(batch), "frozen": [gc.get_freeze_count()] * len(batch),
                                "preloaded": ["ctiflow.jobs.datapath.adapter" in sys.modules and "ctiflow.jobs.datapath.sink" in sys.modules] * len(batch)})

    rows = spark.range(8, numPartitions=4).mapInPandas(probe, "pid long, frozen long, preloaded boolean").collect()
    assert len(rows) == 8
    # gc.freeze() ran in the parent before the fork: only ctiflow.jobs.datapath.spark_daemon calls it (PySpark's daemon does not)
    assert all(r["frozen"] > 10_000 and r["preloaded"] for r in rows), rows[:2]




def test_a_jobs_key_groups_find_their_chunks_decoded_every_micro_batch_whichever_worker_runs_them(
        stack, spark, tmp_path):
    """A count per key over four key groups in the stateful stage's two tasks (the default
    ``spark.shuffle_partitions``): while records arrive (three partitions at uneven rates, a 250 ms
    trigger), every chunk the groups use after their first micro-batches comes decoded from their
    hosts' caches, none is read back from the state store, though Spark hands each task whichever
    of the stage's Python workers was idle longest (first in, first out). (Before the hosts, a task
    found its chunks in its worker's cache in 15 of 28 batches with a pool of the stateful stage's
    own workers, in none to half of them sharing the source's and the sink's:
    docs/performance.md#latency.)"""
    import threading
    import time

    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.driver import pipeline
    from ctiflow.jobs.driver.checkpoint import ProgressLog, latest_query
    from ctiflow.jobs.testing import workload
    from integration_tests.harness import job

    records = workload.transactions(16_000, accounts=60, seed=8, disorder_ms=1500)
    src = stack.topic("cache-in")
    kafka.create_topics(stack.bootstrap, {src: 3})
    cfg = job(stack, tmp_path, job="cache", sources=[{
        "name": "tx", "topic": src, "schema": "transaction", "key_field": "account", "time_field": "event_time",
        "partitions": 3, "cti": {"delay": "5s", "idle_timeout": "1h"}}],
        operators=[{"kind": "count", "name": "per_account_1m", "window": {"time": "1m"}, "per_key": True,
                    "output": stack.topic("cache-counts")}],
        state={"chunk_keys": 8}, spark={"trigger": "250ms"},
        outputs={"late": stack.topic("cache-late"), "dead_letter": stack.topic("cache-dlq")})
    assert cfg.key_groups == 4 and cfg.shuffle_partitions == 2
    serializer, stop = AvroSerializer("transaction"), threading.Event()

    def steady():  # 500 records a second, 2 : 1 : 2 over the partitions, until the job stops
        start = time.monotonic()
        for i, rec in enumerate(records):
            while i > 500 * (time.monotonic() - start):
                if stop.is_set():
                    return
                time.sleep(0.005)
            yield rec

    def produce() -> None:
        kafka.produce(stack.bootstrap, src, steady(), serializer, "account",
                      partition_of=lambda i, rec: (0, 0, 1, 2, 2)[i % 5])

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        pipeline.run(cfg, until_end=False, spark=spark, timeout=28)  # (its first batch: ≈ 12 s)
    finally:
        stop.set()
        producer.join()
    batches = [b for b in latest_query(ProgressLog.of(cfg).read()[0]) if b.get("chunks_loaded")]
    assert len(batches) >= 10, len(batches)
    later = batches[2:]  # (the first ones build the chunks)
    assert sum(b["chunks_loaded"] for b in later) > 4 * len(later)
    assert [b.get("chunks_cached", 0) for b in later] == [b["chunks_loaded"] for b in later]
    assert all(b.get("forward_us", 0) > 0 for b in batches), [b.get("forward_us") for b in batches]


def test_a_worker_ended_by_sighup_leaves_its_python_stack_in_the_tasks_error(spark):
    """PySpark's daemon ends its workers with SIGHUP when it shuts down (Spark restarts a daemon
    that does not hand it a worker in time); faulthandler covers fatal signals only, so such a task
    failed with "crashed:" and nothing after it. ``spark_daemon.stack_on_hangup`` has the worker
    dump its stack first: the error names the function the worker was in."""
    def hung_up_in_the_middle_of_a_task(batches):  # (nested: cloudpickle ships it by value)
        import os
        import signal

        for batch in batches:
            os.kill(os.getpid(), signal.SIGHUP)
            yield batch

    frame = spark.range(4, numPartitions=1).mapInPandas(hung_up_in_the_middle_of_a_task, "id long")
    with pytest.raises(Exception) as failed:  # the JVM's SparkException, as py4j hands it over
        frame.collect()
    message = str(failed.value)
    assert "exited unexpectedly (crashed)" in message, message[:2000]
    assert "hung_up_in_the_middle_of_a_task" in message, message[:2000]
    # and what a failed job test shows of Spark's log (integration_tests.harness.run)
    from integration_tests.harness import python_worker_lines

    assert "hung_up_in_the_middle_of_a_task" in python_worker_lines(spark)


def test_a_job_whose_python_workers_are_killed_while_it_runs_writes_each_result_once(stack, spark, tmp_path):
    """Three times while a job runs (batches back to back over three partitions at uneven rates, a
    count per key and a passthrough; up to six while no task was hit), the Python workers that are
    busy (used CPU in the last 0.1 s) are sent SIGKILL, whatever they are doing: reading the source, running the operators, writing. The tasks that
    lose their worker run again (the default master gives a task four attempts) and the sink's
    markers skip what a failed attempt wrote. Oracles: every input once in the passthrough topic;
    every count estimate once, its bounds holding the exact count of the input; Spark's log names each killed
    worker as not killed by its daemon, at least one task was lost and run again, and the batches'
    progress counts every failed attempt."""
    import re
    import threading
    import time
    from collections import Counter
    from pathlib import Path

    import psutil

    from ctiflow.jobs.testing import oracle
    from integration_tests.harness import job, read, run
    from integration_tests.test_own_topics import uneven_input

    events, src = uneven_input(stack, "kill-in")
    out, counts = stack.topic("kill-out"), stack.topic("kill-counts")
    cfg = job(stack, tmp_path, job=stack.topic("kill"),
              sources=[{"name": "tx", "topic": src, "schema": "transaction", "key_field": "account",
                        "time_field": "event_time", "partitions": 3, "max_offsets_per_trigger": 40,
                        "cti": {"delay": "30s"}}],
              operators=[{"kind": "passthrough", "output": out},
                         {"kind": "count", "name": "per_account_1m", "window": {"time": "1m"}, "per_key": True,
                          "output": counts}],
              spark={"trigger": "0s"},
              outputs={"late": stack.topic("kill-late"), "dead_letter": stack.topic("kill-dlq")})
    log = Path(spark.sparkContext._jvm.java.lang.System.getProperty("ctiflow.spark.log"))
    before = log.read_text(errors="replace")
    killed: list[int] = []
    stop = threading.Event()

    def workers() -> list:  # the daemons' children (the JVM's command line names the module too)
        forks = [p for p in psutil.process_iter(["cmdline"])
                 if (p.info["cmdline"] or [])[1:3] == ["-m", "ctiflow.jobs.datapath.spark_daemon"]]
        pids = {p.pid for p in forks}
        return [c for d in forks if d.ppid() not in pids for c in d.children()]

    def busy() -> list:  # the workers that used CPU time in the last 0.1 s: in a task
        seen = {}
        for worker in workers():
            try:
                seen[worker] = sum(worker.cpu_times()[:2])
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.1)
        running = []
        for worker, used in seen.items():
            try:
                if sum(worker.cpu_times()[:2]) > used:
                    running.append(worker)
            except psutil.NoSuchProcess:
                pass
        return running

    def lost_yet() -> bool:  # a task was hit (its attempt lost), per Spark's log
        return bool(re.search(r"Lost task .* Python worker exited unexpectedly",
                              log.read_text(errors="replace")[len(before):]))

    def kill_three_times() -> None:  # (three: a task that loses each time still has a fourth attempt)
        rounds = 0
        # (a worker busy a moment ago may have ended its task: up to three more rounds while no task
        # was hit yet — then no task has lost an attempt, so none can lose four)
        while (rounds < 3 or (rounds < 6 and not lost_yet())) and not stop.wait(2.0 if rounds else 1.0):
            while not stop.is_set() and not (running := busy()):
                pass
            for worker in running:
                try:
                    worker.kill()
                    killed.append(worker.pid)
                except psutil.NoSuchProcess:
                    pass
            rounds += 1

    killer = threading.Thread(target=kill_three_times, daemon=True)
    killer.start()
    try:
        summary = run(cfg, spark)
    finally:
        stop.set()
        killer.join()

    got = Counter(r["id"] for r in read(stack, out))
    assert got == Counter(e["id"] for e in events)  # nothing lost, nothing twice
    estimates = read(stack, counts)
    assert estimates and len({(r["key"], r["time"]) for r in estimates}) == len(estimates)  # none twice
    exact = oracle.exact_counts(cfg, estimates, lambda topic: read(stack, topic))
    for r in estimates:
        (at, count), = [e for e in exact[(r["counter"], r["key"])] if e[0] == r["time"]]
        assert r["lower"] <= count <= r["upper"], (r, count)
    assert read(stack, cfg.late_topic) == [] and read(stack, cfg.dead_letter_topic) == []
    after = log.read_text(errors="replace")[len(before):]
    assert killed
    named = set(map(int, re.findall(r"worker (\d+) ended by signal SIGKILL \(not sent by this daemon\)", after)))
    assert named and named <= set(killed), (named, killed)
    assert re.search(r"Lost task .* Python worker exited unexpectedly", after), "no task was hit"
    # the driver learned of each failed attempt (Spark logs one "Lost task" line an attempt): the
    # batches' progress, failedTaskAttempts from Spark's count per executor
    lost = len(re.findall(r"Lost task \d+\.\d+ in stage", after))
    assert sum(p.get("failedTaskAttempts", 0) for p in summary.progress) == lost
