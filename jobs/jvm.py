"""The JVM ctiflow's driver side talks to: Spark's (a session's) or, for a tool without a session,
one py4j gateway of its own — for Hadoop's file systems (:class:`ctiflow.jobs.checkpoint.CheckpointDir`)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

_GATEWAY: list = []
_LOCK = threading.Lock()


def spark_log_path() -> Path:
    """Where this process's Spark log goes: ``$CTIFLOW_HOME/logs/spark-<pid>.log``, or
    ``CTIFLOW_SPARK_LOG`` (``ctiflow submit`` names the file once for itself and the driver it starts)."""
    if os.environ.get("CTIFLOW_SPARK_LOG"):
        return Path(os.environ["CTIFLOW_SPARK_LOG"])
    logs = Path(os.environ.get("CTIFLOW_HOME", Path.cwd() / ".ctiflow")) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"spark-{os.getpid()}.log"


def launched() -> bool:
    """Whether spark-submit started this process (its JVM is already there, with its settings)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def launcher_settings() -> dict[str, str]:
    """The Spark settings spark-submit gave this process's JVM (``--master``, ``--conf``, …);
    empty when ctiflow starts its own JVM."""
    if not launched():
        return {}
    from pyspark import SparkConf

    return dict(SparkConf(_jvm=gateway().jvm).getAll())


def java_environment() -> None:
    """What a JVM started from here needs (see ENVIRONMENT.md): loopback, this Python, a JAVA_HOME.
    Under spark-submit, its choices stand (the workers' Python is ``spark.pyspark.python``)."""
    if not launched():
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if not os.environ.get("JAVA_HOME"):
        java = shutil.which("java")
        if java:
            os.environ["JAVA_HOME"] = str(Path(os.path.realpath(java)).parent.parent)


def gateway(conf=None):
    """The py4j gateway to this process's JVM (Spark's and Hadoop's classes): the session's, if
    there is one, else one started once with ``conf`` (a ``SparkConf``: the driver's settings
    apply from its start) — which the session then takes over (:func:`ctiflow.jobs.pipeline.spark_session`),
    so a job checks its checkpoint before Spark starts and still runs one JVM. Its output goes
    to the Spark log."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return SparkContext._gateway
    with _LOCK:
        if not _GATEWAY:
            java_environment()
            log = spark_log_path()
            with open(log, "ab") as sink:
                try:
                    _GATEWAY.append(launch_gateway(conf, popen_kwargs={"stdout": sink, "stderr": sink}))
                except Exception as exc:
                    raise RuntimeError(f"Spark's driver did not start ({exc}); its output is in {log}") from exc
        return _GATEWAY[0]


def hadoop_configuration(jvm, conf=None):
    """Hadoop's configuration as Spark would make it from ``conf`` (``spark.hadoop.*`` settings:
    a checkpoint store's credentials and options), without a session."""
    jconf = jvm.org.apache.spark.SparkConf(False)
    for key, value in (conf.getAll() if conf is not None else ()):
        jconf.set(key, value)
    return jvm.org.apache.spark.deploy.SparkHadoopUtil.get().newConfiguration(jconf)
