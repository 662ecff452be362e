"""Decoded state chunks kept in a Python worker between micro-batches."""

from __future__ import annotations

import os
from collections import OrderedDict


class WarmChunks:
    """Decoded state chunks kept in this Python worker between micro-batches, each entry proven
    current — or an ancestor of the current state — by the header it was committed with.

    Why by hand: no library caches objects against the version of Spark's state store. Every
    commit appends to the header the tokens of the last :data:`CHAIN` commits of the group, its
    own a fresh random one last, then their count (``pickle`` and the zstd frame ignore bytes
    after their end, so the header still loads as before); the chunks the call left decoded are
    filed under its token. A later call whose header ends with that token reads the very state
    this worker committed — the store's chunks are those decoded objects' bytes — so it uses them
    instead of reading and decoding them (*current*). A header that names the token among the
    earlier commits (another worker ran the group since) proves those chunks a committed ancestor
    of the state it reads (*stale*: :class:`ctiflow.jobs.state.chunks.KeyedState` patches them
    with their deltas). A token no header names (a replayed batch restores the previous version;
    another query) is never used. An entry is taken out when used: a call that fails after
    mutating chunks leaves nothing behind, and its retry reads the store. At most ``limit``
    chunks are kept in the process, least recently used go first: memory follows the limit, not
    the live keys."""

    TOKEN_BYTES = 16
    #: commits a header names (its own last): how far back a worker's chunks can be patched from
    CHAIN = 8

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, dict] = OrderedDict()

    @classmethod
    def chain(cls, stored: bytes | None) -> list[bytes]:
        """The commits' tokens ``stored`` ends with, oldest first (empty: none)."""
        if not stored:
            return []
        n = stored[-1]
        if not 0 < n <= cls.CHAIN or len(stored) <= n * cls.TOKEN_BYTES:
            return []
        tail = stored[-1 - n * cls.TOKEN_BYTES:-1]
        return [tail[i:i + cls.TOKEN_BYTES] for i in range(0, len(tail), cls.TOKEN_BYTES)]

    def take(self, stored: bytes | None) -> tuple[dict, dict]:
        """→ (the decoded chunks committed with ``stored``, or those of the latest earlier commit
        it names that this worker holds); one of the two is empty."""
        chain = self.chain(stored)
        if not chain:
            return {}, {}
        current = self.entries.pop(chain[-1], None)
        if current is not None:
            return current, {}
        for token in reversed(chain[:-1]):
            stale = self.entries.pop(token, None)
            if stale is not None:
                return {}, stale
        return {}, {}

    def put(self, value: bytes, chunks: dict, limit: int, previous: bytes | None = None) -> bytes:
        """File ``chunks`` (least recently used first) under a new token; → ``value`` as stored,
        the chain of ``previous`` (the header this commit follows) and the new token after it."""
        token = os.urandom(self.TOKEN_BYTES)
        if limit > 0 and chunks:
            while len(chunks) > limit:
                del chunks[next(iter(chunks))]
            self.entries[token] = chunks
            total = sum(len(c) for c in self.entries.values())
            while total > limit:
                _, oldest = self.entries.popitem(last=False)
                total -= len(oldest)
        chain = [*self.chain(previous)[1 - self.CHAIN:], token]
        return value + b"".join(chain) + bytes([len(chain)])


#: this worker's (one per Python process; Spark reuses workers across micro-batches)
WARM = WarmChunks()
