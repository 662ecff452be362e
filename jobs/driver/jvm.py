"""The JVM ctiflow's driver side talks to: Spark's (a session's) or, for a tool without a session,
one py4j gateway of its own — for Hadoop's file systems
(:class:`ctiflow.jobs.driver.checkpoint.CheckpointDir`)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
from pathlib import Path

_GATEWAY: list = []
_LOCK = threading.Lock()

#: Spark's own logging: to one file per driver (:func:`spark_log_path`), no console output.
SPARK_LOG4J2 = Path(__file__).resolve().parent / "spark-log4j2.properties"


def driver_java_options(log: Path) -> str:
    """The driver JVM's ``spark.driver.extraJavaOptions`` that send Spark's log to ``log`` — the same
    whoever starts the JVM: a session, a tool's own gateway (:func:`gateway`), spark-submit."""
    return f"-Dlog4j2.configurationFile=file:{SPARK_LOG4J2} -Dctiflow.spark.log={log}"


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


#: Spark's rule for which settings hold secrets: the default of ``spark.redaction.regex``, matched
#: against a setting's name (Spark redacts such values in its UI, logs and event logs).
SPARK_REDACTION_REGEX = re.compile(r"(?i)secret|password|token|access[.]?key")


def secret_setting(name: str) -> bool:
    """Whether the Spark setting ``name`` holds a secret (:data:`SPARK_REDACTION_REGEX`): such a
    setting is never put on a command line (:func:`launch_settings_of`,
    :func:`ctiflow.jobs.driver.submit.command`). A value is judged by its name alone, as Spark judges
    it: name a secret of your own ``spark.conf`` so that the regex matches it."""
    return SPARK_REDACTION_REGEX.search(name) is not None


def launch_settings_of(settings: list[tuple[str, str]]) -> tuple[list[tuple[str, str]],
                                                                 list[tuple[str, str]]]:
    """``settings`` split into (what the driver's JVM is started with, what is set on its
    ``SparkConf`` through py4j once it runs). PySpark starts the JVM with every setting as a
    ``--conf`` argument of spark-submit, so they stand in the command line of the ``java``
    process for the whole run, visible to every local user (``ps``, ``/proc/PID/cmdline``).
    Held back: every :func:`secret_setting` and every ``spark.executorEnv.*`` — the executors'
    environment, where ctiflow's own credentials for the executors' clients travel
    (:func:`ctiflow.jobs.driver.pipeline.executor_credentials`). Neither acts before a ``SparkContext``
    exists: Spark reads them from the context's ``SparkConf``, which
    :func:`ctiflow.jobs.driver.pipeline.spark_session` fills through py4j (a socket) before the context
    starts, so they are in force from its first executor on. In local mode the executors' Python
    workers get that environment from the context; on a cluster, the executors get it from the
    driver when they register (standalone: in their process environment, not their command line;
    YARN: the container's launch context). A process's environment (``/proc/PID/environ``) is
    readable by its own user and root only."""
    start, later = [], []
    for name, value in settings:
        (later if secret_setting(name) or name.startswith("spark.executorEnv.")
         else start).append((name, value))
    return start, later


def gateway(conf=None):
    """The py4j gateway to this process's JVM (Spark's and Hadoop's classes): the session's, if
    there is one, else one started once with ``conf`` (a ``SparkConf``: the driver's settings
    apply from its start) — which the session then takes over
    (:func:`ctiflow.jobs.driver.pipeline.spark_session`), so a job checks its checkpoint before Spark
    starts and still runs one JVM. Its output goes
    to the Spark log. The JVM is started without ``conf``'s secrets (:func:`launch_settings_of`):
    whoever starts a context on it passes the whole ``conf`` to the context."""
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
                    started = launch_gateway(_started_with(conf),
                                             popen_kwargs={"stdout": sink, "stderr": sink})
                    _GATEWAY.append(started)
                except Exception as exc:
                    raise RuntimeError(f"Spark's driver did not start ({exc}); its output is in "
                                       f"{log}") from exc
        return _GATEWAY[0]


def _started_with(conf):
    """``conf`` without what :func:`launch_settings_of` holds back (a new ``SparkConf``); without
    ``conf``, the driver's logging alone (a session started on this JVM later logs to the same file)."""
    from pyspark import SparkConf

    if conf is None:
        return SparkConf(loadDefaults=False).set("spark.driver.extraJavaOptions",
                                                 driver_java_options(spark_log_path()))
    return SparkConf(loadDefaults=False).setAll(launch_settings_of(conf.getAll())[0])


def hadoop_configuration(jvm, conf=None):
    """Hadoop's configuration as Spark would make it from ``conf`` (``spark.hadoop.*`` settings:
    a checkpoint store's credentials and options), without a session."""
    jconf = jvm.org.apache.spark.SparkConf(False)
    for key, value in (conf.getAll() if conf is not None else ()):
        jconf.set(key, value)
    return jvm.org.apache.spark.deploy.SparkHadoopUtil.get().newConfiguration(jconf)
