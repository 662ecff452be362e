"""Reading operator and state snapshots back: pickles, some written before ctiflow's modules
moved under the ``ctiflow`` package.

A snapshot pickles a few of our classes by module path (``EventColumns``, ``Event``). Those
written by earlier versions name ``operators.columns`` / ``jobs.…``; :func:`loads` reads them as
``ctiflow.operators.columns`` / ``ctiflow.jobs.…``, so a checkpoint keeps restoring across the move
(and a checkout whose top-level ``operators`` folder happens to be importable never gets a
second, unrelated copy of a class). Every snapshot is read through here.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

_MOVED = ("operators", "jobs")
_VOCABULARY = "ctiflow.operators.cep.expr.vocabulary"
#: Classes that moved to another module since: (old module, name) → new module.
_CLASSES = {("ctiflow.operators.cep.recognize", "Row"): _VOCABULARY,
            ("ctiflow.operators.cep.recognize", "Timestamp"): _VOCABULARY,
            ("ctiflow.operators.cep.sql", "Row"): _VOCABULARY,
            ("ctiflow.operators.cep.sql", "Timestamp"): _VOCABULARY}
#: Modules that moved since (2026-11-29: ``jobs/`` and ``operators/cep/`` in rooms): old → new.
_MODULES = {
    **{f"ctiflow.operators.cep.{old}": f"ctiflow.operators.cep.{new}" for old, new in (
        ("tree", "expr.tree"), ("evaluate", "expr.evaluate"), ("column_form", "expr.column_form"),
        ("expression", "expr.expression"), ("sql", "sql.parse"), ("sql_check", "sql.check"),
        ("sql_translate", "sql.translate"),
        ("compiler", "nfa.compiler"), ("nfa", "nfa.nfa"), ("shared_buffer", "nfa.shared_buffer"),
        ("contiguous_buffer", "nfa.contiguous_buffer"), ("heap", "nfa.heap"),
        ("skip_strategy", "nfa.skip_strategy"))},
    "ctiflow.operators.cep.packed": "ctiflow.operators.packed",
    "ctiflow.operators.cep.nfa.packed": "ctiflow.operators.packed",
    **{f"ctiflow.jobs.{module}": f"ctiflow.jobs.{room}.{module}" for room, modules in (
        ("core", ("runtime", "plan", "broadcast", "rows", "counters", "definitions", "text_forms", "alloc")),
        ("datapath", ("adapter", "sink", "own_topics", "kafka", "librdkafka", "spark_daemon")),
        ("driver", ("config", "planner", "fields", "recognize", "check", "pipeline", "jvm", "checkpoint",
                    "progress", "rules", "masters", "submit", "metrics")),
        ("ops", ("status", "stack", "demo", "plot"))) for module in modules},
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.partition(".")[0] in _MOVED:
            module = f"ctiflow.{module}"
        module = _CLASSES.get((module, name), module)
        module = _MODULES.get(module, module)
        return super().find_class(module, name)


def loads(data: bytes) -> Any:
    """``pickle.loads(data)`` with the modules of earlier versions read under their new names."""
    return _Unpickler(io.BytesIO(data)).load()


class EarlierFormat(Exception):
    """A snapshot written in an earlier format of its reader (``what``, format ``version``): the
    reader knows its current format only; ``ctiflow.jobs.state.compat.upgrade`` rewrites the bytes
    in it, and the reader reads them again."""

    def __init__(self, what: str, version: int) -> None:
        super().__init__(f"a {what} snapshot of format {version}")
        self.what, self.version = what, version


def check_format(what: str, version: Any, current: int) -> None:
    """Accept ``version`` if it is ``current``; an earlier one raises :class:`EarlierFormat`, any
    other (a later ctiflow's, or no format at all) a ``ValueError`` naming it."""
    if version == current:
        return
    if isinstance(version, int) and 0 < version < current:
        raise EarlierFormat(what, version)
    raise ValueError(f"a {what} snapshot of format {version!r}, which this ctiflow (format {current}) "
                     "cannot read: it was written by a later version")
