"""``MATCH_RECOGNIZE`` against Flink itself: cases recorded from Flink's SQL (PyFlink, local
mini-cluster, event time; ``bench/recognize_flink.py``, run by hand) replayed through
:mod:`ctiflow.operators.cep.sql.translate` with no Flink installed. Every output row identical — in order
within a partition — and every query Flink rejects is rejected here too."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from ctiflow.operators.cep.sql.translate import recognize
from ctiflow.operators.cep.expr.vocabulary import Timestamp
from ctiflow.operators.errors import CtiflowError

CASES = Path(__file__).resolve().parent / "data" / "recognize"


def load(path: Path = CASES) -> list[dict]:
    """Every recorded case: of one file, or of every ``flink-cases*.jsonl[.gz]`` in a directory."""
    files = sorted(path.glob("flink-cases*.jsonl*")) if path.is_dir() else [path]
    cases = []
    for f in files:
        with gzip.open(f, "rt") if f.suffix == ".gz" else f.open() as lines:
            cases += [json.loads(line) for line in lines if line.strip()]
    return cases


def by_partition(columns: list[str], rows: list[list], partition: int) -> dict[tuple, list[list]]:
    out: dict[tuple, list[list]] = {}
    for row in rows:
        out.setdefault(tuple(row[:partition]), []).append(row)
    return out


def same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b and type(a) is type(b) or (a == b and {type(a), type(b)} <= {int, float})


#: The recorder's table (``bench/recognize_flink.py``): ``ts`` is a TIMESTAMP(3) rowtime computed
#: from epoch milliseconds, ``ts_ms`` (where recorded) those milliseconds as a BIGINT.
TYPES = {"ts": "timestamp"}


def replay(case: dict) -> None:
    events = [dict(zip(case["columns"], values)) for values in case["events"]]
    if case["error"] is not None:
        with pytest.raises(CtiflowError):
            recognize(case["query"], events, types=TYPES)
        return
    got = recognize(case["query"], events, types=TYPES)
    columns = case["output"]
    ours = [[str(r.get(c)) if isinstance(r.get(c), Timestamp) else r.get(c) for c in columns] for r in got]
    assert all(list(r) == columns for r in got), (columns, got[:1])
    partition = sum(1 for c in columns if c in ("part",))
    theirs = by_partition(columns, case["rows"], partition)
    mine = by_partition(columns, ours, partition)
    assert mine.keys() == theirs.keys(), (case["name"], mine, theirs)
    for key in theirs:
        assert len(mine[key]) == len(theirs[key]) and all(
            all(same(x, y) for x, y in zip(m, t)) for m, t in zip(mine[key], theirs[key])), \
            (case["name"], key, mine[key], theirs[key])


RECORDED = load()


@pytest.mark.parametrize("case", RECORDED, ids=[c["name"] for c in RECORDED])
def test_flinks_answer(case):
    replay(case)


def test_enough_cases_were_recorded():
    answered = [c for c in RECORDED if c["error"] is None]
    assert len(answered) >= 2000  # queries Flink ran, with their rows
    assert sum(len(c["rows"]) > 0 for c in answered) >= 1000  # most of them match something
    assert sum(c["error"] is not None for c in RECORDED) >= 100  # and refusals are checked too
    assert len({c["name"] for c in RECORDED}) == len(RECORDED)


def test_the_recordings_cover_time_types_listagg_and_quantified_groups():
    """``--time-types`` cases (``flink-cases-3``): arithmetic on the BIGINT ``ts_ms`` beside the
    TIMESTAMP rowtime, TIMESTAMPDIFF and INTERVAL on the rowtime, LISTAGG, ``(A)+`` — answered by
    Flink, most with rows."""
    answered = [c for c in RECORDED if c["error"] is None and "ts_ms" in c["columns"]]
    for feature in ("ts_ms -", "TIMESTAMPDIFF(", "+ INTERVAL", "LISTAGG(", ")+"):
        assert sum(feature in c["query"] and bool(c["rows"]) for c in answered) >= 20, feature
