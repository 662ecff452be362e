"""``ctiflow``: the command line for everything a user does with the platform."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from operators.errors import CtiflowError

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Avro-typed Kafka topics → PySpark Structured Streaming with CTIs: counts, matches, bins.")
topics_app = typer.Typer(no_args_is_help=True, help="Create and list Kafka topics.")
schemas_app = typer.Typer(no_args_is_help=True, help="Avro schemas: list, register in a Schema Registry.")
plot_app = typer.Typer(no_args_is_help=True, help="Render count or bin result topics as PNG.")
conformance_app = typer.Typer(no_args_is_help=True, help="Run recorded conformance suites.")
users_app = typer.Typer(no_args_is_help=True, help="SASL/SCRAM users of the embedded broker.")
app.add_typer(topics_app, name="topics")
app.add_typer(schemas_app, name="schemas")
app.add_typer(plot_app, name="plot")
app.add_typer(conformance_app, name="conformance")
app.add_typer(users_app, name="users")

from jobs.kafka import read_topic  # noqa: E402,F401 - re-exported: `from jobs.cli import read_topic` keeps working

console = Console(stderr=True, soft_wrap=True)  # a line per message, also when not a terminal
out = Console(soft_wrap=True)

DEFAULT_PORT = int(os.environ.get("CTIFLOW_BROKER_PORT", "19092"))
BootstrapOpt = typer.Option(None, "--bootstrap", "-b", envvar="CTIFLOW_BOOTSTRAP",
                            help="Kafka bootstrap servers (default: the embedded broker)")


def _bootstrap(value: str | None) -> str:
    return value or f"127.0.0.1:{DEFAULT_PORT}"


def _client() -> dict[str, str]:
    """librdkafka settings for the CLI's own clients (credentials come from the environment,
    added by :func:`jobs.kafka.base_config`)."""
    return {}


# -- embedded stack -------------------------------------------------------------------------
@app.command()
def up(port: int = typer.Option(DEFAULT_PORT, help="loopback port of the embedded broker"),
       authentication: bool = typer.Option(False, "--auth", help="require SASL/SCRAM (create users with `ctiflow users create`)")):
    """Start the embedded Kafka-protocol broker (tansu) on 127.0.0.1:PORT."""
    from jobs import stack

    proc = stack.up(port, authentication=authentication)
    out.print(f"broker up: {proc.bootstrap} (pid {proc.pid}, log {proc.log})")


@app.command()
def down(port: int = typer.Option(DEFAULT_PORT, help="port the broker listens on")):
    """Stop the embedded broker."""
    from jobs import stack

    out.print("broker stopped" if stack.down(port) else f"no embedded broker was running on port {port}")


@app.command()
def status(port: int = typer.Option(DEFAULT_PORT)):
    """Is the embedded broker running, and does it answer?"""
    from jobs import stack

    st = stack.status(port)
    answers = st.running and stack.broker_ready(st.bootstrap, client_config=_client())
    out.print(f"broker on {st.bootstrap}: {'running' if st.running else 'stopped'}"
              f"{f' (pid {st.pid})' if st.pid else ''}{', answering' if answers else ''}")
    raise typer.Exit(0 if st.running else 1)


@app.command()
def doctor(quiet: bool = typer.Option(False, "--quiet", help="print only problems")):
    """Check the machine: Java 17+, pyspark, the broker binary, the schemas."""
    import shutil
    import subprocess

    problems = []
    java = shutil.which("java") or (os.environ.get("JAVA_HOME") and str(Path(os.environ["JAVA_HOME"]) / "bin/java"))
    if not java:
        problems.append("Java 17+ not found: install a JDK/JRE 17 (apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    else:
        ver = subprocess.run([java, "-version"], capture_output=True, text=True).stderr.split("\n")[0]
        if not quiet:
            out.print(f"java: {ver}")
    try:
        from jobs import stack
        from jobs.serde import default_store

        binary = stack.tansu_binary()
        names = default_store().names()
        if not quiet:
            import pyspark

            out.print(f"pyspark {pyspark.__version__}; broker {binary}; schemas: {', '.join(names)}")
    except CtiflowError as exc:
        problems.append(str(exc))
    for p in problems:
        console.print(f"[red]problem:[/red] {p}")
    raise typer.Exit(1 if problems else 0)


@users_app.command("create")
def users_create(username: str, password: str = typer.Option(..., prompt=True, hide_input=True, envvar="CTIFLOW_SASL_PASSWORD"),
                 port: int = typer.Option(DEFAULT_PORT)):
    """Create a SCRAM user on the embedded broker."""
    from jobs import stack

    stack.create_user(port, username, password)
    out.print(f"user {username!r} created")


# -- topics and schemas ---------------------------------------------------------------------
@topics_app.command("create")
def topics_create(names: list[str] = typer.Argument(None, help="topic names"),
                  partitions: int = typer.Option(2, min=1),
                  config: Optional[Path] = typer.Option(None, "--config", "-c", help="create every topic this job uses"),
                  bootstrap: Optional[str] = BootstrapOpt):
    """Create topics (tansu cannot add partitions later: choose the count now)."""
    from jobs import kafka

    wanted = {n: partitions for n in names or []}
    client = _client()
    if config:
        from jobs.config import load

        cfg = load(config)
        bootstrap = bootstrap or cfg.kafka.bootstrap_servers
        client = {**cfg.kafka.client_config(), **client}
        wanted.update({s.topic: s.partitions for s in cfg.sources})
        wanted.update({t: cfg.outputs.partitions for t in cfg.result_topics()})
    if not wanted:
        raise typer.BadParameter("name at least one topic or give --config JOB.yaml")
    for n in wanted:
        kafka.check_topic_name(n)
    bs = _bootstrap(bootstrap)
    kafka.wait_for_broker(bs, client)
    created = kafka.create_topics(bs, wanted, client)
    for n in wanted:
        out.print(f"{n}: {'created' if n in created else 'exists'} ({wanted[n]} partitions)")


@topics_app.command("list")
def topics_list(bootstrap: Optional[str] = BootstrapOpt):
    """List topics and their partition counts."""
    from jobs import kafka

    bs = _bootstrap(bootstrap)
    kafka.wait_for_broker(bs, _client())
    table = Table("topic", "partitions")
    for name, parts in sorted(kafka.list_topics(bs, _client()).items()):
        table.add_row(name, str(parts))
    out.print(table)


@schemas_app.command("list")
def schemas_list():
    """The Avro schemas in schemas/ with their CRC-64-AVRO fingerprints."""
    from jobs.serde import default_store

    store = default_store()
    table = Table("schema", "fingerprint (single-object)")
    for n in store.names():
        table.add_row(n, store.get(n).fingerprint.hex())
    out.print(table)


@schemas_app.command("register")
def schemas_register(config: Path = typer.Option(..., "--config", "-c"),
                     registry: Optional[str] = typer.Option(None, envvar="CTIFLOW_SCHEMA_REGISTRY_URL")):
    """Register every schema a job uses (subject ``<topic>-value``) in the Schema Registry."""
    from confluent_kafka.schema_registry import Schema

    from jobs.config import load
    from jobs.serde import default_store, registry_client

    cfg = load(config)
    url = registry or cfg.kafka.schema_registry.url
    if not url:
        raise CtiflowError("no Schema Registry configured: set kafka.schema_registry.url or CTIFLOW_SCHEMA_REGISTRY_URL")
    client = registry_client(url, cfg.kafka.schema_registry.config)
    topics = {s.topic: s.schema_name for s in cfg.sources} | cfg.result_topics()
    for topic, schema in topics.items():
        sid = client.register_schema(f"{topic}-value", Schema(default_store().get(schema).text, "AVRO"))
        out.print(f"{topic}-value → {schema} (id {sid})")


# -- produce / consume ----------------------------------------------------------------------
@app.command()
def produce(file: str = typer.Argument("-", help="JSON-lines file, or - for stdin"),
            topic: str = typer.Option(..., "--topic", "-t"),
            schema: str = typer.Option(..., "--schema", "-s", help="schema name in schemas/ (e.g. transaction)"),
            key_field: Optional[str] = typer.Option(None, help="record field used as the Kafka key (entity key)"),
            framing: str = typer.Option("single_object", help="single_object | confluent"),
            registry: Optional[str] = typer.Option(None, envvar="CTIFLOW_SCHEMA_REGISTRY_URL"),
            bootstrap: Optional[str] = BootstrapOpt):
    """Produce JSON lines to a topic as Avro (validated against the schema)."""
    from rich.progress import Progress

    from jobs import kafka
    from jobs.serde import AvroSerializer, registry_client

    reg = registry_client(registry) if framing == "confluent" and registry else None
    ser = AvroSerializer(schema, framing=framing, registry=reg, subject=f"{topic}-value")
    bs = _bootstrap(bootstrap)
    kafka.wait_for_broker(bs, _client())
    kafka.topic_partitions(bs, topic, _client())
    prod = kafka.producer(bs, _client())
    lines = sys.stdin if file == "-" else open(file)
    sent = bad = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing to {topic}", total=None)
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                value = ser(rec)
            except (ValueError, CtiflowError) as exc:
                bad += 1
                console.print(f"[yellow]line {lineno} skipped:[/yellow] {exc}")
                continue
            key = str(rec.get(key_field)).encode() if key_field and rec.get(key_field) is not None else None
            kafka.send(prod, topic, value, key)
            sent += 1
            if sent % 5000 == 0:
                prod.poll(0)
                progress.update(task, completed=sent)
    left = prod.flush(60)
    out.print(f"produced {sent - left} records to {topic}" + (f", {bad} lines rejected" if bad else ""))
    if left or bad:
        raise typer.Exit(1)


@app.command()
def consume(topic: str = typer.Option(..., "--topic", "-t"),
            from_beginning: bool = typer.Option(True, "--from-beginning/--new-only"),
            max_records: Optional[int] = typer.Option(None, "--max", help="stop after N records"),
            follow: bool = typer.Option(False, "--follow", "-f", help="keep waiting for new records"),
            registry: Optional[str] = typer.Option(None, envvar="CTIFLOW_SCHEMA_REGISTRY_URL"),
            bootstrap: Optional[str] = BootstrapOpt):
    """Print a topic's records as JSON lines (any ctiflow schema, either framing)."""
    from confluent_kafka import KafkaError

    from jobs import kafka
    from jobs.serde import AvroDeserializer, registry_client

    bs = _bootstrap(bootstrap)
    kafka.wait_for_broker(bs, _client())
    parts = kafka.topic_partitions(bs, topic, _client())
    if not follow and from_beginning:
        for rec in read_topic(bs, topic, _client(), max_records, registry_url=registry):
            out.print_json(json.dumps(rec, default=lambda b: b.hex() if isinstance(b, bytes) else str(b))) \
                if sys.stdout.isatty() else print(json.dumps(rec, default=lambda b: b.hex() if isinstance(b, bytes) else str(b)))
        return
    from confluent_kafka import TopicPartition

    decode = AvroDeserializer(None, registry=registry_client(registry) if registry else None)
    cons = kafka.consumer(bs, _client())
    start = {p: (0 if from_beginning else kafka.true_end_offset(cons, topic, p, 0)) for p in parts}
    cons.assign([TopicPartition(topic, p, o) for p, o in start.items()])
    n = 0
    try:
        while max_records is None or n < max_records:
            msg = cons.poll(1.0)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                continue
            print(json.dumps(decode(msg.value()), default=str), flush=True)
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        cons.close()


# -- jobs -----------------------------------------------------------------------------------
def _progress_printer():
    from jobs import pipeline

    warned: set[str] = set()

    def show(p: dict, counters: dict):
        console.print(pipeline.progress_line(p, counters), soft_wrap=True, highlight=False)
        for warning in pipeline.late_warnings(counters, warned):
            console.print(f"[yellow]{warning}[/yellow]", soft_wrap=True, highlight=False)
    return show


@app.command()
def run(config: Path = typer.Argument(..., help="job YAML"),
        until_end: bool = typer.Option(False, "--until-end", help="bounded: process what is there, flush (final CTI +∞), stop"),
        timeout: Optional[float] = typer.Option(None, help="stop after this many seconds"),
        as_json: bool = typer.Option(False, "--json", help="print the run's summary as one JSON object on stdout")):
    """Run a job (Spark Structured Streaming) described by a YAML file."""
    from jobs import pipeline
    from jobs.config import load
    from jobs.runtime import plan

    cfg = load(config)
    plan(cfg)  # builds every operator once: pattern/predicate errors surface before Spark starts
    summary = pipeline.run(cfg, until_end=until_end, on_progress=_progress_printer(), timeout=timeout)
    if as_json:
        print(json.dumps({"job": cfg.job, "batches": summary.batches, "records": summary.records,
                          "seconds": round(summary.seconds, 3), "cti": summary.cti, "counters": summary.counters,
                          "stopped_by": signal.Signals(summary.stopped_by).name if summary.stopped_by else None}))
        raise typer.Exit(128 + summary.stopped_by if summary.stopped_by else 0)
    out.print(pipeline.summary_line(cfg.job, summary), highlight=False)
    if summary.stopped_by:
        console.print(f"stopped on {signal.Signals(summary.stopped_by).name}; "
                      "the next run continues from the checkpoint", highlight=False)
        raise typer.Exit(128 + summary.stopped_by)


@app.command()
def drain(config: Path = typer.Argument(..., help="job YAML")):
    """Process everything left and flush all operator state (final CTI at +∞), then stop.

    Stop the running job first; ``drain`` continues from its checkpoint."""
    run(config, until_end=True, timeout=None, as_json=False)  # a direct call: typer defaults do not apply


@app.command("demo-data")
def demo_data(out_dir: Path = typer.Option(Path(".ctiflow/demo"), "--out"),
              transactions: int = typer.Option(20000), flows: int = typer.Option(3000), seed: int = 7):
    """Write the sample workloads (JSON lines) the demo produces."""
    from jobs.testing import workload

    out_dir.mkdir(parents=True, exist_ok=True)
    tx = workload.transactions(transactions, accounts=500, seed=seed, late_fraction=0.002)
    workload.write_jsonl(tx, out_dir / "transactions.jsonl")
    workload.write_jsonl(workload.accounts(accounts=500, seed=seed, start_ms=min(t["event_time"] for t in tx) - 60_000),
                         out_dir / "accounts.jsonl")
    workload.write_jsonl(workload.flows(flows, devices=20, seed=seed, rate_per_s=2.0, late_fraction=0.02), out_dir / "flows.jsonl")
    out.print(f"wrote {out_dir}/transactions.jsonl, accounts.jsonl, flows.jsonl")


@app.command()
def demo(port: int = typer.Option(DEFAULT_PORT), keep: bool = typer.Option(False, help="leave the broker running")):
    """The whole pipeline end to end on the embedded stack: broker, topics, sample data, jobs, results."""
    from jobs.demo import run_demo

    run_demo(port=port, keep_broker=keep, console=console, out=out)


@app.command()
def bench(which: str = typer.Argument("all", help="adapter | source | count | bins | match | reliability | all"),
          events: Optional[int] = typer.Option(None, help="events per run (default per benchmark)"),
          trigger: Optional[int] = typer.Option(None, min=1000, help="events per micro-batch for every Spark variant "
                                                "of adapter and bins (default: 200000 and 50000)")):
    """Benchmarks: print figures (events/s, latency percentiles, memory) against a baseline in the same run."""
    from bench import run_benchmarks

    run_benchmarks(which, events=events, out=Console(width=200), trigger=trigger)


@conformance_app.command("cep")
def conformance_cep(file: Path = typer.Argument(None, help="case file (default: the one in tests/data/)")):
    """Replay Flink CEP's recorded test cases through the Pattern API; per-feature pass table."""
    from jobs.testing.conformance import DEFAULT_CASES, main as conformance_main

    raise typer.Exit(conformance_main(str(file or DEFAULT_CASES)))


@plot_app.command("counts")
def plot_counts(topic: str = typer.Option("counts", "--topic", "-t"), out_png: Path = typer.Option(Path("counts.png"), "--out"),
                config: Optional[Path] = typer.Option(None, "--config", "-c",
                                                      help="the job's YAML: also draw the exact count from its input topic"),
                bootstrap: Optional[str] = BootstrapOpt):
    """Estimate with its guaranteed bounds over application time (and the exact count with --config)."""
    from jobs.plot import plot_counts as render

    bs = _bootstrap(bootstrap)
    records = read_topic(bs, topic, _client())
    exact = exact_counts(bs, load_config(config), records) if config else None
    out.print(f"wrote {render(records, str(out_png), exact=exact)} from {len(records)} records")


def load_config(path: Path):
    from jobs.config import load

    return load(path)


def exact_counts(bootstrap: str, cfg, records: list[dict]) -> dict:
    """Brute-force exact counts at every count record's time, from the job's input topic
    (every decodable record, late ones included: the plot's reference line)."""
    from collections import defaultdict

    from jobs.testing import oracle
    from jobs.config import CountOp
    from operators.cep.expression import compile_expression

    src = cfg.source(cfg.reference.fast) if cfg.reference else cfg.sources[0]
    if cfg.reference is not None and cfg.reference.output:
        # Predicates may use the reference version: count over the enriched stream.
        import json as _json

        inputs = [{**_json.loads(r["event_json"]), "reference": _json.loads(r["reference_json"] or "null")}
                  for r in read_topic(bootstrap, cfg.reference.output, _client()) if "_undecodable" not in r]
    else:
        inputs = read_topic(bootstrap, src.topic, _client())
    inputs = [r for r in inputs if "_undecodable" not in r
              and r.get(src.key_field) is not None and isinstance(r.get(src.time_field), int)]
    checked = oracle.check(oracle.to_events(inputs, src.key_field, src.time_field), 0)
    by_key: dict[str, list] = defaultdict(list)
    for c in checked:
        by_key[c.key].append(c)
    exact: dict[tuple[str, str], list] = defaultdict(list)
    ops = {op.name: op for op in cfg.operators if isinstance(op, CountOp)}
    for r in records:
        op = ops.get(r.get("counter"))
        if op is None:
            continue
        kind, window = ("events", op.window.events) if op.window.events else ("time", op.window.time)
        predicate = compile_expression(op.predicate) if op.predicate else None
        pool = checked if not op.per_key else by_key.get(r["key"], [])
        exact[(r["counter"], r["key"])].append(
            (r["time"], oracle.count_at(pool, r["key"], r["time"], kind, window, predicate, op.per_key, op.value_field)))
    return exact


@plot_app.command("bins")
def plot_bins(topic: str = typer.Option("bins-updated", "--topic", "-t"), final_topic: Optional[str] = typer.Option(None, "--final-topic"),
              out_png: Path = typer.Option(Path("bins.png"), "--out"), bootstrap: Optional[str] = BootstrapOpt):
    """Bins per key over time; updated revisions converge on the final value."""
    from jobs.plot import plot_bins as render

    bs = _bootstrap(bootstrap)
    records = read_topic(bs, topic, _client()) + (read_topic(bs, final_topic, _client()) if final_topic else [])
    out.print(f"wrote {render(records, str(out_png))} from {len(records)} records")


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def main() -> None:
    """Entry point: one clear line for our errors, everything started is stopped on Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt)  # `docker compose stop`, `kill`: as Ctrl-C
    try:
        app()
    except CtiflowError as exc:
        from jobs.kafka import env_credentials, redact

        console.print(f"[red]error:[/red] {redact(str(exc), env_credentials())}")
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("interrupted; stopped what this command started")
        sys.exit(130)


if __name__ == "__main__":
    main()
