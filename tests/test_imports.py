"""Every module imports: a syntax error in code no other test reaches (the demo, a benchmark)
fails here, not in front of a user."""

import importlib
import pkgutil

import pytest

import ctiflow.bench as bench
import ctiflow.jobs as jobs
import ctiflow.operators as operators


@pytest.mark.parametrize("name", sorted(m.name for pkg in (jobs, operators, bench)
                                        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")))
def test_module_imports(name):
    importlib.import_module(name)
