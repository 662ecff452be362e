"""Key-group hosts (``ctiflow.jobs.datapath.group_host``), as ctiflow's daemon runs them: a fresh
Python process starts the host server and then calls, as a worker does, into the hosts with a
processor that counts in a state variable of the worker's. Checked from outside: which process
served each call (its pid), what the worker's variable holds (counted here, independently), how
a bug, a host that dies, a wrong key, an idle host and the daemon's end come out.

Spark's state handle is a dict here (the calls' path through the proxy is what is under test);
the data path through Spark with hosts is what every end-to-end test runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

SCENARIO = textwrap.dedent("""
    import gc, hashlib, json, os, signal, sys, time
    import pandas as pd
    import pyarrow as pa
    from ctiflow.jobs.datapath import group_host

    def payload(n):
        "n bytes, the same for the same n (a pack of rows)"
        return (hashlib.sha256(str(n).encode()).digest() * (n // 32 + 1))[:n]

    class Counting:
        "A processor: counts each frame's words in the worker's map state; its own calls in the host."
        def init(self, handle):
            self.var, self.calls = handle.getMapState("state", "key schema", "value schema"), 0
            self.total = handle.getValueState("total", "value schema")  # (get: a row, not an iterator)
            self.log = handle.getListState("log", "value schema")       # (get: an iterator)
            self.send_writes = group_host.writes_sender(handle)

        def _batch(self, frames, reports):
            "frames: words and packs (bytes); → one frame: what the call saw, as JSON, and the first pack reversed"
            self.calls += 1
            words = [w for f in frames for w in f["word"] if w is not None]
            packs = [p for f in frames for p in f["pack"] if p is not None]
            for word in words:
                if word == "boom":
                    raise ValueError("a bug in the call")
                if word == "die":
                    os._exit(3)
                if word == "sync":
                    self.send_writes()
                    continue
                if word.startswith("fill:"):  # (writes only: n keys of their own)
                    for i in range(int(word[5:])):
                        self.var.updateValue((f"fill{i}",), (i,))
                    continue
                got = self.var.getValue((word,))
                self.var.updateValue((word,), ((got[0] if got else 0) + 1,))
            total = self.total.get()
            self.total.update(((total[0] if total else 0) + len(words),))
            self.log.put([*self.log.get(), (len(words),)])
            seen = {"pid": os.getpid(), "calls": self.calls, "reports": reports,
                    "entries": sorted((k[0], v[0]) for k, v in self.var.iterator()),
                    "total": self.total.get()[0], "log": [n for (n,) in self.log.get()],
                    "packs": [[len(p), hashlib.sha256(p).hexdigest(), type(p).__name__] for p in packs]}
            return [pd.DataFrame({"seen": [json.dumps(seen)], "back": [bytes(packs[0])[::-1] if packs else None]})]

    class DictMap:
        def __init__(self):
            self.d = {}
        def getValue(self, k):
            return self.d.get(k)
        def updateValue(self, k, v):
            self.d[k] = v
        def removeKey(self, k):
            self.d.pop(k, None)
        def iterator(self):
            return iter(list(self.d.items()))

    class Value:
        def __init__(self):
            self.row = None
        def get(self):
            return self.row
        def update(self, row):
            self.row = row

    class Listed:
        def __init__(self):
            self.rows = []
        def get(self):
            return iter(list(self.rows))
        def put(self, rows):
            self.rows = list(rows)

    class Handle:
        def __init__(self):
            self.made = {}
        def _var(self, kind, name):
            if (kind, name) in self.made:
                raise AssertionError(f"{kind} {name!r} made twice (Spark would register it again)")
            var = self.made[kind, name] = {"map": DictMap, "value": Value, "list": Listed}[kind]()
            return var
        def getMapState(self, name, *schemas):
            return self._var("map", name)
        def getValueState(self, name, *schemas):
            return self._var("value", name)
        def getListState(self, name, *schemas):
            return self._var("list", name)

    group_host.HOST_IDLE_S, group_host.CHECK_EVERY_S = float(sys.argv[1]), float(sys.argv[2])
    server = group_host.start()
    worker = group_host.RecordingHandle(Handle())
    mine = worker.getMapState("state", "key schema", "value schema")  # (as a worker's init)
    digest, shipped = group_host.shipped(Counting())
    other = Counting()
    other.plan = "another"  # (another query's processor: another digest)
    processors = {"one": (digest, shipped), "other": group_host.shipped(other)}

    received = [0]  # (the messages this worker received: patched after the server forked)
    recv = group_host._recv
    def counted(conn):
        received[0] += 1
        return recv(conn)
    group_host._recv = counted

    def call(group, words, reports=True, processor="one", packs=()):
        "a call of words, and packs of these sizes, in two frames as Spark hands them"
        frames = [pd.DataFrame({"word": words, "pack": [None] * len(words)}),
                  pd.DataFrame({"word": [None] * len(packs), "pack": [payload(n) for n in packs]})]
        before = received[0]
        try:
            got = group_host.run(server, *processors[processor], group, frames, reports, worker)[0]
            out = json.loads(got["seen"][0])
            back = got["back"][0]
            out["back"] = None if back is None else [len(back), hashlib.sha256(back).hexdigest(), type(back).__name__]
            views = sum(type(o) is memoryview for o in gc.get_objects())
            for _ in range(3):  # (the output as PySpark hands it to Spark: an Arrow binary column)
                pa.Array.from_pandas(got["back"], type=pa.binary())
            del got, back
            gc.collect()
            out["views_left"] = sum(type(o) is memoryview for o in gc.get_objects()) - views
        except group_host.GroupHostError as exc:
            out = {"error": str(exc)}
        out["worker"] = sorted((k[0], v[0]) for k, v in mine.d.items())
        out["messages"] = received[0] - before
        print(json.dumps(out), flush=True)
        return out

    for line in sys.stdin:
        step = json.loads(line)
        if step[0] == "call":
            call(*step[1:])
        elif step[0] == "kill":
            os.kill(step[1], signal.SIGKILL)
            print(json.dumps({"killed": step[1]}), flush=True)
        elif step[0] == "wrong key":
            other = group_host.Server(server.directory, os.urandom(32))
            try:
                group_host.run(other, digest, shipped, step[1], [], True, worker)
                print(json.dumps({"auth": "passed"}), flush=True)
            except Exception as exc:
                print(json.dumps({"auth": type(exc).__name__}), flush=True)
        elif step[0] == "where":
            print(json.dumps({"dir": server.directory}), flush=True)
""")


class Daemon:
    """The scenario's process: one JSON step a line in, one JSON answer a line out."""

    def __init__(self, tmp_path, idle_s: float = 300.0, check_every_s: float = 1.0) -> None:
        script = tmp_path / "scenario.py"
        script.write_text(SCENARIO)
        self.proc = subprocess.Popen([sys.executable, str(script), str(idle_s), str(check_every_s)],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def step(self, *step) -> dict:
        self.proc.stdin.write(json.dumps(step) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the scenario process ended (exit code {self.proc.wait()})"
        return json.loads(line)

    def end(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_group_calls_run_in_one_host_that_keeps_its_objects_and_uses_the_workers_state(tmp_path):
    d = Daemon(tmp_path)
    try:
        first = d.step("call", 0, ["a", "b", "a"])
        second = d.step("call", 0, ["b"], False)
        other = d.step("call", 1, ["c"])
    finally:
        d.end()
    assert first["pid"] == second["pid"] != os.getpid()
    assert (first["calls"], second["calls"]) == (1, 2)  # the host's processor object lived on
    assert second["reports"] is False
    # the counts are in the worker's variable, and the host read them back through it
    assert first["worker"] == first["entries"] == [["a", 2], ["b", 1]]
    assert second["worker"] == second["entries"] == [["a", 2], ["b", 2]]
    assert other["pid"] not in (first["pid"], os.getpid()) and other["calls"] == 1  # a group's own host
    # a value state's get is a row, a list state's an iterator: both as the worker's variables answer
    assert (first["total"], second["total"], other["total"]) == (3, 4, 5)
    assert (first["log"], second["log"], other["log"]) == ([3], [3, 1], [3, 1, 1])


def test_a_bug_in_the_host_fails_the_call_with_its_traceback_and_the_host_serves_on(tmp_path):
    d = Daemon(tmp_path)
    try:
        before = d.step("call", 0, ["a"])
        failed = d.step("call", 0, ["a", "boom"])
        after = d.step("call", 0, ["b"])
    finally:
        d.end()
    assert "ValueError: a bug in the call" in failed["error"] and "Traceback" in failed["error"]
    assert failed["worker"] == [["a", 1]]  # (its write of "a", queued, dropped: Spark drops a failed
    assert after["pid"] == before["pid"] and after["calls"] == 3  # task's state changes all the same)


def test_a_host_that_dies_fails_its_call_and_the_next_call_gets_a_new_host(tmp_path):
    d = Daemon(tmp_path)
    try:
        before = d.step("call", 0, ["a"])
        died = d.step("call", 0, ["die"])
        after = d.step("call", 0, ["a"])
        d.step("kill", after["pid"])  # killed between calls (out of memory, an operator's kill)
        assert _gone(after["pid"])
        again = d.step("call", 0, ["a"])
    finally:
        d.end()
    assert "ended during the call" in died["error"]
    assert after["pid"] != before["pid"] and after["calls"] == 1
    assert again["pid"] not in (before["pid"], after["pid"]) and again["calls"] == 1
    assert again["worker"] == [["a", 3]]  # the state is the worker's (Spark's): nothing lost


def test_a_calls_packs_of_many_megabytes_reach_the_host_and_come_back_whole_the_large_out_of_band(tmp_path):
    """A pack of 64 KiB or more travels beside the message's pickle, read into a buffer of its
    own (the host sees a read-only view of it, the worker the ``bytearray`` itself); a smaller one
    inside the pickle. The output, converted to Arrow as PySpark hands it to Spark, leaves nothing
    behind in the worker (a read-only view did: pyarrow keeps a view of each it converts, a call's
    output never freed)."""
    import hashlib

    def digest(n: int, reverse: bool = False) -> str:  # (the scenario's payload, made here again)
        data = (hashlib.sha256(str(n).encode()).digest() * (n // 32 + 1))[:n]
        return hashlib.sha256(data[::-1] if reverse else data).hexdigest()

    sizes = [7_000_003, 65_536, 65_535, 1]
    d = Daemon(tmp_path)
    try:
        first = d.step("call", 0, ["a"], True, "one", sizes)
        again = d.step("call", 0, ["a"], True, "one", sizes[::-1])
    finally:
        d.end()
    assert first["views_left"] == 0 and again["views_left"] == 0
    assert first["packs"] == [[n, digest(n), "memoryview" if n >= 65_536 else "bytes"] for n in sizes]
    assert first["back"] == [7_000_003, digest(7_000_003, reverse=True), "bytearray"]
    assert again["packs"] == first["packs"][::-1] and again["back"] == [1, digest(1, reverse=True), "bytes"]
    assert again["pid"] == first["pid"] and again["worker"] == [["a", 2]]


def test_a_hosts_writes_reach_the_worker_in_order_a_message_for_all_made_between_two_reads(tmp_path):
    """Spark's state calls that return nothing travel with the host's next read, its answer or
    its explicit send: a round trip for many writes, and every read sees the writes before it."""
    d = Daemon(tmp_path)
    try:
        d.step("call", 0, ["a"])  # (the connection is made and kept: its messages not counted below)
        one = d.step("call", 0, ["fill:1"])
        many = d.step("call", 0, ["fill:300"])
        sent = d.step("call", 0, ["x", "sync", "die"])  # written, sent, then the host dies
        queued = d.step("call", 0, ["y", "die"])  # written, still queued when the host dies
        after = d.step("call", 0, ["a"])
    finally:
        d.end()
    assert many["messages"] == one["messages"]  # (300 writes: no message more than 1)
    assert [k for k, _ in many["entries"]] == sorted(["a", *(f"fill{i}" for i in range(300))])
    assert many["worker"] == many["entries"] and dict(many["worker"])["fill299"] == 299
    assert "ended during the call" in sent["error"] and "ended during the call" in queued["error"]
    assert dict(queued["worker"]).get("x") == 1 and "y" not in dict(queued["worker"])
    assert after["entries"] == after["worker"] and dict(after["worker"])["a"] == 2


def test_a_host_superseded_by_another_processors_ends_once_its_query_stopped_not_while_it_runs(tmp_path):
    """Another processor's host for the same group (the session's next query, a job restarted
    with another plan) has the first one end soon after its calls stop; while they keep coming
    (two queries side by side) it serves on."""
    d = Daemon(tmp_path)
    try:
        one = [d.step("call", 0, ["a"], True, "one") for _ in range(3)]
        beside = []
        for _ in range(4):  # (side by side: calls of each within a fraction of a second)
            beside += [d.step("call", 0, ["b"], True, "other"), d.step("call", 0, ["a"], True, "one")]
        stopped = beside[-1]["pid"]
        assert _gone(stopped, within=10.0)  # its calls stopped: gone within 3 gaps + 1 s, not 300 s
        again = d.step("call", 0, ["a"], True, "one")
    finally:
        d.end()
    first, second = {o["pid"] for o in one}, {o["pid"] for o in beside[1::2]}
    assert len(first) == 1 and first == second  # the first host served on beside the other
    assert {o["pid"] for o in beside[::2]}.isdisjoint(first)
    assert again["pid"] not in first and again["calls"] == 1
    assert dict(again["worker"])["a"] == 8  # (its state: the worker's, nothing lost)


def test_a_host_idle_past_its_limit_ends_as_soon_as_another_processors_host_starts(tmp_path):
    """The signal that supersedes a host wakes it: one idle past 3 gaps + 1 s (its query stopped
    a while ago) ends as the next query's host starts, not at its next periodic check (here a
    minute away), so the two queries' hosts do not hold memory side by side."""
    d = Daemon(tmp_path, check_every_s=60.0)
    try:
        one = [d.step("call", 0, ["a"], True, "one") for _ in range(3)]
        time.sleep(1.5)  # (3 × a gap of milliseconds + 1 s: past it)
        assert not _gone(one[-1]["pid"], within=0.2)  # (idle, not superseded: it waits)
        other = d.step("call", 0, ["b"], True, "other")
        assert _gone(one[-1]["pid"], within=10.0)
    finally:
        d.end()
    assert len({o["pid"] for o in one}) == 1 and other["pid"] != one[-1]["pid"]


def test_a_peer_without_the_key_is_refused_and_the_host_serves_on(tmp_path):
    d = Daemon(tmp_path)
    try:
        before = d.step("call", 0, ["a"])
        refused = d.step("wrong key", 0)
        after = d.step("call", 0, ["a"])
    finally:
        d.end()
    assert refused == {"auth": "AuthenticationError"}
    assert after["pid"] == before["pid"] and after["calls"] == 2


def test_an_idle_host_ends_and_the_next_call_starts_another(tmp_path):
    d = Daemon(tmp_path, idle_s=0.5)
    try:
        before = d.step("call", 0, ["a"])
        assert _gone(before["pid"])
        after = d.step("call", 0, ["a"])
    finally:
        d.end()
    assert after["pid"] != before["pid"] and after["calls"] == 1 and after["worker"] == [["a", 2]]


def test_the_server_and_its_hosts_end_with_the_daemon_and_leave_no_directory(tmp_path):
    d = Daemon(tmp_path)
    hosts = [d.step("call", g, ["a"])["pid"] for g in (0, 1)]
    where = d.step("where")["dir"]
    assert os.stat(where).st_mode & 0o777 == 0o700  # (the user's own: only the key's holders connect)
    d.end()
    assert all(_gone(pid) for pid in hosts)
    deadline = time.monotonic() + 10
    while os.path.exists(where) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(where)


def _plan(operators: list[dict], state: dict | None = None):
    from ctiflow.jobs.driver.config import parse
    from ctiflow.jobs.driver.planner import plan_job

    raw = {"job": "p", "kafka": {"bootstrap_servers": "x:1"},
           "sources": [{"name": "tx", "topic": "t", "schema": "transaction", "key_field": "account",
                        "time_field": "event_time"}],
           "operators": operators}
    return plan_job(parse({**raw, **({"state": state} if state else {})}, "p"))


PASS = {"kind": "passthrough", "output": "out"}


def test_a_plan_is_hosted_only_where_a_group_keeps_state_under_keys():
    """Hosts keep chunks decoded; a plan whose groups keep none (every operator stateless, no key
    TTL) gains nothing from one — its calls' rows would travel to the host and back for nothing."""
    assert not _plan([PASS]).keeps_keys
    assert _plan([PASS], {"ttl": "7d"}).keeps_keys  # (the TTL's last-seen times live under keys)
    assert _plan([{"kind": "count", "name": "c", "window": {"events": 10}, "output": "n"}]).keeps_keys
    assert _plan([PASS, {"kind": "count", "name": "c", "window": {"events": 10}, "per_key": False,
                         "output": "n"}]).keeps_keys  # (a global count: under one key, still a chunk's)
