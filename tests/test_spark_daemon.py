"""The daemon's kill of a worker by pid (``spark_daemon.OwnWorkersOnly``): a worker it forked that
still runs is killed; a process that has a pid the daemon never forked, or a pid whose start time
is not the one at the fork (the worker ended and the pid was taken again), is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ctiflow.jobs.datapath.spark_daemon import OwnWorkersOnly, started


def _sleeper_child(guard: OwnWorkersOnly) -> int:
    pid = guard.fork()
    if pid == 0:  # the child: wait to be killed
        time.sleep(60)
        os._exit(0)
    return pid


def test_a_worker_the_daemon_forked_is_killed():
    guard = OwnWorkersOnly(os)
    pid = _sleeper_child(guard)
    guard.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_process_the_daemon_did_not_fork_is_not_killed(capfd):
    guard = OwnWorkersOnly(os)
    other = subprocess.Popen(["sleep", "60"])
    try:
        guard.kill(other.pid, signal.SIGKILL)
        time.sleep(0.2)
        assert other.poll() is None  # still running
        assert f"pid {other.pid} not sent" in capfd.readouterr().err
    finally:
        other.kill()
        other.wait()


def test_a_pid_taken_again_after_the_worker_ended_is_not_killed(capfd):
    """A pid reused cannot be made on purpose: the record of the fork is given another start time,
    which is what a new process with the old worker's pid shows."""
    guard = OwnWorkersOnly(os)
    pid = _sleeper_child(guard)
    try:
        assert guard._forked[pid] == started(pid) is not None
        guard._forked[pid] = str(int(guard._forked[pid]) - 1000)  # the ended worker's start time
        guard.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still running
        assert f"pid {pid} not sent" in capfd.readouterr().err
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_the_shutdowns_process_group_signal_passes(monkeypatch):
    sent = []

    class Recorder:
        def kill(self, pid, sig):
            sent.append((pid, sig))

    OwnWorkersOnly(Recorder()).kill(0, signal.SIGHUP)
    assert sent == [(0, signal.SIGHUP)]


def test_records_of_ended_workers_are_dropped_once_there_are_many(monkeypatch):
    guard = OwnWorkersOnly(os)
    monkeypatch.setattr(OwnWorkersOnly, "PRUNE_AT", 3)
    guard._forked = {999_999_991: "1", 999_999_992: "2", 999_999_993: "3"}  # no such processes
    pid = _sleeper_child(guard)
    try:
        assert list(guard._forked) == [pid]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


DAEMON = """
import os, signal, sys, time
from ctiflow.jobs.datapath.spark_daemon import OwnWorkersOnly, ReapingSignals

guard = OwnWorkersOnly(os)
signals = ReapingSignals(signal, guard.reap)
signals.signal(signal.SIGCHLD, signal.SIG_IGN)  # as PySpark's daemon asks: the reaper instead

def worker(end):
    pid = guard.fork()
    if pid == 0:
        signals.signal(signal.SIGCHLD, signal.SIG_DFL)
        end()
        time.sleep(60)
        os._exit(0)
    return pid

quiet = worker(lambda: os._exit(0))                 # ended as asked: not reported
worker(lambda: os._exit(3))
worker(lambda: (signal.signal(signal.SIGPIPE, signal.SIG_DFL), os.kill(os.getpid(), signal.SIGPIPE)))
worker(lambda: os.kill(os.getpid(), signal.SIGKILL))  # e.g. the kernel's OOM killer
guard.kill(worker(lambda: None), signal.SIGKILL)    # the JVM's request: not reported
time.sleep(1.0)
guard.kill(quiet, signal.SIGKILL)                   # the JVM found it dead: nothing to say
guard.kill(999_999_999, signal.SIGKILL)             # never forked: refused, and said
print("left", sorted(guard._forked), flush=True)
print("quiet", quiet, flush=True)
"""


def test_the_daemon_says_how_each_worker_ended_that_did_not_end_as_asked():
    """The daemon's SIGCHLD handler (``ReapingSignals`` in place of PySpark's ``SIG_IGN``): a worker
    ended by a signal faulthandler does not catch, or by a non-zero exit code, is named on the
    daemon's stderr; an exit code 0 and a SIGKILL the daemon sent are not; every worker is collected.
    The JVM's kill of a worker the reaper collected is dropped without a word (its end was said, or
    was as asked); of a pid the daemon never forked, refused and said."""
    done = subprocess.run([sys.executable, "-c", DAEMON], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = [line.split(": worker ", 1)[1].split(" ", 1)[1] for line in done.stderr.splitlines()
            if line.startswith("ctiflow's Python daemon: worker ")]
    assert sorted(said) == ["ended by signal SIGKILL (not sent by this daemon)", "ended by signal SIGPIPE",
                            "ended with exit code 3"], done.stderr
    left, quiet = done.stdout.splitlines()
    assert left == "left []"  # no zombie, no record of an ended worker
    quiet = int(quiet.split()[1])
    assert f"pid {quiet} not sent" not in done.stderr
    assert "pid 999999999 not sent" in done.stderr
