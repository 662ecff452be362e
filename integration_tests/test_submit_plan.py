"""``ctiflow submit --deploy-mode cluster`` as near as this machine comes to it (no YARN, no
Kubernetes; Spark standalone runs no Python driver in the cluster): a driver whose Python has
neither ctiflow nor any of its packages — the base interpreter this project's venv was made
from — started by spark-submit in a directory holding the unpacked environment archive, given
the job as its plan (``--plan``), as YARN and Kubernetes start the driver of a cluster-mode job.
It imports ctiflow from the archive, runs the job, and every result equals the oracle's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from integration_tests.test_compose_stack import assert_equals_oracle, flows_job, setup_flows
from ctiflow.jobs.driver import submit
from ctiflow.jobs.driver.config import parse

pytestmark = [pytest.mark.integration]


def test_a_driver_without_ctiflow_runs_the_plan_from_the_unpacked_archive(stack, tmp_path):
    bare = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    probe = subprocess.run([str(bare), "-c", "import ctiflow"], capture_output=True, text=True, cwd=tmp_path)
    assert probe.returncode != 0, f"{bare} has ctiflow installed: this test needs a Python without it"

    flows, src, outs, bad = setup_flows(stack, "plan", 900, seed=59)
    name = f"plan-{uuid.uuid4().hex[:6]}"
    spec = flows_job(stack, name, src, outs)
    spec["spark"] = {"key_groups": 4, "checkpoint": str(tmp_path / "checkpoint")}
    plan = submit.plan_of(parse(spec, "test job"))

    driver = tmp_path / "driver"  # the driver's working directory, as YARN and Kubernetes lay it out
    with tarfile.open(submit.environment_archive(tmp_path / "submit")) as tar:
        tar.extractall(driver / submit.ARCHIVE_LINK, filter="data")
    shutil.copy(submit.ENTRY, driver / "entry.py")  # spark-submit ships the file alone
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "CTIFLOW_SPARK_LOG")}
    env |= {"PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin),
            "CTIFLOW_HOME": str(tmp_path / "home"), "SPARK_LOCAL_IP": "127.0.0.1"}
    submit.java_home()
    env.setdefault("JAVA_HOME", os.environ.get("JAVA_HOME", ""))
    done = subprocess.run([submit.spark_submit(), "--master", "local[2]",
                           "--conf", f"spark.pyspark.python={bare}", "--conf", f"spark.pyspark.driver.python={bare}",
                           "--conf", f"spark.executorEnv.PYTHONPATH={submit.ARCHIVE_LINK}",
                           "entry.py", "--plan", plan, "--until-end"],
                          cwd=driver, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert f"{name}: " in done.stdout and "Traceback" not in done.stdout + done.stderr
    figures = assert_equals_oracle(stack, flows, outs, bad)
    print(f"\n[plan] a driver without ctiflow, from the archive: {figures}")
