"""Kafka clients (confluent-kafka) configured from one place: admin, producer, consumer.

``client_config`` is the pass-through of librdkafka settings from the job configuration
(``kafka.client``), so SASL/TLS work without code changes. Records go in through :func:`produce`
and come out through :func:`read_topic` (all of a topic) or :func:`follow_topic` (as they
arrive). tansu quirks handled here:
JoinGroup is slow (we ``assign()`` partitions instead of subscribing), and the reported high
watermark lags the last producer batch (see :func:`true_end_offset`).
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ctiflow.jobs.core.secrets import secret_keys
from ctiflow.jobs.avro.serde import AvroDeserializer, SchemaStore, StoredSchema, registry_client
from ctiflow.jobs.datapath.own_topics import ForeignRecord, schema_entry, skip
from ctiflow.operators.errors import CtiflowError, StackError


def public_client(client: dict[str, str] | None) -> dict[str, str]:
    """``client`` without secrets: what may travel in Spark options and be printed."""
    secrets = secret_keys()
    return {k: v for k, v in (client or {}).items() if k not in secrets}


def redact(text: str, client: dict[str, str] | None) -> str:
    for k in secret_keys():
        v = (client or {}).get(k)
        if v:
            text = text.replace(v, "***")
    return text


#: Secret librdkafka settings other than SASL's (JSON), for executors' clients (see :func:`env_credentials`).
CLIENT_SECRETS_ENV = "CTIFLOW_CLIENT_SECRETS"


def env_credentials() -> dict[str, str]:
    """SASL/SCRAM credentials from ``CTIFLOW_SASL_USERNAME`` / ``CTIFLOW_SASL_PASSWORD``: how
    executors' clients get them (``spark.executorEnv``, set from the job's config by
    :func:`ctiflow.jobs.driver.pipeline.spark_session`, or the container's environment), never from a Spark
    option. The driver passes :meth:`ctiflow.jobs.driver.config.Kafka.client_config` explicitly."""
    secrets = json.loads(os.environ.get(CLIENT_SECRETS_ENV) or "{}")  # ssl.key.password etc.
    user, password = os.environ.get("CTIFLOW_SASL_USERNAME"), os.environ.get("CTIFLOW_SASL_PASSWORD")
    if not (user and password):
        return secrets
    return {"security.protocol": os.environ.get("CTIFLOW_SECURITY_PROTOCOL", "SASL_PLAINTEXT"),
            "sasl.mechanism": os.environ.get("CTIFLOW_SASL_MECHANISM", "SCRAM-SHA-256"),
            "sasl.username": user, "sasl.password": password, **secrets}


def base_config(bootstrap: str, client: dict[str, str] | None = None) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, **env_credentials(), **(client or {})}


#: librdkafka's log lines go through Python logging (warnings and errors reach stderr, its info
#: chatter — e.g. "Purging 1 unserved events" when a client closes — does not).
LIBRDKAFKA_LOG = logging.getLogger("ctiflow.librdkafka")


def admin(bootstrap: str, client: dict[str, str] | None = None) -> AdminClient:
    """The process's admin client for these settings, made once and kept: a new one connects
    before its first answer (≈ 50 ms to the embedded broker, against well under 1 ms for a metadata
    request on a connected one), and librdkafka reconnects a kept one after a broker restart.
    Keyed by process too: a librdkafka client does not survive a fork."""
    conf = base_config(bootstrap, client)
    key = (os.getpid(), tuple(sorted(conf.items())))
    kept = _ADMINS.get(key)
    if kept is None:
        kept = _ADMINS[key] = AdminClient(conf, logger=LIBRDKAFKA_LOG)
    return kept


_ADMINS: dict[tuple, AdminClient] = {}


def producer(bootstrap: str, client: dict[str, str] | None = None, **extra) -> Producer:
    """An idempotent, acks=all producer (result topics never lose or reorder a record on retry)."""
    conf = {"enable.idempotence": True, "acks": "all", "linger.ms": 20, "batch.num.messages": 10000,
            "compression.type": "lz4", **base_config(bootstrap, client), **extra}
    return Producer(conf, logger=LIBRDKAFKA_LOG)


def send(prod: Producer, topic: str, value: bytes, key: bytes | None = None, **kwargs) -> None:
    """``produce`` that waits for room when the local queue is full instead of failing."""
    while True:
        try:
            prod.produce(topic, value=value, key=key, **kwargs)
            return
        except BufferError:
            prod.poll(0.1)


#: :func:`produce` serves the producer's events and reports progress every this many records.
PROGRESS_EVERY = 5000


@dataclass(frozen=True)
class Produced:
    """What :func:`produce` did with its records."""

    sent: int  # given to the producer
    rejected: int  # refused before sending (not JSON, not valid for the serializer, or too large)
    unflushed: int  # of the sent, still queued when the flush timed out: not known to be written


def produce(bootstrap: str, topic: str, records: Iterable[Mapping[str, Any] | str | bytes],
            serializer: Callable[[Mapping[str, Any]], bytes], key_field: str | None = None,
            client: dict[str, str] | None = None, *,
            on_rejected: Callable[[int, Exception], None] | None = None,
            on_progress: Callable[[int], None] | None = None, flush_timeout: float = 60.0,
            partition_of: Callable[[int, Any], int] | None = None,
            config: Mapping[str, Any] | None = None) -> Produced:
    """Write ``records`` to ``topic`` in their order with one idempotent producer, then flush.

    A record is a dict, its JSON text, or a value already encoded. A dict (or JSON text) is
    encoded by ``serializer`` and keyed by its ``key_field`` (unkeyed when that is missing or
    null); bytes are sent as they are, unkeyed (e.g. malformed records for a test). A blank text
    is skipped, so the lines of a JSON-lines file can be passed as they are. A record that is not
    JSON or that ``serializer`` refuses (``ValueError``, :class:`~ctiflow.operators.errors.CtiflowError`)
    is passed to ``on_rejected(position, error)`` (1-based position in ``records``: the line
    number of a file) and skipped, and so is one the producer refuses as larger than a message
    may be (``message.max.bytes``); without ``on_rejected`` the error is raised.
    ``on_progress(sent)`` is called every :data:`PROGRESS_EVERY` records sent.
    ``partition_of(index, record)`` (index from 0) picks a record's partition (default: by key);
    ``config``: producer settings beside the defaults (e.g. ``linger.ms``). ``records`` may be a
    generator that paces itself (a steady load): each record is sent as it comes.
    """
    prod = producer(bootstrap, client, **(config or {}))
    sent = rejected = 0
    for position, record in enumerate(records, 1):
        key = None
        if isinstance(record, bytes):
            value = record
        else:
            if isinstance(record, str) and not record.strip():
                continue
            try:
                record = json.loads(record) if isinstance(record, str) else record
                value = serializer(record)
            except (ValueError, CtiflowError) as exc:
                if on_rejected is None:
                    raise
                rejected += 1
                on_rejected(position, exc)
                continue
            if key_field and record.get(key_field) is not None:
                key = str(record[key_field]).encode()
        try:
            if partition_of is None:
                send(prod, topic, value, key)
            else:
                send(prod, topic, value, key, partition=partition_of(position - 1, record))
        except KafkaException as exc:  # refused by the client before sending: this record only
            if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE or on_rejected is None:
                raise
            rejected += 1
            limit = (client or {}).get("message.max.bytes", 1_000_000)  # librdkafka's default
            on_rejected(position, CtiflowError(f"{len(value):,} bytes encoded, more than a message may have "
                                               f"(message.max.bytes: {limit}; set it in kafka.client)"))
            continue
        sent += 1
        if sent % PROGRESS_EVERY == 0:
            prod.poll(0)
            if on_progress is not None:
                on_progress(sent)
    return Produced(sent, rejected, prod.flush(flush_timeout))


#: Consumer settings chosen by measurement (``ctiflow bench source``, docs/performance.md#source-and-sink).
#: ``fetch.queue.backoff.ms``: a broker may answer one fetch with more than librdkafka's local
#: queue holds (tansu: ≈ 150k records, 12 MB); librdkafka then waits this long before fetching
#: again — 1,000 ms by default, a stall after every such fetch (reading 1M records: 4.3 µs a
#: message of wall time for 0.9 µs of CPU; with 10 ms: 0.84 µs). Larger queues changed nothing
#: measurable. ``fetch.max.bytes``: what a partition's fetch returns at most on a Kafka broker
#: (``max.partition.fetch.bytes``, 1 MiB), which tansu ignores: with librdkafka's 50 MB it
#: answered a fetch with every record after the offset, so the first fetch far from a partition's
#: end cost 65–80 ms instead of 10–25 (docs/changelog.md, "The range's first fetch").
CONSUMER_DEFAULTS = {"group.id": "ctiflow-reader", "enable.auto.commit": False, "enable.partition.eof": True,
                     "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10, "session.timeout.ms": 6000,
                     "fetch.queue.backoff.ms": 10, "fetch.max.bytes": 1 << 20}


def consumer(bootstrap: str, client: dict[str, str] | None = None, **extra) -> Consumer:
    """A consumer with :data:`CONSUMER_DEFAULTS`; ``client`` (``kafka.client``) overrides them
    (a ``message.max.bytes`` above the default ``fetch.max.bytes`` raises that to it, as
    librdkafka requires)."""
    conf = {**CONSUMER_DEFAULTS, **base_config(bootstrap, client), **extra}
    if "fetch.max.bytes" not in {**(client or {}), **extra}:
        conf["fetch.max.bytes"] = max(int(conf["fetch.max.bytes"]), int(conf.get("message.max.bytes", 0)))
    return Consumer(conf, logger=LIBRDKAFKA_LOG)


def wait_for_broker(bootstrap: str, client: dict[str, str] | None = None, timeout: float = 15.0) -> None:
    """Fail with a clear error if no broker answers within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin(bootstrap, client).list_topics(timeout=min(3.0, max(0.5, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            last = exc
            time.sleep(0.3)
    raise StackError(f"no Kafka broker answered at {bootstrap} within {timeout:.0f} s ({last}); "
                     "start the embedded one with `ctiflow up` or fix kafka.bootstrap_servers")


def topic_partitions(bootstrap: str, topic: str, client: dict[str, str] | None = None,
                     timeout: float = 10.0) -> list[int]:
    return partitions_of(bootstrap, [topic], client, timeout)[topic]


def partitions_of(bootstrap: str, topics, client: dict[str, str] | None = None,
                  timeout: float = 10.0) -> dict[str, list[int]]:
    """Each topic's partitions, from one metadata request; a missing topic is a StackError."""
    # Ask for all topics: a metadata request naming the topic would auto-create it on tansu.
    md = admin(bootstrap, client).list_topics(timeout=timeout)
    out = {}
    for topic in topics:
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise StackError(f"topic {topic!r} does not exist on {bootstrap}; create it with "
                             f"`ctiflow topics create {topic}` (or all of a job's topics: "
                             "`ctiflow topics create --config JOB.yaml`)")
        out[topic] = sorted(meta.partitions)
    return out


def list_topics(bootstrap: str, client: dict[str, str] | None = None) -> dict[str, int]:
    md = admin(bootstrap, client).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in md.topics.items() if not name.startswith("__")}


def create_topics(bootstrap: str, topics: dict[str, int], client: dict[str, str] | None = None) -> list[str]:
    """Create missing topics (name → partitions). Returns the names created. tansu cannot add
    partitions later, so the count must be right the first time."""
    existing = list_topics(bootstrap, client)
    wanted = [NewTopic(name, num_partitions=parts, replication_factor=1)
              for name, parts in topics.items() if name not in existing]
    if not wanted:
        return []
    client_ = admin(bootstrap, client)
    futures = client_.create_topics(wanted, operation_timeout=10)
    created = []
    for name, fut in futures.items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise StackError(f"could not create topic {name!r}: {exc}") from exc
    return created


def delete_topics(bootstrap: str, names: Iterable[str], client: dict[str, str] | None = None) -> None:
    names = list(names)
    if not names:
        return
    client_ = admin(bootstrap, client)
    for fut in client_.delete_topics(names, operation_timeout=10).values():
        try:
            fut.result()
        except KafkaException:
            pass  # already gone: deleting is idempotent for our callers


def low_offset(cons: Consumer, topic: str, partition: int, timeout: float = 10.0) -> int:
    """The first offset still held for ``topic[partition]``."""
    return cons.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)[0]


#: ``consume(n, timeout)`` waits for all ``n`` messages until the timeout, even past the end of
#: the partition (measured: 200 ms for the last 1,000 of a range with timeout 2 s, 3 ms with
#: ``n = 1``). Short polls in a loop return what has arrived instead.
POLL = 0.02


def true_end_offset(cons: Consumer, topic: str, partition: int, low_mark: int, timeout: float = 10.0,
                    require_eof: bool = False) -> int:
    """The offset after the last record of a partition (:func:`true_end_offsets` for one)."""
    return true_end_offsets(cons, topic, {partition: low_mark}, timeout, require_eof)[partition]


def true_end_offsets(cons: Consumer, topic: str, low_marks: dict[int, int], timeout: float = 10.0,
                     require_eof: bool = False) -> dict[int, int]:
    """The offset after the last record of each partition in ``low_marks`` (partition → an
    offset the answer is never below), probing past the reported high watermark.

    tansu reports HWM = base offset of the last producer batch + 1, hiding the tail of that
    batch. We fetch from max(HWM − 1, low mark) until end-of-partition and take the last offset
    seen + 1 (never less than the low mark, so offsets do not go backwards). All partitions are
    probed in one assignment, so a call costs about one fetch round trip however many partitions
    there are (the driver asks every micro-batch). Without an end-of-partition event after 2 s of
    quiet we take what we saw — unless ``require_eof``, which waits up to ``timeout`` for it and
    then raises (an answer that may be short is worse than none there).
    """
    ends: dict[int, int] = {}
    assignment = []
    for partition, low_mark in low_marks.items():
        low, high = cons.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout,
                                               cached=False)
        assignment.append(TopicPartition(topic, partition, max(high - 1, low_mark, low)))
        ends[partition] = max(high, low_mark)
    if not assignment:
        return ends
    cons.assign(assignment)
    try:
        open_ = set(ends)
        quiet_until = time.monotonic() + 2.0
        deadline = time.monotonic() + timeout
        while open_:
            batch = cons.consume(num_messages=10000, timeout=POLL / 4)
            if not batch:
                if require_eof and time.monotonic() > deadline:
                    raise StackError(f"{topic}{sorted(open_)}: no end-of-partition event within "
                                     f"{timeout:.0f} s; is the broker up?")
                if not require_eof and time.monotonic() > quiet_until:
                    break  # nothing for 2 s and no end-of-partition event: take what we saw
                continue
            quiet_until = time.monotonic() + 2.0
            for msg in batch:
                partition = msg.partition()
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        open_.discard(partition)
                        continue
                    raise KafkaException(msg.error())
                if partition in ends:
                    ends[partition] = max(ends[partition], msg.offset() + 1)
    finally:
        cons.unassign()
    return ends


def offsets_for_times(cons: Consumer, topic: str, partitions: Iterable[int], ms: int,
                      time_of: Callable[[bytes | None, int], int | None] | None = None,
                      timeout: float = 10.0, seen: dict | None = None) -> dict[int, int]:
    """Each partition's first offset whose record's time is ≥ ``ms`` (its end offset when none is):
    Kafka's ListOffsets by timestamp, checked against the records on each side of its answer, and
    searched for over the records where the check fails — one fetch a step and partition
    (:func:`first_records_at`): interpolation between the times seen (the first step between the partition's
    first and last records; a bisection after two steps in a row that do not halve the range), then the last
    :data:`SCAN_RECORDS` read whole.

    ``time_of(value, timestamp)``: a record's time (default: its Kafka timestamp; None: unknown,
    taken as not before ``ms``, so an unreadable record moves the answer earlier, never later). With
    a record field as the time (event time), an answer from producers' clocks is corrected; tansu
    answers the first offset for every timestamp. Times out of order within a partition make the
    answer approximate, as Kafka's own is: callers start earlier by their disorder bound.
    ``seen``: the records looked at — ``(partition, offset)`` → the first record at or after it, as
    :func:`first_records_at` gives it —, shared by the calls for one topic (a later search starts
    between the records an earlier one saw: each fetch is a round trip)."""
    wanted = sorted(set(partitions))
    seen = {} if seen is None else seen
    answers = {tp.partition: tp.offset for tp in
               cons.offsets_for_times([TopicPartition(topic, p, ms) for p in wanted], timeout=timeout)}
    lows = {p: low_offset(cons, topic, p, timeout) for p in wanted}
    ends = true_end_offsets(cons, topic, lows, timeout)

    def look(offsets: Mapping[int, int]) -> dict:
        missing = {p: o for p, o in offsets.items() if (p, o) not in seen}
        got = first_records_at(cons, topic, missing, ends, timeout) if missing else {}
        seen.update({(p, o): got.get(p) for p, o in missing.items()})
        return {p: seen[(p, o)] for p, o in offsets.items()}

    def before(got) -> bool:  # the first record at or after an offset is older than ms
        t = _time(got, time_of)
        return t is not None and t < ms

    at = {p: max(answers[p], lows[p]) if 0 <= answers.get(p, -1) <= ends[p] else ends[p]
          for p in wanted}
    here = look({p: at[p] for p in wanted if at[p] < ends[p]})
    earlier = look({p: at[p] - 1 for p in wanted if at[p] > lows[p]})
    right = {p for p in wanted if (at[p] == ends[p] or not before(here.get(p)))
             and (at[p] == lows[p] or before(earlier.get(p)))}
    # where the answer is wrong, the first offset not before ms lies in [lo, hi]: narrowed by every
    # record seen (the partition's last one among them)
    search = {p: [lows[p], ends[p], None, None]  # lo, hi, the times seen at lo − 1 and at hi
              for p in wanted if p not in right}
    look({p: ends[p] - 1 for p in search if ends[p] > lows[p]})
    for (p, offset), got in seen.items():
        if p in search and got is not None:
            lo, hi, t_lo, t_hi = search[p]
            t = _time(got, time_of)
            if before(got) and lo <= got[0] + 1 <= hi:
                search[p] = [got[0] + 1, hi, t, t_hi]
            elif not before(got) and lo <= offset < hi:
                search[p] = [lo, offset, t_lo, t]
    slow = dict.fromkeys(search, 0)  # steps in a row that did not halve the range
    while mids := {p: _guess(lo, hi, t_lo, t_hi, ms, slow[p] >= 2)
                   for p, (lo, hi, t_lo, t_hi) in search.items() if hi - lo > SCAN_RECORDS}:
        got = look(mids)
        for p, mid in mids.items():
            lo, hi, t_lo, t_hi = search[p]
            t = _time(got.get(p), time_of)
            search[p] = [mid + 1, hi, t, t_hi] if before(got.get(p)) else [lo, mid, t_lo, t]
            slow[p] = slow[p] + 1 if search[p][1] - search[p][0] > (hi - lo) // 2 else 0
    for p, (lo, hi, _, _) in search.items():
        at[p] = hi
        with closing(read_range(cons, topic, p, lo, hi)) as ranges:
            at[p] = next((m.offset for msgs in ranges for m in msgs
                          if not before((m.offset, m.value, m.timestamp))), hi)
    return at


#: :func:`offsets_for_times` reads a range this short whole rather than narrowing it further (one
#: fetch).
SCAN_RECORDS = 4096


def _time(got, time_of) -> int | None:
    if got is None:
        return None
    return got[2] if time_of is None else time_of(got[1], got[2])


def _guess(lo: int, hi: int, t_lo: int | None, t_hi: int | None, ms: int, halve: bool) -> int:
    """The next offset to look at in [lo, hi): where ``ms`` falls between the times seen at the
    range's ends, or the middle (``halve``, or a time not known)."""
    if halve or t_lo is None or t_hi is None or t_hi <= t_lo:
        return (lo + hi) // 2
    return min(max(lo + (ms - t_lo) * (hi - lo) // (t_hi - t_lo), lo), hi - 1)


def first_records_at(cons: Consumer, topic: str, offsets: Mapping[int, int], ends: Mapping[int, int],
                     timeout: float = 10.0) -> dict[int, tuple[int, bytes | None, int] | None]:
    """Per partition, ``(offset, value, timestamp)`` of the first record of ``topic[partition]`` at or
    after ``offsets[partition]`` and before ``ends[partition]`` (None: none; an offset a compaction or a
    transaction marker left empty is skipped as Kafka skips it). One partition at a time: on tansu a
    fetch assigned several partitions far from their ends costs many times what fetching them one by
    one does (measured: docs/changelog.md); on Kafka each is one short round trip."""
    return {p: first_record_at(cons, topic, p, o, ends[p], timeout) for p, o in offsets.items()}


def first_record_at(cons: Consumer, topic: str, partition: int, offset: int, end: int,
                    timeout: float = 10.0) -> tuple[int, bytes | None, int] | None:
    """:func:`first_records_at` for one partition."""
    if offset >= end:
        return None
    cons.assign([TopicPartition(topic, partition, offset)])
    try:
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise StackError(f"{topic}[{partition}]: no record at offset {offset} within "
                                 f"{timeout:.0f} s; is the broker up?")
            for msg in cons.consume(num_messages=1, timeout=POLL):
                if msg.partition() != partition:
                    continue
                if msg.error() is None:
                    return (msg.offset(), msg.value(), msg.timestamp()[1]) if msg.offset() < end else None
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return None
                raise KafkaException(msg.error())
    finally:
        cons.unassign()


@dataclass(frozen=True)
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None
    headers: tuple | None = None


def read_range(cons: Consumer, topic: str, partition: int, start: int, end: int,
               batch: int = 10000, raw: bool = False) -> Iterator[list]:
    """Every record of ``topic[partition]`` with start ≤ offset < end, in lists of ≤ ``batch``
    (confluent-kafka ``Message`` objects when ``raw``, else :class:`Message`).

    Each ``consume`` asks for no more than the range still needs: it returns as soon as that many
    have arrived instead of waiting out its timeout for messages past the range. A fetch costs
    one Python step per message (the error check, a comprehension: ≈ 13 ns, where
    ``map(methodcaller(...))`` took 52 ns on CPython 3.11); offsets are read at the fetch's ends
    only, unless the range ends inside it."""
    if end <= start:
        return
    cons.assign([TopicPartition(topic, partition, start)])
    try:
        idle_since = time.monotonic()
        expected = start  # the next offset wanted
        while True:
            msgs = cons.consume(num_messages=max(1, min(batch, end - expected)), timeout=POLL)
            errors = [m.error() for m in msgs]
            if errors.count(None) != len(errors):  # end-of-partition events (or a failure) among them
                for err in errors:
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                msgs = [m for m, err in zip(msgs, errors) if err is None]
            cut = len(msgs)
            if msgs and msgs[-1].offset() >= end:  # one partition: offsets ascend
                cut = bisect.bisect_left([m.offset() for m in msgs], end)
            out = msgs if cut == len(msgs) else msgs[:cut]
            if out:
                idle_since = time.monotonic()
                expected = out[-1].offset() + 1
                if raw:
                    yield out
                else:
                    yield [Message(partition, m.offset(), m.key(), m.value(), *_timestamp(m), m.headers())
                           for m in out]
            elif not msgs:
                if time.monotonic() - idle_since > 60:
                    raise StackError(f"{topic}[{partition}]: no data for 60 s while reading offsets "
                                     f"{start}..{end}; is the broker up and the data still there?")
            if cut < len(msgs) or expected >= end:
                return
    finally:
        cons.unassign()


def message_offsets(msgs: list) -> np.ndarray:
    """The offsets of one partition's messages (ascending, as :func:`read_range` yields them):
    a range when they are consecutive (the usual case: no Python step per message), else read
    one by one (a compacted topic, or transaction markers between them)."""
    first, n = msgs[0].offset() if msgs else 0, len(msgs)
    if n and msgs[-1].offset() - first == n - 1:
        return np.arange(first, first + n, dtype=np.int64)
    return np.fromiter([m.offset() for m in msgs], np.int64, n)


def _timestamp(msg) -> tuple[int | None]:
    ts_type, ts = msg.timestamp()
    return (ts if ts_type else None,)


def holds_records(bootstrap: str, topic: str, client: dict | None = None) -> bool:
    """Whether any partition of ``topic`` holds a record now (its true end above its low mark)."""
    cons = consumer(bootstrap, client)
    try:
        for part in topic_partitions(bootstrap, topic, client):
            low = low_offset(cons, topic, part)
            if true_end_offset(cons, topic, part, low) > low:
                return True
        return False
    finally:
        cons.close()


def read_topic(bootstrap: str, topic: str, client: dict | None = None, max_records: int | None = None,
               timeout: float = 10.0, registry_url: str | None = None,
               registry_config: dict[str, str] | None = None, store: SchemaStore | None = None) -> list[dict]:
    """Every record of a topic (from the beginning; the first ``max_records``) decoded to dicts as
    :func:`iter_topic` decodes them, its partitions read at once (:func:`topic_values`). Used by
    the plots, the demo, ``rules test``, the benchmarks and the tests."""
    decode = topic_decoder(bootstrap, topic, client, registry_url, registry_config, store)
    return [decode(v) for v in topic_values(bootstrap, topic, client, max_records)]


def topic_values(bootstrap: str, topic: str, client: dict | None = None,
                 max_records: int | None = None) -> list[bytes | None]:
    """A topic's record values as they are now (the first ``max_records``), partition by partition
    from the beginning. The partitions are read at once, a consumer each: finding a partition's
    ends and its first fetch are round trips, which one consumer would make one after another."""
    from concurrent.futures import ThreadPoolExecutor

    def values(part: int) -> list[bytes | None]:
        out: list[bytes | None] = []
        with closing(consumer(bootstrap, client)) as cons, \
                closing(partition_values(cons, topic, part)) as got:
            for msgs in got:
                out += msgs
                if max_records and len(out) >= max_records:
                    break
        return out

    parts = topic_partitions(bootstrap, topic, client)
    with ThreadPoolExecutor(max(1, min(8, len(parts)))) as pool:
        got = [v for part in pool.map(values, parts) for v in part]
    return got[:max_records] if max_records else got


def iter_topic(bootstrap: str, topic: str, client: dict | None = None, max_records: int | None = None,
               registry_url: str | None = None, registry_config: dict[str, str] | None = None,
               store: SchemaStore | None = None) -> Iterator[dict]:
    """A topic's records as they are now, partition by partition from the beginning, decoded to
    dicts (any ctiflow schema, either framing) one range at a time (a large topic is never held
    in memory); an undecodable record comes back as ``{"_undecodable": reason, "_bytes": hex}``.
    Used by ``ctiflow consume``. The consumer is closed when the iteration ends or is abandoned."""
    decode = topic_decoder(bootstrap, topic, client, registry_url, registry_config, store)
    return map(decode, iter_values(bootstrap, topic, client, max_records))


def topic_decoder(bootstrap: str, topic: str, client: dict | None = None, registry_url: str | None = None,
                  registry_config: dict[str, str] | None = None,
                  store: SchemaStore | None = None) -> Callable[[bytes | None], dict]:
    """A record value of ``topic`` → dict (any ctiflow schema, either framing); one that does not
    decode → ``{"_undecodable": reason, "_bytes": hex}`` (shown, not hidden)."""
    decode = AvroDeserializer(None, store=store,
                              registry=(registry_client(registry_url, registry_config) if registry_url
                                        else None),
                              subject=f"{topic}-value", lookup=SchemaTopic(bootstrap, client))

    def decoded(value: bytes | None) -> dict:
        try:
            return decode(value)
        except Exception as exc:  # noqa: BLE001 - shown, not hidden
            return {"_undecodable": str(exc), "_bytes": (value or b"")[:64].hex()}

    return decoded


def iter_values(bootstrap: str, topic: str, client: dict | None = None,
                max_records: int | None = None) -> Iterator[bytes | None]:
    """A topic's record values as they are now, partition by partition from the beginning, one
    range at a time; the consumer is closed when the iteration ends or is abandoned."""
    n = 0
    cons = consumer(bootstrap, client)
    try:
        for part in topic_partitions(bootstrap, topic, client):
            # closed before the consumer: a range left early unassigns its partition first
            with closing(partition_values(cons, topic, part)) as got:
                for msgs in got:
                    for value in msgs:
                        yield value
                        n += 1
                        if max_records and n >= max_records:
                            return
    finally:
        cons.close()


def partition_values(cons: Consumer, topic: str, part: int) -> Iterator[list[bytes | None]]:
    """``topic[part]``'s record values as they are now, from its first offset to its true end, in
    lists of a fetch (:func:`read_range`); the partition is unassigned when this ends or is closed."""
    low, end = low_offset(cons, topic, part), true_end_offset(cons, topic, part, 0)
    with closing(read_range(cons, topic, part, low, end, raw=True)) as ranges:
        for msgs in ranges:
            yield [m.value() for m in msgs]


def follow_topic(bootstrap: str, topic: str, client: dict | None = None, *, from_beginning: bool = True,
                 max_records: int | None = None, registry_url: str | None = None,
                 registry_config: dict[str, str] | None = None,
                 store: SchemaStore | None = None) -> Iterator[dict]:
    """A topic's records decoded as they arrive (any ctiflow schema, either framing), from the
    beginning or only those written from now on, until ``max_records`` or for ever. A record
    that does not decode comes back as ``{"_undecodable": reason, "_bytes": hex}`` (as from
    :func:`iter_topic`); an error the consumer reports is a StackError. The consumer is closed
    when the iteration ends, fails or is interrupted. Used by ``ctiflow consume --follow``."""
    decode = topic_decoder(bootstrap, topic, client, registry_url, registry_config, store)
    parts = topic_partitions(bootstrap, topic, client)
    cons = consumer(bootstrap, client)
    try:
        start = {p: (0 if from_beginning else true_end_offset(cons, topic, p, 0)) for p in parts}
        cons.assign([TopicPartition(topic, p, o) for p, o in start.items()])
        n = 0
        while max_records is None or n < max_records:
            msg = cons.poll(1.0)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                continue
            if msg.error():
                raise StackError(f"{topic}[{msg.partition()}]: {msg.error().str()}")
            yield decode(msg.value())
            n += 1
    finally:
        cons.close()


# -- the schemas topic ----------------------------------------------------------------------------
# Single-object encoding names a record's writer schema by its 64-bit fingerprint, and a reader
# that does not hold the schema cannot decode the record. The built-in schemas ship with ctiflow;
# a job derives others from its input (typed match records, MATCH_RECOGNIZE rows). Before Spark
# starts, the job publishes each to SCHEMAS_TOPIC, a compacted topic keyed by fingerprint — as
# Confluent's Schema Registry keeps its ``_schemas`` topic — and ``ctiflow consume``, ``plot`` and
# read_topic (the Python API) look a fingerprint up there when they do not know it (SchemaTopic).
# With a Schema Registry the records carry registry ids instead (``ctiflow schemas register``).

#: The topic (one partition, ``cleanup.policy=compact``): key = the schema's fingerprint (8 bytes,
#: as on the wire), value = ``{"name": …, "schema": …}`` as JSON.
SCHEMAS_TOPIC = "_ctiflow_schemas"


def ensure_schemas_topic(bootstrap: str, client: dict[str, str] | None = None) -> None:
    """:data:`SCHEMAS_TOPIC`, created compacted with one partition when it does not exist."""
    if SCHEMAS_TOPIC in list_topics(bootstrap, client):
        return
    held = admin(bootstrap, client)
    futures = held.create_topics([NewTopic(SCHEMAS_TOPIC, 1, 1, config={"cleanup.policy": "compact"})])
    for future in futures.values():
        try:
            future.result(30)
        except Exception as exc:  # noqa: BLE001 - a concurrent job created it: fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                raise


def publish_schemas(bootstrap: str, schemas: Mapping[str, str], client: dict[str, str] | None = None) -> int:
    """Each schema (name → Avro JSON) onto :data:`SCHEMAS_TOPIC` under its fingerprint; → how many.
    Publishing a schema again changes nothing a reader sees (same key, same value), so a retry's
    duplicate is harmless and the producer is not an idempotent one: its set-up cost every job's
    start 0.5–1.0 s on the embedded broker (docs/changelog.md, "The range's first fetch")."""
    if not schemas:
        return 0
    ensure_schemas_topic(bootstrap, client)
    prod = producer(bootstrap, client, **{"enable.idempotence": False})
    for name, text in schemas.items():
        fp = StoredSchema.of(name, text).fingerprint
        send(prod, SCHEMAS_TOPIC, json.dumps({"name": name, "schema": text}).encode(), key=fp)
    remaining = prod.flush(30)
    if remaining:
        raise OSError(f"{remaining} schema(s) not acknowledged by the broker within 30 s ({SCHEMAS_TOPIC})")
    return len(schemas)


class SchemaTopic:
    """``fingerprint → (name, schema JSON) | None`` from :data:`SCHEMAS_TOPIC`, read whole on a miss (at
    most once every ``every`` seconds: a job publishes before it writes, so a miss right after
    a read is a schema nobody published). An entry that is not one
    (:func:`ctiflow.jobs.datapath.own_topics.schema_entry`: not JSON, another shape, a schema whose
    fingerprint is not its key) is skipped with a warning
    naming its offset; the first good entry of a fingerprint stands."""

    def __init__(self, bootstrap: str, client: dict[str, str] | None = None, every: float = 5.0) -> None:
        self.bootstrap, self.client, self.every = bootstrap, client, every
        self.known: dict[bytes, tuple[str, str]] = {}
        self._entries: dict[bytes, bytes] = {}  # the value of each known entry, as read
        self._read_at: float | None = None

    def __call__(self, fingerprint: bytes) -> tuple[str, str] | None:
        if fingerprint not in self.known and (self._read_at is None
                                              or time.monotonic() - self._read_at > self.every):
            self._read()
        return self.known.get(fingerprint)

    def _read(self) -> None:
        self._read_at = time.monotonic()
        if SCHEMAS_TOPIC not in list_topics(self.bootstrap, self.client):
            return
        cons = consumer(self.bootstrap, self.client)
        try:
            end = true_end_offset(cons, SCHEMAS_TOPIC, 0, 0)
            with closing(read_range(cons, SCHEMAS_TOPIC, 0, low_offset(cons, SCHEMAS_TOPIC, 0),
                                    end)) as ranges:
                for msgs in ranges:
                    for m in msgs:
                        if m.key in self._entries and self._entries[m.key] == m.value:
                            continue  # read before (the topic is read whole again on a miss)
                        try:
                            stored = schema_entry(m.key, m.value)
                        except ForeignRecord as why:
                            skip(SCHEMAS_TOPIC, 0, m.offset, why)
                            continue
                        if stored.fingerprint not in self.known:  # an earlier good entry stands
                            self.known[stored.fingerprint] = (stored.name, stored.text)
                            self._entries[stored.fingerprint] = m.value
        finally:
            cons.close()
