"""ctiflow installs as a package: the wheel carries the Avro schemas, the example jobs and Spark's
log4j settings, and works installed (not only as an editable checkout); ``import ctiflow`` is the
documented Python API."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from this checkout, installed into a directory of its own."""
    tmp = tmp_path_factory.mktemp("wheel")
    # setuptools' scratch folder: it keeps modules of earlier builds (packages since renamed)
    # and would pack them into this wheel too.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "dist").glob("ctiflow-*.whl"))
    target = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return target


def run_installed(target: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Python with the installed wheel and this venv's dependencies, but not the checkout: ``-S``
    skips site processing, so the editable install's path hook is not loaded."""
    deps = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), deps])}
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_wheel_carries_schemas_examples_and_the_log4j_settings(installed):
    names = {str(p.relative_to(installed)) for p in installed.rglob("*") if p.is_file()}
    schemas = {p.name for p in (ROOT / "schemas").rglob("*.avsc")}
    assert {f"ctiflow/schemas/{s}" for s in schemas} <= names
    assert {"ctiflow/examples/demo-flows.yaml", "ctiflow/examples/demo-transactions.yaml",
            "ctiflow/jobs/driver/spark-log4j2.properties", "ctiflow/__init__.py",
            "ctiflow/bench/figures.yaml"} <= names  # (what `ctiflow bench` at its defaults records into)
    queries = {p.name for p in (ROOT / "examples" / "recognize").glob("*.sql")}
    assert queries and {f"ctiflow/examples/recognize/{q}" for q in queries} <= names
    tops = {p.name for p in installed.iterdir() if not p.name.endswith((".dist-info", ".egg-info"))}
    assert tops - {"bin", "__pycache__"} == {"ctiflow"}, tops


def test_the_wheel_installs_one_top_level_package(installed, tmp_path):
    """``import ctiflow`` works from the installed wheel; ``jobs``, ``operators`` and ``bench`` —
    generic names another distribution may own — are not installed beside it."""
    for generic in ("jobs", "operators", "bench"):
        got = run_installed(installed, "-c", f"import {generic}", cwd=tmp_path)
        assert got.returncode != 0 and "ModuleNotFoundError" in got.stderr, (generic, got.stdout, got.stderr)
    got = run_installed(installed, "-c", "import ctiflow.operators.count, ctiflow.bench; print(ctiflow.check)",
                        cwd=tmp_path)
    assert got.returncode == 0 and "check_job" in got.stdout, got.stderr


def test_the_installed_benchmarks_find_the_figures_they_record_into(installed, tmp_path):
    """``ctiflow bench`` from the wheel: every benchmark of the registry is named, and the figures
    file a default-size run records into is the wheel's own."""
    got = run_installed(installed, "-c", "from ctiflow.bench import BENCHES, LONG_BENCHES, figures; "
                        "print(','.join(BENCHES + LONG_BENCHES)); print(figures.DATA, figures.DATA.is_file())",
                        cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    names, data = got.stdout.split("\n")[:2]
    assert set(names.split(",")) == {"source", "adapter", "count", "bins", "match", "rules", "rules-test",
                                     "reliability", "scale", "peers", "latency", "soak"}
    path, exists = data.rsplit(" ", 1)
    assert exists == "True" and Path(path).resolve().is_relative_to(installed.resolve()), data


def test_the_installed_package_finds_its_files_and_checks_a_job(installed, tmp_path):
    probe = run_installed(installed, "-c", "import ctiflow, ctiflow.jobs.avro.serde, ctiflow.jobs.driver.pipeline, ctiflow.jobs.ops.demo; "
                          "print(ctiflow.__file__); print(ctiflow.jobs.avro.serde.SCHEMA_DIR); print(ctiflow.jobs.ops.demo.EXAMPLES); "
                          "print(ctiflow.jobs.driver.jvm.SPARK_LOG4J2.is_file())", cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    module, schemas, examples, log4j = probe.stdout.split()
    for path in (module, schemas, examples):
        assert Path(path).resolve().is_relative_to(installed.resolve()), path
    assert log4j == "True"
    checked = run_installed(installed, "-m", "ctiflow.jobs.cli", "check", str(Path(examples) / "demo-transactions.yaml"),
                            cwd=tmp_path)
    assert checked.returncode == 0 and "ok" in checked.stdout, checked.stdout + checked.stderr


def test_user_schema_directories_are_read_after_ctiflow_s(tmp_path, monkeypatch):
    import ctiflow.jobs.avro.serde

    mine = tmp_path / "my-schemas"
    mine.mkdir()
    (mine / "reading.avsc").write_text('{"type": "record", "name": "Reading", "fields": ['
                                       '{"name": "sensor", "type": "string"}, {"name": "at", "type": "long"}, '
                                       '{"name": "value", "type": "double"}]}')
    monkeypatch.setenv("CTIFLOW_SCHEMA_PATH", str(mine))
    monkeypatch.setattr(ctiflow.jobs.avro.serde, "_default_store", None)
    try:
        store = ctiflow.jobs.avro.serde.default_store()
        assert "reading" in store.names() and "transaction" in store.names()
        from ctiflow.jobs.driver.check import config_errors
        from ctiflow.jobs.driver.config import parse

        cfg = parse({"job": "r", "sources": [{"name": "r", "topic": "readings", "schema": "reading",
                                              "key_field": "sensor", "time_field": "at", "measures": ["value"]}],
                     "operators": [{"kind": "bins", "name": "b", "bin_size": "1m", "measures": ["value"],
                                    "outputs": {"final": "bins"}}]})
        assert config_errors(cfg) == []
        from ctiflow.jobs.driver.pipeline import executor_credentials

        assert executor_credentials(cfg)["CTIFLOW_SCHEMA_PATH"] == str(mine)  # executors read the same
        monkeypatch.setenv("CTIFLOW_SCHEMA_PATH", str(tmp_path / "missing"))
        monkeypatch.setattr(ctiflow.jobs.avro.serde, "_default_store", None)
        with pytest.raises(Exception, match="does not exist .from CTIFLOW_SCHEMA_PATH"):
            ctiflow.jobs.avro.serde.default_store()
    finally:
        monkeypatch.setattr(ctiflow.jobs.avro.serde, "_default_store", None)


def test_import_ctiflow_is_light_and_exports_what_its_docstring_promises():
    code = ("import sys, ctiflow; missing = [n for n in ctiflow.__all__ if not hasattr(ctiflow, n)]; "
            "print(missing, 'pyspark' in sys.modules)")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.stdout.split("\n")[0] == "[] False", got.stdout + got.stderr
