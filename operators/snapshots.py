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
#: Classes that moved to another module since: (old module, name) → new module.
_CLASSES = {("ctiflow.operators.cep.recognize", "Row"): "ctiflow.operators.cep.sql",
            ("ctiflow.operators.cep.recognize", "Timestamp"): "ctiflow.operators.cep.sql"}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module.partition(".")[0] in _MOVED:
            module = f"ctiflow.{module}"
        module = _CLASSES.get((module, name), module)
        return super().find_class(module, name)


def loads(data: bytes) -> Any:
    """``pickle.loads(data)`` with the modules of earlier versions read under their new names."""
    return _Unpickler(io.BytesIO(data)).load()
