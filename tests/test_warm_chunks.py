"""The worker's cache of decoded chunks (ctiflow.jobs.state.warm.WarmChunks): an entry is found only by
the header it was committed with, is taken out when used, and the process keeps at most the
configured number of chunks, least recently used going first."""

from ctiflow.jobs.state.warm import WarmChunks

TOKEN = WarmChunks.TOKEN_BYTES


def test_chunks_are_found_by_the_header_they_were_committed_with_and_only_once():
    warm = WarmChunks()
    stored = warm.put(b"header", {1: "c1", 2: "c2"}, limit=10)
    assert stored.startswith(b"header") and len(stored) == len(b"header") + TOKEN
    assert warm.take(b"header" + b"\0" * TOKEN) == {}  # any other header: nothing
    assert warm.take(stored) == {1: "c1", 2: "c2"}
    assert warm.take(stored) == {}  # taken out: a failed call leaves nothing behind


def test_every_commit_gets_a_new_token_even_for_the_same_header():
    warm = WarmChunks()
    first = warm.put(b"h", {1: "a"}, limit=10)
    second = warm.put(b"h", {1: "b"}, limit=10)
    assert first != second
    assert warm.take(first) == {1: "a"} and warm.take(second) == {1: "b"}


def test_the_process_keeps_at_most_limit_chunks_the_least_recently_used_go_first():
    warm = WarmChunks()
    old = warm.put(b"g0", {c: c for c in range(3)}, limit=5)
    new = warm.put(b"g1", {c: c for c in range(10, 14)}, limit=5)  # 3 + 4 > 5: the older entry goes
    assert warm.take(old) == {}
    assert warm.take(new) == {10: 10, 11: 11, 12: 12, 13: 13}
    big = warm.put(b"g2", {c: c for c in range(8)}, limit=5)  # one entry over the limit: its oldest go
    assert warm.take(big) == {3: 3, 4: 4, 5: 5, 6: 6, 7: 7}


def test_a_limit_of_zero_keeps_nothing_and_an_old_header_without_a_token_matches_nothing():
    warm = WarmChunks()
    stored = warm.put(b"h", {1: "a"}, limit=0)
    assert warm.take(stored) == {} and warm.entries == {}
    assert warm.take(None) == {} and warm.take(b"short") == {}
