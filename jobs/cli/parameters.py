"""Parameters several commands share: where the broker and the Schema Registry are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs import stack
from jobs.config import broker_port, load
from jobs.serde import registry_client

#: The embedded broker's default port (``--port``, else ``CTIFLOW_BROKER_PORT``, else this).
DEFAULT_PORT = stack.DEFAULT_PORT

Port = Annotated[int, typer.Option(envvar="CTIFLOW_BROKER_PORT", min=1, max=65535,
                                   help="loopback port of the embedded broker")]
Bootstrap = Annotated[Optional[str], typer.Option(
    "--bootstrap", "-b", envvar="CTIFLOW_BOOTSTRAP",
    help="Kafka bootstrap servers (default: the embedded broker)")]
Registry = Annotated[Optional[str], typer.Option(
    "--registry", envvar="CTIFLOW_SCHEMA_REGISTRY_URL", help="Schema Registry URL")]


def bootstrap_servers(bootstrap: str | None) -> str:
    """The ``--bootstrap`` given, else the embedded broker's address."""
    return bootstrap or f"127.0.0.1:{broker_port()}"


JobFile = Annotated[Optional[Path], typer.Option(
    "--config", "-c", help="a job's YAML: connect as the job does (bootstrap, client settings with TLS/SASL, "
    "credentials, Schema Registry)")]


@dataclass(frozen=True)
class Connection:
    """Where and how a command talks to Kafka and the Schema Registry: the same settings a job
    uses (:class:`jobs.config.Kafka`) when ``--config`` names one, else the flags, the
    ``CTIFLOW_*`` variables and the embedded broker."""

    bootstrap: str
    client: dict[str, str]
    registry_url: str | None = None
    registry_config: dict[str, str] | None = None

    def registry(self):
        return registry_client(self.registry_url, self.registry_config) if self.registry_url else None


def connection(bootstrap: str | None = None, registry: str | None = None, config: Path | None = None) -> Connection:
    """The flags win over the job file, the job file over the defaults."""
    if config is None:
        return Connection(bootstrap_servers(bootstrap), {}, registry)
    cfg = load(config)
    from jobs.recognize import derived_schemas  # the job's derived output schemas decode its topics
    from jobs.runtime import register_schemas

    register_schemas(derived_schemas(cfg))
    kafka_cfg = cfg.kafka
    return Connection(bootstrap or kafka_cfg.bootstrap_servers, kafka_cfg.client_config(),
                      registry or kafka_cfg.schema_registry.url, kafka_cfg.schema_registry.client_config())
