"""What ctiflow keeps beside Spark's checkpoint, in the checkpoint directory — through Spark's
``CheckpointFileManager`` (:class:`CheckpointDir`), so wherever Spark's checkpoint can live: a
local path, HDFS, an object store, any Hadoop ``FileSystem``. Only the driver touches it; the
executors keep nothing on a disk (the sink's replay markers are in Kafka, :mod:`ctiflow.jobs.datapath.sink`),
nor does the sink's commit (the per-batch counters are in Kafka too, :class:`ProgressLog`).

* ``ctiflow-groups.json``: the key groups' labels (:func:`group_labels`): they name the state.
* ``ctiflow-start-<source>.json``: the offsets a source's first micro-batch started from
  (:func:`start_offsets`): Spark asks for them again when it replays batch 0.
Every file is written whole or not at all (``CheckpointFileManager.createAtomic``).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import mmh3

from ctiflow.jobs.driver.config import JobConfig
from ctiflow.jobs.core.counters import is_gauge, merge
from ctiflow.jobs.driver.jvm import gateway, hadoop_configuration
from ctiflow.jobs.datapath.own_topics import ForeignRecord, progress_record, skip
from ctiflow.jobs.state.store import LAYOUTS, STATE_LAYOUT
from ctiflow.operators.errors import ConfigError, StackError


MANAGER_CLASS = "spark.sql.streaming.checkpointFileManagerClass"
#: The manager ctiflow's sessions set (:func:`ctiflow.jobs.driver.pipeline.spark_options` says why).
FILE_SYSTEM_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


class CheckpointDir:
    """A job's checkpoint directory, through Spark's own ``CheckpointFileManager`` (Hadoop's
    ``FileSystem``): a local path, ``hdfs://``, ``s3a://``, ``gs://``, ``abfss://`` or any scheme
    a ``FileSystem`` is registered for. Files are written whole or not at all (``createAtomic``:
    a rename where the store has one, else what the store's manager does).

    By hand because no Python library reaches every Hadoop file system; the JVM does — the
    driver's (:meth:`of` with the session), or one py4j gateway for a tool without Spark
    (``ctiflow check``, started once per process)."""

    def __init__(self, location: str, jvm, hadoop_conf, manager_class: str | None = None) -> None:
        self.location = location
        self._jvm = jvm
        from py4j.protocol import Py4JJavaError

        self._root = jvm.org.apache.hadoop.fs.Path(location)
        try:
            self._fs = self._root.getFileSystem(hadoop_conf)
        except Py4JJavaError as exc:  # no FileSystem for the scheme, its class not found, a bad option
            cause = str(exc.java_exception.toString()).splitlines()[0]
            raise ConfigError(
                f"spark.checkpoint {location!r}: Hadoop cannot open it here ({cause}). Put the store's "
                "connector on the classpath (spark.jars, or spark-submit --jars / --packages: hadoop-aws for "
                "s3a://, the GCS connector for gs://) and give its spark.hadoop.* settings") from None
        if manager_class:  # the manager Spark's own checkpoint uses (a SQL setting Hadoop's configuration
                           # lacks)
            hadoop_conf = jvm.org.apache.hadoop.conf.Configuration(hadoop_conf)
            hadoop_conf.set(MANAGER_CLASS, manager_class)
        manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
        self._files = manager.create(self._root, hadoop_conf)

    @classmethod
    def of(cls, location: str | Path, spark=None, conf=None) -> "CheckpointDir":
        """The directory ``location`` (a path or a URI), through ``spark``'s JVM and Hadoop
        configuration, or else the process's gateway (:func:`ctiflow.jobs.driver.jvm.gateway`) and the
        Hadoop configuration ``conf`` (a ``SparkConf``) gives."""
        if spark is not None:
            return cls(str(location), spark._jvm, spark._jsc.hadoopConfiguration(),
                       spark.conf.get(MANAGER_CLASS, None))
        jvm = gateway(conf).jvm
        return cls(str(location), jvm, hadoop_configuration(jvm, conf),
                   conf.get(MANAGER_CLASS) if conf else None)

    @classmethod
    def for_job(cls, cfg: JobConfig, conf=None) -> "CheckpointDir":
        """The job's checkpoint as its session sees it: ``conf`` (the session's ``SparkConf``),
        else the job's own ``spark.conf`` (a store's ``spark.hadoop.*`` settings, a file system's
        class path) — enough for a tool such as ``ctiflow check``."""
        if conf is None:
            from pyspark import SparkConf

            conf = SparkConf().setAll([(MANAGER_CLASS, FILE_SYSTEM_MANAGER), *cfg.spark.conf.items()])
        return cls.of(cfg.checkpoint_dir, conf=conf)

    def __str__(self) -> str:
        return self.location

    def _path(self, name: str):
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name) if name else self._root

    def exists(self, name: str = "") -> bool:
        return bool(self._files.exists(self._path(name)))

    def is_dir(self, name: str = "") -> bool:
        path = self._path(name)
        return bool(self._files.exists(path)) and bool(self._fs.getFileStatus(path).isDirectory())

    def names(self, name: str = "") -> list[str]:
        """The entries of directory ``name`` (none if it does not exist)."""
        path = self._path(name)
        if not self._files.exists(path):
            return []
        return sorted(status.getPath().getName() for status in self._files.list(path))

    def read_text(self, name: str) -> str:
        stream = self._files.open(self._path(name))
        try:
            return bytes(stream.readAllBytes()).decode()
        finally:
            stream.close()

    def write_text(self, name: str, text: str) -> None:
        """``name`` written whole or not at all (a kill mid-write leaves no file). ctiflow writes
        each of its files once; one that exists is deleted first (Spark's rename-based manager
        does not overwrite)."""
        path = self._path(name)
        if self._files.exists(path):
            self._files.delete(path)
        self._files.mkdirs(path.getParent())
        stream = self._files.createAtomic(path, True)
        try:
            stream.write(bytearray(text.encode()))
        except BaseException:
            stream.cancel()
            raise
        stream.close()

    def delete(self, name: str) -> None:
        """``name`` and everything under it."""
        self._files.delete(self._path(name))

    def batches(self, log: str) -> list[int]:
        """The batch ids in one of Spark's logs (``offsets``, ``commits``), ascending."""
        return sorted(int(n) for n in self.names(log) if n.isdigit())


#: the layouts this version reads (:data:`ctiflow.jobs.state.store.LAYOUTS`); a checkpoint keeps the
#: layout it was started with
STATE_LAYOUTS_READ = tuple(LAYOUTS)


GROUPS = "ctiflow-groups.json"


def check_key_groups(groups: int, checkpoint: CheckpointDir) -> dict | None:
    """The key groups a checkpoint was written with (None: a new checkpoint); a different count,
    or an earlier state layout, is refused before the query starts: each group's state is stored
    under its group, so a new count would silently lose or misplace state."""
    if not checkpoint.exists(GROUPS):
        if checkpoint.batches("commits"):
            raise ConfigError(f"the checkpoint {checkpoint} was written by an earlier ctiflow, which kept "
                              "each key group's state in one blob; this version keeps it in chunks of keys "
                              "and cannot read it: start from a new checkpoint (spark.checkpoint), or finish "
                              "the old one with the ctiflow version that wrote it")
        return None
    saved = json.loads(checkpoint.read_text(GROUPS))
    if saved.get("state_layout", 0) > STATE_LAYOUT:
        raise ConfigError(f"the checkpoint {checkpoint} was written by a newer ctiflow (state layout "
                          f"{saved['state_layout']}; this version writes {STATE_LAYOUT}): run that version, "
                          "or start from a new checkpoint (spark.checkpoint)")
    if saved.get("state_layout") not in STATE_LAYOUTS_READ:
        raise ConfigError(f"the checkpoint {checkpoint} was written by an earlier ctiflow, which kept each "
                          "key group's state in one blob; this version keeps it in chunks of keys and cannot "
                          "read it: start from a new checkpoint (spark.checkpoint), or finish the old one "
                          "with the ctiflow version that wrote it")
    if saved["key_groups"] != groups:
        raise ConfigError(f"spark.key_groups is {groups}, but the checkpoint {checkpoint} was written with "
                          f"{saved['key_groups']} key groups (each group's state is stored under its group; "
                          f"spark.key_groups defaults to spark.shuffle_partitions): set spark.key_groups to "
                          f"{saved['key_groups']}, or start from a new checkpoint (spark.checkpoint)")
    return saved


def group_labels(groups: int, partitions: int, checkpoint: CheckpointDir | None = None) -> list[int]:
    """The value each key group carries into Spark's shuffle, chosen so the groups spread
    evenly over the stateful stage's partitions. Spark places a row by
    ``pmod(murmur3(value, seed 42), partitions)``; the plain numbers 0..7 land 3 and 5 on 2
    partitions, so one core would do 5/8 of the work. Label *g* is the next integer Spark puts
    in partition ``g mod partitions`` (Spark's hash is Murmur3 x86_32 with seed 42 over the
    int's 4 little-endian bytes; a test checks the placement against Spark's partitioner).
    Labels name the state, so they are kept with the checkpoint and reused on restart (Spark
    keeps a checkpoint's partition count too); a changed ``key_groups`` is refused."""
    saved = check_key_groups(groups, checkpoint) if checkpoint is not None else None
    if saved is not None:
        return saved["labels"]
    labels = _spread_labels(groups, partitions)
    if checkpoint is not None:
        checkpoint.write_text(GROUPS, json.dumps({"key_groups": groups, "partitions": partitions,
                                                  "labels": labels, "state_layout": STATE_LAYOUT}))
    return labels


def state_layout(checkpoint: CheckpointDir) -> int:
    """The state layout of the checkpoint (after :func:`group_labels` has checked or created it):
    :data:`STATE_LAYOUT` for a new one, the one it was started with otherwise."""
    return _saved_groups(checkpoint).get("state_layout", STATE_LAYOUT)


def _saved_groups(checkpoint: CheckpointDir) -> dict:
    """What :func:`group_labels` kept with the checkpoint (empty for a new one)."""
    return json.loads(checkpoint.read_text(GROUPS)) if checkpoint.exists(GROUPS) else {}


def _spread_labels(groups: int, partitions: int) -> list[int]:
    """Label *g* is the next integer Spark's partitioner puts in partition ``g mod partitions``."""
    def spark_partition(label: int) -> int:  # Spark's HashPartitioning of an int: murmur3, seed 42
        return mmh3.hash(struct.pack("<i", label), 42) % partitions

    free: dict[int, list[int]] = {p: [] for p in range(partitions)}
    labels: list[int] = []
    candidate = 0
    for g in range(groups):
        want = g % partitions
        while not free[want]:
            free[spark_partition(candidate)].append(candidate)
            candidate += 1
        labels.append(free[want].pop(0))
    return labels


def start_offsets(checkpoint: CheckpointDir, stream: str, resolve: Callable[[], dict]) -> dict:
    """The offsets a source's first micro-batch starts from: kept in the checkpoint the first
    time (``resolve()``: from ``starting_offsets``), read back on every later run. Spark logs only
    a batch's *end* offsets and asks again for the start of batch 0 when it replays it after a
    crash; ``latest`` (or ``earliest`` after retention) would by then be elsewhere, and the
    replay would not be the batch whose results already landed."""
    name = f"ctiflow-start-{stream}.json"
    if checkpoint.exists(name):
        return json.loads(checkpoint.read_text(name))
    start = resolve()
    checkpoint.write_text(name, json.dumps(start))
    return start


def replay_through(checkpoint: CheckpointDir) -> int:
    """The last batch Spark's offset log had planned before this run (-1: none): a run replays
    at most that one, and the sink treats every batch up to it as a replay
    (:mod:`ctiflow.jobs.datapath.sink`)."""
    planned = checkpoint.batches("offsets")
    return planned[-1] if planned else -1


class ProgressLog:
    """A job's per-batch counters, one record per attempt of a micro-batch (key: the batch id;
    value: JSON with ``batch``, ``time``, ``query`` and the counters), written by the sink's
    commit on the driver (:meth:`ctiflow.jobs.datapath.sink.KafkaStreamWriter.commit`) to the topic
    :func:`ctiflow.jobs.driver.config.progress_topic` — in Kafka, not beside the checkpoint, because that
    commit runs in a Python process of the driver's with no way to Hadoop's file systems.

    A topic outlives a checkpoint: the counters are those of the job's latest query (the
    ``query`` of the last record; a new checkpoint is a new query). A record the sink did not
    write is skipped with a warning (:mod:`ctiflow.jobs.datapath.own_topics`); a topic that was deleted and
    created again is read from its new start."""

    def __init__(self, bootstrap: str, topic: str, client: dict | None = None) -> None:
        self.bootstrap, self.topic, self.client = bootstrap, topic, client

    @classmethod
    def of(cls, cfg: JobConfig) -> "ProgressLog":
        return cls(cfg.kafka.bootstrap_servers, cfg.progress_topic, cfg.kafka.client_config())

    def read(self, start: int = 0) -> tuple[list[dict], int]:
        """The sink's records from offset ``start`` on, and the offset after them; none while
        the broker does not answer (a job waits out an outage: its counters wait with it). A
        record the sink did not write is left out, with a warning naming its offset (once per
        process); when the topic ends before ``start`` (it was deleted and created again) it
        is read from its start."""
        from confluent_kafka import KafkaException

        from ctiflow.jobs.datapath import kafka

        try:
            if self.topic not in kafka.list_topics(self.bootstrap, self.client):
                return [], start
            # a consumer a read: one kept across a (memory-only) broker's restart crashed its process
            cons = kafka.consumer(self.bootstrap, self.client)
            try:
                low = kafka.low_offset(cons, self.topic, 0)
                end = kafka.true_end_offset(cons, self.topic, 0, low, require_eof=True)  # exact: see below
                if end < start:  # another topic under the same name: its records are all new
                    start = low
                records = []
                for msgs in kafka.read_range(cons, self.topic, 0, max(start, low), end):
                    for m in msgs:
                        try:
                            records.append(progress_record(m.key, m.value))
                        except ForeignRecord as why:
                            skip(self.topic, 0, m.offset, why)
                return records, end
            finally:
                cons.close()
        except (KafkaException, StackError):
            return [], start

def latest_query(records: list[dict]) -> list[dict]:
    """The records of the query of the last record (older checkpoints' records left out)."""
    if not records:
        return []
    query = records[-1].get("query")
    return [rec for rec in records if rec.get("query") == query]


def read_counters(log: ProgressLog, batches: set[int] | None = None) -> dict:
    """The job's counters summed over its latest query's batches (``batches``: only those). A
    batch replayed after a crash has a record per attempt; the last one is the committed one."""
    last: dict[int, dict] = {}
    for rec in latest_query(log.read(0)[0]):
        if batches is None or rec["batch"] in batches:
            last[rec["batch"]] = rec
    totals: dict[str, int] = {}
    for batch in sorted(last):
        rec = {k: v for k, v in last[batch].items() if k not in ("batch", "time", "query")}
        for gauge in [k for k in rec if is_gauge(k)]:
            totals[gauge] = rec.pop(gauge)  # the state after the latest batch, not a sum over batches
        merge(totals, rec)
    return totals


class CounterReader:
    """:func:`read_counters` of a growing progress log, reading only what was added since the
    last call (a job calls it after every batch: re-reading days of records each time would cost
    seconds a batch). A batch is replayed only while it is the newest (Spark commits a batch
    before it starts the next), so every batch but the newest is folded into running totals; a
    record of another query (a new checkpoint) starts the totals again."""

    def __init__(self, log: ProgressLog):
        self.log = log
        self.offset = 0
        self.query = None
        self.settled: dict[str, int] = {}
        self.newest: dict | None = None
        self.gauges_of = -1  # the batch the settled gauges are from: the highest folded

    def _fold(self, rec: dict) -> None:
        batch = rec["batch"]
        rec = {k: v for k, v in rec.items() if k not in ("batch", "time", "query")}
        for gauge in [k for k in rec if is_gauge(k)]:
            value = rec.pop(gauge)
            if batch >= self.gauges_of:
                self.settled[gauge] = value
        self.gauges_of = max(self.gauges_of, batch)
        merge(self.settled, rec)

    def __call__(self) -> dict:
        records, self.offset = self.log.read(self.offset)
        for rec in records:
            if rec.get("query") != self.query:  # another query's: its totals start from nothing
                self.query, self.settled, self.newest, self.gauges_of = rec.get("query"), {}, None, -1
            if self.newest is not None and rec["batch"] != self.newest["batch"]:
                self._fold(self.newest)
            self.newest = rec  # a replay of the newest batch replaces its earlier attempt
        if self.newest is None:
            return dict(self.settled)
        saved = self.settled, self.gauges_of
        self.settled = dict(self.settled)
        try:
            self._fold(self.newest)
            return self.settled
        finally:
            self.settled, self.gauges_of = saved


#: What a checkpoint directory ctiflow runs in may hold: Spark's entries and ctiflow's (``ctiflow-*``).
CHECKPOINT_ENTRIES = frozenset({"offsets", "commits", "metadata", "sources", "state", ".metadata.crc"})
#: Spark's ``metadata`` half-written: its checkpoint file manager writes ``.metadata.<uuid>.tmp`` (and
#: Hadoop's local file system a ``.crc`` of it) and renames it, so a run killed between the two leaves it
_METADATA_TMP = re.compile(r"\.\.?metadata\.[0-9a-f-]{36}\.tmp(\.crc)?")


def check_checkpoint_dir(checkpoint: CheckpointDir) -> None:
    """Refuse, before the query starts, a checkpoint directory that holds something neither
    Spark's checkpoint nor ctiflow put there: a mistyped ``spark.checkpoint`` must not make a job
    write into (or clean up) a user's folder."""
    if not checkpoint.exists():
        return
    if not checkpoint.is_dir():
        raise ConfigError(f"spark.checkpoint: {checkpoint} is a file, not a directory; give a new or empty "
                          "directory")
    entries = {n for n in checkpoint.names() if not _METADATA_TMP.fullmatch(n)}
    foreign = sorted(n for n in entries
                     if n not in CHECKPOINT_ENTRIES and not n.startswith(("ctiflow-", ".ctiflow-")))
    spark_like = entries & (CHECKPOINT_ENTRIES - {"metadata", ".metadata.crc"})
    if foreign or (spark_like and not entries & {"metadata", "ctiflow-groups.json"}):
        # Spark writes ``metadata`` when a query starts, ctiflow its key groups before: a folder with
        # only ``state/`` (or ``offsets/``) in it is somebody else's, not a checkpoint to reset
        names = foreign or sorted(spark_like)
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        raise ConfigError(f"spark.checkpoint: {checkpoint} is not a ctiflow checkpoint (it holds {shown}"
                          f"{'' if foreign else ' but neither Spark metadata nor ctiflow key groups'}); "
                          "give a new or empty directory (ctiflow keeps a job's offsets and state there)")


def reset_uncommitted_checkpoint(checkpoint: CheckpointDir) -> bool:
    """A run killed before its first micro-batch committed can leave operator state but no
    committed batch; Spark 4 then refuses to plan batch 0 if it has to plan it again
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). None of that state was committed, so it goes;
    everything else stays: the offset log (Spark replays batch 0 over exactly the offsets it
    logged, from the starting offsets the source saved, so its output is the same and the sink
    skips what landed: the batch is up to :func:`replay_through`) and the key-group labels.

    Only a checkpoint ctiflow made is touched: one with its key-group labels
    (``ctiflow-groups.json``, written before Spark's first batch)."""
    if not checkpoint.exists(GROUPS) or not checkpoint.is_dir("state") or checkpoint.batches("commits"):
        return False
    checkpoint.delete("state")
    return True
