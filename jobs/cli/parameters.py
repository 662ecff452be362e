"""Parameters several commands share: where the broker and the Schema Registry are."""

from __future__ import annotations

import codecs
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, BinaryIO, Optional

import typer

from ctiflow.jobs.ops import stack
from ctiflow.jobs.driver.config import broker_port, load
from ctiflow.jobs.avro.serde import SchemaStore, registry_client
from ctiflow.operators.errors import CtiflowError

#: The embedded broker's default port (``--port``, else ``CTIFLOW_BROKER_PORT``, else this).
DEFAULT_PORT = stack.DEFAULT_PORT

Port = Annotated[int, typer.Option(envvar="CTIFLOW_BROKER_PORT", min=1, max=65535,
                                   help="loopback port of the embedded broker")]
Bootstrap = Annotated[Optional[str], typer.Option(
    "--bootstrap", "-b", envvar="CTIFLOW_BOOTSTRAP",
    help="Kafka bootstrap servers (default: the embedded broker)")]
Registry = Annotated[Optional[str], typer.Option(
    "--registry", envvar="CTIFLOW_SCHEMA_REGISTRY_URL", help="Schema Registry URL")]


class InputError(CtiflowError):
    """What a command was given (a file, an option's value) cannot be used; the message names it."""


def not_utf8(exc: UnicodeDecodeError) -> str:
    """The one message for text that is not UTF-8: the first byte that is not, and where."""
    return f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at position {exc.start + 1}: {exc.reason})"


def read_text(path: Path) -> str:
    """A user's text file: UTF-8, a byte-order mark skipped; else an :class:`InputError` naming
    it (a missing file, a folder: ``OSError``, reported with its name by :func:`ctiflow.jobs.cli.main`)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {not_utf8(exc)}") from None


def open_lines(file: str) -> tuple[str, BinaryIO]:
    """A JSON-lines input opened now (``-``: standard input): its name for messages, and its
    lines as bytes — decode each with :func:`decode_line`, so a line that is not UTF-8 is
    named by its number. A missing file or a folder fails here, before anything connects."""
    if file == "-":
        return "<stdin>", sys.stdin.buffer
    return file, open(file, "rb")


def decode_line(raw: bytes, number: int) -> str:
    """Line ``number`` (1-based) of a JSON-lines input as text: UTF-8, the first line's byte-order
    mark skipped; not UTF-8: ``UnicodeDecodeError``."""
    return (raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw).decode("utf-8")


def bootstrap_servers(bootstrap: str | None) -> str:
    """The ``--bootstrap`` given, else the embedded broker's address."""
    return bootstrap or f"127.0.0.1:{broker_port()}"


JobFile = Annotated[Optional[Path], typer.Option(
    "--config", "-c", help="a job's YAML: connect as the job does (bootstrap, client settings with TLS/SASL, "
    "credentials, Schema Registry)")]


@dataclass(frozen=True)
class Connection:
    """Where and how a command talks to Kafka and the Schema Registry: the same settings a job
    uses (:class:`ctiflow.jobs.driver.config.Kafka`) when ``--config`` names one, else the flags, the
    ``CTIFLOW_*`` variables and the embedded broker."""

    bootstrap: str
    client: dict[str, str]
    registry_url: str | None = None
    registry_config: dict[str, str] | None = None
    store: SchemaStore | None = None  # with --config: the job's schemas, derived ones included

    def registry(self):
        return registry_client(self.registry_url, self.registry_config) if self.registry_url else None


def connection(bootstrap: str | None = None, registry: str | None = None,
               config: Path | None = None) -> Connection:
    """The flags win over the job file, the job file over the defaults."""
    if config is None:
        return Connection(bootstrap_servers(bootstrap), {}, registry)
    cfg = load(config)
    from ctiflow.jobs.driver.recognize import job_schema_store  # the job's derived output schemas decode
                                                                # its topics

    kafka_cfg = cfg.kafka
    return Connection(bootstrap or kafka_cfg.bootstrap_servers, kafka_cfg.client_config(),
                      registry or kafka_cfg.schema_registry.url, kafka_cfg.schema_registry.client_config(),
                      job_schema_store(cfg))
