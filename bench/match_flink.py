"""The Flink side of ``bench/match_operator.py``: the same patterns as Flink SQL MATCH_RECOGNIZE.

Runs with the PyFlink venv's interpreter (``bash bench/setup_flink.sh`` makes ``.venv-flink``),
never in the project's venv; it imports nothing from the project. The pattern dicts are read
from ``bench/match_operator.py`` with ``ast.literal_eval`` (no import, so none of the project's
dependencies are needed here) and rendered by :func:`match_recognize`:

* stages become pattern variables ``A B C`` with ``PARTITION BY account ORDER BY rowtime``;
* ``next`` (strict contiguity) is MATCH_RECOGNIZE's own contiguity: ``PATTERN (A B C)``;
* ``followed_by`` (relaxed, skip till next match) is *emulated*: SQL row patterns only have
  strict contiguity, so a reluctant variable that matches every row the next stage does not
  match is put in between: ``A NOT_B*? B`` with ``NOT_B AS NOT (<B's condition>)``. That is
  how Flink CEP itself implements ``followedBy`` (an IGNORE edge on "not the take condition"),
  so the matches are the same: same count, same first and last rows;
* a relaxed ``one_or_more`` stage followed by a relaxed stage is emulated as one row of it,
  followed by the gap variable, which also absorbs the stage's later rows: the matches are the
  same ones (same first and last rows) but the stage's rows are not listed in the measures.
  A ``consecutive`` loop is ``B+``; ``times: n`` with ``consecutive`` is ``B{n}``;
* ``followed_by_any`` (skip till any match: every later matching row starts a branch) is
  **not expressible**: a row pattern variable consumes the rows it matches, there are no
  pattern alternations/groups and no ``ALL MATCHES`` mode in Flink's MATCH_RECOGNIZE — such
  patterns are reported as "n/a";
* ``within_ms`` → ``WITHIN INTERVAL 'n' SECOND`` (first-to-last, as ``within``);
* ``skip`` → ``AFTER MATCH SKIP PAST LAST ROW`` / ``TO NEXT ROW`` / ``TO FIRST v`` /
  ``TO LAST v``; ``no_skip`` has no SQL equivalent (n/a).

What is timed: three jobs in one JVM, with a CSV filesystem source (columns
``account, ts, type, amount``; ``rowtime = TO_TIMESTAMP_LTZ(ts, 3)``, watermark = rowtime, the
file is in event-time order), streaming mode, parallelism 1 by default, results collected to
this process:

0. ``SELECT COUNT(*) FROM events`` once untimed (``warmup_seconds``): class loading, JIT and
   the first job on the local mini-cluster cost ≈ 9 s here and would distort the baseline;
1. the same again — the *scan*: job submission, reading and parsing the CSV, counting;
2. ``SELECT COUNT(*) FROM events MATCH_RECOGNIZE (…)`` — the match query.

``seconds`` is query 2 from ``execute_sql`` to the last result row (planning, job start, CSV
parsing, sorting by rowtime behind the watermark, matching, counting); ``scan_seconds`` is
query 1, so ``seconds - scan_seconds`` estimates the matching alone. JVM start-up
(``TableEnvironment.create``) is reported as ``jvm_start_seconds`` and excluded.

    .venv-flink/bin/python bench/match_flink.py --events-file events.csv --pattern within
    .venv-flink/bin/python bench/match_flink.py --pattern within --print-sql

prints one JSON line: ``{"pattern", "events", "seconds", "matches", "scan_seconds", …}``.
Flink's log goes to ``$FLINK_LOG_DIR`` (default: ``flink-log/`` beside the events file), not
into the venv.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import sys
import time
import tokenize
from pathlib import Path
from typing import Any

PATTERNS_FILE = Path(__file__).resolve().parent / "match_operator.py"


class NotExpressible(Exception):
    """The pattern has no MATCH_RECOGNIZE equivalent (the message says why)."""


def load_patterns(path: Path = PATTERNS_FILE) -> dict[str, dict[str, Any]]:
    """The ``PATTERNS = {...}`` literal of ``bench/match_operator.py``, without importing it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "PATTERNS" for t in targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"no PATTERNS literal in {path}")


# ---------------------------------------------------------------------------------------------
# Rendering a declarative pattern as MATCH_RECOGNIZE
# ---------------------------------------------------------------------------------------------

_SQL_OPS = {"==": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "(": "(", ")": ")",
            "+": "+", "-": "-", "*": "*", "/": "/", "%": "%"}
_SQL_WORDS = {"and": "AND", "or": "OR", "not": "NOT", "True": "TRUE", "False": "FALSE",
              "true": "TRUE", "false": "FALSE", "None": "NULL", "null": "NULL"}


def sql_condition(text: str, var: str) -> str:
    """A stage condition (``type == 'x' and amount > 5``) as SQL over the variable ``var``.

    Only fields, literals, comparisons and ``and/or/not`` translate; functions (``first(…)``,
    ``lower(…)``, …), ``in``, ``is`` and attribute access raise :class:`NotExpressible`."""
    out: list[str] = []
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
              if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.INDENT,
                                tokenize.DEDENT)]
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if tok.type == tokenize.NAME:
            if tok.string in _SQL_WORDS:
                out.append(_SQL_WORDS[tok.string])
            elif tok.string in ("in", "is", "if", "else", "lambda"):
                raise NotExpressible(f"{text!r}: {tok.string!r} is not translated to SQL")
            elif nxt in ("(", ".", "["):
                raise NotExpressible(f"{text!r}: functions and nested fields are not translated")
            else:
                out.append(f"{var}.`{tok.string}`")
        elif tok.type == tokenize.NUMBER:
            out.append(tok.string)
        elif tok.type == tokenize.STRING:
            value = ast.literal_eval(tok.string)
            out.append("'" + value.replace("'", "''") + "'")
        elif tok.type == tokenize.OP and tok.string in _SQL_OPS:
            out.append(_SQL_OPS[tok.string])
        else:
            raise NotExpressible(f"{text!r}: {tok.string!r} is not translated to SQL")
    return " ".join(out)


def _skip_clause(skip: Any) -> str:
    if skip == "skip_past_last_event":
        return "AFTER MATCH SKIP PAST LAST ROW"
    if skip == "skip_to_next":
        return "AFTER MATCH SKIP TO NEXT ROW"
    if isinstance(skip, dict) and "skip_to_first" in skip:
        return f"AFTER MATCH SKIP TO FIRST {skip['skip_to_first'].upper()}"
    if isinstance(skip, dict) and "skip_to_last" in skip:
        return f"AFTER MATCH SKIP TO LAST {skip['skip_to_last'].upper()}"
    raise NotExpressible("no skip strategy (every match) has no MATCH_RECOGNIZE equivalent: "
                         "AFTER MATCH always skips (default: PAST LAST ROW)")


def match_recognize(spec: dict[str, Any], table: str = "events") -> tuple[str, list[str]]:
    """``SELECT COUNT(*) FROM table MATCH_RECOGNIZE (…)`` for ``spec``, plus notes on what was
    emulated. Raises :class:`NotExpressible` with the reason."""
    stages = spec["stages"]
    items: list[str] = []
    defines: list[str] = []
    notes: list[str] = []
    pending_loop: str | None = None  # a relaxed loop emulated by one row + the next gap
    for index, stage in enumerate(stages):
        name = stage["name"]
        for key in ("group", "negation", "until", "subtype", "or", "within_ms", "window_ms"):
            if key in stage:
                raise NotExpressible(f"stage {name!r}: {key!r} is not translated")
        var = name.upper()
        where = stage.get("where")
        condition = sql_condition(where, var) if where else "TRUE"
        contiguity = stage.get("contiguity") or ("begin" if index == 0 else "followed_by")
        if index > 0:
            if contiguity in ("followed_by_any", "non_deterministic_relaxed"):
                raise NotExpressible(
                    "followed_by_any (skip till any match) has no MATCH_RECOGNIZE equivalent: "
                    "row pattern variables are strictly contiguous and consume their rows, and "
                    "Flink supports neither alternations/groups nor ALL MATCHES")
            if contiguity in ("followed_by", "relaxed"):
                gap = f"NOT_{var}"
                items.append(f"{gap}*?")
                defines.append(f"{gap} AS NOT ({sql_condition(where, gap) if where else 'TRUE'})")
                if pending_loop:
                    notes.append(f"{pending_loop}: relaxed one_or_more emulated as one row, later "
                                 f"rows absorbed by {gap}")
                    pending_loop = None
                else:
                    notes.append(f"followed_by before {var} emulated with {gap}*?")
            elif pending_loop:
                raise NotExpressible(f"{pending_loop}: a relaxed loop before a strict stage")
        quantifier = stage.get("quantifier", "one")
        consecutive = bool(stage.get("consecutive"))
        if stage.get("allow_combinations"):
            raise NotExpressible(f"stage {name!r}: allow_combinations is skip till any")
        if quantifier in (None, "one"):
            items.append(var)
        elif quantifier == "optional":
            items.append(f"{var}?")
        elif quantifier in ("one_or_more", "zero_or_more"):
            suffix = "+" if quantifier == "one_or_more" else "*"
            if consecutive:
                items.append(f"{var}{suffix}" + ("" if stage.get("greedy") else "?"))
            elif quantifier == "one_or_more" and index < len(stages) - 1:
                items.append(var)
                pending_loop = var
            else:
                raise NotExpressible(f"stage {name!r}: a relaxed loop at the end of the pattern")
        elif isinstance(quantifier, dict) and "times" in quantifier and consecutive:
            times = quantifier["times"]
            items.append(f"{var}{{{times}}}" if isinstance(times, int)
                         else f"{var}{{{times[0]},{times[1]}}}")
        else:
            raise NotExpressible(f"stage {name!r}: quantifier {quantifier!r} is not translated")
        defines.append(f"{var} AS {condition}")
    if pending_loop:
        raise NotExpressible(f"{pending_loop}: a relaxed loop at the end of the pattern")
    within = spec.get("within_ms")
    within_sql = ""
    if within:
        if spec.get("within_type", "first_and_last") != "first_and_last":
            raise NotExpressible("within_type previous_and_current is not translated")
        within_sql = f" WITHIN INTERVAL '{within / 1000:g}' SECOND"
    skip = _skip_clause(spec.get("skip"))
    first = stages[0]["name"].upper()
    sql = (
        f"SELECT COUNT(*) AS match_count FROM {table}\n"
        "MATCH_RECOGNIZE (\n"
        "  PARTITION BY account\n"
        "  ORDER BY rowtime\n"
        f"  MEASURES FIRST({first}.ts) AS first_ts\n"
        "  ONE ROW PER MATCH\n"
        f"  {skip}\n"
        f"  PATTERN ({' '.join(items)}){within_sql}\n"
        "  DEFINE\n    " + ",\n    ".join(defines) + "\n"
        ") AS T"
    )
    return sql, notes


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


#: ``hot_key``: ``examples/recognize/two-countries.sql`` as Flink runs it (the CSV adds a country
#: column): ORDER BY the rowtime attribute, the large purchase's time as the BIGINT ``ts``.
HOT_KEY = "hot_key"
HOT_KEY_FILE = Path(__file__).resolve().parent.parent / "examples" / "recognize" / "two-countries.sql"


def hot_key_sql(table: str = "events") -> str:
    text = "\n".join(line for line in HOT_KEY_FILE.read_text().splitlines() if not line.startswith("--"))
    body = text[text.index("MATCH_RECOGNIZE"):].rstrip().rstrip(";")
    body = body.replace("ORDER BY event_time", "ORDER BY rowtime").replace("LARGE.event_time", "LARGE.ts")
    body = body.replace("LARGE", "BIG")  # LARGE is a keyword of Flink's SQL parser
    return f"SELECT COUNT(*) AS match_count FROM {table}\n{body} AS T"


def source_ddl(path: Path, table: str = "events", country: bool = False) -> str:
    return (
        f"CREATE TEMPORARY TABLE {table} (\n"
        "  account STRING, ts BIGINT, `type` STRING, amount DOUBLE,\n"
        + ("  country STRING,\n" if country else "") +
        "  rowtime AS TO_TIMESTAMP_LTZ(ts, 3),\n"
        "  WATERMARK FOR rowtime AS rowtime\n"
        ") WITH ('connector' = 'filesystem', 'path' = '" + str(path).replace("'", "''") + "', "
        "'format' = 'csv')"
    )


def _final_count(t_env: Any, sql: str) -> tuple[int, float, int]:
    """(final COUNT(*), seconds from submission to the last row, changelog rows received)."""
    from pyflink.common import RowKind

    t0 = time.perf_counter()
    result = t_env.execute_sql(sql)
    value, rows = 0, 0
    with result.collect() as it:
        for row in it:
            rows += 1
            if row.get_row_kind() in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                value = row[0]
            elif row.get_row_kind() in (RowKind.DELETE,):
                value = 0
    return int(value), time.perf_counter() - t0, rows


def run(events_file: Path, name: str, *, parallelism: int = 1, mode: str = "streaming") -> dict[str, Any]:
    out: dict[str, Any] = {"pattern": name, "engine": "flink"}
    if name == HOT_KEY:
        sql, notes = hot_key_sql(), []
    else:
        try:
            sql, notes = match_recognize(load_patterns()[name])
        except NotExpressible as exc:
            out.update(expressible=False, reason=str(exc))
            return out
    out.update(expressible=True, sql=sql, notes=notes)

    # PyFlink logs into its own package directory by default; keep the venv untouched.
    os.environ.setdefault("FLINK_LOG_DIR", str(events_file.parent / "flink-log"))
    import pyflink
    from pyflink.table import EnvironmentSettings, TableEnvironment

    t0 = time.perf_counter()
    settings = (EnvironmentSettings.in_batch_mode() if mode == "batch"
                else EnvironmentSettings.in_streaming_mode())
    t_env = TableEnvironment.create(settings)
    conf = t_env.get_config()
    conf.set("parallelism.default", str(parallelism))
    conf.set("table.exec.resource.default-parallelism", str(parallelism))
    # Few changelog rows for the COUNT(*) on top: the count is updated per mini-batch.
    conf.set("table.exec.mini-batch.enabled", "true")
    conf.set("table.exec.mini-batch.allow-latency", "1 s")
    conf.set("table.exec.mini-batch.size", "100000")
    t_env.execute_sql(source_ddl(events_file, country=name == HOT_KEY))
    out["jvm_start_seconds"] = time.perf_counter() - t0

    scan = "SELECT COUNT(*) FROM events"
    _, warmup_seconds, _ = _final_count(t_env, scan)  # class loading, JIT, first mini-cluster
    events, scan_seconds, _ = _final_count(t_env, scan)
    matches, seconds, changelog = _final_count(t_env, sql)
    net = seconds - scan_seconds
    out.update(
        flink_version=getattr(pyflink, "__version__", None) or _pyflink_version(),
        parallelism=parallelism, mode=mode, events=events, seconds=seconds, matches=matches,
        scan_seconds=scan_seconds, warmup_seconds=warmup_seconds, changelog_rows=changelog,
        events_per_s=events / seconds if seconds > 0 else None,
        net_events_per_s=events / net if net > 0 else None,
        timed="execute_sql → last result row: planning, job start on the local mini-cluster, "
              "CSV parsing, watermark sort, matching, COUNT(*); JVM start excluded; "
              "scan_seconds = the same for SELECT COUNT(*) FROM events",
    )
    return out


def _pyflink_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("apache-flink")
    except Exception:
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events-file", type=Path, help="CSV: account,ts,type,amount (event-time order)")
    parser.add_argument("--pattern", required=True, help="a name from PATTERNS in bench/match_operator.py")
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--mode", choices=("streaming", "batch"), default="streaming",
                        help="Flink runtime mode (streaming is the comparison: the operator is one)")
    parser.add_argument("--print-sql", action="store_true", help="print the query and exit")
    args = parser.parse_args(argv)
    patterns = {**load_patterns(), HOT_KEY: None}
    if args.pattern not in patterns:
        raise SystemExit(f'Invalid pattern "{args.pattern}". Valid choices are: {", ".join(patterns)}.')
    if args.print_sql:
        try:
            sql, notes = (hot_key_sql(), []) if args.pattern == HOT_KEY else match_recognize(patterns[args.pattern])
        except NotExpressible as exc:
            print(f"n/a: {exc}")
            return
        print(sql)
        for note in notes:
            print(f"-- {note}")
        return
    if args.events_file is None:
        raise SystemExit("--events-file is required (unless --print-sql)")
    print(json.dumps(run(args.events_file.resolve(), args.pattern, parallelism=args.parallelism,
                         mode=args.mode)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
