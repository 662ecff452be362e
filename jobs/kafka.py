"""Kafka clients (confluent-kafka) configured from one place: admin, producer, consumer.

``client_config`` is the pass-through of librdkafka settings from the job configuration
(``kafka.client``), so SASL/TLS work without code changes. tansu quirks handled here:
JoinGroup is slow (we ``assign()`` partitions instead of subscribing), and the reported high
watermark lags the last producer batch (see :func:`true_end_offset`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from jobs.config import SECRET_KEYS, check_topic_name  # noqa: F401 - re-exported: configuration facts
from jobs.serde import AvroDeserializer, registry_client
from operators.errors import StackError


def public_client(client: dict[str, str] | None) -> dict[str, str]:
    """``client`` without secrets: what may travel in Spark options and be printed."""
    return {k: v for k, v in (client or {}).items() if k not in SECRET_KEYS}


def redact(text: str, client: dict[str, str] | None) -> str:
    for k in SECRET_KEYS:
        v = (client or {}).get(k)
        if v:
            text = text.replace(v, "***")
    return text


def env_credentials() -> dict[str, str]:
    """SASL/SCRAM credentials from ``CTIFLOW_SASL_USERNAME`` / ``CTIFLOW_SASL_PASSWORD``: how
    executors' clients get them (``spark.executorEnv``, set from the job's config by
    :func:`jobs.pipeline.spark_session`, or the container's environment), never from a Spark
    option. The driver passes :meth:`jobs.config.Kafka.client_config` explicitly."""
    user, password = os.environ.get("CTIFLOW_SASL_USERNAME"), os.environ.get("CTIFLOW_SASL_PASSWORD")
    if not (user and password):
        return {}
    return {"security.protocol": os.environ.get("CTIFLOW_SECURITY_PROTOCOL", "SASL_PLAINTEXT"),
            "sasl.mechanism": os.environ.get("CTIFLOW_SASL_MECHANISM", "SCRAM-SHA-256"),
            "sasl.username": user, "sasl.password": password}


def base_config(bootstrap: str, client: dict[str, str] | None = None) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, **env_credentials(), **(client or {})}


def admin(bootstrap: str, client: dict[str, str] | None = None) -> AdminClient:
    return AdminClient(base_config(bootstrap, client))


def producer(bootstrap: str, client: dict[str, str] | None = None, **extra) -> Producer:
    """An idempotent, acks=all producer (result topics never lose or reorder a record on retry)."""
    conf = {"enable.idempotence": True, "acks": "all", "linger.ms": 20, "batch.num.messages": 10000,
            "compression.type": "lz4", **base_config(bootstrap, client), **extra}
    return Producer(conf)


def send(prod: Producer, topic: str, value: bytes, key: bytes | None = None, **kwargs) -> None:
    """``produce`` that waits for room when the local queue is full instead of failing."""
    while True:
        try:
            prod.produce(topic, value=value, key=key, **kwargs)
            return
        except BufferError:
            prod.poll(0.1)


def consumer(bootstrap: str, client: dict[str, str] | None = None, **extra) -> Consumer:
    conf = {"group.id": "ctiflow-reader", "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10, "session.timeout.ms": 6000,
            **base_config(bootstrap, client), **extra}
    return Consumer(conf)


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
    # Ask for all topics: a metadata request naming the topic would auto-create it on tansu.
    md = admin(bootstrap, client).list_topics(timeout=timeout)
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise StackError(f"topic {topic!r} does not exist on {bootstrap}; create it with "
                         f"`ctiflow topics create {topic}` (or all of a job's topics: "
                         "`ctiflow topics create --config JOB.yaml`)")
    return sorted(meta.partitions)


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
    client_ = admin(bootstrap, client)  # keep the handle alive until the futures resolve
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
    """The offset after the last record of a partition, probing past the reported high watermark.

    tansu reports HWM = base offset of the last producer batch + 1, hiding the tail of that
    batch. We fetch from max(HWM − 1, ``low_mark``) until end-of-partition and take the last
    offset seen + 1 (never less than ``low_mark``, so offsets do not go backwards). Without an
    end-of-partition event after 2 s of quiet we take what we saw — unless ``require_eof``,
    which waits up to ``timeout`` for it and then raises (an answer that may be short is worse
    than none there).
    """
    low, high = cons.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout, cached=False)
    start = max(high - 1, low_mark, low)
    end = max(high, low_mark)
    cons.assign([TopicPartition(topic, partition, start)])
    try:
        quiet_until = time.monotonic() + 2.0
        deadline = time.monotonic() + timeout
        while True:
            batch = cons.consume(num_messages=10000, timeout=POLL / 4)
            if not batch:
                if require_eof and time.monotonic() > deadline:
                    raise StackError(f"{topic}[{partition}]: no end-of-partition event within {timeout:.0f} s; "
                                     "is the broker up?")
                if not require_eof and time.monotonic() > quiet_until:
                    break  # nothing for 2 s and no end-of-partition event: take what we saw
                continue
            quiet_until = time.monotonic() + 2.0
            done = False
            for msg in batch:
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        done = True
                        continue
                    raise KafkaException(msg.error())
                end = max(end, msg.offset() + 1)
            if done:
                break
    finally:
        cons.unassign()
    return end


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
    (confluent-kafka ``Message`` objects when ``raw``, else :class:`Message`)."""
    if end <= start:
        return
    cons.assign([TopicPartition(topic, partition, start)])
    try:
        idle_since = time.monotonic()
        while True:
            msgs = cons.consume(num_messages=batch, timeout=POLL)
            out: list[Message] = []
            finished = False
            for msg in msgs:
                err = msg.error()
                if err:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                off = msg.offset()
                if off >= end:
                    finished = True
                    break
                if raw:
                    out.append(msg)
                else:
                    ts_type, ts = msg.timestamp()
                    out.append(Message(partition, off, msg.key(), msg.value(), ts if ts_type else None, msg.headers()))
                if off + 1 >= end:
                    finished = True
                    break
            if out:
                idle_since = time.monotonic()
                yield out
            elif not msgs:
                if time.monotonic() - idle_since > 60:
                    raise StackError(f"{topic}[{partition}]: no data for 60 s while reading offsets "
                                     f"{start}..{end}; is the broker up and the data still there?")
            if finished:
                return
    finally:
        cons.unassign()


def read_topic(bootstrap: str, topic: str, client: dict | None = None, max_records: int | None = None,
               timeout: float = 10.0, registry_url: str | None = None) -> list[dict]:
    """Every record of a topic (from the beginning) decoded to dicts (any ctiflow schema, either
    framing); an undecodable record comes back as ``{"_undecodable": reason, "_bytes": hex}``.
    Used by ``ctiflow consume``, the plots, the demo, the benchmarks and the tests."""
    decode = AvroDeserializer(None, registry=registry_client(registry_url) if registry_url else None)
    records = []
    cons = consumer(bootstrap, client)
    for part in topic_partitions(bootstrap, topic, client):
        end = true_end_offset(cons, topic, part, 0)
        for msgs in read_range(cons, topic, part, low_offset(cons, topic, part), end):
            for m in msgs:
                try:
                    rec = decode(m.value)
                except Exception as exc:  # noqa: BLE001 - shown, not hidden
                    rec = {"_undecodable": str(exc), "_bytes": (m.value or b"")[:64].hex()}
                records.append(rec)
                if max_records and len(records) >= max_records:
                    cons.close()
                    return records
    cons.close()
    return records
