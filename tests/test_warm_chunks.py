"""The worker's cache of decoded chunks (ctiflow.jobs.state.warm.WarmChunks): an entry is found as
current only by the header it was committed with, as stale (an ancestor) only by a header whose
chain of commits names it, is taken out when used, and the process keeps at most the configured
number of chunks, least recently used going first."""

from ctiflow.jobs.state.warm import WarmChunks

TOKEN = WarmChunks.TOKEN_BYTES


def test_chunks_are_found_by_the_header_they_were_committed_with_and_only_once():
    warm = WarmChunks()
    stored = warm.put(b"header", {1: "c1", 2: "c2"}, limit=10)
    assert stored.startswith(b"header") and len(stored) == len(b"header") + TOKEN + 1
    assert warm.take(b"header" + b"\0" * TOKEN + b"\1") == ({}, {})  # any other header: nothing
    assert warm.take(stored) == ({1: "c1", 2: "c2"}, {})
    assert warm.take(stored) == ({}, {})  # taken out: a failed call leaves nothing behind


def test_every_commit_gets_a_new_token_even_for_the_same_header():
    warm = WarmChunks()
    first = warm.put(b"h", {1: "a"}, limit=10)
    second = warm.put(b"h", {1: "b"}, limit=10)
    assert first != second
    assert warm.take(first) == ({1: "a"}, {}) and warm.take(second) == ({1: "b"}, {})


def test_a_header_names_the_commits_before_it_so_a_worker_finds_its_chunks_of_an_ancestor():
    mine, other = WarmChunks(), WarmChunks()
    v1 = mine.put(b"h1", {1: "mine at v1"}, limit=10)
    v2 = other.put(b"h2", {1: "other at v2"}, limit=10, previous=v1)
    v3 = other.put(b"h3", {1: "other at v3"}, limit=10, previous=v2)
    assert WarmChunks.chain(v3)[:-1] == WarmChunks.chain(v2) and WarmChunks.chain(v2)[:-1] == WarmChunks.chain(v1)
    assert mine.take(v3) == ({}, {1: "mine at v1"})  # an ancestor's: stale
    assert mine.take(v3) == ({}, {})


def test_chunks_of_a_commit_no_header_names_are_never_found():
    mine, other = WarmChunks(), WarmChunks()
    v1 = other.put(b"h1", {}, limit=10)
    mine.put(b"h2", {1: "never committed"}, limit=10, previous=v1)  # its state version was thrown away
    v2 = other.put(b"h2", {1: "committed"}, limit=10, previous=v1)
    assert mine.take(v2) == ({}, {})


def test_the_chain_keeps_the_last_commits_only():
    warm, other = WarmChunks(), WarmChunks()
    stored = warm.put(b"h", {1: "old"}, limit=100)
    for i in range(WarmChunks.CHAIN - 1):
        stored = other.put(b"h", {}, limit=100, previous=stored)
    assert len(WarmChunks.chain(stored)) == WarmChunks.CHAIN and warm.take(stored) == ({}, {1: "old"})
    stored = warm.put(b"h", {1: "old"}, limit=100)
    for i in range(WarmChunks.CHAIN):
        stored = other.put(b"h", {}, limit=100, previous=stored)
    assert len(WarmChunks.chain(stored)) == WarmChunks.CHAIN and warm.take(stored) == ({}, {})


def test_the_process_keeps_at_most_limit_chunks_the_least_recently_used_go_first():
    warm = WarmChunks()
    old = warm.put(b"g0", {c: c for c in range(3)}, limit=5)
    new = warm.put(b"g1", {c: c for c in range(10, 14)}, limit=5)  # 3 + 4 > 5: the older entry goes
    assert warm.take(old) == ({}, {})
    assert warm.take(new) == ({10: 10, 11: 11, 12: 12, 13: 13}, {})
    big = warm.put(b"g2", {c: c for c in range(8)}, limit=5)  # one entry over the limit: its oldest go
    assert warm.take(big) == ({3: 3, 4: 4, 5: 5, 6: 6, 7: 7}, {})


def test_a_limit_of_zero_keeps_nothing_and_an_old_header_without_a_chain_matches_nothing():
    warm = WarmChunks()
    stored = warm.put(b"h", {1: "a"}, limit=0)
    assert warm.take(stored) == ({}, {}) and warm.entries == {}
    assert warm.take(None) == ({}, {}) and warm.take(b"short") == ({}, {})
    kept = warm.put(b"h", {1: "a"}, limit=10)
    token = WarmChunks.chain(kept)[-1]
    for last in range(256):  # a header of before the chain: its own token last, any byte its end
        assert warm.take(b"h" * 40 + token[:-1] + bytes([last])) == ({}, {})
