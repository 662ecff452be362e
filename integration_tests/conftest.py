"""The ``stack`` the integration tests run against, and one shared Spark session.

With a reachable Docker engine the stack is ``docker-compose.yml`` (testcontainers' Compose
support); otherwise the embedded stack: tansu on a free loopback port. The test output says
which. Spark starts once per test session (it takes ≈10 s); jobs run as bounded runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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
    home = tmp_path_factory.mktemp("ctiflow-home")
    os.environ["CTIFLOW_HOME"] = str(home)
    if docker_available() and os.environ.get("CTIFLOW_TEST_STACK", "auto") != "embedded":
        from testcontainers.compose import DockerCompose

        compose = DockerCompose(str(ROOT), compose_file_name="docker-compose.yml", wait=True,
                                services=["kafka", "schema-registry"])
        compose.start()
        print("\n[stack] docker compose (testcontainers): kafka + schema registry")
        try:
            yield Stack("docker-compose", "localhost:9094", "http://localhost:8081")
        finally:
            compose.stop()
        return
    from jobs import stack as embedded

    port = embedded.free_port()
    embedded.up(port)
    print(f"\n[stack] embedded: tansu on 127.0.0.1:{port} (no Docker engine reachable)")
    try:
        yield Stack("embedded", f"127.0.0.1:{port}", None, port)
    finally:
        embedded.down(port)


@pytest.fixture(scope="session")
def spark(stack):
    from jobs.pipeline import spark_session

    session = spark_session()
    yield session
    session.stop()
