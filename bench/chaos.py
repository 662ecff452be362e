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


def _start(config: Path, log: Path, until_end: bool = True) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "ctiflow.jobs.cli", "run", str(config)] + ["--until-end"] * until_end,
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _finish(config: Path, log: Path, timeout: float) -> int:
    """A bounded run to the end; its exit code."""
    proc = _start(config, log)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


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
    report.final_returncode = _finish(config, log, final_timeout)
    report.runs += 1
    return report


def kill_when(spec: dict, workdir: Path, ready, until_end: bool = True, then=None,
              timeout: float = 300.0, poll: float = 0.002) -> int:
    """Start the job (a bounded run, or a continuous one with ``until_end=False``) and SIGKILL
    it the moment ``ready()`` holds — a check of the checkpoint's files, so a test can kill
    inside a chosen step of a micro-batch; call ``then()`` (e.g. produce more input); then a
    bounded restart. Returns the restart's exit code."""
    config = workdir / "job.yaml"
    config.write_text(yaml.safe_dump(spec))
    log = workdir / "job.log"
    proc = _start(config, log, until_end)
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended (exit code {proc.returncode}) before the kill point; see {log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the kill point was not reached in {timeout:.0f} s; see {log}")
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if then is not None:
        then()
    return _finish(config, log, timeout)
