"""``ctiflow bench reliability``: kills survived, records checked, duplicates, losses, bad
inputs dead-lettered, broker-outage seconds survived — one table.

Everything runs against a private embedded broker; each job is a child ``ctiflow run``
process (one Spark job at a time)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table


def _passthrough(bootstrap: str, topic: str, out: str, ckpt: Path, job: str, limit: int) -> dict:
    return {"job": job, "kafka": {"bootstrap_servers": bootstrap},
            "sources": [{"name": "tx", "topic": topic, "schema": "transaction", "key_field": "account",
                         "time_field": "event_time", "partitions": 1, "max_offsets_per_trigger": limit,
                         "cti": {"delay": "1h"}}],
            "operators": [{"kind": "passthrough", "output": out}],
            "spark": {"checkpoint": str(ckpt), "key_groups": 4}}


def main(out: Console | None = None, kills: int = 10, events: int = 20_000, bad: int = 10_000) -> dict:
    from ctiflow.bench.chaos import crash_loop
    from ctiflow.bench.outage import outage_run
    from ctiflow.jobs.datapath import kafka
    from ctiflow.jobs.ops import stack
    from ctiflow.jobs.datapath.kafka import read_topic
    from ctiflow.jobs.avro.serde import AvroSerializer
    from ctiflow.jobs.testing import workload

    out = out or Console(width=160)
    work = Path(tempfile.mkdtemp(prefix="ctiflow-reliability-"))
    port = stack.free_port()
    bootstrap = f"127.0.0.1:{port}"
    stack.up(port)
    try:
        records = workload.transactions(events, accounts=200, seed=1)
        kafka.create_topics(bootstrap, {"rel-in": 1, "rel-fuzz": 2})
        ser = AvroSerializer("transaction")
        kafka.produce(bootstrap, "rel-in", records, ser, "account")
        bad_values = workload.bad_records(bad, seed=2)
        kafka.produce(bootstrap, "rel-fuzz", [*records[:2000], *(v for _, v in bad_values)], ser, "account")

        # 50 micro-batches: the input must outlast the kills (at 1,000 a batch the job finished
        # after 8 of 10 once the adapter got faster).
        spec = _passthrough(bootstrap, "rel-in", "rel-out", work / "ck-chaos", "rel-chaos", events // 50)
        report = crash_loop(spec, work, kills=kills, seed=3)
        if report.final_returncode != 0:
            raise RuntimeError(f"the job did not finish after the crash loop; see {work / 'job.log'}")
        seen = Counter(r["id"] for r in read_topic(bootstrap, "rel-out"))
        duplicates = sum(c - 1 for c in seen.values() if c > 1)
        losses = sum(1 for r in records if r["id"] not in seen)

        fuzz = _passthrough(bootstrap, "rel-fuzz", "rel-fuzz-out", work / "ck-fuzz", "rel-fuzz", 5000)
        (work / "fuzz.yaml").write_text(yaml.safe_dump(fuzz))
        subprocess.run([sys.executable, "-m", "ctiflow.jobs.cli", "run", str(work / "fuzz.yaml"), "--until-end"],
                       capture_output=True, check=True, timeout=900)
        dead = read_topic(bootstrap, "rel-fuzz.dead-letter")
        fuzz_out = read_topic(bootstrap, "rel-fuzz-out")
    finally:
        stack.down(port)

    port2 = stack.free_port()
    b2 = f"127.0.0.1:{port2}"
    part = workload.transactions(1000, accounts=20, seed=4)
    o_spec = {**_passthrough(b2, "o-in", "o-out", work / "ck-outage", "rel-outage", 1000),
              "kafka": {"bootstrap_servers": b2, "outage_timeout": "120s"}}
    o_spec["sources"][0]["cti"] = {"delay": "5s"}
    o_spec["spark"]["trigger"] = "1s"
    outage = outage_run(o_spec, work, port2, [("o-in", "transaction", part[:500], "account")],
                        [("o-in", "transaction", part[500:], "account")], outage=32)
    import json

    o_seen = Counter([r["id"] for r in outage.before["o-out"] + outage.drained["o-out"]] +
                     [json.loads(r["fields_json"])["id"] for r in outage.before["rel-outage.late"] +
                      outage.drained["rel-outage.late"]])
    figures = {
        "SIGKILLs survived (driver + workers)": f"{report.kills} of {kills}",
        "records checked after the crash loop": len(records),
        "duplicates": duplicates,
        "losses": losses,
        "bad inputs tried": len(bad_values),
        "dead-lettered": len(dead),
        "good records passed next to them": f"{len(fuzz_out)} of 2000",
        "broker outage survived (s)": round(outage.outage_seconds),
        "outage: duplicates / losses": f"{sum(c - 1 for c in o_seen.values() if c > 1)} / "
                                       f"{sum(1 for r in part if r['id'] not in o_seen)}",
    }
    table = Table(title="ctiflow bench reliability (embedded stack)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in figures.items():
        table.add_row(k, f"{v:,}" if isinstance(v, int) else str(v))
    out.print(table)
    return figures


if __name__ == "__main__":
    main()
