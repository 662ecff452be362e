"""What librdkafka itself says about its configuration properties (the one confluent-kafka loads).

Written by hand because no library exposes it: confluent-kafka has no property table. librdkafka
prints its table (``rd_kafka_conf_properties_show``) and, when a client is created with
``debug=conf``, logs its settings with every property it flags ``_RK_SENSITIVE`` as
``[redacted]``: that flag, not a list kept here, decides what ctiflow treats as a secret.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import tempfile

_PROBE = "ctiflow-probe-value"


def _library() -> ctypes.CDLL:
    """librdkafka as confluent-kafka's extension links it (its symbols via the extension's handle)."""
    from confluent_kafka import cimpl

    return ctypes.CDLL(cimpl.__file__)


@functools.cache
def string_properties() -> tuple[str, ...]:
    """Every property librdkafka's table types as a string."""
    lib, libc = _library(), ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    fd, path = tempfile.mkstemp(prefix="ctiflow-librdkafka-")
    os.close(fd)
    try:
        stream = libc.fopen(path.encode(), b"w")
        if not stream:
            raise OSError(f"cannot write librdkafka's property table to {path}")
        lib.rd_kafka_conf_properties_show(stream)
        libc.fclose(stream)
        with open(path) as table:
            rows = table.read().splitlines()
    finally:
        os.unlink(path)
    names = [m.group(1) for row in rows if "*Type: string*" in row
             for m in [re.match(r"([a-z][a-z0-9._]*)\s+\|", row)] if m]
    if not names:
        raise RuntimeError("librdkafka printed no string properties: its table format changed "
                           "(a bug to fix here)")
    return tuple(dict.fromkeys(names))


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@functools.cache
def sensitive_properties() -> frozenset[str]:
    """The properties librdkafka redacts as sensitive (each set alone on a throw-away producer
    with ``debug=conf``; a property it refuses a plain string for is not one of them)."""
    from confluent_kafka import KafkaException, Producer

    found = set()
    for name in string_properties():
        lines = _Lines()
        logger = logging.getLogger(f"ctiflow.librdkafka.{name}")
        logger.addHandler(lines)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        try:
            Producer({"debug": "conf", "logger": logger, name: _PROBE}).flush(0)
        except (KafkaException, ValueError, TypeError):
            continue
        finally:
            logger.removeHandler(lines)
        if any(f"{name} = [redacted]" in line for line in lines.lines):
            found.add(name)
    if not found:
        raise RuntimeError("librdkafka redacted no property in its conf log: its format changed "
                           "(a bug to fix here)")
    return frozenset(found)


if __name__ == "__main__":  # the list ctiflow.jobs.core.secrets.SECRET_KEYS holds
    print("\n".join(sorted(sensitive_properties())))
