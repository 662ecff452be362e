"""Spark master URLs: the forms spark-submit and ``SparkContext`` take (Spark 4 has no Mesos), and
whether the master named answers — checked before an archive is built or a JVM is started, so a
typo or a master that is down is one line naming it, not a Py4J error a minute later (Spark retries
registering with a standalone master for ≈ 80 s before it gives up)."""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

from ctiflow.operators.errors import ConfigError

#: ``local``, ``local[N]``, ``local[*]``, ``local[N, F]`` / ``local[*, F]`` (F: task failures
#: tolerated), ``local-cluster[N, cores, MiB]``: Spark's ``SparkMasterRegex``.
LOCAL = re.compile(r"local(\[\s*(\d+|\*)\s*(,\s*\d+\s*)?\])?|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]")
#: What to write instead, in the refusals.
FORMS = ("spark://HOST:PORT[,HOST:PORT...] (standalone), yarn, k8s://https://HOST:PORT, local, local[N], "
         "local[*], local[N,F]")
#: How long one endpoint has to accept a connection.
CONNECT_TIMEOUT_S = 5.0


def endpoints(master: str, option: str) -> list[tuple[str, int]]:
    """The (host, port) pairs ``master`` connects to — a standalone master's (any of them
    answering will do), Kubernetes' API server — or none (``yarn`` finds its ResourceManager in
    the Hadoop configuration, ``local`` runs here). Raises :class:`ConfigError` naming ``option``
    for a URL of no form Spark takes."""
    if master == "yarn" or LOCAL.fullmatch(master):
        return []
    if master.startswith("spark://"):
        found = []
        for one in master[len("spark://"):].split(","):
            parts = urlsplit(f"spark://{one.strip()}")
            try:
                port = parts.port
            except ValueError:
                port = None
            if not parts.hostname or port is None or parts.path or parts.username or parts.password:
                raise ConfigError(f"{option} {master!r}: a standalone master is spark://HOST:PORT (several: "
                                  f"spark://HOST1:PORT1,HOST2:PORT2); {one.strip()!r} is not HOST:PORT")
            found.append((parts.hostname, port))
        return found
    if master.startswith("k8s://"):
        api = master[len("k8s://"):]
        parts = urlsplit(api if "://" in api else f"https://{api}")
        try:
            port = parts.port or (80 if parts.scheme == "http" else 443)
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise ConfigError(f"{option} {master!r}: Kubernetes is k8s://https://HOST:PORT (the API server)")
        return [(parts.hostname, port)]
    raise ConfigError(f"{option} {master!r}: not a master Spark takes; give one of {FORMS}")


def check_master(master: str, option: str, *, reach: bool = True) -> None:
    """Refuse ``master`` (given as ``option``: ``--master``, ``spark.master``) unless it is of a
    form Spark takes and — with ``reach`` — one of its :func:`endpoints` accepts a TCP connection
    within :data:`CONNECT_TIMEOUT_S`. Only the port is probed: something else listening there is
    found by Spark itself."""
    found = endpoints(master, option)
    if not reach or not found:
        return
    reasons = []
    for host, port in found:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
            return
        except socket.gaierror:
            reasons.append(f"{host} does not resolve")
        except (socket.timeout, TimeoutError):
            reasons.append(f"{host}:{port} did not answer within {CONNECT_TIMEOUT_S:g} s")
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    what = "Kubernetes' API server" if master.startswith("k8s://") else "the Spark master"
    raise ConfigError(f"{option} {master}: {what} cannot be reached ({'; '.join(reasons)}); start it, or "
                      "give the URL of one that runs")
