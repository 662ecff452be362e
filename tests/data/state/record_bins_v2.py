"""Writes ``bins-v2-2026-12-01.pkl.gz`` (path: the first argument) when run in a checkout of
``8d5a0a4`` (bins snapshot version 2, the keys a JSON list): a binner of keys with non-ASCII names
and a NUL, pending increments and open bins; its snapshot, the events after it and the records
that version produced from them (``tests/test_bins_binner.py`` restores it with this version)."""
import gzip
import pickle
import sys

from ctiflow.operators import bins as old
from ctiflow.operators.time import Event, ViolationPolicy
from ctiflow.operators.operator import outputs_of


def flow(key, start, end, b=100, p=1, off=0):
    return Event(key, start, end, {"bytes": b, "packets": p}, offset=off, stream="flows")


settings = old.BinSettings("flows", 60, measures=("bytes", "packets"),
                           outputs=frozenset({"incremental", "updated", "final"}), policy=ViolationPolicy.ADJUST)
b = old.Binner(settings)
keys = ["zürich", "a", "k10", "k9", "b\x00", "b", "日本", "k1"]
i = 0
for t in range(0, 300, 7):
    b.process(flow(keys[i % len(keys)], t, t + (i % 5) * 40, b=i * 3 + 1, p=i % 4, off=i))
    i += 1
    if t % 70 == 0:
        b.advance_to(t)
for t in range(300, 330, 3):
    b.process(flow(keys[(i * 3) % len(keys)], t, t + 100, b=i, p=1, off=i))
    i += 1
snap = b.snapshot()
assert snap.startswith(b"CTIFLOW-BINS\x02")
after = [flow(keys[j % len(keys)], 330 + j * 11, 360 + j * 13, b=j, p=2, off=1000 + j) for j in range(20)]
outs = []
for j, e in enumerate(after):
    b.process(e)
    if j % 5 == 4:
        outs.append([(o.role, o.record) for o in outputs_of(b.advance_to(e.start))])
outs.append([(o.role, o.record) for o in outputs_of(b.advance_to(2**62))])
with gzip.open(sys.argv[1], "wb") as f:
    pickle.dump({"snapshot": snap, "after": [(e.key, e.start, e.end, e.fields, e.offset) for e in after],
                 "outputs": outs}, f)
print(len(snap), sum(map(len, outs)))
