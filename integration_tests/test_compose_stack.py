"""The docker-compose stack, for real: jobs in Spark cluster mode (driver in a job container,
executors on the spark-worker container, checkpoints and replay markers on the shared volume),
fed and read through the broker's published port, compared with the same independent oracles
as the embedded tests (``jobs.oracle``). Faults: ``docker kill`` of a job container mid-stream
and a restart from its checkpoint; the worker container killed mid-batch and started again.

Inputs use one partition and ``max_offsets_per_trigger`` so the micro-batch cuts (and with them
the CTIs) are known to the oracle, as in ``test_operators``."""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter

import pytest

from integration_tests.harness import produce, read
from jobs import kafka, oracle, workload

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


def assert_equals_oracle(stack, flows, outs, dead_letters: int) -> dict[str, int]:
    """Every result topic against the oracle; each record once. Returns the figures checked."""
    checked = oracle.check(oracle.to_events(flows, "device", "start_time", "end_time"), DELAY_MS,
                           oracle.even_cuts(len(flows) + dead_letters, PER_BATCH))
    admitted = oracle.admitted(checked)
    late_expected = sorted(c.event.offset for c in checked if c.status == oracle.LATE)
    assert late_expected, "the workload must contain late events for this test to mean something"
    counts = read(stack, outs["counts"])
    exact = oracle.sliding_counts(checked, "time", 600_000)
    got, want = Counter((r["key"], r["time"]) for r in counts), Counter((e["key"], e["time"]) for e in exact)
    duplicates, losses = sum((got - want).values()), sum((want - got).values())
    assert got == want, f"counts: {duplicates} records too many, {losses} missing"
    expected = oracle.final_bins(checked, 60_000, 0, ["bytes"])
    final = read(stack, outs["final"])
    assert sorted((r["key"], r["bin_start"]) for r in final) == sorted(expected), "each final bin exactly once"
    for r in final:
        assert math.isclose(r["measures"]["bytes"], float(expected[(r["key"], r["bin_start"])].measures["bytes"]),
                            rel_tol=1e-9, abs_tol=1e-6)
    inc = Counter()
    for r in read(stack, outs["incremental"]):
        inc[(r["key"], r["bin_start"])] += r["measures"]["bytes"]
    for k, e in expected.items():
        assert math.isclose(inc[k], float(e.measures["bytes"]), rel_tol=1e-9, abs_tol=1e-6)
    late = read(stack, outs["late"])
    assert sorted(r["offset"] for r in late) == late_expected
    dlq = read(stack, outs["dlq"])
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
    assert "Spark's own log:" in done.stderr and "TaskSetManager" not in done.stdout + done.stderr, \
        "the job's console shows ctiflow's lines, Spark's log goes to its file"
    figures = assert_equals_oracle(compose_stack, flows, outs, bad)
    print(f"[compose] cluster mode: {figures}")
    # The executors ran on the worker, not in the job container.
    logs = compose_stack.docker("logs", f"{compose_stack_project()}-spark-worker-1").stdout + \
        compose_stack.docker("logs", f"{compose_stack_project()}-spark-worker-1").stderr
    assert "Asked to launch executor" in logs


def compose_stack_project() -> str:
    from integration_tests.conftest import COMPOSE_PROJECT

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
        import subprocess

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
    import subprocess

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
