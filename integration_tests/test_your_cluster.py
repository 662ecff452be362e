"""ctiflow on the Spark cluster a user already has (integration_tests/cluster/docker-compose.cluster.yml):
a stock Spark master and three stock workers — the Spark stand-in image, no ctiflow, no volume —
and the checkpoints on an object store reached over HTTP (ObjectStoreFileSystem's ``http://``
store, its class shipped with ``--jars``: nothing ctiflow keeps is on a disk two nodes share).
ctiflow and its packages reach the workers in the environment archive of ``ctiflow submit``
(client mode: the driver runs where it is called).

* the demo jobs submitted from this machine's own installation — what a user with a cluster
  does, no ctiflow image anywhere in the cluster (the driver binds the compose network's gateway
  address, which the executors reach) — results equal to the same jobs on local Spark here;
* SIGKILL of a worker and of the driver (submitted from a container of the ctiflow image on the
  cluster's network) mid-stream, then a restart from the checkpoint on the object store: every
  result against the independent oracle of test_compose_stack, exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from integration_tests.conftest import COMPOSE_FILES, COMPOSE_PROJECT, ROOT
from integration_tests.harness import produce, read
from integration_tests.test_compose_stack import assert_equals_oracle, flows_job, setup_flows, wait_for_records
from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.driver.config import parse
from ctiflow.jobs.driver.recognize import job_schema_store
from ctiflow.jobs.testing import workload

pytestmark = [pytest.mark.integration, pytest.mark.compose]

CLUSTER_FILE = "integration_tests/cluster/docker-compose.cluster.yml"
WORKERS = 3
MASTER = "spark://stock-master:7077"
#: The object store's class on the classpath of the driver and (shipped by spark-submit) every executor.
STORE_CONF = {"spark.hadoop.fs.objstore.impl": "ObjectStoreFileSystem",
              "spark.hadoop.fs.objstore.root": "http://objstore:9000"}


class StockCluster:
    def __init__(self, stack, work: Path):
        self.stack, self.work = stack, work

    def command(self, *args: str) -> list[str]:
        files = [a for f in [*COMPOSE_FILES, CLUSTER_FILE] for a in ("-f", str(ROOT / f))]
        return ["docker", "compose", "-p", COMPOSE_PROJECT, *files, "--profile", "cluster", *args]

    def submit(self, spec: dict, name: str, *, detach: bool = False) -> list[str]:
        """``ctiflow submit`` of a job spec in a submitter container named ``name``."""
        (self.work / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        (self.work / f"{name}.yaml").chmod(0o644)
        return self.command("run", *(["-d"] if detach else ["--rm"]), "--name", name,
                            "-v", f"{self.work}:/jobs:ro", "submitter",
                            "submit", f"/jobs/{name}.yaml", "--master", MASTER, "--until-end",
                            "--jars", "/jobs/objstore.jar", "--conf", "spark.executor.cores=1",
                            "--conf", f"spark.cores.max={WORKERS}")

    def run(self, spec: dict, name: str, timeout: float = 900) -> subprocess.CompletedProcess:
        done = subprocess.run(self.submit(spec, name), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"job {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def worker(self, i: int) -> str:
        return f"{COMPOSE_PROJECT}-stock-worker-{i}"

    def address(self, container: str) -> str:
        return self.stack.docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                 container).stdout.strip()

    def submit_from_here(self, spec: dict, name: str, home: Path, timeout: float = 900) -> subprocess.CompletedProcess:
        """``ctiflow submit`` of this machine's installation: the driver here, bound to the compose
        network's gateway (the executors connect to it there), the master and the object store
        by their addresses on that network."""
        gateway = self.stack.docker("network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}",
                                    f"{COMPOSE_PROJECT}_default").stdout.strip()
        path = home / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        master = f"spark://{self.address(f'{COMPOSE_PROJECT}-stock-master-1')}:7077"
        env = {**os.environ, "SPARK_LOCAL_IP": gateway, "CTIFLOW_HOME": str(home)}
        done = subprocess.run([str(Path(sys.executable).parent / "ctiflow"), "submit", str(path), "--master", master,
                               "--until-end", "--jars", str(self.work / "objstore.jar"),
                               "--conf", "spark.executor.cores=1", "--conf", f"spark.cores.max={WORKERS}"],
                              capture_output=True, text=True, timeout=timeout, env=env)
        assert done.returncode == 0, f"job {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done


@pytest.fixture(scope="module")
def stock_cluster(compose_stack):
    work = Path(tempfile.mkdtemp(prefix="ctiflow-cluster-"))
    work.chmod(0o755)
    # The object store's FileSystem, compiled now against the pyspark jars (as test_reliability's).
    from ctiflow.jobs.driver.jvm import java_environment
    import pyspark

    java_environment()
    bin_dir = Path(os.environ["JAVA_HOME"]) / "bin"
    classes = work / "classes"
    subprocess.run([shutil.which("javac") or str(bin_dir / "javac"), "-d", str(classes), "-cp",
                    f"{Path(pyspark.__file__).parent / 'jars'}/*",
                    str(ROOT / "integration_tests" / "objectstore" / "ObjectStoreFileSystem.java")],
                   check=True, timeout=120)
    subprocess.run([shutil.which("jar") or str(bin_dir / "jar"), "cf", str(work / "objstore.jar"), "-C",
                    str(classes), "."], check=True, timeout=60)
    (work / "objstore.jar").chmod(0o644)
    cluster = StockCluster(compose_stack, work)
    up = subprocess.run(cluster.command("up", "-d", "--wait", "--scale", f"stock-worker={WORKERS}",
                                        "objstore", "stock-master", "stock-worker"),
                        capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, f"the stock cluster did not start:\n{up.stderr[-3000:]}"
    try:
        yield cluster
    finally:
        subprocess.run(cluster.command("rm", "-sfv", "objstore", "stock-master", "stock-worker"),
                       capture_output=True, timeout=300)
        shutil.rmtree(work, ignore_errors=True)


def demo_spec(name: str, suffix: str, sources: dict[str, str], bootstrap: str, checkpoint: str) -> dict:
    """An example job of examples/ with its input topics renamed to ``sources``, its result
    topics given ``suffix``, its own job name and checkpoint."""
    spec = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())
    spec["job"] = f"{name}-{suffix}"
    spec["kafka"] = {"bootstrap_servers": bootstrap}
    for src in spec["sources"]:
        src["topic"] = sources[src["topic"]]
    if spec.get("reference"):
        spec["reference"]["output"] += f"-{suffix}"
    for op in spec["operators"]:
        for field in ("output", "timed_out"):
            if field in op:
                op[field] += f"-{suffix}"
        for kind in op.get("outputs", {}):
            op["outputs"][kind] += f"-{suffix}"
        if "rules" in op:  # (an input: both runs read the same rules)
            op["rules"]["topic"] = sources[op["rules"]["topic"]]
    spec["spark"]["checkpoint"] = checkpoint
    return spec


def result_topics(spec: dict) -> list[str]:
    return sorted(parse(spec, "spec").result_topics())


def canonical(records: list[dict]) -> Counter:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in records)


def test_the_demo_jobs_on_stock_workers_via_submit_equal_the_local_run(stock_cluster, spark, tmp_path):
    stack = stock_cluster.stack
    tag = uuid.uuid4().hex[:6]
    out = tmp_path / "demo"
    subprocess.run([str(Path(sys.executable).parent / "ctiflow"), "demo-data", "--out", str(out),
                    "--transactions", "8000", "--flows", "2000"], check=True, capture_output=True, timeout=120)
    inputs = {"transactions": ("transaction", "account"), "accounts": ("account", "account"),
              "flows": ("flow", "device")}
    sources = {t: f"{t}-{tag}" for t in (*inputs, "transaction-rules")}
    kafka.create_topics(stack.bootstrap, {topic: 2 for topic in sources.values()})
    for topic, (schema, key) in inputs.items():
        records = [json.loads(line) for line in (out / f"{topic}.jsonl").read_text().splitlines()]
        produce(stack.bootstrap, sources[topic], schema, records, key)
    # The demo's rule, changed mid-stream, as `ctiflow demo` puts it
    from rich.console import Console

    from ctiflow.jobs.ops.demo import put_demo_rules

    tx = [json.loads(line) for line in (out / "transactions.jsonl").read_text().splitlines()]
    rules_job = parse(demo_spec("demo-transactions", f"rules-{tag}", sources, stack.bootstrap, str(tmp_path / "x")),
                      "rules")
    assert len(put_demo_rules(rules_job, tx, Console(file=open(os.devnull, "w")))) == 2

    compared = {}
    objects = f"http://{stock_cluster.address(f'{COMPOSE_PROJECT}-objstore-1')}:9000"
    for name in ("demo-flows", "demo-transactions"):
        # localhost:9094 is the broker here, and on each stock worker its forwarder (see the compose file)
        on_cluster = demo_spec(name, f"cluster-{tag}", sources, stack.bootstrap, f"objstore://bucket/{name}-{tag}")
        on_cluster["spark"]["conf"] = {**STORE_CONF, "spark.hadoop.fs.objstore.root": objects}
        local = demo_spec(name, f"local-{tag}", sources, stack.bootstrap, str(tmp_path / f"{name}-checkpoint"))
        started = time.monotonic()
        done = stock_cluster.submit_from_here(on_cluster, f"{name}-{tag}", tmp_path)
        print(f"\n[cluster] {name} on {WORKERS} stock workers: {time.monotonic() - started:.1f} s; "
              + done.stdout.strip().splitlines()[-1])
        console = done.stdout + done.stderr
        assert "Traceback" not in console and "TransformWithStateInPandas" not in console, console[-3000:]
        from ctiflow.jobs.driver import pipeline

        cfg = parse(local, "local")
        pipeline.run(cfg, until_end=True, spark=spark)
        store = job_schema_store(cfg)
        for mine in result_topics(on_cluster):
            theirs = mine.replace(f"cluster-{tag}", f"local-{tag}")
            got, want = canonical(read(stack, mine, store)), canonical(read(stack, theirs, store))
            assert got == want, (f"{mine}: {sum((got - want).values())} records not in the local run's "
                                 f"{theirs}, {sum((want - got).values())} missing")
            compared[mine] = sum(want.values())
    assert sum(compared.values()) > 1000 and all(compared[t] for t in compared if "final" in t or "matches" in t)
    print(f"[cluster] equal to the local run: {compared}")
    # The executors ran on the stock workers, which have no ctiflow.
    logs = "".join(stock_cluster.stack.docker("logs", stock_cluster.worker(i)).stderr for i in range(1, WORKERS + 1))
    assert logs.count("Asked to launch executor") >= 2
    bare = stack.docker("exec", stock_cluster.worker(1), "python3", "-c", "import ctiflow", check=False)
    assert bare.returncode != 0 and "No module named 'ctiflow'" in bare.stderr


def test_sigkill_of_a_worker_and_of_the_driver_with_the_checkpoint_on_the_object_store(stock_cluster):
    stack = stock_cluster.stack
    flows, src, outs, bad = setup_flows(stack, "stock-kill", 1500, seed=53)
    name = f"stock-kill-{uuid.uuid4().hex[:6]}"
    spec = flows_job(stack, name, src, outs)
    spec["kafka"]["bootstrap_servers"] = "kafka:9094"
    spec["spark"] = {"key_groups": 4, "checkpoint": f"objstore://bucket/{name}", "conf": dict(STORE_CONF)}
    worker = stock_cluster.worker(2)
    try:
        subprocess.run(stock_cluster.submit(spec, name, detach=True), check=True, capture_output=True, timeout=120)
        seen = wait_for_records(stack, outs["counts"], 150)
        stack.docker("kill", "-s", "KILL", worker)
        print(f"\n[cluster] SIGKILL {worker} after {seen} count records")
        seen = wait_for_records(stack, outs["counts"], seen + 150)
        stack.docker("kill", "-s", "KILL", name)
        print(f"[cluster] SIGKILL of the driver ({name}) after {seen} count records")
        stack.docker("rm", "-f", name)
        done = stock_cluster.run(spec, name)  # the restart runs to the end from the object store
        print("[cluster] " + done.stdout.strip().splitlines()[-1])
    finally:
        stack.docker("start", worker, check=False)
        stack.docker("rm", "-f", name, check=False)
    figures = assert_equals_oracle(stack, flows, outs, bad)
    print(f"[cluster] worker and driver killed, checkpoint on the object store: {figures}")
