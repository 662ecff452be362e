"""The binner benchmark runs end to end on a tiny workload and conserves the measures.

Never a wall-clock assertion: timing targets live in ``bench/bins_operator.py``.
"""

from __future__ import annotations

import pytest

from ctiflow.bench.bins_operator import run


def test_bench_conserves_measures():
    result = run(events=3_000, bin_size=1_000, keys=25, cti_every=100)
    assert result["events"] == 3_000
    assert result["records"]["bin_final"] > 0
    assert result["records"]["late"] == 0
    assert result["max_relative_error"] < 1e-12
    for m, total in result["input_sums"].items():
        assert result["final_sums"][m] == pytest.approx(total, rel=1e-12)
