"""What ctiflow keeps beside Spark's checkpoint, in the checkpoint directory.

* ``ctiflow-groups.json``: the key groups' labels (:func:`group_labels`): they name the state.
* ``ctiflow-start-<source>.json``: the offsets a source's first micro-batch started from
  (:func:`start_file`): Spark asks for them again when it replays batch 0.
* ``ctiflow-sink/``: the sink's replay markers (:mod:`ctiflow.jobs.sink`).
* ``ctiflow-progress.jsonl``: per-batch counters (:func:`progress_path`, :func:`read_counters`).

Every file is written whole or not at all (:func:`write_atomically`).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import mmh3

from ctiflow.jobs.config import JobConfig
from ctiflow.jobs.counters import is_gauge, merge
from ctiflow.jobs.state.store import LAYOUTS, STATE_LAYOUT
from ctiflow.operators.errors import ConfigError


#: the layouts this version reads (:data:`ctiflow.jobs.state.store.LAYOUTS`); a checkpoint keeps the
#: layout it was started with
STATE_LAYOUTS_READ = tuple(LAYOUTS)


def check_key_groups(groups: int, checkpoint: Path) -> dict | None:
    """The key groups a checkpoint was written with (None: a new checkpoint); a different count,
    or an earlier state layout, is refused before Spark starts: each group's state is stored
    under its group, so a new count would silently lose or misplace state."""
    path = checkpoint / "ctiflow-groups.json"
    if not path.exists():
        if any((checkpoint / "commits").glob("[0-9]*")):
            raise ConfigError(f"the checkpoint {checkpoint} was written by an earlier ctiflow, which kept each key "
                              "group's state in one blob; this version keeps it in chunks of keys and cannot "
                              "read it: start from a new checkpoint (spark.checkpoint), or finish the old one with "
                              "the ctiflow version that wrote it")
        return None
    saved = json.loads(path.read_text())
    if saved.get("state_layout", 0) > STATE_LAYOUT:
        raise ConfigError(f"the checkpoint {checkpoint} was written by a newer ctiflow (state layout "
                          f"{saved['state_layout']}; this version writes {STATE_LAYOUT}): run that version, or "
                          "start from a new checkpoint (spark.checkpoint)")
    if saved.get("state_layout") not in STATE_LAYOUTS_READ:
        raise ConfigError(f"the checkpoint {checkpoint} was written by an earlier ctiflow, which kept each key group's "
                          "state in one blob; this version keeps it in chunks of keys and cannot read it: start "
                          "from a new checkpoint (spark.checkpoint), or finish the old one with the ctiflow version "
                          "that wrote it")
    if saved["key_groups"] != groups:
        raise ConfigError(f"spark.key_groups is {groups}, but the checkpoint {checkpoint} was written with "
                          f"{saved['key_groups']} key groups (each group's state is stored under its group; "
                          f"spark.key_groups defaults to spark.shuffle_partitions): set spark.key_groups to "
                          f"{saved['key_groups']}, or start from a new checkpoint (spark.checkpoint)")
    return saved


def group_labels(groups: int, partitions: int, checkpoint: Path | None = None) -> list[int]:
    """The value each key group carries into Spark's shuffle, chosen so the groups spread
    evenly over the stateful stage's partitions. Spark places a row by
    ``pmod(murmur3(value, seed 42), partitions)``; the plain numbers 0..7 land 3 and 5 on 2
    partitions, so one core would do 5/8 of the work. Label *g* is the next integer Spark puts
    in partition ``g mod partitions`` (Spark's hash is Murmur3 x86_32 with seed 42 over the
    int's 4 little-endian bytes; a test checks the placement against Spark's partitioner).
    Labels name the state, so they are kept with the checkpoint and reused on restart (Spark
    keeps a checkpoint's partition count too); a changed ``key_groups`` is refused."""
    path = checkpoint / "ctiflow-groups.json" if checkpoint else None
    saved = check_key_groups(groups, checkpoint) if checkpoint else None
    if saved is not None:
        return saved["labels"]
    labels = _spread_labels(groups, partitions)
    if path is not None:
        write_atomically(path, json.dumps({"key_groups": groups, "partitions": partitions, "labels": labels,
                                           "state_layout": STATE_LAYOUT}))
    return labels


def state_layout(checkpoint: Path) -> int:
    """The state layout of the checkpoint (after :func:`group_labels` has checked or created it):
    :data:`STATE_LAYOUT` for a new one, the one it was started with otherwise."""
    path = checkpoint / "ctiflow-groups.json"
    return json.loads(path.read_text()).get("state_layout", STATE_LAYOUT) if path.exists() else STATE_LAYOUT


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


def write_atomically(path: Path, text: str) -> None:
    """Written whole or not at all: a kill mid-write must not leave a file the restart cannot read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def start_file(cfg: JobConfig, src) -> Path:
    """Where a source keeps the offsets its first micro-batch starts from (see
    :meth:`ctiflow.jobs.source.reader.KafkaStreamReader.initialOffset`)."""
    return Path(cfg.checkpoint_dir) / f"ctiflow-start-{src.name}.json"


def progress_path(cfg: JobConfig) -> Path:
    """The job's per-batch counters (JSON lines), kept inside its checkpoint directory."""
    path = Path(cfg.checkpoint_dir) / "ctiflow-progress.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def read_counters(path: Path, batches: set[int] | None = None) -> dict:
    """The job's counters summed over the progress file's batches (``batches``: only those).
    A batch replayed after a crash has a line per attempt; the last one is the committed one."""
    last: dict[int, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if batches is None or rec["batch"] in batches:
                last[rec["batch"]] = rec
    totals: dict[str, int] = {}
    for batch in sorted(last):
        rec = {k: v for k, v in last[batch].items() if k not in ("batch", "time")}
        for gauge in [k for k in rec if is_gauge(k)]:
            totals[gauge] = rec.pop(gauge)  # the state after the latest batch, not a sum over batches
        merge(totals, rec)
    return totals


class CounterReader:
    """:func:`read_counters` of a growing progress file, reading only what was appended since the
    last call (a job calls it after every batch: re-reading days of lines each time would cost
    seconds a batch). A batch is replayed only while it is the newest (Spark commits a batch
    before it starts the next), so every batch but the newest is folded into running totals;
    a line still being written waits for its newline."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.settled: dict[str, int] = {}
        self.newest: dict | None = None
        self.gauges_of = -1  # the batch the settled gauges are from: the highest folded

    def _fold(self, rec: dict) -> None:
        batch = rec["batch"]
        rec = {k: v for k, v in rec.items() if k not in ("batch", "time")}
        for gauge in [k for k in rec if is_gauge(k)]:
            value = rec.pop(gauge)
            if batch >= self.gauges_of:
                self.settled[gauge] = value
        self.gauges_of = max(self.gauges_of, batch)
        merge(self.settled, rec)

    def __call__(self) -> dict:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            whole = data[:data.rfind(b"\n") + 1]
            self.offset += len(whole)
            for line in whole.splitlines():
                if not line.strip():
                    continue
                rec = json.loads(line)
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


def check_checkpoint_dir(checkpoint: Path) -> None:
    """Refuse, before Spark starts, a checkpoint directory that holds something neither Spark's
    checkpoint nor ctiflow put there: a mistyped ``spark.checkpoint`` must not make a job write
    into (or clean up) a user's folder."""
    if not checkpoint.exists():
        return
    if not checkpoint.is_dir():
        raise ConfigError(f"spark.checkpoint: {checkpoint} is a file, not a directory; give a new or empty directory")
    foreign = sorted(p.name for p in checkpoint.iterdir()
                     if p.name not in CHECKPOINT_ENTRIES and not p.name.startswith(("ctiflow-", ".ctiflow-")))
    entries = {p.name for p in checkpoint.iterdir()}
    spark_like = entries & (CHECKPOINT_ENTRIES - {"metadata", ".metadata.crc"})
    if foreign or (spark_like and not entries & {"metadata", "ctiflow-groups.json"}):
        # Spark writes ``metadata`` when a query starts, ctiflow its key groups before: a folder with
        # only ``state/`` (or ``offsets/``) in it is somebody else's, not a checkpoint to reset
        names = foreign or sorted(spark_like)
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        raise ConfigError(f"spark.checkpoint: {checkpoint} is not a ctiflow checkpoint (it holds {shown}"
                          f"{'' if foreign else ' but neither Spark metadata nor ctiflow key groups'}); give a "
                          "new or empty directory (ctiflow keeps a job's offsets and state there)")


def reset_uncommitted_checkpoint(checkpoint: Path) -> bool:
    """A run killed before its first micro-batch committed can leave operator state but no
    committed batch; Spark 4 then refuses to plan batch 0 if it has to plan it again
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). None of that state was committed, so it goes;
    everything else stays: the offset log (Spark replays batch 0 over exactly the offsets it
    logged, from the starting offsets the source saved, so its output is the same and the sink's
    replay markers skip what landed), the markers and the key-group labels.

    Only a checkpoint ctiflow made is touched: one with its key-group labels
    (``ctiflow-groups.json``, written before Spark's first batch)."""
    state = checkpoint / "state"
    if (not (checkpoint / "ctiflow-groups.json").is_file() or not state.is_dir()
            or any((checkpoint / "commits").glob("[0-9]*"))):
        return False
    shutil.rmtree(state)
    return True
