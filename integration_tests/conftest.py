"""The ``stack`` the integration tests run against, and one shared Spark session.

``stack``: the embedded stack (tansu on a free loopback port) for the tests that run jobs on
local Spark in this process; Spark starts once per test session (it takes ≈10 s). ``compose_stack``:
docker-compose.yml through testcontainers, for the tests marked ``compose`` (jobs in Spark
cluster mode in containers). The test output says which stack it used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def docker_available() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Stack:
    kind: str
    bootstrap: str
    registry_url: str | None = None
    port: int | None = None

    def topic(self, name: str) -> str:
        """A unique topic name per test so tests never see each other's records."""
        return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The embedded stack (tansu on a free loopback port): the tests that run jobs on local Spark
    in this process. The compose stack is ``compose_stack`` below."""
    home = tmp_path_factory.mktemp("ctiflow-home")
    os.environ["CTIFLOW_HOME"] = str(home)
    from ctiflow.jobs.ops import stack as embedded

    port = embedded.free_port()
    embedded.up(port)
    print(f"\n[stack] embedded: tansu on 127.0.0.1:{port}")
    try:
        yield Stack("embedded", f"127.0.0.1:{port}", None, port)
    finally:
        embedded.down(port)


#: The compose files the compose tests run: the stack of docker-compose.yml with the offline
#: stand-in images (this machine cannot pull the official ones). CTIFLOW_COMPOSE_FILES overrides
#: it (comma-separated; e.g. "docker-compose.yml" where the official images can be pulled).
COMPOSE_FILES = os.environ.get("CTIFLOW_COMPOSE_FILES", "docker-compose.yml,docker-compose.offline.yml").split(",")
COMPOSE_PROJECT = "ctiflow-test"


@dataclass
class ComposeStack(Stack):
    """The docker-compose stack: Kafka (or its stand-in) published on localhost:9094, a Spark
    master and worker; jobs run as containers of the ctiflow image in Spark cluster mode (driver
    in the job container, executors on spark-worker, checkpoints on the shared volume)."""

    compose: object = None
    job_dir: Path | None = None

    def command(self, *args: str) -> list[str]:
        files = [a for f in COMPOSE_FILES for a in ("-f", str(ROOT / f))]
        return ["docker", "compose", "-p", COMPOSE_PROJECT, *files, *args]

    def job_command(self, spec: dict, name: str, *, until_end: bool = True, detach: bool = False,
                    as_service: bool = False) -> list[str]:
        """`docker compose run` of ``ctiflow run`` for a job spec, in a container named ``name``,
        with its own checkpoint on the shared volume (``/checkpoints/<name>``); ``as_service``:
        reachable as ``job-flows`` on the compose network (where Prometheus scrapes)."""
        import yaml

        path = self.job_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        path.chmod(0o644)
        return self.command("run", *(["-d"] if detach else ["--rm"]), *(["--use-aliases"] if as_service else []),
                            "--no-deps", "--name", name,
                            "-e", f"CTIFLOW_CHECKPOINT=/checkpoints/{name}", "-v", f"{self.job_dir}:/jobs:ro",
                            "job-flows", "run", f"/jobs/{name}.yaml", *(["--until-end"] if until_end else []))

    def run_job(self, spec: dict, name: str, timeout: float = 900) -> subprocess.CompletedProcess:
        done = subprocess.run(self.job_command(spec, name), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"job {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def docker(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
        return done


@pytest.fixture(scope="session")
def compose_stack(tmp_path_factory):
    """docker-compose.yml (+ the offline override) through testcontainers: the images are built
    first (``deploy/build-images``: cached), the infrastructure services are started and waited
    for (health checks), and everything is removed at the end (``down --volumes``)."""
    import tempfile
    import time

    if not docker_available():
        pytest.fail("no Docker engine reachable: the compose tests need one (./dev test deselects "
                    "them where none can run)")
    from testcontainers.compose import DockerCompose

    os.environ["COMPOSE_PROJECT_NAME"] = COMPOSE_PROJECT
    if "docker-compose.offline.yml" in COMPOSE_FILES:
        built = subprocess.run(["bash", str(ROOT / "deploy" / "build-images")], capture_output=True, text=True,
                               env={**os.environ, "PYTHON": sys.executable, "CTIFLOW_BUILD_QUIET": "1"}, timeout=1800)
        assert built.returncode == 0, f"building the images failed:\n{built.stderr[-4000:]}"
    job_dir = Path(tempfile.mkdtemp(prefix="ctiflow-compose-jobs-"))
    job_dir.chmod(0o755)  # the job containers run as the image's unprivileged user
    # `up --wait` counts a one-shot service that has exited as a failure: init runs after it.
    compose = DockerCompose(str(ROOT), compose_file_name=COMPOSE_FILES, wait=True,
                            services=["kafka", "spark-master", "spark-worker"])
    stack = ComposeStack("docker-compose", "localhost:9094", None, None, compose, job_dir)
    started = time.monotonic()
    try:
        compose.start()
        init = subprocess.run(stack.command("run", "--rm", "init"), capture_output=True, text=True, timeout=300)
        assert init.returncode == 0, f"init failed:\n{init.stdout}\n{init.stderr}"
        print(f"\n[stack] docker compose ({' + '.join(COMPOSE_FILES)}), project {COMPOSE_PROJECT}: "
              f"broker, spark-master, spark-worker up and init done in {time.monotonic() - started:.1f} s")
        yield stack
    finally:
        compose.services = None  # down takes every service, the jobs started later included
        compose.stop(down=True)
        shutil.rmtree(job_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def spark(stack):
    from ctiflow.jobs.driver.pipeline import spark_session

    session = spark_session()
    yield session
    session.stop()
