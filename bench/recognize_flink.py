"""Record Flink's own ``MATCH_RECOGNIZE`` answers as test data (run by hand; never at test time).

Random queries over random event streams, each run through Flink's SQL ``MATCH_RECOGNIZE``
(PyFlink from the package index, a local mini-cluster, event time), written to
``tests/data/recognize/flink-cases.jsonl.gz`` with Flink's output rows or its error. The test suite
(``tests/test_recognize_flink.py``) replays them through :mod:`ctiflow.operators.cep.sql.translate` with no
Flink installed: every row identical, in order within a partition, and every query Flink
rejects rejected too.

    bash bench/setup_flink.sh                       # once: .venv-flink with apache-flink
    .venv-flink/bin/python bench/recognize_flink.py --cases 2000 --seed 1   # --resume continues a file
    .venv-flink/bin/python bench/recognize_flink.py --cases 600 --seed 3 --time-types \
        --out tests/data/recognize/flink-cases-3.jsonl    # BIGINT/TIMESTAMP time, LISTAGG, (A)+

The streams look like real topics: several partitions at uneven rates, equal timestamps
(ties keep arrival order), NULLs. No row is late: the watermark trails by a day, so Flink
matches everything when the bounded input ends — as ``ctiflow recognize`` does.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import random
import sys
import time
from decimal import Decimal
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "recognize" / "flink-cases.jsonl"
COLUMNS = ["id", "part", "ts", "price", "tag", "amt"]
#: ``--time-types``: also the table's ``ts_ms`` (the BIGINT epoch ms beside the TIMESTAMP rowtime
#: ``ts``), and queries that do arithmetic on it, TIMESTAMPDIFF and INTERVAL arithmetic on ``ts``,
#: LISTAGG, and quantified parenthesised variables ``(A)+`` (the gaps a held-out suite found).
TIME_COLUMNS = [*COLUMNS, "ts_ms"]
T0 = 1_767_225_600_000


# -- random streams -----------------------------------------------------------------------------
def events(rng: random.Random) -> list[dict]:
    parts = rng.choice([["p"], ["p", "q"], ["p", "q", "r"]])
    weights = [rng.randint(1, 6) for _ in parts]  # uneven rates
    t = T0
    out = []
    for i in range(rng.randint(6, 48)):
        t += rng.choice([0, 0, 1000, 1000, 1000, 2000, 5000, 30_000])
        out.append({"id": i + 1, "part": rng.choices(parts, weights)[0], "ts": t,
                    "price": None if rng.random() < 0.06 else rng.randint(0, 19),
                    "tag": rng.choice("aabbc"), "amt": None if rng.random() < 0.2 else round(rng.uniform(0, 10), 2)})
    for _ in range(len(out) // 4):  # arrival out of order: a late-ish neighbour (never behind the watermark)
        j = rng.randrange(len(out) - 1)
        out[j], out[j + 1] = out[j + 1], out[j]
    return out


# -- random queries -----------------------------------------------------------------------------
QUANTIFIERS = ["", "", "", "", "", "*", "+", "+", "?", "{2}", "{1,3}", "{2,}", "*?", "+?", "+?", "{1,3}?", "{2,}?",
               "{0,2}", "{3}"]
#: The last variable: Flink refuses a greedy one, so mostly what it accepts (some refusals stay).
LAST_QUANTIFIERS = ["", "", "", "", "{2}", "+?", "*?", "{1,3}?", "{2,}?", "?", "{3}", "+", "??"]


def condition(rng: random.Random, var: str, earlier: list[str], time_types: bool = False) -> str:
    k, other = rng.randint(2, 15), rng.choice(earlier) if earlier else None
    if time_types and rng.random() < 0.5:
        options = [f"{var}.ts_ms - FIRST(ts_ms) < {k * 1000}", f"{var}.ts < FIRST(ts) + INTERVAL '{k}' SECOND",
                   f"TIMESTAMPDIFF(SECOND, FIRST(ts), {var}.ts) <= {k}", f"{var}.ts_ms > {T0 + k * 1000}",
                   f"{var}.ts_ms - LAST({var}.ts_ms, 1) < {k * 1000} OR LAST({var}.ts_ms, 1) IS NULL"]
        if other:
            options += [f"{var}.ts_ms - {other}.ts_ms < {k * 1000}",
                        f"TIMESTAMPDIFF(SECOND, {other}.ts, {var}.ts) < {k}",
                        f"{var}.ts <= {other}.ts + INTERVAL '{k}' SECOND"]
        text = rng.choice(options)
        return f"({text}) AND ({condition(rng, var, earlier)})" if rng.random() < 0.3 else text
    options = [
        f"{var}.tag = '{rng.choice('abc')}'", f"tag = '{rng.choice('abc')}'", f"{var}.price > {k}",
        f"price < {k}", f"{var}.price > LAST({var}.price, 1) OR LAST({var}.price, 1) IS NULL",
        f"SUM({var}.price) < {k * 3}", f"COUNT({var}.id) <= {rng.randint(1, 3)}", f"{var}.price > FIRST(price)",
        f"AVG({var}.price) > {k}", f"{var}.amt IS NOT NULL AND {var}.amt > {rng.randint(1, 9)}.5",
        f"LAST(price, 1) IS NULL OR price <> LAST(price, 1)", f"{var}.price + 1 > {k}",
        f"CASE WHEN {var}.tag = 'a' THEN {var}.price > 5 ELSE {var}.price < 10 END",
        f"{var}.price BETWEEN {k - 2} AND {k + 4}", f"{var}.tag IN ('a', 'c')", f"MOD({var}.price, 2) = 0",
        f"{var}.price * 2 - 3 > {k}", f"{var}.price / 3 > {rng.randint(1, 4)}", f"{var}.amt / 2 < 3",
        f"{var}.price > {var}.amt", f"NOT {var}.tag = 'b'",
        f"FIRST({var}.price) < {k}", f"MAX({var}.price) - MIN({var}.price) < {rng.randint(3, 9)}",
    ]
    if other:
        options += [f"{var}.price >= {other}.price", f"{var}.tag <> {other}.tag", f"{var}.price > FIRST({other}.price)",
                    f"{var}.price > PREV({other}.price)", f"SUM({other}.price) > {k}", f"{var}.id > LAST({other}.id, 1)"]
    if rng.random() < 0.03:
        options = [f"PREV({var}.price) > 3"]  # Flink: no physical offsets within a partition
    elif rng.random() < 0.5:  # often something most rows pass, so longer patterns still match
        options = [f"{var}.price < {k + 6}", f"{var}.tag <> 'c'", f"{var}.price >= 0 OR {var}.price IS NULL",
                   f"COUNT({var}.id) <= {rng.randint(2, 4)}", f"{var}.amt IS NULL OR {var}.amt < 8"]
    text = rng.choice(options)
    if rng.random() < 0.25:
        text = f"({text}) {rng.choice(['AND', 'OR'])} ({rng.choice(options)})"
    return text


def measures(rng: random.Random, names: list[str], time_types: bool = False) -> list[str]:
    def pick():
        v = rng.choice(names)
        if time_types and rng.random() < 0.5:
            return rng.choice([f"LAST({v}.ts_ms) - FIRST({v}.ts_ms)", f"LISTAGG({v}.tag, '|')", f"LISTAGG({v}.tag)",
                               f"TIMESTAMPDIFF(SECOND, FIRST({v}.ts), LAST(ts))", "LAST(ts_ms)", f"FIRST({v}.ts_ms)",
                               "LISTAGG(tag, '')", f"{v}.ts_ms + 1"])
        return rng.choice([f"FIRST({v}.id)", f"LAST({v}.id)", f"COUNT({v}.id)", f"SUM({v}.price)", f"MAX({v}.price)",
                           f"MIN({v}.amt)", f"AVG({v}.price)", f"AVG({v}.amt)", f"{v}.price", "FIRST(id)", "LAST(id)",
                           "LAST(id, 1)", "COUNT(*)", "MATCH_ROWTIME()", f"FIRST({v}.ts)", f"{v}.tag",
                           f"SUM({v}.amt)", f"FIRST({v}.id, 1)", f"LAST({v}.price) - FIRST({v}.price)",
                           f"COUNT({v}.price)", "LAST(tag)"])
    return [f"{pick()} AS m{i}" for i in range(rng.randint(1, 4))]


def query(rng: random.Random, time_types: bool = False) -> str:
    names = list("ABCD")[:rng.choices([1, 2, 3, 4], [3, 5, 3, 1])[0]]
    items = [(n, rng.choice(QUANTIFIERS if n != names[-1] else LAST_QUANTIFIERS)) for n in names]
    if time_types:  # now and then a quantified parenthesised variable: (A)+
        pattern = " ".join(f"({n}){q}" if q and rng.random() < 0.35 else n + q for n, q in items)
    else:
        pattern = " ".join(n + q for n, q in items)
    if rng.random() < 0.02:
        pattern = pattern.replace(names[0], names[0] + "{,2}", 1) if pattern[1:2] in (" ", "") else pattern
    defined = [n for n in names if rng.random() < 0.85]
    define = ", ".join(f"{n} AS {condition(rng, n, names[:names.index(n)], time_types)}" for n in defined)
    target = rng.choice(names[1:] if len(names) > 1 and rng.random() < 0.85 else names)  # TO FIRST <first variable>
    skip = rng.choice(["", "AFTER MATCH SKIP TO NEXT ROW", "AFTER MATCH SKIP PAST LAST ROW",  # fails on every match
                       f"AFTER MATCH SKIP TO FIRST {target}", f"AFTER MATCH SKIP TO LAST {target}"])
    within = f" WITHIN INTERVAL '{rng.choice([2, 5, 30, 90])}' SECOND" if rng.random() < 0.25 else ""
    partition = "PARTITION BY part " if rng.random() < 0.8 else ""
    order = "ORDER BY ts" + (", id DESC" if rng.random() < 0.1 else "")
    return (f"SELECT * FROM events MATCH_RECOGNIZE (\n  {partition}{order}\n  MEASURES {', '.join(measures(rng, names, time_types))}\n"
            f"  ONE ROW PER MATCH\n  {skip}\n  PATTERN ({pattern}){within}\n"
            + (f"  DEFINE {define}\n" if define else "") + ")")


# -- Flink --------------------------------------------------------------------------------------
class Flink:
    """One PyFlink table environment (a local mini-cluster) for every case."""

    def __init__(self) -> None:
        from pyflink.datastream import StreamExecutionEnvironment
        from pyflink.table import StreamTableEnvironment

        self.env = StreamExecutionEnvironment.get_execution_environment()
        self.env.set_parallelism(1)
        self.t_env = StreamTableEnvironment.create(self.env)
        self.t_env.get_config().set("table.local-time-zone", "UTC")

    def run(self, text: str, rows: list[dict]) -> tuple[list[str], list[list]]:
        """Flink's output columns and rows for ``text`` over ``rows``."""
        from pyflink.common import Row, Types
        from pyflink.table import DataTypes, Schema

        types = Types.ROW_NAMED(["id", "part", "ts_ms", "price", "tag", "amt"],
                                [Types.LONG(), Types.STRING(), Types.LONG(), Types.LONG(), Types.STRING(), Types.DOUBLE()])
        ds = self.env.from_collection([Row(r["id"], r["part"], r["ts"], r["price"], r["tag"], r["amt"]) for r in rows],
                                      type_info=types)
        schema = (Schema.new_builder().column("id", DataTypes.BIGINT()).column("part", DataTypes.STRING())
                  .column("ts_ms", DataTypes.BIGINT()).column("price", DataTypes.BIGINT())
                  .column("tag", DataTypes.STRING()).column("amt", DataTypes.DOUBLE())
                  # TIMESTAMP(3), not _LTZ: PyFlink cannot hand back the Instant a LTZ measure holds
                  .column_by_expression("ts", "CAST(TO_TIMESTAMP_LTZ(ts_ms, 3) AS TIMESTAMP(3))")
                  .watermark("ts", "ts - INTERVAL '1' DAY").build())
        self.t_env.create_temporary_view("events", self.t_env.from_data_stream(ds, schema))
        try:
            result = self.t_env.execute_sql(text)
            names = list(result.get_table_schema().get_field_names())
            with result.collect() as rows_out:
                return names, [[plain(v) for v in row] for row in rows_out]
        finally:
            self.t_env.drop_temporary_view("events")


def plain(value):
    """A Flink value as the JSON ``ctiflow recognize`` prints (timestamps as TIMESTAMP(3) text)."""
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.") + f"{value.microsecond // 1000:03d}"
    if isinstance(value, Decimal):
        return float(value)
    return value


def flink_error(exc: Exception) -> str:
    """The first line of the Java exception that decided it (the innermost cause)."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if "Exception:" in line]
    return (lines[-1] if lines else text.splitlines()[0])[:500]


#: What a failing PyFlink / mini-cluster says (not Flink's answer to a query): the case is retried
#: in a fresh process.
INFRASTRUCTURE = ("PickleException", "Py4JNetworkError", "Could not create actor system", "Py4JError",
                  "Address already in use")


def record(seed: int, first: int, last: int, out_path: Path, time_types: bool = False) -> int:
    """Cases ``first`` … ``last - 1`` of ``seed``, appended to ``out_path``; exit code 3 (after
    writing what was recorded) when PyFlink itself fails."""
    import pyflink

    flink = Flink()
    with out_path.open("a") as out:
        for n in range(first, last):
            rng = random.Random(f"{seed}/{n}")
            text, rows = query(rng, time_types), events(rng)
            columns = TIME_COLUMNS if time_types else COLUMNS
            for r in rows:
                r["ts_ms"] = r["ts"]  # the table's BIGINT beside the rowtime
            case = {"name": f"flink-{seed}-{n:04d}", "query": text, "columns": columns,
                    "events": [[r[c] for c in columns] for r in rows], "flink": pyflink.version.__version__}
            try:
                case["output"], case["rows"] = flink.run(text, rows)
                case["error"] = None
            except Exception as exc:  # noqa: BLE001 - Flink's refusal is the recorded answer
                if any(marker in str(exc) for marker in INFRASTRUCTURE):
                    print(f"case {n}: PyFlink failed ({flink_error(exc)[:120]}); a fresh process retries it",
                          file=sys.stderr)
                    return 3
                case["output"], case["rows"], case["error"] = None, None, flink_error(exc)
            out.write(json.dumps(case) + "\n")
            out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--resume", action="store_true", help="keep the cases already in --out, record the rest")
    ap.add_argument("--chunk", type=int, default=150, help="cases per PyFlink process (its mini-cluster leaks)")
    ap.add_argument("--time-types", action="store_true", help="queries over ts_ms (BIGINT) and ts (TIMESTAMP), "
                    "LISTAGG, (A)+ (see TIME_COLUMNS)")
    ap.add_argument("--worker", nargs=2, type=int, metavar=("FIRST", "LAST"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return record(args.seed, args.worker[0], args.worker[1], args.out, args.time_types)
    import subprocess

    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        args.out.write_text("")
    started, failures = time.monotonic(), 0
    while True:
        done = sum(1 for line in args.out.read_text().splitlines() if line.strip())
        if done >= args.cases:
            break
        code = subprocess.run([sys.executable, __file__, "--seed", str(args.seed), "--out", str(args.out),
                               *(["--time-types"] if args.time_types else []),
                               "--worker", str(done), str(min(done + args.chunk, args.cases))]).returncode
        now = sum(1 for line in args.out.read_text().splitlines() if line.strip())
        failures = 0 if now > done else failures + 1
        if code not in (0, 3) or failures >= 3:
            print(f"stopped at {now} cases (exit {code})", file=sys.stderr)
            return 1
        print(f"{now} cases, {time.monotonic() - started:.0f} s", file=sys.stderr)
    cases = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    rejected = sum(c["error"] is not None for c in cases)
    packed = args.out.with_suffix(".jsonl.gz")  # what the repository keeps (a tenth of the size)
    with gzip.open(packed, "wt", compresslevel=9) as out:
        out.write(args.out.read_text())
    args.out.unlink()
    print(f"wrote {len(cases)} cases ({rejected} rejected by Flink) to {packed}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
