"""The cyclic collector is paused inside a batch's work and restored after it, nested or not."""

import gc

import pytest

from ctiflow.jobs.core.alloc import cyclic_gc_paused


@pytest.fixture(autouse=True)
def _restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_restored_after_even_when_nested_or_raising():
    gc.enable()
    with cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block must not re-enable it for the outer one
    assert gc.isenabled()
    with pytest.raises(KeyError):
        with cyclic_gc_paused():
            raise KeyError("a bug")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    with cyclic_gc_paused():
        pass
    assert not gc.isenabled()
