"""Key-group hosts: each key group's calls run in one long-lived process of the executor that keeps
the group's decoded state between micro-batches, whichever Python worker Spark hands the task.

Why: Spark hands a task the Python worker idle longest, so a group's worker changes from batch to
batch (two tasks swap their workers, and the pool serves the source's stages too). A worker's
decoded chunks (:class:`ctiflow.jobs.state.warm.WarmChunks`) then lag the store: it reads the
frames the other worker wrote and absorbs them, and reads whole the chunks the other compacted —
measured end to end with sparse keys (bins, 3M keys): 767–1,059 ms of state a batch after a
swap against 248–402 without one. Here the work goes to the state instead: the worker sends the
group's rows to the group's host and serves the host's state calls (Spark's state server talks
only to the worker), the host runs :meth:`OperatorProcessor._batch` — the same code a worker ran —
and sends back the output frames.

Processes: ctiflow's daemon (:mod:`ctiflow.jobs.datapath.spark_daemon`) starts a host server
(:func:`start`) before it forks any worker: a child with no thread, so it can fork. Workers —
forked from the daemon afterwards — inherit :data:`SERVER` (the server's directory and a random
key; no environment variable, no file holds the key). A worker connects to the host of
``(processor, group)`` at ``<dir>/<digest>-<group>``; when there is none, it asks the server, which
forks one (the listening socket made before the fork). Every connection is authenticated with the
key (:func:`multiprocessing.connection.deliver_challenge`): the directory is the user's own (0700)
and the key proves the peer is one of this daemon's processes. A worker keeps its connection to
a host for its next call (a connect and its challenges cost a few round trips a call otherwise). A
host serves one call at a time, whichever worker's connection it comes on, and ends when idle
:data:`HOST_IDLE_S`, soon after its query stopped once another processor's host serves its group
(:data:`SUPERSEDED_GAPS`), or when the server ends; the server ends with the daemon (its pidfd),
its hosts and directory with it. Hosts are the daemon's grandchildren: what counts an executor's
Python processes (``bench``'s peak memory) counts them.

Contract: nothing here changes what a batch computes — a host's cache is proven current by the
header's token exactly as a worker's (a replayed batch, another query or another process that
ran the group since: the host reads the store). A bug in the host fails the task with the host's
traceback; a host that dies (killed, out of memory) during a call fails the task, and its retry
gets a new host (one that ended between calls: the call goes to a new host). Without ctiflow's
daemon (``spark.python.use.daemon`` false, or a processor called in-process) :data:`SERVER` is None
and the worker runs the batch itself; a job whose groups keep nothing under keys
(:attr:`~ctiflow.jobs.core.plan.Plan.keeps_keys`) runs it there too.

Why by hand: Spark has no executor-side process that outlives a task but its Python daemon, and no
task-to-worker affinity; the wire is :mod:`multiprocessing.connection`'s (lengths, HMAC challenge),
its messages pickles of protocol 5 whose large bytes travel out of band (:func:`_send`)."""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

#: A host with no call for this long ends (its decoded state goes with it; the next call's host
#: reads the store): bounds the processes a daemon keeps for queries that stopped.
HOST_IDLE_S = 300.0
#: A host whose key group another processor's host now serves (the next query of a session, a job
#: restarted with another plan) ends once idle this many times the gap between its last two calls
#: (+ 1 s): soon after its query stopped, not while a query it serves runs beside the other (its
#: calls keep coming within that gap).
SUPERSEDED_GAPS = 3.0
#: How often an idle host checks its idle limit and that its server lives; SIGUSR1 (superseded)
#: wakes it at once, so a host idle past its limit then ends as another query's host starts.
CHECK_EVERY_S = 1.0
#: How long a worker waits for a host to accept before it asks the server again.
CONNECT_TIMEOUT_S = 30.0
#: How often a worker that cannot connect asks the server for the host (again).
ASK_EVERY_S = 0.5
#: A bytes value of a call's frames at least this long (a pack of rows or of results) travels beside
#: the message's pickle, not in it (:func:`_send`).
OUT_OF_BAND_BYTES = 1 << 16


@dataclass(frozen=True)
class Server:
    """Where this daemon's host server listens, and the key its processes share."""

    directory: str
    key: bytes

    @property
    def address(self) -> str:
        return os.path.join(self.directory, "server")

    def host_address(self, digest: str, group) -> str:
        return os.path.join(self.directory, f"{digest}-{group}")


#: This daemon's host server (set in the daemon before it forks workers; None: no server, the
#: worker runs its batches itself)
SERVER: Server | None = None


class GroupHostError(RuntimeError):
    """A key group's host failed its call (a bug: the host's traceback follows) or died."""


# -- the worker's side --------------------------------------------------------------------------

#: this worker's connections to hosts, (server, digest, group) → connection: a worker keeps one to each
#: host it called, for its next call (one connection carries a worker's calls to a host)
_LINKS: dict = {}


def run(server: Server, digest: str, shipped: bytes, group, frames: list, reports: bool, handle) -> list:
    """The output frames of key group ``group``'s call, run in its host: ``frames`` (the call's
    input) and, on a new connection, ``shipped`` (the processor as pickled before ``init``) sent,
    the host's state calls made on ``handle`` (:class:`RecordingHandle`, the worker's) until it
    answers — each message's queued writes first, in order (:class:`_Link`). A kept connection
    whose host ended before the call reached the state (idle, killed) is replaced once: nothing
    of the call ran."""
    conn = _LINKS.pop((server, digest, group), None)
    kept = conn is not None
    conn = conn or _connect(server, digest, group)
    called = False
    try:
        _send(conn, ("batch", None if kept else shipped, group, out_of_band(frames), reports))
        while True:
            msg = _recv(conn)
            if msg[0] == "call":
                called = True
                _send_reply(conn, _made(handle, *msg[1:]))
            elif msg[0] == "done":
                _, writes, out = msg
                kind, got = _made(handle, writes, None)
                if kind == "error":  # (Spark's state call failed: the task fails on it)
                    raise got
                _LINKS[server, digest, group], conn = conn, None
                return out
            else:
                raise GroupHostError(f"key group {group!r} failed in its host:\n{msg[1]}")
    except (EOFError, OSError) as exc:
        if kept and not called:
            conn.close()
            conn = None
            return run(server, digest, shipped, group, frames, reports, handle)
        raise GroupHostError(f"the host of key group {group!r} ended during the call ({exc!r}); the task "
                             "is retried with a new host") from None
    finally:
        if conn is not None:
            conn.close()


def _made(handle, writes: list, call: tuple | None) -> tuple:
    """``writes`` made on the worker's variables in order, then ``call`` (None: none) → the reply:
    ``("ok", value)``, ``("iter", items)`` or ``("error", what Spark raised)``."""
    try:
        for var, method, args in writes:
            getattr(handle.var(var), method)(*args)
        if call is None:
            return "ok", None
        var, method, args = call
        got = getattr(handle.var(var), method)(*args)
        return ("iter", list(got)) if isinstance(got, Iterator) else ("ok", got)
    except Exception as exc:  # Spark's state call failed: the host raises it in its call
        return "error", exc


def _send_reply(conn: Connection, reply: tuple) -> None:
    try:
        _send(conn, reply)
    except (TypeError, AttributeError, ValueError, pickle.PicklingError) as exc:  # (Spark's error, as text)
        _send(conn, ("error", RuntimeError(f"{reply[1]!r} (not picklable: {exc})")))


# -- the wire between a worker and a host or the host server -----------------------------------

def out_of_band(frames: list, to_spark: bool = False) -> list:
    """``frames`` with each bytes value of at least :data:`OUT_OF_BAND_BYTES` wrapped to travel out of
    band (sent by :func:`_send`): the other side's frames hold a read-only ``memoryview`` there (a pack
    is read from any buffer) or, ``to_spark`` (a call's output, which the worker hands to Spark), the
    ``bytearray`` it was read into (:class:`_Beside`). (A host's input as a ``bytearray`` measured
    ≈ 30 MB more heap a host than as views in ``bench peers``' bins, 2026-12-06; not found why.)"""
    wrap = _Beside if to_spark else pickle.PickleBuffer
    out = []
    for frame in frames:
        columns = {}
        for name, dtype in frame.dtypes.items():
            values = frame[name].to_numpy() if dtype == object else ()
            large = [i for i, v in enumerate(values) if type(v) is bytes and len(v) >= OUT_OF_BAND_BYTES]
            if large:
                column = columns[name] = values.copy()
                for i in large:  # (one at a time: numpy reads a buffer in a list as an array)
                    column[i] = wrap(values[i])
        out.append(frame.assign(**columns) if columns else frame)
    return out


class _Beside:
    """A bytes value that travels beside its message's pickle (:func:`_send`) and is received as the
    ``bytearray`` :func:`_recv` read it into, not as the read-only ``memoryview`` pickle makes of such a
    buffer: pyarrow (26) converting a ``memoryview`` to a binary value keeps a view of it that is
    never freed — a hosted call's output packs, ≈ 2 MB a call, stayed in the worker that handed them
    to Spark (its heap grew ≈ 2.7 MB/s in ``bench peers``, measured 2026-12-06)."""

    __slots__ = ("buffer",)

    def __init__(self, value: bytes) -> None:
        self.buffer = pickle.PickleBuffer(value)

    def __reduce__(self):
        return _received, (self.buffer,)


def _received(view: memoryview) -> bytearray:
    return view.obj  # (the buffer _recv read the value into; the view is dropped)


def _send(conn: Connection, message) -> None:
    """``message`` pickled (protocol 5), its :class:`pickle.PickleBuffer` s out of band: the sizes,
    the pickle, then each buffer written straight from its memory (:func:`_recv` reads each into a
    ``bytearray`` of its own). Why by hand: :class:`~multiprocessing.connection.Connection` pickles
    with protocol 4, copying a call's ≈ 5 MB of packs into the pickle, and reads it through a
    ``BytesIO`` that copies it again; the host then copied it into new ``bytes``."""
    buffers: list = []
    data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    conn.send_bytes(struct.pack(f"<{len(raws)}Q", *(r.nbytes for r in raws)))
    conn.send_bytes(data)
    fd = conn.fileno()
    for raw in raws:
        while raw:
            raw = raw[os.write(fd, raw):]


def _recv(conn: Connection):
    """The message :func:`_send` sent (EOFError: the other side ended)."""
    sizes = conn.recv_bytes()
    data = conn.recv_bytes()
    fd, buffers = conn.fileno(), []
    for (size,) in struct.iter_unpack("<Q", sizes):
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise EOFError("the connection ended within a message")
            got += n
        buffers.append(buffer)
    return pickle.loads(data, buffers=buffers)


class RecordingHandle:
    """The worker's ``StatefulProcessorHandle`` with the state variables it made kept by their
    getter and arguments, so that a host's call on "the map state named X" reaches the very
    variable the worker's ``init`` made (Spark registers a variable per task: asking again
    would register it again)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.made: dict = {}

    def __getattr__(self, name: str):
        getter = getattr(self.handle, name)
        if not name.startswith("get") or not callable(getter):
            return getter

        def made(*args):  # (by the variable's name, its first argument: unique in a processor)
            var = self.made.get((name, args[0]))
            if var is None:
                var = self.made[name, args[0]] = getter(*args)
            return var
        return made

    def var(self, key):
        getter, args = key
        return getattr(self, getter)(*args)


def _connect(server: Server, digest: str, group) -> Connection:
    address = server.host_address(digest, group)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    asked = 0.0
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            now = time.monotonic()
            if now > deadline:
                raise GroupHostError(f"no host for key group {group!r} at {address} after "
                                     f"{CONNECT_TIMEOUT_S:.0f} s (ctiflow's host server: {server.address})")
            if now - asked > ASK_EVERY_S:  # (again later: a host that just ended may not be reaped yet)
                _ask(server, digest, group)
                asked = now
            else:
                time.sleep(0.01)
            continue
        conn = Connection(sock.detach())
        try:
            answer_challenge(conn, server.key)
            deliver_challenge(conn, server.key)
        except (EOFError, OSError):  # the host ended as it accepted (idle): ask for another
            conn.close()
            asked = 0.0
            continue
        return conn


def _ask(server: Server, digest: str, group) -> None:
    """Have the server start the host of ``(digest, group)`` (a no-op if it runs)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(server.address)
    except OSError as exc:
        sock.close()
        raise GroupHostError(f"ctiflow's host server at {server.address} does not answer ({exc!r}): the "
                             "Python daemon that started it has ended") from None
    conn = Connection(sock.detach())
    try:
        answer_challenge(conn, server.key)
        deliver_challenge(conn, server.key)
        _send(conn, ("host", digest, str(group)))
        _recv(conn)
    finally:
        conn.close()


# -- the host's side ----------------------------------------------------------------------------

class _WorkerGone(Exception):
    """The worker of the call a host serves ended (its task killed, the worker gone)."""


#: The state calls that return nothing (Spark's ``MapState``, ``ValueState`` and ``ListState``):
#: a host queues them and sends them with its next call that returns something, with
#: :meth:`_Link.send_writes` or with its answer — a round trip for every few reads, not one a write.
WRITES = frozenset({"updateValue", "removeKey", "update", "put", "appendValue", "appendList", "clear"})


class _Link:
    """The connection of the call a host serves (one at a time), and the writes it queued. A
    write's arguments are sent as they are when it is sent (bytes and tuples: not changed after);
    the worker makes the queued writes in order before the call they come with, so a read sees
    every write made before it. Writes still queued when a call fails are dropped: the task fails,
    and Spark keeps none of its state changes."""

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.writes: list = []

    def start(self, conn: Connection | None) -> None:
        self.conn, self.writes = conn, []

    def call(self, var, method: str, args: tuple):
        if method in WRITES:
            self.writes.append((var, method, args))
            return None
        return self._sent((var, method, args))

    def send_writes(self) -> None:
        """Have the worker make the queued writes now (one round trip), not with the answer."""
        if self.writes:
            self._sent(None)

    def take_writes(self) -> list:
        writes, self.writes = self.writes, []
        return writes

    def _sent(self, call: tuple | None):
        try:
            _send(self.conn, ("call", self.take_writes(), call))
            kind, got = _recv(self.conn)
        except (EOFError, OSError) as exc:
            raise _WorkerGone() from exc
        if kind == "error":
            raise got
        return iter(got) if kind == "iter" else got  # (an iterator's items come as a list)


class _ProxyVar:
    """A state variable of the worker's, each call made there (:func:`run`; writes queued: :class:`_Link`)."""

    def __init__(self, link: _Link, var) -> None:
        self._link, self._var = link, var

    def __getattr__(self, method: str):
        link, var = self._link, self._var
        return lambda *args: link.call(var, method, args)


class _ProxyHandle:
    """A ``StatefulProcessorHandle`` whose state variables are the worker's (:class:`_ProxyVar`)."""

    def __init__(self, link: _Link) -> None:
        self._link = link

    def __getattr__(self, name: str):
        if not name.startswith("get"):
            raise AttributeError(f"a key group's host has no {name!r} of Spark's handle")
        return lambda *args: _ProxyVar(self._link, (name, args))


def writes_sender(handle):
    """What sends the writes a call queued to the store now (:meth:`_Link.send_writes`) when
    ``handle`` is a host's; a no-op for Spark's own handle (its writes reached the store as made)."""
    return handle._link.send_writes if isinstance(handle, _ProxyHandle) else _no_writes


def _no_writes() -> None:
    pass


def _host(listener: socket.socket, key: bytes, server_pid: int) -> None:
    """A host's life: the calls of the workers connected to ``listener``, one at a time; ends when
    idle :data:`HOST_IDLE_S`, when superseded (SIGUSR1 from the server, which wakes it) and idle
    :data:`SUPERSEDED_GAPS` times its last gap between calls, or when its server has ended."""
    link, processor, conns, superseded = _Link(), None, [], []
    idle_since, started, gap = time.monotonic(), None, 0.0
    signalled, wakeup = socket.socketpair()  # (a signal's byte ends the select: the check runs at once)
    wakeup.setblocking(False)
    signal.set_wakeup_fd(wakeup.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGUSR1, lambda *_: superseded.append(True))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # (blocked in the server: see _serve)
    while True:
        ready, _, _ = select.select([listener, signalled, *conns], [], [], CHECK_EVERY_S)
        if signalled in ready:
            signalled.recv(64)
            ready.remove(signalled)
        if not ready:
            idle = time.monotonic() - idle_since
            limit = min(HOST_IDLE_S, SUPERSEDED_GAPS * gap + 1.0) if superseded else HOST_IDLE_S
            if os.getppid() != server_pid or idle > limit:
                return
            continue
        for conn in ready:
            if conn is listener:
                sock, _ = listener.accept()
                conn = Connection(sock.detach())
                try:
                    deliver_challenge(conn, key)
                    answer_challenge(conn, key)
                    conns.append(conn)
                except (EOFError, OSError, AuthenticationError):  # (a peer without the key: refused)
                    conn.close()
                continue
            link.start(conn)
            now = time.monotonic()
            gap, started = (now - started if started is not None else gap), now
            try:
                _, shipped, group, frames, reports = _recv(conn)
                processor = _call(conn, link, processor, shipped, frames, reports)
            except (EOFError, OSError, _WorkerGone):  # the worker is gone (its task killed, the worker
                conns.remove(conn)                     # ended): what a call took from the cache is gone too
                conn.close()
            finally:
                link.start(None)
                frames = None  # (the call's input is not kept while idle)
                idle_since = time.monotonic()


def _call(conn: Connection, link: _Link, processor, shipped: bytes | None, frames: list, reports: bool):
    """One call of a worker's: its output sent, or the traceback of the bug that failed it → the
    host's processor (unpickled from ``shipped`` on the host's first call)."""
    from pyspark import cloudpickle

    from ctiflow.jobs.core.alloc import cyclic_gc_paused

    try:
        if processor is None:  # (kept only once its init succeeded)
            loaded = cloudpickle.loads(shipped)
            loaded.init(_ProxyHandle(link))
            processor = loaded
        with cyclic_gc_paused():
            out = list(processor._batch(frames, reports))
    except _WorkerGone:
        raise
    except Exception:
        _send(conn, ("failed", traceback.format_exc()))
    else:
        _send(conn, ("done", link.take_writes(), out_of_band(out, to_spark=True)))
    return processor


def _serve(server: Server, listener: socket.socket, daemon_pid: int) -> None:
    """The host server's life: start hosts on request (a new processor's host for a key group
    supersedes the others' hosts of that group: SIGUSR1, see :data:`SUPERSEDED_GAPS`); end with the
    daemon, its hosts with it. SIGUSR1 stays blocked here, so a host forked from here gets it only
    once its handler is set (:func:`_host`)."""
    hosts: dict[tuple[str, str], int] = {}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    watch = os.pidfd_open(daemon_pid)
    try:
        while True:
            ready, _, _ = select.select([listener, watch], [], [], 5.0)
            _reap(hosts)
            if watch in ready:
                return
            if listener not in ready:
                continue
            sock, _ = listener.accept()
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, server.key)
                answer_challenge(conn, server.key)
                _, digest, group = _recv(conn)
                if (digest, group) not in hosts:
                    for (other, g), pid in hosts.items():
                        if g == group and other != digest:
                            _signal(pid, signal.SIGUSR1)
                    hosts[digest, group] = _fork_host(server, f"{digest}-{group}")
                _send(conn, "ok")
            except (EOFError, OSError, AuthenticationError):
                pass
            finally:
                conn.close()
    finally:
        for pid in hosts.values():
            _signal(pid, signal.SIGTERM)
        shutil.rmtree(server.directory, ignore_errors=True)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # (ended: reaped at the next round)
        os.kill(pid, sig)


def _reap(hosts: dict) -> None:
    """Forget the hosts that ended (their socket files removed: the next call starts another)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for name, p in list(hosts.items()):
            if p == pid:
                del hosts[name]


def _fork_host(server: Server, name: str) -> int:
    address = os.path.join(server.directory, name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # (a host that ended left it)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(8)
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            _host(listener, server.key, server_pid)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(OSError):
                os.unlink(address)
            os._exit(code)
    listener.close()
    return pid


def start() -> Server | None:
    """Start this daemon's host server (call it before the daemon forks a worker: the server
    forks the hosts, and the workers inherit :data:`SERVER`) → it, or None where processes
    cannot be forked so (then workers run their batches themselves)."""
    global SERVER
    try:
        os.close(os.pidfd_open(os.getpid()))  # (Linux ≥ 5.3, and a container's seccomp lets it)
    except (AttributeError, OSError):
        return None
    server = Server(tempfile.mkdtemp(prefix="ctiflow-hosts-"), os.urandom(32))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server.address)
    listener.listen(64)
    daemon_pid = os.getpid()
    if os.fork() == 0:  # (the daemon's child; it ends with the daemon: _serve watches it)
        code = 0
        try:
            os.setpgid(0, 0)  # (a terminal's Ctrl-C is the job's driver's to handle, not ours)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, _exit_cleanly)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)  # (the daemon's stdin is the JVM's pipe, its stdout too)
            os.dup2(2, 1)
            _serve(server, listener, daemon_pid)
        except SystemExit:
            pass
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    listener.close()
    SERVER = server
    return server


def _exit_cleanly(signum, _frame):
    raise SystemExit(0)  # (the server's cleanup runs: its hosts ended, its directory removed)


def shipped(processor) -> tuple[str, bytes]:
    """``processor`` as a host receives it (pickled as Spark pickles it, before ``init``) and its
    digest (a host serves one processor: another plan is another host)."""
    import hashlib

    from pyspark import cloudpickle

    data = cloudpickle.dumps(processor)
    return hashlib.sha256(data).hexdigest()[:24], data


