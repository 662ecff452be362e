"""Records key-group state written by one ctiflow version, for ``tests/test_state_compat.py``.

Run with the version to record on ``PYTHONPATH`` (its checkout's root):
``PYTHONPATH=<checkout> python tests/data/state/record.py tests/data/state/<name>.pkl.gz``.
Per job of :data:`JOBS`: the input is cut in two; the first half goes through that version's
``GroupRuntime`` (events offered per micro-batch, each batch's CTI from the frontiers), the state
is snapshotted mid-stream (events still buffered, a reference join and its output buffer holding
some), and that version then runs the second half to the end from the snapshot. The file keeps
the job, the snapshot, the second half's batches and the records that version produced for them:
a later version must restore the snapshot and produce the same records.
"""

from __future__ import annotations

import gzip
import pickle
import random
import sys

try:  # jobs/ in rooms (from 2026-11-29)
    from ctiflow.jobs.core import rows
    from ctiflow.jobs.core.runtime import GroupRuntime
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.planner import plan_job as plan
except ImportError:
    from ctiflow.jobs.config import parse
    from ctiflow.jobs.runtime import GroupRuntime

    try:
        from ctiflow.jobs import rows
    except ImportError:
        rows = None
    try:
        from ctiflow.jobs.planner import plan_job as plan
    except ImportError:
        try:
            from ctiflow.jobs.runtime import plan  # the versions this was written for
        except ImportError:
            from ctiflow.jobs.runtime import Plan

            plan = Plan.from_config
from ctiflow.operators.time import CTI_INFINITY, Event

TX = {"name": "s", "topic": "t", "schema": "transaction", "key_field": "account", "time_field": "event_time",
      "cti": {"delay": 40, "policy": "adjust"}}
REF = {"name": "r", "topic": "r", "schema": "account", "key_field": "account", "time_field": "valid_from",
       "shape": "edge"}
JOBS = {
    "reference-count": {"job": "compat-ref", "kafka": {"bootstrap_servers": "x:1"}, "sources": [TX, REF],
                        "reference": {"fast": "s", "source": "r", "sync": "min", "join_field": "account"},
                        "operators": [{"kind": "count", "name": "c", "window": {"events": 5}, "per_key": True,
                                       "output": "counts"}]},
    "one-stream-match": {"job": "compat-one", "kafka": {"bootstrap_servers": "x:1"}, "sources": [TX],
                         "operators": [{"kind": "match", "name": "m", "output": "matches", "pattern": {
                             "within_ms": 200, "stages": [{"name": "a", "where": "amount > 500"},
                                                          {"name": "b", "contiguity": "followed_by",
                                                           "where": "amount < 100"}]}}]},
    # A match operator with its own pattern and rules (a rules topic: its stream ``rules_m``); the
    # rule records of :func:`rule_events` come in the batches with the transactions.
    "ruled-match": {"job": "compat-ruled", "kafka": {"bootstrap_servers": "x:1"}, "sources": [TX],
                    "operators": [{"kind": "match", "name": "m", "output": "matches", "pattern": {
                        "within_ms": 300, "stages": [{"name": "a", "where": "amount > 700"},
                                                     {"name": "b", "contiguity": "followed_by", "where": "amount < 50"}]},
                        "rules": {"topic": "rules", "on_change": "drain", "late_rules": "adjust"}}]},
}
RULES = "rules_m"


def rule_definition(low: int, high: int, within: int) -> str:
    return ('{"within_ms": %d, "stages": [{"name": "x", "where": "amount > %d"}, '
            '{"name": "y", "contiguity": "followed_by", "where": "amount < %d"}]}' % (within, high, low))


def rule_events(batch: int, cti: int, offset: int) -> list[Event]:
    """The rule records of micro-batch ``batch`` (``cti``: about where its events are): a rule
    put, replaced, a second one, a late one (adjusted), one refused (a bad definition), a delete."""
    plans = {1: [("big", 1, cti + 50, "put", rule_definition(100, 800, 400))],
             2: [("small", 1, cti + 20, "put", rule_definition(20, 600, 200)),
                 ("bad", 1, cti + 20, "put", '{"within_ms": 100, "stages": [{"name": "x", "where": "amount >"}]}')],
             4: [("big", 2, cti + 10, "put", rule_definition(300, 500, 500)),
                 ("late", 1, cti - 500, "put", rule_definition(50, 900, 100))],
             8: [("small", 2, cti + 30, "delete", None)],
             9: [("big", 3, cti + 40, "put", rule_definition(200, 650, 300))]}
    out = []
    for i, (rule_id, version, effective, action, definition) in enumerate(plans.get(batch, ())):
        fields = {"rule_id": rule_id, "operator": "m", "version": version, "effective_time": effective,
                  "action": action, "definition": definition, "comment": None}
        out.append(Event(rule_id, effective, effective, fields, 0, offset + i, RULES))
    return out


def batches(job: str, seed: int = 3) -> list[list[Event]]:
    """12 micro-batches: 2 partitions of transactions at uneven rates, out of order within and
    beyond the delay; with a reference stream, account versions now and then."""
    rng = random.Random(seed)
    out, clock, offsets = [], [1000, 1000], {("s", 0): 0, ("s", 1): 0, ("r", 0): 0}
    for _ in range(12):
        batch = []
        for _ in range(rng.randint(5, 25)):
            p = 0 if rng.random() < 0.7 else 1
            clock[p] += rng.randint(0, 15 if p == 0 else 40)
            t = clock[p] - rng.randint(0, 60)
            account = rng.choice("abcde")
            batch.append(Event(account, t, t, {"account": account, "amount": float(rng.randint(0, 1000)),
                                               "country": "DE", "type": "purchase"}, p, offsets[("s", p)], "s"))
            offsets[("s", p)] += 1
            if job.startswith("reference") and rng.random() < 0.15:
                v = min(clock) - rng.randint(0, 30)
                batch.append(Event(account, v, CTI_INFINITY, {"account": account, "limit": rng.randint(1, 9) * 100.0,
                                                              "segment": "retail"}, 0, offsets[("r", 0)], "r"))
                offsets[("r", 0)] += 1
        if job.startswith("ruled"):
            batch += rule_events(len(out), min(clock), offsets[("r", 0)])
            offsets[("r", 0)] += len(batch) - sum(e.stream == "s" for e in batch)
        out.append(batch)
    return out


def run(rt: GroupRuntime, batch: list[Event], last: bool, side: tuple[str, ...] = ()) -> list[tuple]:
    """One micro-batch: through the low-level calls of the versions that had them, else through
    ``run_batch`` as ``tests/test_state_compat.py`` feeds it (the versions from 2026-11-28 on)."""
    if not hasattr(rt, "assign"):
        from ctiflow.operators.columns import EventColumns

        Control, GroupInput = rows.Control, rows.GroupInput

        streams = [*rt.plan.streams, *side]  # (side: a rules stream, not among the plan's streams)
        got = GroupInput([], [], [(s, Control([0, 1] if s == "s" else [0], [], last)) for s in streams], [])
        for slot in sorted({(e.stream, e.partition) for e in batch}):
            mine = [e for e in batch if (e.stream, e.partition) == slot]
            got.columns.append(EventColumns.from_events(mine))
            got.frontiers.append((*slot, max(e.start for e in mine)))
        return [(topic, o.role, o.record, key) for topic, o, key in rt.run_batch(got).outputs]
    for stream in rt.plan.streams:
        rt.assign(stream, [0, 1] if stream == "s" else [0], [])
    for e in batch:
        rt.observe(e.stream, e.partition, e.start)
    out = rt.offer_many(batch)
    flush = last and [rt.end_of_input(s) for s in rt.plan.streams][-1]  # True once every stream has ended
    out += rt.advance(CTI_INFINITY if flush else rt.next_cti())
    return [(topic, o.role, o.record, key) for topic, o, key in out]


def record(path: str) -> None:
    got = {}
    for name, spec in JOBS.items():
        cfg = parse(spec, spec["job"])
        p = plan(cfg)
        todo = batches(name)
        rt = GroupRuntime(p)
        side = tuple({e.stream for b in todo for e in b} - set(rt.plan.streams))
        for batch in todo[:6]:
            run(rt, batch, False, side)
        snapshot = rt.snapshot()
        rt = GroupRuntime(p, snapshot)
        outputs = [run(rt, batch, i == 5, side) for i, batch in enumerate(todo[6:])]
        got[name] = {"spec": spec, "snapshot": snapshot, "batches": todo[6:], "outputs": outputs}
    with gzip.open(path, "wb") as f:
        pickle.dump(got, f, protocol=5)


if __name__ == "__main__":
    record(sys.argv[1])
