"""Decoded state chunks kept in a Python worker between micro-batches."""

from __future__ import annotations

import os
from collections import OrderedDict


class WarmChunks:
    """Decoded state chunks kept in this Python worker between micro-batches, each entry proven
    current by the header it was committed with.

    Why by hand: no library caches objects against the version of Spark's state store. Every
    commit appends a fresh random token to the header (:data:`TOKEN_BYTES`; ``pickle`` ignores
    bytes after its stop opcode, so the header still loads as before); the chunks the call left
    decoded are filed under that token. A later call whose header ends with the same token reads
    the very state this worker committed — the store's chunks are those decoded objects' bytes —
    so it uses them instead of reading and decoding them. Any other header (a replayed batch
    restores the previous version; another worker ran the group since; another query) matches no
    entry — but a header whose last commits include one that read this worker's state (other
    workers ran the group since: Spark hands a task the worker idle longest, so two tasks swap
    their workers, and the pool serves other stages too) names that state's token, and then the
    chunks none of those commits rewrote whole are used, with the frames they wrote absorbed
    (:meth:`take_token`). An entry is taken out when used:
    a call that fails after mutating chunks leaves nothing behind, and its retry reads the store.
    At most ``limit`` chunks are kept in the process, least recently used go first: memory follows
    the limit, not the live keys."""

    TOKEN_BYTES = 16

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, dict] = OrderedDict()

    def take(self, header: bytes | None) -> dict:
        """The decoded chunks committed with ``header`` (an empty dict if none are)."""
        token = self.token(header)
        return {} if token is None else self.take_token(token)

    def take_token(self, token: bytes) -> dict:
        """The decoded chunks filed under ``token`` (an empty dict if none are). A header names the
        tokens of the states its last commits read (:class:`ctiflow.jobs.state.chunks.KeyedState`): the
        worker that committed one of them takes its chunks by it, some commits behind the store, and
        brings them up to date with what the commits since wrote (other workers of the pool ran them)."""
        return self.entries.pop(token, {})

    @classmethod
    def token(cls, header: bytes | None) -> bytes | None:
        """The token a stored header ends with (None: a header of none, or no header)."""
        if header is None or len(header) <= cls.TOKEN_BYTES:
            return None
        return header[-cls.TOKEN_BYTES:]

    def put(self, header: bytes, chunks: dict, limit: int) -> bytes:
        """File ``chunks`` (least recently used first) under a new token; → the header to store."""
        token = os.urandom(self.TOKEN_BYTES)
        if limit > 0 and chunks:
            while len(chunks) > limit:
                del chunks[next(iter(chunks))]
            self.entries[token] = chunks
            total = sum(len(c) for c in self.entries.values())
            while total > limit:
                _, oldest = self.entries.popitem(last=False)
                total -= len(oldest)
        return header + token


#: this worker's (one per Python process; Spark reuses workers across micro-batches)
WARM = WarmChunks()
