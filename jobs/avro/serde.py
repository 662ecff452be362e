"""Avro serde for Kafka values: Confluent framing and Avro single-object encoding.

Same call shape as confluent-kafka's serializers: ``serializer(obj, ctx) -> bytes`` and
``deserializer(data, ctx) -> dict``. Writers choose one framing:

* ``confluent``: magic byte 0 + 4-byte big-endian schema id from a Schema Registry;
* ``single_object`` (the embedded default, no registry): 0xC3 0x01 + the 8-byte little-endian
  CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form; the schema itself
  comes from ``schemas/``.

Readers accept both and resolve writer → reader schema as the Avro spec says, so a record
written with a compatible older or newer schema decodes. Decoding is strict
(:mod:`ctiflow.jobs.avro.decode`: hostile bytes that fastavro would return as a record are refused);
anything that does not decode raises :class:`~ctiflow.operators.errors.DecodeError` with the reason (the
job dead-letters it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
import functools
import json
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from ctiflow.jobs.avro.decode import Node, Reader, compile_schema, read_body, record_reader
from ctiflow.jobs.avro.encode import AvroWriteError, record_writer
from ctiflow.operators.errors import DecodeError, SchemaError, invalid_choice


def bundled_dir(name: str) -> Path:
    """A directory shipped with ctiflow: inside the installed ``ctiflow`` package (a wheel maps it
    there), else beside that package at the top of a source checkout (an editable install)."""
    import importlib.util  # finds the package without importing it (ctiflow imports this module)

    package = Path(next(iter(importlib.util.find_spec("ctiflow").submodule_search_locations)))
    inside = package / name
    return inside if inside.is_dir() else package.parent / name


#: The schemas ctiflow ships (inputs of the examples, and every result topic's).
SCHEMA_DIR = bundled_dir("schemas")
#: Where users keep their own ``.avsc`` files: directories separated by ``os.pathsep``, read
#: after :data:`SCHEMA_DIR` (a user's schema of the same name wins). Executors get the variable
#: from the driver (``spark.executorEnv``); the directories must exist there too.
SCHEMA_PATH_ENV = "CTIFLOW_SCHEMA_PATH"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
FRAMINGS = ("single_object", "confluent")


def _fingerprint(parsed: dict | str) -> bytes:
    """CRC-64-AVRO of the Parsing Canonical Form, as the 8 little-endian bytes the spec puts on the wire."""
    # fastavro renders the 64-bit value's little-endian bytes as hex (checked against an
    # independent implementation of the spec's algorithm in tests/test_serde.py).
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


@dataclass(frozen=True)
class StoredSchema:
    name: str
    parsed: Any
    text: str
    fingerprint: bytes

    @staticmethod
    def of(name: str, text: str) -> "StoredSchema":
        """``text`` (Avro JSON) parsed and fingerprinted; a :class:`SchemaError` if it does not parse."""
        try:
            parsed = fastavro.parse_schema(json.loads(text), named_schemas={})
        except Exception as exc:  # fastavro raises several types; all mean "bad schema"
            raise SchemaError(f"schema {name!r} does not parse: {exc}") from exc
        return StoredSchema(name, parsed, text, _fingerprint(parsed))

    @functools.cached_property
    def node(self) -> Node:
        """The compiled schema (:mod:`ctiflow.jobs.avro.decode`), built once."""
        return compile_schema(json.loads(self.text))


class SchemaStore:
    """Every ``.avsc`` under a directory (recursively, so ``schemas/versions/`` holds older
    writer versions), addressable by name (file stem) and by fingerprint."""

    def __init__(self, directory: Path = SCHEMA_DIR, *more: Path):
        self.directory = Path(directory)
        self.directories = [self.directory, *map(Path, more)]
        self._by_name: dict[str, StoredSchema] = {}
        self._by_fp: dict[bytes, StoredSchema] = {}
        for directory in self.directories:
            if not directory.is_dir():
                raise SchemaError(f"schema directory {directory} does not exist"
                                  + (f" (from {SCHEMA_PATH_ENV})" if directory != self.directory else ""))
            for path in sorted(directory.rglob("*.avsc")):
                self.add(path.stem, path.read_text())

    def add(self, name: str, text: str) -> StoredSchema:
        stored = StoredSchema.of(name, text)
        self._by_name[name] = stored
        self._by_fp[stored.fingerprint] = stored
        return stored

    def with_schemas(self, schemas: Mapping[str, str]) -> "SchemaStore":
        """A store with this one's schemas and ``schemas`` (name → Avro JSON, e.g. a job's derived
        record schemas) besides; this store is left as it is."""
        other = copy.copy(self)
        other._by_name, other._by_fp = dict(self._by_name), dict(self._by_fp)
        for name, text in schemas.items():
            other.add(name, text)
        return other

    def adopt(self, name: str, text: str) -> StoredSchema:
        """A schema found elsewhere (the schemas topic): addressable by its fingerprint, and by
        ``name`` only when no schema has that name (it never replaces one of this store's)."""
        stored = StoredSchema.of(name, text)
        self._by_fp.setdefault(stored.fingerprint, stored)
        self._by_name.setdefault(name, stored)
        return stored

    def get(self, name: str) -> StoredSchema:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name))
            where = ", ".join(map(str, self.directories))
            raise SchemaError(f"unknown schema {name!r}; known schemas: {known} (files in {where}; add "
                              f"directories of your own with {SCHEMA_PATH_ENV})") from None

    def by_fingerprint(self, fp: bytes) -> StoredSchema | None:
        return self._by_fp.get(fp)

    def names(self) -> list[str]:
        return sorted(self._by_name)


_default_store: SchemaStore | None = None


def default_store() -> SchemaStore:
    """ctiflow's schemas plus the directories in ``CTIFLOW_SCHEMA_PATH`` (read once per process)."""
    global _default_store
    if _default_store is None:
        extra = [p for p in os.environ.get(SCHEMA_PATH_ENV, "").split(os.pathsep) if p.strip()]
        _default_store = SchemaStore(SCHEMA_DIR, *extra)
    return _default_store


#: Secret registry settings (JSON) for clients on executors: set from the job's config through
#: ``spark.executorEnv`` (:func:`ctiflow.jobs.driver.pipeline.executor_credentials`), never a Spark option.
REGISTRY_SECRETS_ENV = "CTIFLOW_REGISTRY_SECRETS"


def registry_client(url: str, config: dict[str, str] | None = None):
    """confluent-kafka's Schema Registry client (``mock://…`` gives its in-memory mock), with the
    secret settings of :data:`REGISTRY_SECRETS_ENV` when that is set."""
    from confluent_kafka.schema_registry import SchemaRegistryClient  # only with a registry: it pulls in
                                                                      # httpx

    conf = {"url": url, **json.loads(os.environ.get(REGISTRY_SECRETS_ENV) or "{}"), **(config or {})}
    return SchemaRegistryClient.new_client(conf) if url.startswith("mock://") else SchemaRegistryClient(conf)


#: Registry settings naming files: read where the job runs (a cluster's driver may have them, this
#: machine not), so :func:`registry_settings_error` leaves them out.
_REGISTRY_FILE_SETTINGS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
                           "ssl.key.password")


def registry_settings_error(url: str, config: dict[str, str]) -> str | None:
    """Why confluent-kafka's registry client refuses ``url`` with ``config`` (every setting,
    secrets included), in its own words ("Unrecognized properties: …", a malformed
    ``basic.auth.user.info``, an invalid url), or None. The client is built as
    :func:`registry_client` builds it, which connects to nothing; the message names settings,
    never their values."""
    from confluent_kafka.schema_registry import SchemaRegistryClient  # (see registry_client)

    if url.startswith("mock://"):
        return None
    try:
        SchemaRegistryClient({"url": url,
                              **{k: v for k, v in config.items() if k not in _REGISTRY_FILE_SETTINGS}})
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


class AvroSerializer:
    """Encode dicts with one writer schema in one framing (:func:`ctiflow.jobs.avro.encode.record_writer`);
    a record that does not fit the schema is a :class:`SchemaError` naming the field."""

    def __init__(self, schema: str, *, framing: str = "single_object", store: SchemaStore | None = None,
                 registry: Any = None, subject: str | None = None):
        if framing not in FRAMINGS:
            raise invalid_choice("framing", framing, FRAMINGS, SchemaError)
        self.store = store or default_store()
        self.schema = self.store.get(schema)
        self.framing = framing
        self._write = record_writer(self.schema.node)
        if framing == "confluent":
            if registry is None:
                raise SchemaError("framing 'confluent' needs a Schema Registry: set schema_registry.url")
            from confluent_kafka.schema_registry import Schema  # (see registry_client)

            self.schema_id = registry.register_schema(subject or f"{schema}-value",
                                                      Schema(self.schema.text, "AVRO"))
            self._header = CONFLUENT_MAGIC + struct.pack(">I", self.schema_id)
        else:
            self._header = SINGLE_OBJECT_MAGIC + self.schema.fingerprint

    @property
    def header(self) -> bytes:
        """The framing header every record this serializer writes starts with."""
        return self._header

    def __call__(self, obj: dict, ctx: Any = None) -> bytes:
        out = bytearray(self._header)
        try:
            self._write(obj, out)
        except AvroWriteError as exc:
            raise SchemaError(f"record does not match schema {self.schema.name!r}: {exc}") from None
        return bytes(out)


class AvroDeserializer:
    """Decode either framing into a dict shaped by the reader schema (``schema=None``: by the
    writer schema the header names — for tools that read any topic)."""

    #: How long a schema id found outside the subject stays refused before the registry is asked again.
    REFUSED_FOR_S = 30.0

    def __init__(self, schema: str | None, *, store: SchemaStore | None = None, registry: Any = None,
                 subject: str | None = None, lookup: Callable[[bytes], tuple[str, str] | None] | None = None):
        """``subject``: with a registry, only schema ids registered under it are writer schemas
        (the topic's ``<topic>-value``); any other id is a :class:`DecodeError` — a record must
        not pick its own writer schema from everything the registry holds. ``lookup``: where a
        fingerprint the store lacks is looked up (``fingerprint → (name, schema JSON)`` or None:
        :class:`ctiflow.jobs.datapath.kafka.SchemaTopic`); a schema found whose own fingerprint is another
        is refused."""
        self.lookup = lookup
        self.store = store or default_store()
        self.reader = self.store.get(schema) if schema is not None else None
        self.registry = registry
        self.subject = subject
        self._by_id: dict[int, StoredSchema] = {}
        self._subject_ids: set[int] = set()
        self._refused: dict[int, float] = {}  # schema id → monotonic time it was last looked up and refused
        self._readers: dict[bytes, Reader] = {}

    def writer_schema(self, data: bytes) -> tuple[StoredSchema, int]:
        """The writer schema named by the header and the header's length."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            if len(data) < 10:
                raise DecodeError("truncated single-object header (needs 10 bytes)")
            fp = bytes(data[2:10])
            found = self.store.by_fingerprint(fp)
            if found is None and self.lookup is not None:
                found = self._looked_up(fp)
            if found is None:
                where = f"{self.store.directory}" + (" nor in the schemas topic" if self.lookup is not None
                                                     else "")
                raise DecodeError(f"unknown schema fingerprint {fp.hex()} (not in {where})")
            return found, 10
        if data[:1] == CONFLUENT_MAGIC:
            if len(data) < 5:
                raise DecodeError("truncated Confluent header (needs 5 bytes)")
            schema_id = struct.unpack(">I", data[1:5])[0]
            return self._registry_schema(schema_id), 5
        raise DecodeError(f"not Avro: unknown magic byte 0x{data[:1].hex() or 'empty'}")

    def _looked_up(self, fp: bytes) -> StoredSchema | None:
        got = self.lookup(fp)
        if got is None:
            return None
        name, text = got
        try:
            stored = SchemaStore.adopt(self.store, name, text)
        except SchemaError as exc:
            raise DecodeError(f"the schemas topic's schema for fingerprint {fp.hex()} does not parse: "
                              f"{exc}") from None
        if stored.fingerprint != fp:
            raise DecodeError(f"the schemas topic's entry for fingerprint {fp.hex()} is a schema of "
                              f"fingerprint {stored.fingerprint.hex()}: refused")
        return stored

    def _registry_schema(self, schema_id: int) -> StoredSchema:
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        if self.registry is None:
            raise DecodeError(f"Confluent-framed record with schema id {schema_id}, but no schema registry "
                              "is configured")
        if self.subject is not None:
            self._check_subject(schema_id)
        try:
            text = self.registry.get_schema(schema_id).schema_str
        except Exception as exc:
            raise DecodeError(f"unknown schema id {schema_id}: {exc}") from exc
        parsed = fastavro.parse_schema(json.loads(text), named_schemas={})
        stored = StoredSchema(f"id:{schema_id}", parsed, text, _fingerprint(parsed))
        self._by_id[schema_id] = stored
        return stored

    def _check_subject(self, schema_id: int) -> None:
        """Refuse an id not registered under :attr:`subject`. The subject's ids are re-read when an
        unknown id comes (a producer may have registered a new version), at most once per
        :attr:`REFUSED_FOR_S` for an id already refused (a flood of forged ids stays cheap)."""
        if schema_id in self._subject_ids:
            return
        now = time.monotonic()
        if now - self._refused.get(schema_id, -self.REFUSED_FOR_S) >= self.REFUSED_FOR_S:
            try:
                versions = self.registry.get_versions(self.subject)
                self._subject_ids = {self.registry.get_version(self.subject, v).schema_id for v in versions}
            except Exception as exc:
                raise DecodeError(f"schema id {schema_id}: cannot list subject {self.subject!r}: "
                                  f"{exc}") from exc
            if schema_id in self._subject_ids:
                return
            self._refused[schema_id] = now
        raise DecodeError(f"schema id {schema_id} is not registered under subject {self.subject!r} "
                          f"(its ids: {sorted(self._subject_ids) or 'none'}): a record's writer schema must "
                          "be one of its topic's")

    def record_reader(self, writer: StoredSchema) -> Reader:
        """The compiled reader for records written with ``writer`` (resolved to the reader schema);
        a writer schema that does not resolve raises :class:`DecodeError` naming why."""
        got = self._readers.get(writer.fingerprint)
        if got is None:
            target = (None if self.reader is None or writer.fingerprint == self.reader.fingerprint
                      else self.reader.node)
            try:
                got = record_reader(writer.node, target)
            except DecodeError as exc:
                raise DecodeError(f"writer schema {writer.name!r} does not resolve to {self.reader.name!r}: "
                                  f"{exc}") from None
            self._readers[writer.fingerprint] = got
        return got

    def __call__(self, data: bytes | None, ctx: Any = None) -> dict:
        if not data:
            raise DecodeError("empty value")
        writer, header = self.writer_schema(data)
        try:
            record = read_body(self.record_reader(writer), data, header)
        except DecodeError as exc:
            raise DecodeError(f"Avro body does not decode with schema {writer.name!r}: {exc}") from None
        if not isinstance(record, dict):
            raise DecodeError(f"decoded a {type(record).__name__}, expected a record")
        return record
