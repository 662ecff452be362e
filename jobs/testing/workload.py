"""Sample workloads: realistic, seeded, deterministic input records for demos, benchmarks and tests.

Every generator returns plain dicts shaped exactly like its input schema in ``schemas/``
(``transaction.avsc``, ``flow.avsc``, ``account.avsc``), in **arrival order** — the order a
producer would write them to Kafka — with times as ms since the epoch (Avro longs). The same
arguments always give the same records (``random.Random`` seeded from the arguments; no
global state, no wall clock).

Arrival order model. Each record gets an arrival instant and the list is sorted by it:

* an on-time record arrives at ``sync + U(0, disorder_ms)``, where ``sync`` is the time the
  producer learns of it (a transaction's ``event_time``, a flow's ``end_time``: flows are
  reported when they end). Hence, for on-time records, a record arriving *after* another has
  a sync time at most ``disorder_ms`` older: arrival disorder is bounded by ``disorder_ms``;
* a late record (a ``late_fraction`` of them, chosen independently of everything else)
  arrives at ``sync + late_by_ms + U(0, disorder_ms)``: far behind its time.

What that means for a job's CTI (``latest start − delay``): transactions arrive with no late
events as long as ``delay ≥ disorder_ms``; flows have starts up to :data:`MAX_FLOW_MS` before
their end, so no flow is late as long as ``delay ≥ MAX_FLOW_MS + disorder_ms`` (or the stream
uses the ``adjust`` policy). Changing ``late_fraction``, ``late_by_ms`` or ``disorder_ms`` changes
only the order, never the records themselves.

Planted scenarios (transactions), so the demo's CEP patterns really match: the account of a
scenario is reserved for its duration (no other event of that account falls in between, so
even strict contiguity — ``next`` — matches), and scenario events are never made late.

* *login burst*: three ``login_failed`` a few seconds apart, then ``login_ok``;
* *country hop*: a purchase at home, within 8 minutes a purchase in a foreign country, then
  within 90 s a large purchase (≥ :data:`LARGE_AMOUNT`, above every account's
  ``risk_threshold``) there — the whole scenario well within :data:`HOP_WINDOW_MS` (10 min).

:func:`login_bursts` and :func:`country_hops` find these shapes in any list of transactions.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ctiflow.jobs.avro.serde import AvroSerializer
from ctiflow.operators.errors import ConfigError

#: 2026-01-01T00:00:00Z, the default start of every workload.
DEFAULT_START_MS = 1_767_225_600_000
TRANSACTION_TYPES = ("purchase", "withdrawal", "refund", "login_failed", "login_ok")
_TYPE_WEIGHTS = (0.70, 0.12, 0.04, 0.04, 0.10)
COUNTRIES = ("DE", "FR", "NL", "ES", "IT", "AT", "BE", "PL", "SE", "GB", "US", "CH")
_COUNTRY_WEIGHTS = (20, 14, 8, 10, 10, 5, 5, 6, 4, 8, 6, 4)
_CURRENCY = {"GB": "GBP", "US": "USD", "CH": "CHF", "PL": "PLN", "SE": "SEK"}
#: Probability that a base (non-scenario) transaction happens outside the home country.
FOREIGN_SHARE = 0.03
#: Amounts above this are "high value" (a share of ordinary purchases are).
HIGH_VALUE = 1000.0
#: The country-hop scenario's final purchase is at least this much: above every risk threshold.
LARGE_AMOUNT = 3500.0
#: The country hop completes within this (the demo's pattern uses within(10 min)).
HOP_WINDOW_MS = 600_000
TIERS = ("standard", "gold", "platinum")
_TIER_WEIGHTS = (0.80, 0.15, 0.05)
#: risk_threshold of a tier; later versions may move it within RISK_THRESHOLDS (max 3000).
TIER_THRESHOLD = {"standard": 800.0, "gold": 1500.0, "platinum": 3000.0}
RISK_THRESHOLDS = (500.0, 800.0, 1000.0, 1500.0, 2000.0, 3000.0)
#: Longest flow (start to end).
MAX_FLOW_MS = 300_000
PROTOCOLS = ("tcp", "udp", "icmp")
_PROTOCOL_WEIGHTS = (0.80, 0.17, 0.03)
_MINUTE = 60_000


# ---------------------------------------------------------------------------------------------
# argument checks and shared pieces
# ---------------------------------------------------------------------------------------------


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f'Invalid "{name}" value: {value!r}. It must be an integer >= {low}.')


def _check_common(n: int, seed: Any, start_ms: int, rate_per_s: float, late_fraction: float,
                  late_by_ms: int, disorder_ms: int) -> None:
    _check_int("n", n, 0)
    _check_int("start_ms", start_ms, 0)
    _check_int("late_by_ms", late_by_ms, 0)
    _check_int("disorder_ms", disorder_ms, 0)
    if isinstance(seed, bool) or not isinstance(seed, (int, str)):
        raise ConfigError(f'Invalid "seed" value: {seed!r}. Use an integer (or a string).')
    if not isinstance(rate_per_s, (int, float)) or not math.isfinite(rate_per_s) or rate_per_s <= 0:
        raise ConfigError(f'Invalid "rate_per_s" value: {rate_per_s!r}. '
                          "It must be a positive number of events per second.")
    if not isinstance(late_fraction, (int, float)) or not 0 <= late_fraction <= 1:
        raise ConfigError(f'Invalid "late_fraction" value: {late_fraction!r}. It must be in [0, 1], '
                          'e.g. 0.01.')


def account_name(i: int, accounts: int = 1000) -> str:
    """``acct-0042``: zero-padded to at least 4 digits (more when there are more accounts)."""
    return f"acct-{i:0{max(4, len(str(accounts - 1)))}d}"


def device_name(i: int, devices: int = 50) -> str:
    """``dev-007``: zero-padded to at least 3 digits."""
    return f"dev-{i:0{max(3, len(str(devices - 1)))}d}"


def home_country(i: int, seed: int | str = 0) -> str:
    """The home country of account ``i`` for ``seed``; :func:`transactions` and the first
    version in :func:`accounts` agree on it."""
    return random.Random(f"home:{seed}:{i}").choices(COUNTRIES, _COUNTRY_WEIGHTS)[0]


def _arrival_order(records: list[dict], sync: list[int], rng: random.Random, late_fraction: float,
                   late_by_ms: int, disorder_ms: int, never_late: set[int] | None = None) -> list[dict]:
    """Sort ``records`` by arrival instant (see the module docstring); ties keep generation order."""
    keyed = []
    for i, (rec, t) in enumerate(zip(records, sync)):
        late = rng.random() < late_fraction and not (never_late and i in never_late)
        jitter = rng.random() * disorder_ms
        keyed.append((t + (late_by_ms if late else 0) + jitter, i, rec))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return [rec for _, _, rec in keyed]


# ---------------------------------------------------------------------------------------------
# transactions (point events)
# ---------------------------------------------------------------------------------------------


def _amount(rng: random.Random, kind: str) -> float:
    if kind == "purchase":
        if rng.random() < 0.015:
            return round(rng.uniform(HIGH_VALUE, 5000.0), 2)
        return round(min(rng.lognormvariate(3.4, 1.1), 999.0) + 0.5, 2)
    if kind == "withdrawal":
        return float(rng.choice((20, 50, 50, 100, 100, 200, 300, 500)))
    if kind == "refund":
        return round(rng.lognormvariate(3.0, 0.9) + 0.5, 2)
    return 0.0


def _merchant(rng: random.Random, kind: str) -> str | None:
    if kind in ("purchase", "refund"):
        return f"m-{rng.randrange(500):03d}"
    if kind == "withdrawal":
        return f"atm-{rng.randrange(200):03d}"
    return None


def _foreign(rng: random.Random, home: str) -> str:
    return rng.choice([c for c in COUNTRIES if c != home])


def _tx(account: str, t: int, kind: str, amount: float, country: str, merchant: str | None) -> dict:
    return {"id": "", "account": account, "event_time": t, "type": kind, "amount": amount,
            "currency": _CURRENCY.get(country, "EUR"), "country": country, "merchant": merchant}


class _Accounts:
    """Draws accounts for events at increasing times; an account reserved for a scenario
    gets no other event until the scenario ends."""

    def __init__(self, rng: random.Random, accounts: int, seed: int | str):
        self.rng = rng
        self.names = [account_name(i, accounts) for i in range(accounts)]
        self.homes = [home_country(i, seed) for i in range(accounts)]
        self.busy_until: dict[int, int] = {}

    def free(self, now: int) -> int:
        """A random account with no scenario running at ``now``."""
        busy = self.busy_until
        for _ in range(64):
            a = self.rng.randrange(len(self.names))
            if busy.get(a, -1) < now:
                return a
        return self.rng.choice([a for a in range(len(self.names)) if busy.get(a, -1) < now])

    def can_reserve(self, now: int) -> bool:
        """At most half of the accounts run a scenario at once, so :meth:`free` always finds one."""
        return sum(1 for until in self.busy_until.values() if until >= now) < len(self.names) // 2

    def reserve(self, a: int, until: int) -> None:
        self.busy_until[a] = until


def _login_burst(rng: random.Random, pool: _Accounts, now: int) -> list[dict]:
    a = pool.free(now)
    name, home = pool.names[a], pool.homes[a]
    out, t = [], now
    for i in range(3):
        if i:
            t += rng.randint(1_500, 15_000)
        out.append(_tx(name, t, "login_failed", 0.0, home, None))
    t += rng.randint(5_000, 60_000)
    out.append(_tx(name, t, "login_ok", 0.0, home, None))
    pool.reserve(a, t)
    return out


def _country_hop(rng: random.Random, pool: _Accounts, now: int) -> list[dict]:
    a = pool.free(now)
    name, home = pool.names[a], pool.homes[a]
    abroad = _foreign(rng, home)
    t1 = now
    t2 = t1 + rng.randint(60_000, 480_000)
    t3 = t2 + rng.randint(10_000, 90_000)
    out = [
        _tx(name, t1, "purchase", _amount(rng, "purchase"), home, _merchant(rng, "purchase")),
        _tx(name, t2, "purchase", _amount(rng, "purchase"), abroad, _merchant(rng, "purchase")),
        _tx(name, t3, "purchase", round(rng.uniform(LARGE_AMOUNT, 9000.0), 2), abroad,
            _merchant(rng, "purchase")),
    ]
    pool.reserve(a, t3)
    return out


def transactions(n: int, accounts: int = 1000, seed: int | str = 0, start_ms: int = DEFAULT_START_MS,
                 rate_per_s: float = 50.0, late_fraction: float = 0.0, late_by_ms: int = 120_000,
                 disorder_ms: int = 2_000, scenario_rate: float = 0.01) -> list[dict]:
    """``n`` card transactions (``transaction.avsc``) of ``accounts`` accounts, in arrival order.

    Events start at ``start_ms`` with exponential gaps (``rate_per_s`` on average, all accounts
    together). Types: mostly purchases, some withdrawals, refunds and logins (``login_*`` have
    amount 0 and no merchant). Purchase amounts are log-normal (median ≈ 30) with 1.5 % high-value
    ones in [1000, 5000]; countries are the account's home country (:func:`home_country`) except
    for a :data:`FOREIGN_SHARE`. Each generation step plants a login burst or a country hop with
    probability ``scenario_rate`` each (and, if ``scenario_rate > 0`` and ``n >= 40``, at least one
    of each), as long as at most half of the accounts are running a scenario. Ids
    ``tx-00000000`` … follow event-time order.
    """
    _check_common(n, seed, start_ms, rate_per_s, late_fraction, late_by_ms, disorder_ms)
    _check_int("accounts", accounts, 1)
    if not isinstance(scenario_rate, (int, float)) or not 0 <= scenario_rate <= 0.5:
        raise ConfigError(f'Invalid "scenario_rate" value: {scenario_rate!r}. It must be in [0, 0.5].')
    rng = random.Random(f"transactions:{seed}:{accounts}:{start_ms}:{rate_per_s}:{scenario_rate}")
    pool = _Accounts(rng, accounts, seed)
    made: list[tuple[int, int, dict, bool]] = []  # (event_time, generation seq, record, planted)
    t = float(start_ms)
    bursts = hops = 0
    force = scenario_rate > 0 and n >= 40
    while len(made) < n:
        t += rng.expovariate(rate_per_s) * 1000.0
        now = int(t)
        left = n - len(made)
        r = rng.random()
        want = None
        if left >= 4 and (r < scenario_rate or (force and not bursts and len(made) >= n // 4)):
            want = _login_burst
        elif left >= 3 and (r < 2 * scenario_rate or (force and not hops and len(made) >= n // 2)):
            want = _country_hop
        planted = want(rng, pool, now) if want is not None and pool.can_reserve(now) else []
        bursts += want is _login_burst and bool(planted)
        hops += want is _country_hop and bool(planted)
        if planted:
            made.extend((rec["event_time"], len(made) + j, rec, True) for j, rec in enumerate(planted))
            continue
        a = pool.free(now)
        kind = rng.choices(TRANSACTION_TYPES, _TYPE_WEIGHTS)[0]
        home = pool.homes[a]
        country = _foreign(rng, home) if rng.random() < FOREIGN_SHARE else home
        made.append((now, len(made), _tx(pool.names[a], now, kind, _amount(rng, kind), country,
                                         _merchant(rng, kind)), False))
    made.sort(key=lambda x: (x[0], x[1]))
    records = []
    for i, (_, _, rec, _) in enumerate(made):
        rec["id"] = f"tx-{i:08d}"
        records.append(rec)
    never_late = {i for i, m in enumerate(made) if m[3]}
    order_rng = random.Random(f"arrival:{seed}")
    return _arrival_order(records, [r["event_time"] for r in records], order_rng, late_fraction, late_by_ms,
                          disorder_ms, never_late)


def _by_account(records: Iterable[dict]) -> dict[str, list[dict]]:
    per: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        per[r["account"]].append(r)
    for evs in per.values():
        evs.sort(key=lambda r: (r["event_time"], r["id"]))
    return per


def login_bursts(records: Iterable[dict]) -> list[list[dict]]:
    """Every run of three ``login_failed`` immediately followed (per account, in event-time
    order) by ``login_ok``: the 4 events of each, sorted by account then time."""
    found = []
    for account in sorted(per := _by_account(records)):
        evs = per[account]
        for j in range(len(evs) - 3):
            if all(e["type"] == "login_failed" for e in evs[j:j + 3]) and evs[j + 3]["type"] == "login_ok":
                found.append(evs[j:j + 4])
    return found


def country_hops(records: Iterable[dict], within_ms: int = HOP_WINDOW_MS,
                 large_amount: float = LARGE_AMOUNT) -> list[list[dict]]:
    """Every three consecutive purchases of an account (event-time order, nothing in between)
    where the second is in another country than the first and the third is at least
    ``large_amount``, all within ``within_ms``: the planted country hops (and any the base
    stream makes by chance)."""
    found = []
    for account in sorted(per := _by_account(records)):
        evs = per[account]
        for a, b, c in zip(evs, evs[1:], evs[2:]):
            if (a["type"] == b["type"] == c["type"] == "purchase" and a["country"] != b["country"]
                    and c["amount"] >= large_amount
                    and c["event_time"] - a["event_time"] <= within_ms):
                found.append([a, b, c])
    return found


# ---------------------------------------------------------------------------------------------
# flows (interval events)
# ---------------------------------------------------------------------------------------------


def flows(n: int, devices: int = 50, seed: int | str = 0, start_ms: int = DEFAULT_START_MS,
          rate_per_s: float = 20.0, late_fraction: float = 0.0, late_by_ms: int = 600_000,
          disorder_ms: int = 2_000) -> list[dict]:
    """``n`` network flows (``flow.avsc``) of ``devices`` devices, in arrival order (by end time).

    Flow starts follow exponential gaps (``rate_per_s``); durations lie in [0, :data:`MAX_FLOW_MS`]:
    10 % zero-length, 10 % starting and ending exactly on minute boundaries (1–5 minutes), 5 %
    ending exactly on a minute boundary, the rest log-uniform in [1 ms, 5 min]. ``packets`` is
    heavy-tailed, ``bytes`` = packets × 60–1500 (both whole numbers as doubles). Ids
    ``flow-00000000`` … follow start order. Flows are reported when they end, so arrival is by
    ``end_time`` (+ disorder); late ones arrive ``late_by_ms`` after their end.
    """
    _check_common(n, seed, start_ms, rate_per_s, late_fraction, late_by_ms, disorder_ms)
    _check_int("devices", devices, 1)
    rng = random.Random(f"flows:{seed}:{devices}:{start_ms}:{rate_per_s}")
    names = [device_name(i, devices) for i in range(devices)]
    made = []
    t = float(start_ms)
    for seq in range(n):
        t += rng.expovariate(rate_per_s) * 1000.0
        start = int(t)
        r = rng.random()
        if r < 0.10:
            duration = 0
        elif r < 0.20:
            start = -(-start // _MINUTE) * _MINUTE
            duration = rng.randint(1, MAX_FLOW_MS // _MINUTE) * _MINUTE
        elif r < 0.25:
            duration = -(-(start + 1) // _MINUTE) * _MINUTE - start
        else:
            duration = min(MAX_FLOW_MS, int(10 ** rng.uniform(0, math.log10(MAX_FLOW_MS))))
        packets = 1 if duration == 0 else 1 + int(rng.lognormvariate(2.5, 1.5))
        nbytes = float(packets * rng.randint(60, 1500))
        made.append((start, seq, {"id": "", "device": rng.choice(names), "start_time": start,
                                  "end_time": start + duration, "bytes": nbytes, "packets": float(packets),
                                  "protocol": rng.choices(PROTOCOLS, _PROTOCOL_WEIGHTS)[0]}))
    made.sort(key=lambda x: (x[0], x[1]))
    records = []
    for i, (_, _, rec) in enumerate(made):
        rec["id"] = f"flow-{i:08d}"
        records.append(rec)
    order_rng = random.Random(f"flow-arrival:{seed}")
    return _arrival_order(records, [r["end_time"] for r in records], order_rng, late_fraction, late_by_ms,
                          disorder_ms)


# ---------------------------------------------------------------------------------------------
# accounts (slow reference stream, edge events)
# ---------------------------------------------------------------------------------------------


def accounts(accounts: int = 1000, versions: int | None = None, seed: int | str = 0,
             start_ms: int = DEFAULT_START_MS, span_ms: int = 600_000) -> list[dict]:
    """Account metadata versions (``account.avsc``), in arrival order = ``valid_from`` order.

    One version per account valid from ``start_ms`` (home country as :func:`home_country`, a
    tier and its :data:`TIER_THRESHOLD`), then ``versions`` (default ``accounts // 10``) later
    versions of random accounts at random times in ``(start_ms, start_ms + span_ms]``: mostly a
    new ``risk_threshold``, sometimes a tier change, rarely a move (new home country). Each
    version repeats the account's unchanged fields. Two versions of one account never share a
    ``valid_from``.
    """
    _check_int("accounts", accounts, 1)
    _check_int("start_ms", start_ms, 0)
    _check_int("span_ms", span_ms, 1)
    versions = accounts // 10 if versions is None else versions
    _check_int("versions", versions, 0)
    rng = random.Random(f"accounts:{seed}:{accounts}:{start_ms}:{span_ms}")
    current = []
    out = []
    for i in range(accounts):
        tier = rng.choices(TIERS, _TIER_WEIGHTS)[0]
        rec = {"account": account_name(i, accounts), "valid_from": start_ms,
               "home_country": home_country(i, seed), "risk_threshold": TIER_THRESHOLD[tier], "tier": tier}
        current.append(rec)
        out.append(rec)
    changes = []
    used: set[tuple[int, int]] = set()
    for _ in range(versions):
        a = rng.randrange(accounts)
        t = start_ms + rng.randint(1, span_ms)
        while (a, t) in used:
            t = start_ms + rng.randint(1, span_ms)
        used.add((a, t))
        changes.append((t, a, rng.random(), rng.random()))
    changes.sort()
    for t, a, what, pick in changes:
        rec = dict(current[a], valid_from=t)
        if what < 0.6:
            rec["risk_threshold"] = RISK_THRESHOLDS[int(pick * len(RISK_THRESHOLDS))]
        elif what < 0.9:
            rec["tier"] = TIERS[int(pick * len(TIERS))]
            rec["risk_threshold"] = TIER_THRESHOLD[rec["tier"]]
        else:
            rec["home_country"] = _foreign(rng, rec["home_country"])
        current[a] = rec
        out.append(rec)
    return out


# ---------------------------------------------------------------------------------------------
# JSON lines
# ---------------------------------------------------------------------------------------------


def write_jsonl(records: Iterable[dict], path: str | Path) -> Path:
    """One JSON object per line (UTF-8); creates parent directories. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, allow_nan=False, separators=(",", ":")))
            f.write("\n")
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    """The records of a JSON-lines file (blank lines skipped); errors name the line."""
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{no}: not a JSON object: {exc.msg}") from None
    return out


# ---------------------------------------------------------------------------------------------
# malformed Kafka values (dead-letter tests)
# ---------------------------------------------------------------------------------------------

#: The kinds of :func:`bad_records`, in the order they cycle, with the schema of the topic each
#: is meant for and where the job must reject it (``decode``: the bytes are not a readable
#: record; ``validate``: a readable record the source's checks reject).
BAD_KINDS: dict[str, tuple[str, str]] = {
    "random_bytes": ("transaction", "decode"),
    "truncated": ("transaction", "decode"),
    "unknown_fingerprint": ("transaction", "decode"),
    "unknown_schema_id": ("transaction", "decode"),
    "huge_string": ("transaction", "decode"),
    "null_event_time": ("transaction", "validate"),
    "absurd_event_time": ("transaction", "validate"),
    "flow_end_before_start": ("flow", "validate"),
    "flow_non_finite_bytes": ("flow", "validate"),
}
#: Event times the source rejects as absurd: before 1970 or in the year 3000.
ABSURD_TIMES = (-1, -86_400_000, 32_503_680_000_000)


def zigzag(n: int) -> bytes:
    """An Avro long (zigzag varint), written out here so hostile records need no encoder under test."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def bad_records(n: int, seed: int | str = 0) -> list[tuple[str, bytes]]:
    """``n`` malformed Kafka values as ``(kind, bytes)``, cycling through :data:`BAD_KINDS` (so
    ``n >= len(BAD_KINDS)`` contains every kind). Each must end on the dead-letter topic:

    * ``random_bytes`` — 1–64 random bytes, not starting with either Avro magic;
    * ``truncated`` — a valid single-object transaction cut short (header or body);
    * ``unknown_fingerprint`` — 0xC3 0x01 + 8 random bytes + a valid body;
    * ``unknown_schema_id`` — Confluent framing (0x00 + id) with an id no registry knows;
    * ``huge_string`` — a transaction whose ``id`` declares 2**40 bytes (a decoder that trusted
      it would allocate a terabyte) followed by a few bytes;
    * ``null_event_time`` — a valid transaction with ``event_time`` null;
    * ``absurd_event_time`` — a valid transaction at a time of :data:`ABSURD_TIMES`;
    * ``flow_end_before_start`` — a valid flow with ``end_time < start_time``;
    * ``flow_non_finite_bytes`` — a valid flow whose ``bytes`` is NaN, +inf or -inf.

    The flow kinds are flow-schema records (for a flows topic); on a transactions topic they
    still fail, at schema resolution (Flow → Transaction).
    """
    _check_int("n", n, 0)
    tx_ser = AvroSerializer("transaction")
    flow_ser = AvroSerializer("flow")
    rng = random.Random(f"bad:{seed}")
    kinds = list(BAD_KINDS)
    base_tx = transactions(len(kinds), accounts=50, seed=f"bad:{seed}", scenario_rate=0.0)
    base_flows = flows(len(kinds), devices=5, seed=f"bad:{seed}")
    out: list[tuple[str, bytes]] = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        tx = dict(base_tx[rng.randrange(len(base_tx))], id=f"bad-{i:06d}",
                  merchant=f"m-{rng.randrange(500):03d}")
        flow = dict(base_flows[rng.randrange(len(base_flows))], id=f"bad-{i:06d}")
        if kind == "random_bytes":
            first = rng.choice([b for b in range(256) if b not in (0x00, 0xC3)])
            value = bytes([first]) + rng.randbytes(rng.randint(0, 63))
        elif kind == "truncated":
            whole = tx_ser(tx)
            value = whole[: rng.randint(1, len(whole) - 1)]
        elif kind == "unknown_fingerprint":
            value = b"\xc3\x01" + rng.randbytes(8) + tx_ser(tx)[10:]
        elif kind == "unknown_schema_id":
            value = b"\x00" + struct.pack(">I", rng.randint(1_000_000, 2**31 - 1)) + tx_ser(tx)[10:]
        elif kind == "huge_string":
            value = tx_ser(tx)[:10] + zigzag(2**40) + rng.randbytes(rng.randint(4, 32))
        elif kind == "null_event_time":
            value = tx_ser(dict(tx, event_time=None))
        elif kind == "absurd_event_time":
            value = tx_ser(dict(tx, event_time=rng.choice(ABSURD_TIMES)))
        elif kind == "flow_end_before_start":
            value = flow_ser(dict(flow, end_time=flow["start_time"] - rng.randint(1, MAX_FLOW_MS)))
        else:
            value = flow_ser(dict(flow, bytes=rng.choice((math.nan, math.inf, -math.inf))))
        out.append((kind, value))
    return out
