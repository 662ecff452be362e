"""Plots render count and bin records to PNGs of the requested size, whatever the records hold."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ctiflow.jobs.ops.plot import DEFAULT_SIZE, plot_bins, plot_counts
from ctiflow.jobs.testing import oracle

T0 = 1_767_225_600_000


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def count_record(counter: str, key: str, t: int, estimate: float, exact: int | None = None) -> dict:
    return {"counter": counter, "key": key, "time": T0 + t, "window_kind": "events", "window": 100,
            "epsilon": 0.1, "estimate": estimate, "lower": int(estimate) - 1, "upper": int(estimate) + 1,
            "seed_estimate": int(estimate), "bucket_count": 3, "exact": exact}


def bin_record(key: str, k: int, kind: str, bytes_: float, revision: int = 1, cti: int = 0) -> dict:
    return {"binner": "traffic", "key": key, "bin_start": T0 + k * 60_000, "bin_end": T0 + (k + 1) * 60_000,
            "measures": {"bytes": bytes_, "packets": bytes_ / 100}, "fraction_sum": 1.0, "events": 2,
            "revision": revision, "final": kind == "final", "cti": T0 + cti, "kind": kind}


COUNTS = [count_record(c, f"acct-{k:04d}", t * 1000, 10 + t % 7)
          for c in ("big", "fails") for k in range(5) for t in range(40)]


def bins_records() -> list[dict]:
    out = []
    for key in ("dev-001", "dev-002"):
        for k in range(6):
            first, second = k * 60_000, (k + 2) * 60_000  # the CTIs of revisions 1 and 2
            out += [bin_record(key, k, "incremental", 300.0, 1, first), bin_record(key, k, "incremental", 700.0, 2, second),
                    bin_record(key, k, "updated", 300.0, 1, first), bin_record(key, k, "updated", 1000.0, 2, second),
                    bin_record(key, k, "final", 1000.0, 2, second)]
    return out


def test_counts_plot_is_a_png_of_the_default_size(tmp_path):
    path = plot_counts(COUNTS, tmp_path / "counts.png")
    assert path == tmp_path / "counts.png"
    assert path.stat().st_size > 10_000
    assert png_size(path) == DEFAULT_SIZE


def test_counts_plot_takes_a_size_and_creates_the_directory(tmp_path):
    path = plot_counts(COUNTS[:40], str(tmp_path / "out" / "c.png"), size=(640, 480))
    assert png_size(Path(path)) == (640, 480)


def test_counts_plot_draws_exact_counts_from_oracle_records(tmp_path):
    events = [oracle.OracleEvent("acct-0001", T0 + t * 1000, T0 + t * 1000, {"big": t % 2 == 0}, 0, t)
              for t in range(40)]
    exact = oracle.sliding_counts(oracle.check(events, 0), "events", 100, lambda f: f["big"])
    with_exact = plot_counts(COUNTS, tmp_path / "a.png", exact=exact)
    without = plot_counts(COUNTS, tmp_path / "b.png")
    assert with_exact.read_bytes() != without.read_bytes()


def test_counts_plot_takes_exact_counts_as_a_mapping_or_from_the_records(tmp_path):
    mapping = {("big", "acct-0000"): [(T0, 9), (T0 + 20_000, 12)]}
    assert png_size(plot_counts(COUNTS, tmp_path / "m.png", exact=mapping)) == DEFAULT_SIZE
    own = [dict(r, exact=int(r["estimate"])) for r in COUNTS]
    assert png_size(plot_counts(own, tmp_path / "o.png")) == DEFAULT_SIZE


def test_counts_plot_skips_times_a_date_cannot_show(tmp_path):
    far = count_record("big", "acct-0000", 0, 3.0)
    far["time"] = 2**62
    assert png_size(plot_counts(COUNTS + [far], tmp_path / "far.png")) == DEFAULT_SIZE


@pytest.mark.parametrize("plot", [plot_counts, plot_bins])
def test_no_records_still_give_a_png(tmp_path, plot):
    path = plot([], tmp_path / "empty.png")
    assert path.stat().st_size > 0 and png_size(path) == DEFAULT_SIZE


def test_bins_plot_is_a_png_of_the_default_size(tmp_path):
    path = plot_bins(bins_records(), tmp_path / "bins.png")
    assert path.stat().st_size > 10_000
    assert png_size(path) == DEFAULT_SIZE


def test_bins_plot_accepts_one_kind_alone(tmp_path):
    finals = [r for r in bins_records() if r["kind"] == "final"]
    assert png_size(plot_bins(finals, tmp_path / "f.png", size=(800, 600))) == (800, 600)


def test_bins_plot_without_measures_plots_event_counts(tmp_path):
    recs = [dict(r, measures={}) for r in bins_records()]
    assert png_size(plot_bins(recs, tmp_path / "e.png")) == DEFAULT_SIZE


def test_bins_plot_with_many_keys_and_gaps_between_bins(tmp_path):
    recs = [bin_record(f"dev-{i:03d}", k, "final", 100.0 * i) for i in range(9) for k in (0, 1, 5, 9)]
    assert png_size(plot_bins(recs, tmp_path / "many.png")) == DEFAULT_SIZE


def test_bins_delivered_twice_plot_as_once(tmp_path):
    recs = bins_records()
    once = plot_bins(recs, tmp_path / "once.png", size=(400, 300))
    twice = plot_bins(recs + recs[::-1], tmp_path / "twice.png", size=(400, 300))
    assert once.read_bytes() == twice.read_bytes()
