"""ctiflow's spark-submit entry point: runs one job in the driver spark-submit started.

    spark-submit --master URL --archives ctiflow-environment-….tar.gz#environment \\
        --conf spark.executorEnv.PYTHONPATH=environment --conf spark.pyspark.python=python3 \\
        …/ctiflow/jobs/cli/entry.py JOB.yaml [--until-end] [--timeout SECONDS]

``ctiflow submit`` builds that command (``--print-command`` shows it); in cluster mode it passes
``--plan`` (the parsed job, :func:`ctiflow.jobs.driver.submit.plan_of`) instead of a file. spark-submit's
settings win over the job file's: its ``--master`` is the job's ``spark.master``, its ``--conf``
values stand (:func:`ctiflow.jobs.driver.pipeline.spark_conf`). Where the driver has no ctiflow installed
(cluster mode), it imports ctiflow from the unpacked archive in its working directory.

The same run as ``ctiflow run``, after one check ``ctiflow run`` does not need: the executors'
Python is the minor version the archive was built for (else one clear error, not a worker's
import failure per task)."""

from __future__ import annotations

import argparse
import json
import os
import sys

ARCHIVE_LINK = "environment"  # ctiflow.jobs.driver.submit.ARCHIVE_LINK (this file imports no ctiflow first)
MANIFEST = "ctiflow-environment.json"


def _archive_manifest() -> dict | None:
    """The unpacked environment archive's manifest in the working directory, if there is one
    (cluster mode: put on ``sys.path``, with its schema directories on ``CTIFLOW_SCHEMA_PATH``)."""
    manifest = os.path.join(os.path.abspath(ARCHIVE_LINK), MANIFEST)
    if not os.path.isfile(manifest):
        return None
    with open(manifest) as f:
        found = json.load(f)
    if os.path.abspath(ARCHIVE_LINK) not in sys.path:
        sys.path.insert(0, os.path.abspath(ARCHIVE_LINK))
    if found.get("schema_path"):
        os.environ["CTIFLOW_SCHEMA_PATH"] = os.pathsep.join(os.path.abspath(p) for p in found["schema_path"])
    return found


def workers_python(spark) -> set[str]:
    """The Python minor versions the executors run (one small task per default slot)."""
    sc = spark.sparkContext
    slots = max(1, sc.defaultParallelism)
    return set(sc.parallelize(range(slots), slots).map(lambda _: "%d.%d" % __import__("sys").version_info[:2])
               .distinct().collect())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="entry.py", description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", help="job YAML (client mode, or shipped with --files)")
    parser.add_argument("--plan", help="the parsed job (ctiflow submit, cluster mode)")
    parser.add_argument("--until-end", action="store_true")
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--json", action="store_true", dest="as_json")
    args = parser.parse_args(argv)
    if (args.job is None) == (args.plan is None):
        parser.error("give a job file or --plan")
    manifest = _archive_manifest()

    from ctiflow.jobs.cli import guarded

    guarded(lambda: _run(args, manifest))
    return 0


def _run(args, manifest: dict | None) -> None:
    from ctiflow.jobs.driver import submit
    from ctiflow.jobs.cli.run import run_job
    from ctiflow.jobs.driver.config import load
    from ctiflow.jobs.driver.jvm import launcher_settings
    from ctiflow.operators.errors import ConfigError

    cfg = submit.config_of_plan(args.plan) if args.plan else load(args.job)
    master = launcher_settings().get("spark.master")
    if master:
        cfg = submit.with_master(cfg, master)
    submit.check_cluster_checkpoint(cfg)
    expected = (manifest or {}).get("python", submit.python_version())

    def session(job):
        from ctiflow.jobs.driver.pipeline import spark_session

        spark = spark_session(job)
        found = workers_python(spark)
        if found != {expected}:
            raise ConfigError(
                f"the executors run Python {', '.join(sorted(found))}; the environment archive holds "
                f"packages for Python {expected} (the Python ctiflow submit ran on). Submit from a Python "
                f"{expected}, or point spark.pyspark.python at the workers' python{expected}")
        return spark

    code = run_job(cfg, until_end=args.until_end, timeout=args.timeout, as_json=args.as_json, session=session)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    sys.exit(main())
