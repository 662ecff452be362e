"""`ctiflow bench scale` runs and builds the live keys it reports (figures are not asserted)."""

from rich.console import Console

from ctiflow.bench.state_scale import main, sparse_main


def test_the_scale_bench_builds_its_live_keys_and_prints_a_row_each():
    out = Console(file=open("/dev/null", "w"), width=400, record=True)
    rows = main(out, sizes=(500, 3000), per_batch=300, active=40, batches=3, chunk_keys=8)
    text = out.export_text()
    header = [line for line in text.splitlines() if line.startswith("┃")]
    cells = [line for line in text.splitlines() if line.startswith("│")]
    assert len(header) == 1 and len(cells) == len(rows)  # (one line each: no cell wrapped)
    assert all(line.count("│") == header[0].count("┃") for line in cells)
    assert all(name.strip() for name in header[0].strip("┃").split("┃"))  # a header for every cell
    assert [(r.operator, r.live_keys) for r in rows] == [
        ("identity", 0), ("count", 500), ("count", 3000), ("match", 500), ("match", 3000), ("bins", 500), ("bins", 3000)]
    assert all(r.events == 600 and r.written > 0 for r in rows[1:])


def test_the_sparse_table_spreads_each_batch_over_every_key_and_its_workers_keep_chunks_decoded():
    """Two workers in turn (as Spark's tasks swap them): every batch touches every chunk (sparse
    keys), and after each worker's first turn it takes chunks from its cache, caught up with the
    other's frames (not those the other wrote whole: a chunk of fewer than 4 KiB stored always is;
    2,000 keys' counts are about 5 KiB)."""
    out = Console(file=open("/dev/null", "w"), width=400, record=True)
    rows = sparse_main(out, sizes=(500, 12000), per_batch=400, batches=3, chunk_keys=2048)
    assert [(r.operator, r.live_keys) for r in rows] == [
        ("count", 500), ("count", 12000), ("match", 500), ("match", 12000), ("bins", 500), ("bins", 12000)]
    for r in rows:
        assert r.events == 1200 and r.written > 0 and r.chunks == -(-r.live_keys // 2048)
    assert all(r.cached > 0 for r in rows if r.live_keys == 12000)


def test_the_cti_delay_table_holds_what_each_delay_holds_back_and_stores_the_buffer_apart():
    """The buffer holds about rate × delay events (give or take the batch and 2 s of disorder),
    and the stored header stays small however much it holds: the buffer is stored in parts."""
    from ctiflow.bench.state_scale import delay_main

    rows = delay_main(Console(file=open("/dev/null", "w")), delays=(2, 20), rate=200)
    assert [r.delay_s for r in rows] == [2, 20]
    for r in rows:
        assert r.delay_s * 100 <= r.buffered <= (r.delay_s + 8) * 200
    assert rows[1].buffered > 5 * rows[0].buffered and rows[1].header < 2 * rows[0].header
