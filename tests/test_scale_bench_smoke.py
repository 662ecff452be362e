"""`ctiflow bench scale` runs and builds the live keys it reports (figures are not asserted)."""

from rich.console import Console

from bench.state_scale import main


def test_the_scale_bench_builds_its_live_keys_and_prints_a_row_each():
    rows = main(Console(file=open("/dev/null", "w")), sizes=(500, 3000), per_batch=300, active=40, batches=3,
                chunk_keys=8)
    assert [(r.operator, r.live_keys) for r in rows] == [
        ("identity", 0), ("count", 500), ("count", 3000), ("match", 500), ("match", 3000), ("bins", 500), ("bins", 3000)]
    assert all(r.events == 600 and r.written > 0 for r in rows[1:])
