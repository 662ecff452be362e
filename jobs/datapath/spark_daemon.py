"""PySpark's Python worker daemon (``pyspark.daemon``) with the modules every ctiflow worker
imports already imported, and frozen out of the cyclic collector, before it forks its workers.

Why: Spark forks one Python process per concurrent task (the source's readers, the stateful
workers, the sink's writers: 15–17 processes in a 2-core job), and each imported pandas,
pyarrow, NumPy, PySpark's worker and ctiflow after the fork — ≈ 50 MB of private heap apiece.
Imported before the fork, those pages are shared copy-on-write; ``gc.freeze`` keeps the
collector from writing to them. Measured: docs/changelog.md#memory.
``ctiflow.jobs.driver.pipeline.spark_session`` sets ``spark.python.daemon.module`` to this module.

Contract: nothing here starts a thread or opens a client (a fork copies neither); a job's own
state is built in the forked worker, as before.

A worker also leaves its Python stack in Spark's faulthandler file when SIGHUP or SIGTERM ends it
(:func:`stack_on_hangup`), which ``spark.python.worker.faulthandler.enabled`` covers only for fatal
signals: the task's error then shows where the worker was, where it would say "crashed" and nothing
more. And the daemon's kill of a worker by pid reaches only a worker it forked that still runs
(:class:`OwnWorkersOnly`), never a process that took the pid of a worker gone before; and a worker
that ends by a signal faulthandler does not catch (SIGKILL, SIGPIPE) or by a non-zero exit code is
named on the daemon's stderr, in Spark's log (:meth:`OwnWorkersOnly.reap`, :class:`ReapingSignals`)."""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import gc
import signal
import sys


def preload() -> None:
    """Import what a ctiflow worker imports (each import a no-op in the worker after the fork)."""
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401
    import pyspark.sql.pandas.serializers  # noqa: F401
    import pyspark.worker  # noqa: F401

    import ctiflow.jobs.datapath.adapter  # noqa: F401 - the stateful workers (runtime, operators, encoders)
    import ctiflow.jobs.datapath.sink  # noqa: F401 - the sink's writers
    import ctiflow.jobs.datapath.source.reader  # noqa: F401 - the source's readers (decoders, Kafka clients)


HANGUPS = (signal.SIGHUP, signal.SIGTERM)


def stack_on_hangup(main):
    """PySpark's worker ``main`` that first has SIGHUP and SIGTERM dump every thread's Python stack
    into the worker's faulthandler file (open from the fork for the worker's life, read by the JVM
    when the worker's socket ends) and then end the worker as before (``chain``: the default action).

    Why: PySpark's daemon ends its workers with SIGHUP when it shuts down — on the JVM's SIGTERM,
    which Spark also sends when it restarts a daemon that did not hand it a new worker in time — and
    such a worker leaves an empty file, so the task fails with "Python worker exited unexpectedly
    (crashed)" and no stack. A dump without a "Fatal Python error" line above it is such an ending.
    Registered for each task and unregistered after it: the daemon's worker loop resets both
    signals before each."""

    @functools.wraps(main)
    def wrapped(infile, outfile):
        from pyspark.util import _faulthandler_helper  # the file PySpark's daemon opened at the fork

        log = getattr(_faulthandler_helper, "_log_file", None)
        if log is None:
            return main(infile, outfile)
        for sig in HANGUPS:
            faulthandler.register(sig, file=log, all_threads=True, chain=True)
        try:
            return main(infile, outfile)
        finally:
            # (faulthandler registers a signal once: the next task's reset of the signal would leave
            # it thinking its handler is still there)
            for sig in HANGUPS:
                faulthandler.unregister(sig)

    return wrapped


def started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat``); None if no such
    process (or no ``/proc``: then every pid compares equal, and kills pass as PySpark sends them)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[19].decode()  # field 22 of the line; fields[0] is field 3 (after "pid (comm)")


@contextlib.contextmanager
def _children_unseen():
    """SIGCHLD held back (delivered when the block ends)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class OwnWorkersOnly:
    """The ``os`` module as PySpark's daemon sees it, but for ``kill`` of a pid: sent only to a
    worker this daemon forked that still runs (the pid and its start time as at the fork).

    Why: the JVM asks the daemon to kill a worker by its pid (``PythonWorkerFactory.stopWorker``)
    also when the worker is already gone — a worker found dead in the idle queue is "discarded"
    that way — and PySpark's daemon sends SIGKILL to whatever process has that pid by then. Pids
    wrap at ``/proc/sys/kernel/pid_max`` (often 32,768: minutes on a busy machine), so the kill can
    land on another task's worker, which then fails with "Python worker exited unexpectedly
    (crashed)" and an empty stack. A kill refused is said on the daemon's stderr (Spark's log),
    but for a worker the reaper collected (its end is said there if it was not as asked). The
    process-group signal of the daemon's shutdown (pid 0) passes as it is."""

    #: Forked pids kept before those whose process is gone are dropped; ended ones kept at most.
    PRUNE_AT = 4096

    def __init__(self, real) -> None:
        self._os = real
        self._forked: dict[int, str | None] = {}
        self._stopped: set[int] = set()  # workers this daemon sent SIGKILL at the JVM's request
        self._ended: dict[int, None] = {}  # workers the reaper collected, oldest first
        self._ending_all = False  # the daemon's shutdown signalled its process group

    def reap(self, _signum=None, _frame=None) -> None:
        """Collect every ended worker (the SIGCHLD handler in place of PySpark's ``SIG_IGN``) and
        say on the daemon's stderr (Spark's log) how each ended that did not end as asked: by a
        signal or a non-zero exit code — the one trace of a worker whose task failed "crashed"
        with an empty faulthandler file (SIGKILL, SIGPIPE and other signals faulthandler does
        not catch). A SIGKILL the JVM asked for and the shutdown's SIGHUP are not reported."""
        with _children_unseen():  # (not re-entered: one line a worker)
            self._reap()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = self._os.waitpid(-1, self._os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            stopped = pid in self._stopped
            self._stopped.discard(pid)
            if self._forked.pop(pid, False) is not False:
                self._ended[pid] = None
                if len(self._ended) > self.PRUNE_AT:
                    del self._ended[next(iter(self._ended))]
            if self._os.WIFSIGNALED(status):
                sig = self._os.WTERMSIG(status)
                if (sig == signal.SIGKILL and stopped) or (sig == signal.SIGHUP and self._ending_all):
                    continue
                how = f"by signal {signal.Signals(sig).name}" + (
                    " (not sent by this daemon)" if sig == signal.SIGKILL else "")
            elif self._os.WIFEXITED(status) and self._os.WEXITSTATUS(status):
                how = f"with exit code {self._os.WEXITSTATUS(status)}"
            else:
                continue
            print(f"ctiflow's Python daemon: worker {pid} ended {how}", file=sys.stderr, flush=True)

    def __getattr__(self, name: str):
        return getattr(self._os, name)

    def fork(self) -> int:
        with _children_unseen():  # (a worker that ends at once is collected after its record)
            pid = self._os.fork()
            if pid > 0:
                self._ended.pop(pid, None)
                if len(self._forked) >= self.PRUNE_AT:
                    self._forked = {p: t for p, t in self._forked.items() if started(p) == t}
                self._forked[pid] = started(pid)
        return pid

    def kill(self, pid: int, sig: int) -> None:
        if pid > 0 and (pid not in self._forked or started(pid) != self._forked[pid]):
            if pid in self._ended and pid not in self._forked:  # (found dead by the JVM: said or fine)
                return
            print(f"ctiflow's Python daemon: signal {sig} for pid {pid} not sent: no worker this daemon "
                  "forked runs with that pid (it ended; the pid may belong to another process now)",
                  file=sys.stderr, flush=True)
            return
        if pid == 0:
            self._ending_all = True
        elif sig == signal.SIGKILL:
            self._stopped.add(pid)
        self._os.kill(pid, sig)


class ReapingSignals:
    """The ``signal`` module as PySpark's daemon sees it, but for the daemon's ``SIG_IGN`` of
    SIGCHLD (which has the kernel collect ended workers unseen): ``reap`` is the handler instead."""

    def __init__(self, real, reap) -> None:
        self._signal = real
        self._reap = reap

    def __getattr__(self, name: str):
        return getattr(self._signal, name)

    def signal(self, signum, handler):
        if signum == self._signal.SIGCHLD and handler == self._signal.SIG_IGN:
            handler = self._reap
        return self._signal.signal(signum, handler)


if __name__ == "__main__":
    from pyspark import daemon

    try:
        preload()
    except ImportError:  # e.g. an environment archive of another Python (ctiflow submit): the
        pass             # daemon still serves, and the task that needs the module reports it
    import pyspark.worker

    pyspark.worker.main = stack_on_hangup(pyspark.worker.main)
    daemon.os = OwnWorkersOnly(daemon.os)
    daemon.signal = ReapingSignals(daemon.signal, daemon.os.reap)
    gc.freeze()
    try:
        from ctiflow.jobs.datapath import group_host
    except ImportError:  # (as preload's)
        pass
    else:
        group_host.start()  # (before any worker: they inherit the server's address and key)
    daemon.manager()
