"""A job with registry and SASL secrets, run as ``ctiflow run`` runs it (its own process, its own
Spark driver JVM), shows no secret in any process's command line, from the start of the run to its
end — and its registry credentials work: Confluent-framed records through a registry that
enforces basic auth (:class:`ctiflow.jobs.testing.registry.RegistryDouble`), the credentials given
as ``user:password@`` in the url.

What is checked, every 0.2 s while the job runs: every ``/proc/PID/cmdline`` on this machine
(what ``ps`` shows any local user), and ``ps -eww -o args`` once the JVM is up. Not checked to be
secret-free: ``/proc/PID/environ``, which the kernel lets only the process's own user and root
read, and which is how Spark hands ``spark.executorEnv`` to the executors' Python workers in every
deploy mode — what is checked instead is that only those workers hold a secret there: not the
JVM, not the ``ctiflow run`` process. The embedded broker cannot authenticate anyone
(ENVIRONMENT.md), so the SASL credentials are configured with ``security.protocol: PLAINTEXT``:
every Kafka client of the job carries them, none uses them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from ctiflow.jobs.datapath import kafka
from ctiflow.jobs.avro.serde import AvroSerializer, registry_client
from ctiflow.jobs.testing.registry import RegistryDouble

pytestmark = [pytest.mark.integration]

REGISTRY_PASSWORD = "reg-pw-7f3a9c"
SASL_PASSWORD = "sasl-pw-51d0be"
SECRETS = (REGISTRY_PASSWORD, SASL_PASSWORD)
T0 = 1_767_225_600_000


def transactions(n: int) -> list[dict]:
    return [{"id": f"tx-{i}", "account": f"acct-{i % 13}", "event_time": T0 + i * 100, "type": "purchase",
             "amount": float(i % 50), "currency": "EUR", "country": "DE", "merchant": None} for i in range(n)]


def processes() -> dict[int, tuple[bytes, bytes | None]]:
    """pid → (command line, environment or None where it cannot be read) of every process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # (gone meanwhile)
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            environ = None
        found[int(entry.name)] = (cmdline, environ)
    return found


class Watch(threading.Thread):
    """Samples every process until stopped: the command lines and environments with a secret in
    them, and whether a Spark driver JVM was seen at all (else the watch proved nothing)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.on_command_line: dict[int, str] = {}
        self.in_environment: dict[int, str] = {}
        self.jvm_seen = False
        self.ps_listing = ""
        self.samples = 0

    def run(self) -> None:
        secrets = [s.encode() for s in SECRETS]
        while not self.stop.is_set():
            for pid, (cmdline, environ) in processes().items():
                shown = cmdline.replace(b"\0", b" ").decode(errors="replace")
                if "java" in shown and "org.apache.spark.deploy.SparkSubmit" in shown:
                    self.jvm_seen = True
                    if not self.ps_listing:
                        self.ps_listing = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True,
                                                         text=True).stdout
                if any(s in cmdline for s in secrets):
                    self.on_command_line[pid] = shown
                if environ is not None and any(s in environ for s in secrets):
                    self.in_environment[pid] = shown
            self.samples += 1
            self.stop.wait(0.2)


def watched(cmd: list[str]) -> tuple[subprocess.CompletedProcess, Watch]:
    """``cmd`` run to its end (without the test's own credential variables) under a :class:`Watch`."""
    watch = Watch()
    watch.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTIFLOW_SASL", "CTIFLOW_SCHEMA_REGISTRY"))}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    finally:
        watch.stop.set()
        watch.join()
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done, watch


def assert_no_secret_shown(done: subprocess.CompletedProcess, watch: Watch, secrets: tuple[str, ...]) -> None:
    assert watch.jvm_seen and watch.samples > 10, "the watch never saw the job's Spark driver"
    assert watch.on_command_line == {}, f"secrets on a command line: {watch.on_command_line}"
    assert not any(s in watch.ps_listing for s in secrets)
    holders = watch.in_environment.values()
    assert not any("SparkSubmit" in c or "ctiflow.jobs.cli" in c for c in holders), list(holders)
    assert all("python" in c for c in holders), list(holders)  # the executors' Python workers only
    logs = "".join(path.read_text(errors="replace")
                   for path in (Path(os.environ["CTIFLOW_HOME"]) / "logs").glob("*.log"))
    for secret in secrets:
        assert secret not in done.stdout + done.stderr and secret not in logs


def job_spec(stack, tmp_path: Path, registry: RegistryDouble, src: str, out: str, **spark_conf) -> Path:
    """The job: passthrough of ``src`` to ``out``, SASL credentials configured (unused: see the
    module's docstring), the registry's credentials as ``user:password@`` in its url."""
    spec = {"job": "secrets", "kafka": {
                "bootstrap_servers": stack.bootstrap, "client": {"security.protocol": "PLAINTEXT"},
                "sasl_username": "alice", "sasl_password": SASL_PASSWORD,
                "schema_registry": {"url": registry.url_with("alice")}},
            "sources": [{"name": "tx", "topic": src, "schema": "transaction", "key_field": "account",
                         "time_field": "event_time", "cti": {"delay": "1h"}}],
            "operators": [{"kind": "passthrough", "output": out}],
            "outputs": {"late": stack.topic("sec-late"), "dead_letter": stack.topic("sec-dlq")},
            "spark": {"checkpoint": str(tmp_path / "checkpoint"), "key_groups": 2, "conf": spark_conf}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def produce_framed(stack, registry: RegistryDouble, src: str, events: list[dict]) -> None:
    writer = registry_client(registry.url, {"basic.auth.user.info": f"alice:{REGISTRY_PASSWORD}"})
    kafka.create_topics(stack.bootstrap, {src: 2})
    done = kafka.produce(stack.bootstrap, src, events, AvroSerializer(
        "transaction", framing="confluent", registry=writer, subject=f"{src}-value"), "account")
    assert done.unflushed == 0 and done.sent == len(events)


def assert_passed_through(stack, registry: RegistryDouble, src: str, out: str, events: list[dict]) -> None:
    got = kafka.read_topic(stack.bootstrap, out, registry_url=registry.url,
                           registry_config={"basic.auth.user.info": f"alice:{REGISTRY_PASSWORD}"})
    assert sorted(r["id"] for r in got) == sorted(e["id"] for e in events)
    assert registry.refused == 0
    # the executors' decoders asked the registry, as alice
    assert ("GET", f"/subjects/{src}-value/versions", "alice") in registry.requests


def test_no_secret_on_any_command_line_and_registry_credentials_in_the_url_work(stack, tmp_path):
    src, out = stack.topic("sec-in"), stack.topic("sec-out")
    events = transactions(300)
    with RegistryDouble({"alice": REGISTRY_PASSWORD}) as registry:
        produce_framed(stack, registry, src, events)
        path = job_spec(stack, tmp_path, registry, src, out)
        done, watch = watched([sys.executable, "-m", "ctiflow.jobs.cli", "run", str(path), "--until-end"])
        assert_passed_through(stack, registry, src, out, events)
    assert_no_secret_shown(done, watch, SECRETS)


def test_ctiflow_submit_shows_no_secret_either(stack, tmp_path):
    """Through spark-submit (client mode, a local master): the job's secret ``spark.conf``
    setting travels in the properties file, gone once spark-submit is done."""
    src, out = stack.topic("sub-in"), stack.topic("sub-out")
    events = transactions(200)
    store_secret = "s3-key-0c77aa"
    with RegistryDouble({"alice": REGISTRY_PASSWORD}) as registry:
        produce_framed(stack, registry, src, events)
        path = job_spec(stack, tmp_path, registry, src, out, **{"spark.hadoop.fs.s3a.secret.key": store_secret})
        done, watch = watched([sys.executable, "-m", "ctiflow.jobs.cli", "submit", str(path),
                               "--master", "local[2]", "--until-end"])
        assert_passed_through(stack, registry, src, out, events)
    assert_no_secret_shown(done, watch, (*SECRETS, store_secret))
    assert not list((Path(os.environ["CTIFLOW_HOME"]) / "submit" / "secrets").iterdir())
