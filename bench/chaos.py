"""Crash harness: run ``ctiflow run JOB --until-end`` as a child process and SIGKILL it (the
driver JVM and its Python workers, the whole process group) at random points, restarting from
the checkpoint each time; the last run goes to completion."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml


@dataclass
class ChaosReport:
    kills: int = 0
    runs: int = 0
    kill_times: list[float] = field(default_factory=list)
    final_returncode: int | None = None


def _start(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "jobs.cli", "run", str(config), "--until-end"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def crash_loop(spec: dict, workdir: Path, kills: int, seed: int = 0, window: tuple[float, float] = (8.0, 32.0),
               final_timeout: float = 600.0) -> ChaosReport:
    """Kill the job ``kills`` times at random moments, then let it finish."""
    config = workdir / "job.yaml"
    config.write_text(yaml.safe_dump(spec))
    log = workdir / "job.log"
    rng = random.Random(seed)
    report = ChaosReport()
    while report.kills < kills:
        proc = _start(config, log)
        report.runs += 1
        at = rng.uniform(*window)
        try:
            code = proc.wait(timeout=at)  # finished before the kill: the input is exhausted
            if code != 0:
                raise RuntimeError(f"the job failed with exit code {code} (not killed); see {log}")
            break
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            report.kills += 1
            report.kill_times.append(round(at, 1))
    proc = _start(config, log)
    report.runs += 1
    try:
        report.final_returncode = proc.wait(timeout=final_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return report
