"""``ctiflow conformance``: recorded conformance suites (:mod:`ctiflow.jobs.testing.conformance`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ctiflow.jobs.testing.conformance import DEFAULT_CASES, main as replay

app = typer.Typer(no_args_is_help=True, help="Run recorded conformance suites.")


@app.command("cep")
def cep(file: Annotated[Optional[Path], typer.Argument(
        help="case file (default: the one in tests/data/)")] = None):
    """Replay Flink CEP's recorded test cases through the Pattern API; per-feature pass table."""
    raise typer.Exit(replay(str(file or DEFAULT_CASES)))
