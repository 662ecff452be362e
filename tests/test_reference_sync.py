"""Reference sync: CTI import vs the older of both CTIs on a silent reference stream
(seed: "AdvanceTimeImportSettings ... so the join produces output as fast as the fastest input")."""

import pytest

from ctiflow.operators.errors import ConfigError
from ctiflow.operators.reference import ReferenceJoinSettings, SyncMode, join_cti
from ctiflow.jobs.testing.time_layer import run_reference_sync
from ctiflow.operators.time import (
    CTI_INFINITY,
    REASON_ADJUSTED,
    REASON_DROPPED,
    AdvanceTimeSettings,
    Event,
    ViolationPolicy,
)

INF = CTI_INFINITY
COMMIT_AT_ONCE = AdvanceTimeSettings(delay=-1)  # a CTI one tick after each event


def version(t, offset, **fields):
    return Event("dev", t, INF, fields, offset=offset, stream="reference")


def clicks(times):
    return [Event("dev", t, t, {"n": t}, offset=t, stream="events") for t in times]


def silent_reference():
    """One device version at 0, then the reference stream is silent while 100 clicks come."""
    return [version(0, 0, owner="x")] + clicks(range(1, 101))


def before_flush(run):
    return [o for s in run.steps if s.cti < INF for o in s.outputs]


def test_import_keeps_output_flowing_while_the_reference_is_silent():
    run = run_reference_sync(ReferenceJoinSettings(sync="import"), COMMIT_AT_ONCE, COMMIT_AT_ONCE,
                             silent_reference())
    assert len(before_flush(run)) == 100
    for step in run.steps[:-1]:  # each click is enriched as soon as its own CTI (t + 1) comes
        assert [o.record["time"] for o in step.outputs] == [step.cti - 1]
    assert all(o.record["reference"] == {"owner": "x"} for o in run.outputs)


def test_min_stalls_while_the_reference_is_silent_until_the_final_cti():
    run = run_reference_sync(ReferenceJoinSettings(sync="min"), COMMIT_AT_ONCE, COMMIT_AT_ONCE,
                             silent_reference())
    assert before_flush(run) == []
    assert max(s.cti for s in run.steps if s.cti < INF) == 1  # the reference's CTI: 0 + 1
    assert len(run.outputs) == 100  # all of them at +∞


def test_min_catches_up_when_the_reference_speaks_and_never_makes_it_late():
    arrivals = silent_reference() + [version(50, 1, owner="y")]
    run = run_reference_sync(ReferenceJoinSettings(sync="min"), COMMIT_AT_ONCE, COMMIT_AT_ONCE,
                             arrivals)
    assert run.late == []
    assert [o.record["time"] for o in before_flush(run)] == list(range(1, 51))
    owners = {o.record["time"]: o.record["reference"]["owner"] for o in run.outputs}
    assert (owners[49], owners[50], owners[100]) == ("x", "y", "y")


def test_import_drops_a_reference_version_behind_the_imported_cti():
    arrivals = silent_reference() + [version(50, 1, owner="y")] + clicks([150])
    run = run_reference_sync(ReferenceJoinSettings(sync="import"), COMMIT_AT_ONCE, COMMIT_AT_ONCE,
                             arrivals)
    [late] = run.late
    assert (late.record["reason"], late.record["cti"], late.record["start"]) == (REASON_DROPPED, 101, 50)
    assert {o.record["reference"]["owner"] for o in run.outputs} == {"x"}


def test_import_with_adjust_makes_a_late_version_effective_from_the_cti():
    ref = AdvanceTimeSettings(delay=-1, policy=ViolationPolicy.ADJUST)
    arrivals = silent_reference() + [version(50, 1, owner="y")] + clicks([150])
    run = run_reference_sync(ReferenceJoinSettings(sync="import"), COMMIT_AT_ONCE, ref, arrivals)
    [late] = run.late
    assert (late.record["reason"], late.record["cti"]) == (REASON_ADJUSTED, 101)
    enriched = {o.record["time"]: o.record for o in run.outputs}
    assert enriched[100]["reference"] == {"owner": "x"}  # already final: not rewritten
    assert (enriched[150]["reference"], enriched[150]["reference_valid_from"]) == ({"owner": "y"}, 101)


def test_join_cti_is_the_fast_cti_under_import_and_the_older_under_min():
    assert join_cti(SyncMode.IMPORT, fast_cti=100, reference_cti=1) == 100
    assert join_cti(SyncMode.IMPORT, fast_cti=100, reference_cti=300) == 100
    assert join_cti(SyncMode.MIN, fast_cti=100, reference_cti=1) == 1


def test_import_mode_sets_import_from_on_the_reference_stream():
    cfg = ReferenceJoinSettings(sync="import").time_settings(COMMIT_AT_ONCE, COMMIT_AT_ONCE)
    assert cfg["reference"].import_from == "events" and cfg["events"].import_from is None


def test_min_mode_rejects_import_from():
    with pytest.raises(ConfigError, match='sync: "min"'):
        ReferenceJoinSettings(sync="min").time_settings(
            COMMIT_AT_ONCE, AdvanceTimeSettings(import_from="events"))
