"""The topics ctiflow writes for itself and reads back, what their records are, and what a
reader does with a record ctiflow did not write and with a topic that is gone.

| topic (partitions) | written by | read by | key | value (JSON object) |
| --- | --- | --- | --- | --- |
| ``<job>.ctiflow-progress`` (1) | the sink's ``commit``, once per attempt of a micro-batch | :class:`ctiflow.jobs.driver.checkpoint.ProgressLog` (counters, ``ctiflow status``) | the batch id | ``batch`` (int), ``time`` (number), ``query`` (text), every other field a counter (int) |
| ``<job>.ctiflow-markers`` (a partition per task) | a sink task, before it writes | :func:`ctiflow.jobs.datapath.sink.began` | the task id | ``query`` (text), ``batch`` (int), ``task`` (int), ``time`` (number) |
| ``_ctiflow_schemas`` (1, compacted) | :func:`ctiflow.jobs.datapath.kafka.publish_schemas` | :class:`ctiflow.jobs.datapath.kafka.SchemaTopic` | the schema's fingerprint (8 bytes) | ``name`` (text), ``schema`` (Avro JSON whose fingerprint is the key) |

**A record a reader cannot read** — not UTF-8, not JSON, not an object of the shape above, a
key that is not the one the value names, a schema whose fingerprint is not its key — is a
*data* fault, not a bug: somebody else wrote it (a tool, a test, a mistyped topic name). The
parsers here raise :class:`ForeignRecord` for it; the readers skip the record and say so once
per process with :func:`skip` (topic, partition, offset, why). Skipping is safe for each topic:

* progress: the counters of the job's own records are summed as before; a foreign record adds
  nothing;
* markers: a marker is only ever *looked for* (did an attempt of this task begin?), so a record
  that is not one is no marker; the search goes on past it;
* schemas: an entry that is not the schema its key names is ignored, so an earlier good entry
  for that fingerprint stands (and a reader never decodes with a schema it was not written with).

**A topic that is gone** (deleted while the job runs, or on a broker that lost it) is created
again by the writer that needs it — with :func:`recreate`, which says so once — before it writes
(the sink's tasks for the marker topic, its commit for the progress topic). The history it held is gone:
the progress topic's counters start again from the batch after, and a sink task that finds no
marker of its query at all (neither its own nor an earlier batch's) treats its batch as a replay
(:func:`ctiflow.jobs.datapath.sink.began`), which costs a scan of the result partitions and never writes a
record twice. Where the topic cannot be created, the run stops with one line naming it
(:class:`~ctiflow.operators.errors.StackError`).
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

from ctiflow.jobs.avro.serde import StoredSchema
from ctiflow.operators.errors import CtiflowError, StackError

#: Where the readers' warnings go (to stderr unless the application configures logging).
LOG = logging.getLogger("ctiflow.own_topics")


class ForeignRecord(CtiflowError, ValueError):
    """A record in one of the job's own topics that ctiflow did not write, or that cannot be
    read as what it should be: the reader skips it (:func:`skip`). The message says why."""


#: (topic, partition, offset, why) of the records this process has warned about (each once; the
#: reason too, so a topic created again gets its own warnings); bounded.
_WARNED: set[tuple[str, int, int, str]] = set()
_WARNED_MAX = 10_000


def skip(topic: str, partition: int, offset: int, why: ForeignRecord | str) -> None:
    """Warn, once per process, that ``topic[partition]`` at ``offset`` was skipped and why."""
    where = (topic, partition, offset, str(why))
    if where in _WARNED:
        return
    if len(_WARNED) >= _WARNED_MAX:
        _WARNED.clear()
    _WARNED.add(where)
    LOG.warning(f"warning: {topic} partition {partition} offset {offset}: skipped a record ctiflow "
                f"did not write ({why})")


def recreate(topic: str, partitions: int, what: str) -> None:
    """Say that ``topic`` (``what``: which of the job's topics) was missing and was created
    again with ``partitions`` partitions (the caller created it)."""
    LOG.warning(f"warning: {what} {topic} was missing (deleted?); created it again with {partitions} "
                f"partition(s): what it held is gone (see docs/operations/checkpoints.md)")


def _object(value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise ForeignRecord("no value")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ForeignRecord(f"not UTF-8 text: byte {value[exc.start]:#04x} at position {exc.start}") from None
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ForeignRecord(f"not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ForeignRecord(f"a JSON {type(parsed).__name__}, not an object")
    return parsed


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _field(record: dict, name: str, check, wanted: str) -> Any:
    if name not in record:
        raise ForeignRecord(f"no field {name!r}")
    if not check(record[name]):
        raise ForeignRecord(f"field {name!r} is {record[name]!r}, not {wanted}")
    return record[name]


def _key(key: bytes | None, expected: int) -> None:
    if key != str(expected).encode():
        raise ForeignRecord(f"its key {key!r} is not {str(expected)!r}")


def progress_record(key: bytes | None, value: bytes | None) -> dict[str, Any]:
    """A progress record (see the table above) as the sink's commit wrote it: the value as a
    dict whose counters are ints. :class:`ForeignRecord` if it is not one."""
    record = _object(value)
    batch = _field(record, "batch", _is_int, "an int")
    _field(record, "query", lambda v: isinstance(v, str), "text")
    _field(record, "time", _is_time, "a number")
    _key(key, batch)
    for name, n in record.items():
        if name not in ("batch", "time", "query") and not _is_int(n):
            raise ForeignRecord(f"counter {name!r} is {n!r}, not an int")
    return record


def marker_record(key: bytes | None, value: bytes | None) -> dict[str, Any]:
    """A replay marker (see the table above) as a sink task left it: ``query``, ``batch``,
    ``task`` (and ``time``). :class:`ForeignRecord` if it is not one."""
    record = _object(value)
    _field(record, "query", lambda v: isinstance(v, str), "text")
    _field(record, "batch", _is_int, "an int")
    task = _field(record, "task", lambda v: _is_int(v) and v >= 0, "a task id (an int ≥ 0)")
    _field(record, "time", _is_time, "a number")
    _key(key, task)
    return record


def schema_entry(key: bytes | None, value: bytes | None) -> StoredSchema:
    """A schemas-topic entry (see the table above): the schema, parsed, whose fingerprint is
    the key. :class:`ForeignRecord` if it is not one — among them an entry whose schema is
    another than the one its key names."""
    record = _object(value)
    name = _field(record, "name", lambda v: isinstance(v, str) and v != "", "a schema name")
    text = _field(record, "schema", lambda v: isinstance(v, str), "a schema's Avro JSON as text")
    if key is None or len(key) != 8:
        raise ForeignRecord(f"its key {key!r} is not a fingerprint (8 bytes)")
    try:
        stored = StoredSchema.of(name, text)
    except CtiflowError as exc:
        raise ForeignRecord(str(exc)) from None
    if stored.fingerprint != key:
        raise ForeignRecord(f"schema {name!r} has fingerprint {stored.fingerprint.hex()}, not its key "
                            f"{key.hex()}: ignored")
    return stored


_STACK_ERROR = re.compile(r"ctiflow\.operators\.errors\.StackError: ([^\n]+)")


def stack_error_in(failure: BaseException) -> StackError | None:
    """The :class:`StackError` a sink task or the sink's commit raised (a topic that is gone and
    cannot be created again), from the failure of the streaming query it stopped: Spark wraps a
    Python task's exception in its own, with the traceback as text; ``None`` for any other
    failure (a bug stays one)."""
    found = _STACK_ERROR.findall(str(failure))
    return StackError(found[-1].strip()) if found else None
