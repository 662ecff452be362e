"""The docker-compose stack, for real: jobs in Spark cluster mode (driver in a job container,
executors on the spark-worker container, checkpoints on the shared volume, replay markers in Kafka),
fed and read through the broker's published port, compared with the same independent oracles
as the embedded tests (``ctiflow.jobs.testing.oracle``). Faults: ``docker kill`` of a job container mid-stream
and a restart from its checkpoint; the worker container killed mid-batch and started again; the
broker container stopped for 30 s and started again while a job runs (handled as the embedded
outage test handles it: the stand-in broker is memory-only, see that test).

Inputs use one partition and ``max_offsets_per_trigger`` so the micro-batch cuts (and with them
the CTIs) are known to the oracle, as in ``test_operators``."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from integration_tests.conftest import COMPOSE_FILES, COMPOSE_PROJECT
from integration_tests.harness import produce, read
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.testing import oracle, workload

pytestmark = [pytest.mark.integration, pytest.mark.compose]

PER_BATCH = 150
DELAY_MS = 360_000


def flows_job(stack, name: str, src: str, outs: dict[str, str], policy: str = "drop") -> dict:
    """A bins + count job over one flows partition (the job container gets the broker, the Spark
    master and the checkpoint from its environment)."""
    return {"job": name, "kafka": {"bootstrap_servers": stack.bootstrap},
            "sources": [{"name": "flows", "topic": src, "schema": "flow", "key_field": "device",
                         "time_field": "start_time", "end_field": "end_time", "shape": "interval",
                         "partitions": 1, "measures": ["bytes", "packets"], "max_offsets_per_trigger": PER_BATCH,
                         "cti": {"delay": "6m", "policy": policy}}],
            "operators": [
                {"kind": "count", "name": "flows_per_device_10m", "window": {"time": "10m"}, "epsilon": 0.1,
                 "per_key": True, "emit": "per_event", "output": outs["counts"]},
                {"kind": "bins", "name": "per_minute", "bin_size": "1m", "measures": ["bytes"],
                 "outputs": {"final": outs["final"], "incremental": outs["incremental"]}}],
            "outputs": {"late": outs["late"], "dead_letter": outs["dlq"]},
            "spark": {"key_groups": 4, "checkpoint": f"/checkpoints/{name}"}}


def setup_flows(stack, prefix: str, n: int, seed: int):
    flows = workload.flows(n, devices=6, seed=seed, rate_per_s=0.5, late_fraction=0.03, late_by_ms=900_000)
    src = stack.topic(f"{prefix}-in")
    outs = {k: stack.topic(f"{prefix}-{k}") for k in ("counts", "final", "incremental", "late", "dlq")}
    kafka.create_topics(stack.bootstrap, {src: 1, **{t: 1 for t in outs.values()}})
    raw = [b"\x00not avro", b"\xc3\x01" + b"\x00" * 8 + b"unknown fingerprint"]
    produce(stack.bootstrap, src, "flow", flows, "device", raw=raw)
    return flows, src, outs, len(raw)


def assert_equals_oracle(stack, flows, outs, dead_letters: int,
                         earlier: dict[str, list[dict]] | None = None) -> dict[str, int]:
    """Every result topic against the oracle; each record once. ``earlier``: records of a topic
    read before a broker restart lost them (they count as if still there). Returns the figures
    checked."""
    earlier = earlier or {}

    def results(topic: str) -> list[dict]:
        return earlier.get(topic, []) + read(stack, topic)

    checked = oracle.check(oracle.to_events(flows, "device", "start_time", "end_time"), DELAY_MS,
                           oracle.even_cuts(len(flows) + dead_letters, PER_BATCH))
    admitted = oracle.admitted(checked)
    late_expected = sorted(c.event.offset for c in checked if c.status == oracle.LATE)
    assert late_expected, "the workload must contain late events for this test to mean something"
    counts = results(outs["counts"])
    exact = oracle.sliding_counts(checked, "time", 600_000)
    got, want = Counter((r["key"], r["time"]) for r in counts), Counter((e["key"], e["time"]) for e in exact)
    duplicates, losses = sum((got - want).values()), sum((want - got).values())
    assert got == want, f"counts: {duplicates} records too many, {losses} missing"
    expected = oracle.final_bins(checked, 60_000, 0, ["bytes"])
    final = results(outs["final"])
    assert sorted((r["key"], r["bin_start"]) for r in final) == sorted(expected), "each final bin exactly once"
    for r in final:
        assert math.isclose(r["measures"]["bytes"], float(expected[(r["key"], r["bin_start"])].measures["bytes"]),
                            rel_tol=1e-9, abs_tol=1e-6)
    inc = Counter()
    for r in results(outs["incremental"]):
        inc[(r["key"], r["bin_start"])] += r["measures"]["bytes"]
    for k, e in expected.items():
        assert math.isclose(inc[k], float(e.measures["bytes"]), rel_tol=1e-9, abs_tol=1e-6)
    late = results(outs["late"])
    assert sorted(r["offset"] for r in late) == late_expected
    dlq = results(outs["dlq"])
    assert len(dlq) == dead_letters
    records = len(counts) + len(final) + len(late) + len(dlq)
    return {"input": len(flows) + dead_letters, "admitted": len(admitted), "records_checked": records,
            "duplicates": duplicates, "losses": losses}


def test_a_job_in_cluster_mode_equals_the_oracle(compose_stack):
    flows, src, outs, bad = setup_flows(compose_stack, "cluster", 900, seed=41)
    name = f"cluster-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    done = compose_stack.run_job(flows_job(compose_stack, name, src, outs), name)
    print(f"\n[compose] job {name}: {time.monotonic() - started:.1f} s; last lines:\n"
          + "\n".join(done.stdout.strip().splitlines()[-3:]))
    console = done.stdout + done.stderr
    assert "Spark's own log:" in done.stderr and "TaskSetManager" not in console, \
        "the job's console shows ctiflow's lines, Spark's log goes to its file"
    assert "Python worker" not in console and "Traceback" not in console, console[-2000:]
    figures = assert_equals_oracle(compose_stack, flows, outs, bad)
    print(f"[compose] cluster mode: {figures}")
    # The executors ran on the worker, not in the job container.
    logs = compose_stack.docker("logs", f"{compose_stack_project()}-spark-worker-1").stdout + \
        compose_stack.docker("logs", f"{compose_stack_project()}-spark-worker-1").stderr
    assert "Asked to launch executor" in logs


def compose_stack_project() -> str:
    return COMPOSE_PROJECT


def wait_for_records(stack, topic: str, at_least: int, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = len(read(stack, topic))
        if n >= at_least:
            return n
        time.sleep(2)
    raise AssertionError(f"{topic}: fewer than {at_least} records after {timeout} s")


def test_a_killed_job_container_restarts_from_its_checkpoint_exactly_once(compose_stack):
    flows, src, outs, bad = setup_flows(compose_stack, "kill-job", 1500, seed=43)
    name = f"kill-job-{uuid.uuid4().hex[:6]}"
    spec = flows_job(compose_stack, name, src, outs)
    kills = 0
    for _ in range(2):  # two kills mid-stream, at increasing amounts of output
        run = compose_stack.job_command(spec, name, detach=True)
        subprocess.run(run, check=True, capture_output=True, timeout=120)
        seen = wait_for_records(compose_stack, outs["counts"], 150 * (kills + 1))
        compose_stack.docker("kill", name)
        kills += 1
        print(f"\n[compose] docker kill {name} after {seen} count records")
        compose_stack.docker("rm", "-f", name)
    compose_stack.run_job(spec, name)  # the restart runs to the end from the checkpoint
    figures = assert_equals_oracle(compose_stack, flows, outs, bad)
    print(f"[compose] job container killed {kills}x: {figures}")


def test_a_killed_worker_comes_back_and_the_results_equal_the_oracle(compose_stack):
    flows, src, outs, bad = setup_flows(compose_stack, "kill-worker", 1500, seed=47)
    name = f"kill-worker-{uuid.uuid4().hex[:6]}"
    spec = flows_job(compose_stack, name, src, outs)
    job = subprocess.Popen(compose_stack.job_command(spec, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    worker = f"{compose_stack_project()}-spark-worker-1"
    try:
        seen = wait_for_records(compose_stack, outs["counts"], 150)
        compose_stack.docker("kill", worker)
        print(f"\n[compose] docker kill {worker} after {seen} count records")
        time.sleep(5)
        compose_stack.docker("start", worker)
        out, err = job.communicate(timeout=900)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, f"the job did not survive the worker's loss:\n{out[-2000:]}\n{err[-2000:]}"
    figures = assert_equals_oracle(compose_stack, flows, outs, bad)
    print(f"[compose] worker killed once: {figures}")


def job_counters(stack, name: str, tmp_path) -> dict:
    """The running job's counters (its progress topic)."""
    from ctiflow.jobs.driver.checkpoint import ProgressLog, read_counters
    from ctiflow.jobs.driver.config import progress_topic

    return read_counters(ProgressLog(stack.bootstrap, progress_topic(name)))


def wait_for_received(stack, name: str, n: int, tmp_path, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = stack.docker("inspect", "-f", "{{.State.Running}}", name, check=False).stdout.strip()
        assert running == "true", f"job container {name} is not running:\n" + \
            stack.docker("logs", "--tail", "40", name, check=False).stderr
        counters = job_counters(stack, name, tmp_path)
        if counters.get("received", 0) >= n:
            return counters
        time.sleep(2)
    raise AssertionError(f"{name}: fewer than {n} records received after {timeout} s")


def produce_as_one_batch(bootstrap: str, topic: str, records: list[dict], raw: list[bytes]) -> None:
    """Records (then ``raw`` values) in one producer batch: the job, polling while this is
    produced, sees none or all of them, so its micro-batch cuts stay those of the oracle."""
    from ctiflow.jobs.avro.serde import AvroSerializer

    done = kafka.produce(bootstrap, topic, [*records, *raw], AvroSerializer("flow"), "device",
                         config={"linger.ms": 30_000, "batch.num.messages": 100_000, "batch.size": 1_000_000})
    assert done.unflushed == 0


def test_a_broker_restart_is_waited_out_and_the_results_equal_the_oracle(compose_stack, tmp_path):
    """The broker container stopped for 30 s and started again while the job (cluster mode) runs.

    As in the embedded outage test (``test_reliability``, ``bench/outage.py``): the stand-in
    broker (tansu, memory-only storage) comes back *empty* — no topic, record or consumer-group
    offset survives, the job's marker and progress topics included; its offsets and state live
    in its checkpoint on the volume. So, standing in for a real broker's durable log, the
    test re-creates the topics and produces the same input again (same records, same offsets)
    after the restart, and reads the results written before the outage *before* stopping the
    broker (they are lost with its memory). Results read before + results written after must be
    the oracle's, each record once. (With the official Kafka image the `kafka-data` volume keeps
    topics and records across a restart: then only the rest is produced, and only what the
    topics hold at the end is counted.)"""
    stack = compose_stack
    flows = workload.flows(1500, devices=6, seed=53, rate_per_s=0.5, late_fraction=0.03, late_by_ms=900_000)
    raw = [b"\x00not avro", b"\xc3\x01" + b"\x00" * 8 + b"unknown fingerprint"]
    first = 5 * PER_BATCH  # before the outage: whole micro-batches, so the cuts are the oracle's
    src = stack.topic("restart-broker-in")
    outs = {k: stack.topic(f"restart-broker-{k}") for k in ("counts", "final", "incremental", "late", "dlq")}
    topics = {src: 1, **{t: 1 for t in outs.values()}}
    kafka.create_topics(stack.bootstrap, topics)
    produce(stack.bootstrap, src, "flow", flows[:first], "device")
    name = f"restart-broker-{uuid.uuid4().hex[:6]}"
    spec = flows_job(stack, name, src, outs)
    # The outage must not make the partition idle (its CTI would then stop holding the stream's
    # back, and the oracle knows nothing of idleness): idle_timeout well beyond the outage.
    spec["sources"][0]["cti"]["idle_timeout"] = "10m"
    subprocess.run(stack.job_command(spec, name, until_end=False, detach=True), check=True, capture_output=True,
                   timeout=120)
    broker = f"{compose_stack_project()}-kafka-1"
    try:
        wait_for_received(stack, name, first, tmp_path)
        time.sleep(3)
        before = {t: read(stack, t) for t in outs.values()}
        assert before[outs["counts"]], "results must flow before the outage for this test to mean something"
        stack.docker("stop", broker)
        down = time.monotonic()
        time.sleep(30)
        assert stack.docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true", \
            "the job must wait the outage out, not fail"
        stack.docker("start", broker)
        for _ in range(60):
            if stack.docker("inspect", "-f", "{{.State.Health.Status}}", broker).stdout.strip() == "healthy":
                break
            time.sleep(1)
        outage = time.monotonic() - down
        kept = set(kafka.list_topics(stack.bootstrap)) & set(topics)
        # The source topic tells a durable broker from a memory-only one: the job never names it in
        # a metadata request, while its idle producers' metadata refresh after the reconnect names
        # the output topics they wrote to, and tansu auto-creates a topic a metadata request names
        # (empty, one partition) — so outputs may be back before the test re-creates anything.
        durable = src in kept
        if "docker-compose.offline.yml" in COMPOSE_FILES:
            assert not durable, "the stand-in broker is memory-only: a restarted one lost the input topic"
        if durable:  # a broker with a durable log (the official image and its volume): only the rest
            assert kept == set(topics), f"some topics survived the restart, some not: {sorted(kept)}"
            before = {}
            produce_as_one_batch(stack.bootstrap, src, flows[first:], raw)
        else:  # memory-only: the same input again (same offsets), then the rest — and the job's own
            from ctiflow.jobs.driver.config import parse  # marker and progress topics went with it too

            kafka.create_topics(stack.bootstrap, {**topics, **parse(spec, name).written_topics()})
            produce_as_one_batch(stack.bootstrap, src, flows, raw)
        # the progress topic of a memory-only broker counts anew from the restart: the records after `first`
        counters = wait_for_received(stack, name, len(flows) + len(raw) - (0 if durable else first), tmp_path)
        print(f"\n[compose] broker container stopped for {outage:.0f} s (restarted empty) after "
              f"{sum(map(len, before.values()))} result records; the job waited and resumed: {counters}")
        stack.docker("stop", "-t", "60", name)
        stopped = stack.docker("logs", "--tail", "20", name, check=False)
        assert "stopped on SIGTERM" in stopped.stderr and "Traceback" not in stopped.stderr, stopped.stderr
    finally:
        stack.docker("rm", "-f", name, check=False)
        if stack.docker("inspect", "-f", "{{.State.Running}}", broker, check=False).stdout.strip() != "true":
            stack.docker("start", broker, check=False)
    stack.run_job(spec, name)  # drain: the rest from the checkpoint, final CTI (as `ctiflow drain`)
    figures = assert_equals_oracle(stack, flows, outs, len(raw), earlier=before)
    print(f"[compose] broker restarted once: {figures}")


def prometheus(query_path: str, **params) -> dict:
    """Prometheus's HTTP API on the host (published on 127.0.0.1:9090)."""
    import json
    import urllib.parse
    import urllib.request

    url = f"http://127.0.0.1:9090{query_path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def instant(query: str) -> list[tuple[dict, float]]:
    return [(r["metric"], float(r["value"][1])) for r in prometheus("/api/v1/query", query=query)["result"]]


def firing(alert: str, **labels) -> bool:
    return any(a["labels"].get("alertname") == alert and a["state"] == "firing"
               and all(a["labels"].get(k) == v for k, v in labels.items())
               for a in prometheus("/api/v1/alerts")["alerts"])


def eventually(check, timeout: float, what: str, every: float = 2.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as exc:  # Prometheus not answering yet
            last = exc
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def test_prometheus_scrapes_the_jobs_and_spark_and_alerts_on_faults(compose_stack):
    """The compose stack's Prometheus (deploy/prometheus/): its configuration and rules pass
    promtool; it scrapes a running job (as the job-flows service) with the values the input
    implies, the driver's and the master's Spark metrics; CtiflowDeadLettersRising fires after a
    burst of malformed records and CtiflowJobDown after the job's container stops — neither before."""
    stack = compose_stack
    checked = subprocess.run(stack.command("run", "--rm", "--no-deps", "--entrypoint", "promtool", "prometheus",
                                           "check", "config", "/etc/ctiflow/prometheus.yml"),
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    subprocess.run(stack.command("up", "-d", "--wait", "--no-deps", "prometheus"), check=True, capture_output=True,
                   timeout=300)
    flows = workload.flows(600, devices=6, seed=61, rate_per_s=0.5, late_fraction=0.03, late_by_ms=900_000)
    src = stack.topic("prom-in")
    outs = {k: stack.topic(f"prom-{k}") for k in ("counts", "final", "incremental", "late", "dlq")}
    kafka.create_topics(stack.bootstrap, {src: 1, **{t: 1 for t in outs.values()}})
    produce(stack.bootstrap, src, "flow", flows, "device")  # no malformed record yet
    name = f"prom-{uuid.uuid4().hex[:6]}"
    spec = flows_job(stack, name, src, outs)
    spec["spark"]["trigger"] = "2s"
    spec["sources"][0]["cti"]["idle_timeout"] = "10m"
    subprocess.run(stack.job_command(spec, name, until_end=False, detach=True, as_service=True), check=True,
                   capture_output=True, timeout=120)
    try:
        eventually(lambda: instant(f'sum(ctiflow_records_received_total{{job="{name}"}})') == [({}, len(flows))],
                   300, f"Prometheus has {name}'s input counted")
        assert instant(f'ctiflow_records_dead_letter_total{{job="{name}"}}')[0][1] == 0
        frontier = max(f["start_time"] for f in flows)
        cti = instant(f'ctiflow_partition_cti_timestamp_seconds{{job="{name}",stream="flows",partition="0"}}')
        assert cti and cti[0][1] == pytest.approx((frontier - DELAY_MS) / 1000)
        assert instant(f'ctiflow_state_keys{{job="{name}",operator="flows_per_device_10m"}}')[0][1] > 0
        written = {m["topic"]: v for m, v in instant(f'ctiflow_records_written_total{{job="{name}"}}')}
        assert written.get(outs["counts"], 0) > 0 and not written.get(outs["dlq"])
        assert instant('up{job="ctiflow",instance="job-flows:9464"}')[0][1] == 1
        eventually(lambda: instant('up{job="spark-driver",instance="job-flows:4040"}') == [
            ({"__name__": "up", "job": "spark-driver", "instance": "job-flows:4040"}, 1.0)], 60,
            "the driver's Spark metrics are scraped")
        assert instant('count({job="spark-driver",__name__=~"metrics_.*"})')[0][1] > 10  # Spark's own series
        assert instant('up{job="spark-master"}')[0][1] == 1
        assert instant('count({job="spark-master",__name__=~"metrics_master_.*"})')[0][1] > 0

        # `ctiflow status` reads the stack's Prometheus (its default when given no job): the job's line,
        # once Prometheus holds two samples of the input to take a rate over (a series seen once has none).
        eventually(lambda: instant(f'rate(ctiflow_records_received_total{{job="{name}"}}[1m])'), 60,
                   "Prometheus has an input rate")
        view = subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "status", "--once"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "COLUMNS": "90"})
        assert view.returncode == 0, view.stderr
        line = next(row for row in view.stdout.splitlines() if row.startswith(f"{name}: "))
        assert "CTI " in line and "dead-letter 0" in line and "state " in line and "lag " in line, line
        assert "state -" not in line and " in -" not in line, line  # Prometheus's state series and input rate
        time.sleep(12)  # two more evaluations with every record counted and none dead-lettered
        assert not firing("CtiflowDeadLettersRising", job=name)
        produce_as_one_batch(stack.bootstrap, src, [], [b"\x00burst %d" % i for i in range(50)])
        eventually(lambda: instant(f'ctiflow_records_dead_letter_total{{job="{name}"}}')[0][1] == 50, 120,
                   "the burst is counted")
        eventually(lambda: firing("CtiflowDeadLettersRising", job=name), 60, "CtiflowDeadLettersRising fires")

        assert not firing("CtiflowJobDown", instance="job-flows:9464")
        stack.docker("stop", "-t", "60", name)
        eventually(lambda: firing("CtiflowJobDown", instance="job-flows:9464"), 90, "CtiflowJobDown fires")
    finally:
        stack.docker("rm", "-f", name, check=False)
        subprocess.run(stack.command("stop", "prometheus"), capture_output=True, timeout=120)


def test_the_demo_puts_its_rule_and_the_transactions_job_fills_rule_matches(compose_stack):
    """`docker compose --profile demo up` as a user runs it, the transactions job as its service:
    the demo producer puts the demo's rule (two versions of `large`) before the events, the job
    judges each event by the version in effect at its time, and `ctiflow rules list` on the host
    reads back from the job's own topics that it applied both. Run again, the producer puts
    nothing twice."""
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.recognize import job_schema_store
    from ctiflow.jobs.driver.rules import list_rules
    from ctiflow.jobs.ops.demo import EXAMPLES

    stack = compose_stack
    # `up` runs init first (the stand-in broker of an earlier test may have been restarted, empty)
    init = subprocess.run(stack.command("run", "--rm", "init"), capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stdout + init.stderr
    produced = subprocess.run(stack.command("--profile", "demo", "run", "--rm", "--no-deps", "demo-producer"),
                              capture_output=True, text=True, timeout=600)
    assert produced.returncode == 0, produced.stdout + produced.stderr
    assert produced.stdout.count("rule 'large' version") == 2, produced.stdout
    os.environ["CTIFLOW_BOOTSTRAP"] = stack.bootstrap  # (the host's view of the stack's broker)
    try:
        cfg = load(EXAMPLES / "demo-transactions.yaml")
        subprocess.run(stack.command("up", "-d", "--no-deps", "job-transactions"), check=True, capture_output=True,
                       timeout=300)
        store = job_schema_store(cfg)

        def both_versions() -> list[dict]:
            got = read(stack, "rule-matches", store)
            return got if {r["rule_version"] for r in got} >= {1, 2} else []

        matches = eventually(both_versions, 600, "rule-matches holds matches of both versions", every=5)
        judged = list_rules(cfg)["large-after-abroad"]
        assert [(j.rule.version, j.judged) for j in judged] == [(1, "applied"), (2, "applied")]
        effective = {j.rule.version: j.effective for j in judged}
        for r in matches:
            assert r["rule_effective_time"] == effective[r["rule_version"]]
            first, large = r["stages"][0]["events"][0], r["stages"][-1]["events"][-1]
            assert first["event_time"] >= effective[r["rule_version"]]
            if r["rule_version"] == 1:
                assert first["event_time"] < effective[2]  # (drain: version 1 starts no run from version 2 on)
            assert large["amount"] > (1000 if r["rule_version"] == 1 else 500)
        again = subprocess.run(stack.command("--profile", "demo", "run", "--rm", "--no-deps", "demo-producer"),
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 0 and "rule 'large' is there already; not put again" in again.stdout, \
            again.stdout + again.stderr
        assert [j.rule.version for j in list_rules(cfg)["large-after-abroad"]] == [1, 2]
    finally:
        os.environ.pop("CTIFLOW_BOOTSTRAP", None)
        subprocess.run(stack.command("rm", "-s", "-f", "job-transactions"), capture_output=True, timeout=180)
