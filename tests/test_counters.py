"""The one counter table (:mod:`ctiflow.jobs.core.counters`): what the key groups and the sink report is in
it, it adds up as the progress file and the metrics expect, and every Prometheus name the
status command and the alert rules use is one of its families."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ctiflow.jobs.core import counters
from ctiflow.jobs.core.counters import Counters

ROOT = Path(__file__).resolve().parent.parent


def test_every_counter_a_key_group_or_the_sink_reports_is_in_the_table():
    c = Counters(received=3, by_partition={("tx", 0): [2, 1], ("tx", 1): [1, 0]},
                 partitions={("tx", 0): (100, 0), ("tx", 1): (90, 1)}, ops={"hot": (10, 2)},
                 shared={"fraud": {"rules_active": 2, "rules_versions": 3, "rules_scheduled": 1, "rules_applied": 3,
                                   "rules_adjusted": 0, "rules_rejected": 1}}, tallies={("fraud", "big"): 4},
                 side_read={("rules_fraud", 0): 7})
    reported = set(c.metrics()) | {"written", "replay_skipped", counters.key("written", "out-topic")}
    assert {f.name for f in dataclasses.fields(Counters)} - {"by_partition", "partitions", "ops", "shared",
                                                             "tallies", "side_read"} <= set(
        c.metrics())
    assert c.metrics()[counters.key("side_read", "rules_fraud", 0)] == 7
    assert counters.key("rules_rejected", "fraud") in reported
    assert counters.key("rule_partial_matches", "fraud", "big") in reported
    unknown = sorted(name for name in reported if counters.counter(name) is None)
    assert unknown == []


def test_keys_split_back_into_name_and_labels():
    assert counters.split(counters.key("cti", "tx", 3)) == ("cti", ("tx", "3"))
    assert counters.split(counters.key("written", "a.b-c")) == ("written", ("a.b-c",))
    assert counters.split("released") == ("released", ())
    assert list(counters.labelled({"late@tx/0": 2, "late@ref/1": 1, "late": 3, "received@tx/0": 9}, "late")) == [
        (("ref", "1"), 1), (("tx", "0"), 2)]


def test_counts_add_up_gauges_of_groups_add_up_and_shared_gauges_take_the_maximum():
    totals: dict[str, int] = {}
    counters.merge(totals, {"received": 2, "state_bytes": 10, "cti": 50, "cti@tx/0": 50, "idle@tx/0": 0})
    counters.merge(totals, {"received": 3, "state_bytes": 5, "cti": 40, "cti@tx/0": 60, "idle@tx/0": 1})
    assert totals == {"received": 5, "state_bytes": 15, "cti": 50, "cti@tx/0": 60, "idle@tx/0": 1}
    # over batches the progress file keeps a gauge's latest value, never the job's CTI's
    assert [counters.is_gauge(n) for n in ("state_bytes", "state_bytes@op", "cti@tx/0", "idle@tx/0")] == [True] * 4
    assert [counters.is_gauge(n) for n in ("cti", "received", "received@tx/0", "written@t", "unknown")] == [False] * 5


def test_every_prometheus_name_the_status_command_and_the_alert_rules_use_is_a_family_of_the_table():
    known = counters.all_metric_names()
    used = set()
    for path in (ROOT / "deploy" / "prometheus" / "alerts.yml", ROOT / "jobs" / "ops" / "status.py"):
        used |= set(re.findall(r"\bctiflow_[a-z_]*[a-z]\b", path.read_text()))
    used -= {"ctiflow_records_received_rate"}  # status's own rate() series
    assert used and sorted(used - known) == []
