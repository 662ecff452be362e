"""Parameters several commands share: where the broker and the Schema Registry are."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from jobs import stack

#: The embedded broker's port: ``CTIFLOW_BROKER_PORT`` or the stack's default.
DEFAULT_PORT = int(os.environ.get("CTIFLOW_BROKER_PORT", str(stack.DEFAULT_PORT)))

Port = Annotated[int, typer.Option(help="loopback port of the embedded broker")]
Bootstrap = Annotated[Optional[str], typer.Option(
    "--bootstrap", "-b", envvar="CTIFLOW_BOOTSTRAP",
    help="Kafka bootstrap servers (default: the embedded broker)")]
Registry = Annotated[Optional[str], typer.Option(
    "--registry", envvar="CTIFLOW_SCHEMA_REGISTRY_URL", help="Schema Registry URL")]


def bootstrap_servers(bootstrap: str | None) -> str:
    """The ``--bootstrap`` given, else the embedded broker's address."""
    return bootstrap or f"127.0.0.1:{DEFAULT_PORT}"
