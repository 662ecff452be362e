"""The embedded stack: ``up``, ``down``, ``status``, ``doctor`` and ``users create``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from ctiflow.jobs.ops import stack as embedded
from ctiflow.jobs.cli.consoles import console, out
from ctiflow.jobs.cli.parameters import DEFAULT_PORT, Port
from ctiflow.jobs.avro.serde import default_store
from ctiflow.operators.errors import CtiflowError

app = typer.Typer()
users_app = typer.Typer(no_args_is_help=True, help="SASL/SCRAM users of the embedded broker.")


@app.command()
def up(port: Port = DEFAULT_PORT,
       authentication: Annotated[bool, typer.Option(
           "--auth", help="require SASL/SCRAM (create users with `ctiflow users create`)")] = False):
    """Start the embedded Kafka-protocol broker (tansu) on 127.0.0.1:PORT."""
    proc = embedded.up(port, authentication=authentication)
    out.print(f"broker up: {proc.bootstrap} (pid {proc.pid}, log {proc.log})")


@app.command()
def down(port: Port = DEFAULT_PORT):
    """Stop the embedded broker."""
    out.print("broker stopped" if embedded.down(port) else f"no embedded broker was running on port {port}")


@app.command()
def broker(port: Port = DEFAULT_PORT):
    """Is the embedded broker running, and does it answer? (`ctiflow status` watches jobs.)"""
    st = embedded.status(port)
    answers = st.running and embedded.broker_ready(st.bootstrap)
    out.print(f"broker on {st.bootstrap}: {'running' if st.running else 'stopped'}"
              f"{f' (pid {st.pid})' if st.pid else ''}{', answering' if answers else ''}")
    raise typer.Exit(0 if st.running else 1)


@app.command()
def doctor(quiet: Annotated[bool, typer.Option("--quiet", help="print only problems")] = False):
    """Check the machine: Java 17+, pyspark, the broker binary, the schemas."""
    problems = []
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java") or (java_home and str(Path(java_home) / "bin/java"))
    if not java:
        problems.append("Java 17+ not found: install a JDK/JRE 17 "
                        "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    else:
        version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr.split("\n")[0]
        if not quiet:
            out.print(f"java: {version}")
    try:
        binary = embedded.tansu_binary()
        names = default_store().names()
        if not quiet:
            import pyspark  # here: only the full report pays for importing Spark

            out.print(f"pyspark {pyspark.__version__}; broker {binary}; schemas: {', '.join(names)}")
    except CtiflowError as exc:
        problems.append(str(exc))
    for problem in problems:
        console.print(f"[red]problem:[/red] {problem}")
    raise typer.Exit(1 if problems else 0)


@users_app.command("create")
def users_create(username: str,
                 password: Annotated[str, typer.Option(
                     prompt=True, hide_input=True, envvar="CTIFLOW_SASL_PASSWORD")],
                 port: Port = DEFAULT_PORT):
    """Create a SCRAM user on the embedded broker."""
    embedded.create_user(port, username, password)
    out.print(f"user {username!r} created")
