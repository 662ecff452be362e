"""PNG renderings of count and bin result records (``schemas/count.avsc``, ``schemas/bin.avsc``).

Both functions draw with matplotlib's object API on an Agg canvas (no pyplot, no global
backend switch, safe in threads and headless containers), put application time on the x axis
as UTC datetimes, and return the path of the PNG they wrote. The image is exactly
``size`` pixels (width, height); with no usable records it says so instead of failing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from matplotlib import dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

#: At most this many series (count: counter/key pairs; bins: keys) per figure.
MAX_SERIES = 6
DEFAULT_SIZE = (1200, 800)
_DPI = 100
#: Times a datetime can show (years 1 to 9999); anything else (e.g. the +∞ CTI) is skipped.
_MIN_MS, _MAX_MS = -62_135_596_800_000, 253_402_300_799_999


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _plottable(ms: Any) -> bool:
    return isinstance(ms, (int, float)) and _MIN_MS <= ms <= _MAX_MS


def _figure(size: tuple[int, int]) -> Figure:
    fig = Figure(figsize=(size[0] / _DPI, size[1] / _DPI), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _time_axis(ax) -> None:
    locator = mdates.AutoDateLocator(tz=timezone.utc)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
    ax.set_xlabel("application time (UTC)")
    ax.grid(True, alpha=0.3)


def _save(fig: Figure, out_png: str | Path) -> Path:
    path = Path(out_png)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=_DPI)
    return path


def _empty(fig: Figure, title: str, what: str) -> None:
    ax = fig.add_subplot(1, 1, 1)
    ax.set_title(title)
    ax.text(0.5, 0.5, f"no {what} to plot", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _grid(n: int) -> tuple[int, int]:
    return (1, 1) if n == 1 else (1, 2) if n == 2 else ((n + 1) // 2, 2)


# ---------------------------------------------------------------------------------------------
# counts
# ---------------------------------------------------------------------------------------------


def _exact_series(exact: Any) -> dict[tuple[str | None, str], list[tuple[int, float]]]:
    """``(counter or None, key) → [(time, exact)]`` from a mapping or from records."""
    out: dict[tuple[str | None, str], list[tuple[int, float]]] = defaultdict(list)
    if exact is None:
        return out
    if isinstance(exact, Mapping):
        for k, points in exact.items():
            ident = tuple(k) if isinstance(k, tuple) else (None, str(k))
            out[ident].extend((int(t), float(v)) for t, v in points)
        return out
    for r in exact:
        if r.get("exact") is not None and _plottable(r.get("time")):
            out[(r.get("counter"), str(r["key"]))].append((int(r["time"]), float(r["exact"])))
    return out


def plot_counts(records: Iterable[Mapping[str, Any]], out_png: str | Path, exact: Any = None,
                size: tuple[int, int] = DEFAULT_SIZE) -> Path:
    """Estimate with its guaranteed band ``[lower, upper]`` over application time, one panel per
    ``(counter, key)`` — the ``MAX_SERIES`` most active: the largest estimates, then the most
    records (ties by name).

    The exact count is drawn when known: from ``exact`` — records with ``key``, ``time``,
    ``exact`` and optionally ``counter`` (e.g. :func:`ctiflow.jobs.testing.oracle.sliding_counts`), or a
    mapping ``(counter, key)`` / ``key`` → ``[(time, exact), …]`` — or else from the records' own
    ``exact`` field. Counts hold between records, so every line is a step."""
    series: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if _plottable(r.get("time")):
            series[(str(r["counter"]), str(r["key"]))].append(r)
    truth = _exact_series(exact) or _exact_series(r for recs in series.values() for r in recs)
    fig = _figure(size)
    title = "approximate counts (exponential histogram)"
    if not series:
        _empty(fig, title, "count records")
        return _save(fig, out_png)
    # the most active series: the largest counts, then the most records (not keys that step 0 → 1)
    chosen = sorted(series,
                    key=lambda s: (-max(r["estimate"] for r in series[s]), -len(series[s]), s))[:MAX_SERIES]
    rows, cols = _grid(len(chosen))
    for i, (counter, key) in enumerate(chosen):
        recs = sorted(series[(counter, key)], key=lambda r: r["time"])
        ax = fig.add_subplot(rows, cols, i + 1)
        x = [_utc(r["time"]) for r in recs]
        ax.fill_between(x, [r["lower"] for r in recs], [r["upper"] for r in recs], step="post", alpha=0.25,
                        color="tab:blue", label="guaranteed [lower, upper]")
        ax.plot(x, [r["estimate"] for r in recs], drawstyle="steps-post", color="tab:blue", label="estimate")
        points = sorted(truth.get((counter, key)) or truth.get((None, key)) or [])
        if points:
            ax.plot([_utc(t) for t, _ in points], [v for _, v in points], drawstyle="steps-post",
                    color="black", linestyle="--", linewidth=1, label="exact")
        r0 = recs[0]
        window = (f"last {r0['window']} events" if r0.get("window_kind") == "events"
                  else f"last {r0.get('window')} ms")
        ax.set_title(f"{counter} · key {key} ({window}, ε = {r0.get('epsilon')})", fontsize=9)
        ax.set_ylabel("count")
        _time_axis(ax)
        if i == 0:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{title}: {len(chosen)} of {len(series)} series")
    fig.tight_layout()
    return _save(fig, out_png)


# ---------------------------------------------------------------------------------------------
# bins
# ---------------------------------------------------------------------------------------------


def _bin_steps(points: list[tuple[int, float]],
               size_of: Mapping[int, int]) -> tuple[list[datetime], list[float]]:
    """A step line over each bin's span: gaps between non-adjacent bins are left empty."""
    x: list[datetime] = []
    y: list[float] = []
    prev_end = None
    for end, v in points:
        start = end - size_of[end]
        if prev_end is not None and start != prev_end:
            x += [_utc(prev_end), _utc(prev_end)]
            y += [y[-1], math.nan]
        x.append(_utc(start))
        y.append(v)
        prev_end = end
    if points:
        x.append(_utc(prev_end))
        y.append(y[-1])
    return x, y


def _bin_series(ax, by_kind: dict, k: str, c: str, size_of: dict[int, int], value) -> None:
    """One key's bins in one panel: ``updated`` revisions as crosses, Σ ``incremental`` dashed,
    the newest ``final`` revision of each bin solid (:func:`plot_bins`)."""
    updated = by_kind.get((k, "updated"), [])
    if updated:
        ax.scatter([_utc(r["bin_end"] - size_of[r["bin_end"]] / 2) for r in updated],
                   [value(r) for r in updated], marker="x", s=14, alpha=0.3, color=c)
    total: dict[int, float] = defaultdict(float)
    for r in by_kind.get((k, "incremental"), []):
        total[r["bin_end"]] += value(r)
    if total:
        x, y = _bin_steps(sorted(total.items()), size_of)
        ax.plot(x, y, drawstyle="steps-post", linestyle="--", linewidth=1.4, color=c, alpha=0.9)
    last: dict[int, Mapping[str, Any]] = {}
    for r in sorted(by_kind.get((k, "final"), []), key=lambda r: (r.get("revision", 0), r.get("cti", 0))):
        last[r["bin_end"]] = r
    finals = [last[b] for b in sorted(last)]
    if finals:
        x, y = _bin_steps([(r["bin_end"], value(r)) for r in finals], size_of)
        ax.plot(x, y, drawstyle="steps-post", linewidth=1.2, color=c)


def plot_bins(records: Iterable[Mapping[str, Any]], out_png: str | Path,
              size: tuple[int, int] = DEFAULT_SIZE) -> Path:
    """Bin values per key over application time, one panel per measure (``events`` when the
    records carry no measures), for the ``MAX_SERIES`` keys with the most bins.

    Each bin is drawn over its span ``(bin_start, bin_end]``: ``final`` values as a solid step
    line; ``updated`` revisions as faint crosses at the bin's middle that converge on it; the
    ``incremental`` records summed per bin as a dashed step line (it must lie on the final
    line). Records of any mix of kinds may be given (a record without ``kind`` counts as
    ``final`` if its ``final`` flag is set, else as ``updated``); a record delivered twice
    (same key, bin and CTI) counts once, and of several final records of one bin the newest
    revision wins."""
    recs = [r for r in records if _plottable(r.get("bin_end"))]
    fig = _figure(size)
    binners = sorted({str(r.get("binner")) for r in recs})
    title = f"bins of {', '.join(binners)}" if binners else "bins"
    if not recs:
        _empty(fig, title, "bin records")
        return _save(fig, out_png)
    measures = sorted({m for r in recs for m in (r.get("measures") or {})}) or ["events"]

    def value(r: Mapping[str, Any], m: str) -> float:
        given = r.get("measures") or {}
        return float(r["events"]) if m == "events" and m not in given else float(given.get(m, 0.0))

    bins_of: dict[str, set[int]] = defaultdict(set)
    for r in recs:
        bins_of[str(r["key"])].add(r["bin_end"])
    keys = sorted(bins_of, key=lambda k: (-len(bins_of[k]), k))[:MAX_SERIES]
    colors = {k: f"C{i}" for i, k in enumerate(keys)}
    # (key, kind) → records, one per (bin, cti): a record delivered twice (at-least-once) counts once
    unique: dict[tuple[str, str], dict[tuple[int, Any], Mapping[str, Any]]] = defaultdict(dict)
    for r in recs:
        if str(r["key"]) in colors:
            kind = r.get("kind") or ("final" if r.get("final") else "updated")
            unique[(str(r["key"]), kind)][(r["bin_end"], r.get("cti"))] = r
    by_kind = {kk: list(v.values()) for kk, v in unique.items()}
    size_of = {r["bin_end"]: r["bin_end"] - r["bin_start"] for r in recs}
    for i, m in enumerate(measures):
        ax = fig.add_subplot(len(measures), 1, i + 1)
        for k in keys:
            _bin_series(ax, by_kind, k, colors[k], size_of, lambda r: value(r, m))
        ax.set_ylabel(m)
        ax.set_title(f"{m} per bin", fontsize=9)
        _time_axis(ax)
        if i == 0:
            handles = [Line2D([], [], color=colors[k], label=k) for k in keys] + [
                Line2D([], [], color="gray", label="final"),
                Line2D([], [], color="gray", linestyle="--", label="Σ incremental"),
                Line2D([], [], color="gray", marker="x", linestyle="none", alpha=0.5,
                       label="updated revisions"),
            ]
            ax.legend(handles=handles, fontsize=7, loc="best", ncol=2)
    fig.suptitle(f"{title}: {len(keys)} of {len(bins_of)} keys "
                 "(a bin covers (start, end]: drawn over its span)")
    fig.tight_layout()
    return _save(fig, out_png)
