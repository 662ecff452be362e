"""Rules that change at a CTI: patterns put, replaced and deleted while a job runs (SPEC §4.6).

A **rule** is a reference record whose validity starts at an application time: ``(rule_id,
version, effective_time, action, definition)``. Version ``k`` of a rule **judges** the events
whose time lies in ``[effective_k, effective_{k+1})`` — a run of it starts only on such an
event — and a ``delete`` version judges nothing. What happens at ``effective_{k+1}`` to the runs
version ``k`` has in flight is the operator's ``on_change``:

* ``drain`` (default): they are judged by version ``k`` to their end (match, timeout, window);
  only their *start* is withdrawn (:meth:`MatchOperator.close`).
* ``cut``: version ``k`` is advanced to ``effective_{k+1}`` (what completes or times out by then
  is emitted) and its runs are discarded.

So the results are a function of the events and the rule versions alone: a version's runs see
exactly the events a static job with that pattern would see from ``effective_k`` on, with no
run starting at or after ``effective_{k+1}`` (drain) or nothing after it at all (cut) — never
of batch boundaries, partitions, restarts or when the rule's record was read.

**Late rules.** A rule record is judged against the CTI in effect when it arrives (as an event
is): ``effective_time < CTI`` means events it should judge have been released already.
``late_rules: reject`` refuses it (the previous version stays); ``adjust`` moves its effective
time to the CTI (the record's :attr:`RuleVersion.requested` keeps what was asked).

:class:`RuleBook` is the timeline (one per operator and key group, in the group's header): it
validates and schedules rule records. :class:`RuledMatchOperator` is one chunk's keys: a
:class:`MatchOperator` per rule version (and one for the job file's static pattern), fed by the
timeline; the runtime hands every chunk its group's book (:meth:`RuledMatchOperator.use_shared`)
before any other call.
"""

from __future__ import annotations

import bisect
import pickle
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctiflow.operators import snapshots
from ctiflow.operators.cep.operator import (MatchOperator, MatchSettings, PartialMatchLimit, _compiled,
                                            start_keys)
from ctiflow.operators.errors import CtiflowError, EventRejected, invalid_choice
from ctiflow.operators.operator import HELD, Decision, Operator, Output, SharedState, Traits
from ctiflow.operators.time import CTI_INFINITY, CTI_NONE

ON_CHANGE = ("drain", "cut")
LATE_RULES = ("reject", "adjust")
ACTIONS = ("put", "delete")
#: The ruled match operator's snapshot format: its versions' snapshots in the match operator's
#: current format (earlier ones are rewritten in it by ``ctiflow.jobs.state.compat``)
SNAPSHOT_FORMAT = 4
#: The rule book's snapshot format: with whether the book may forget versions (:meth:`RuleBook.forget`)
BOOK_FORMAT = 2
#: The longest rule definition (UTF-8 bytes) a rules topic may carry; longer ones are refused before
#: they are parsed (a definition's parse and compile cost grows with its length).
MAX_DEFINITION_BYTES = 64 * 1024
_STATIC = ("", 0)  # the sub-operator key of the job file's own pattern


@dataclass(frozen=True)
class Rule:
    """One record of a rules topic (``schemas/rule.avsc``)."""

    rule_id: str
    operator: str
    version: int
    effective_time: int
    action: str = "put"
    definition: str | None = None
    comment: str | None = None

    @classmethod
    def from_record(cls, record: dict) -> "Rule":
        return cls(**{f: record.get(f) for f in cls.__dataclass_fields__ if f in record})


@dataclass(frozen=True)
class RuleVersion:
    """A version in the timeline: its settings (None: deleted from ``effective`` on), the time
    it takes effect, and the time its record asked for (they differ when it was adjusted)."""

    rule_id: str
    version: int
    effective: int
    settings: MatchSettings | None
    requested: int

    @property
    def key(self) -> tuple[str, int]:
        return self.rule_id, self.version


@dataclass(frozen=True)
class RulesSettings:
    """How an operator takes rules: ``operator`` (its name: the records it accepts),
    ``on_change``, ``late_rules``, ``max_rules`` (rule ids with a live version at once)."""

    operator: str
    on_change: str = "drain"
    late_rules: str = "reject"
    max_rules: int = 1000

    def __post_init__(self) -> None:
        if self.on_change not in ON_CHANGE:
            raise invalid_choice("on_change", self.on_change, ON_CHANGE)
        if self.late_rules not in LATE_RULES:
            raise invalid_choice("late_rules", self.late_rules, LATE_RULES)


def record_problem(rule: Rule) -> str | None:
    """What :meth:`RuleBook.offer` refuses in a record on its own, before the timeline or the
    definition's compile is looked at (so cheap, and first): an empty ``rule_id``, an unknown
    ``action``, a ``version`` below 1, a negative ``effective_time``, a put without a definition
    or with one over :data:`MAX_DEFINITION_BYTES`. → the reason, or None."""
    if not rule.rule_id:
        return "rule_id is empty"
    if rule.action not in ACTIONS:
        return f"action {rule.action!r} is not one of put, delete"
    if rule.version < 1:
        return f"version {rule.version} of rule {rule.rule_id!r}: versions start at 1"
    if rule.effective_time < 0:
        return f"effective_time {rule.effective_time} is negative: give epoch milliseconds"
    if rule.action == "put":
        if not rule.definition:
            return "a put needs a definition (a pattern or a MATCH_RECOGNIZE query)"
        size = len(rule.definition.encode("utf-8", "surrogatepass"))
        if size > MAX_DEFINITION_BYTES:
            return (f"the definition is {size:,} bytes, more than {MAX_DEFINITION_BYTES:,} (a rule is one "
                    "pattern or query: split it into several rules)")
    return None


class RuleBook(SharedState):
    """The timeline of an operator's rules: ``rule_id → [RuleVersion]`` in effective-time order
    (strictly increasing versions, non-decreasing effective times). Past a CTI the timeline
    never changes (a record behind it is late), so every chunk that reads it — whenever it
    catches up — sees the same versions at the same times. The operator's shared state
    (:class:`ctiflow.operators.operator.SharedState`): its side input is the rules topic;
    ``compile`` (a rule → its settings) is what :meth:`offer_record` judges definitions with."""

    family = "rules"

    def __init__(self, settings: RulesSettings,
                 compile: Callable[[Rule], MatchSettings] | None = None) -> None:
        self.settings = settings
        self.compile = compile
        self.timeline: dict[str, list[RuleVersion]] = {}
        self._times: list[int] = []  # every version's effective time, sorted (with repeats)
        self.applied = self.rejected = self.adjusted = 0
        self._bytes: bytes | None = None  # the snapshot while nothing changed since
        #: whether the chunks report the versions they hold (:meth:`forget`): books begun before
        #: they did (read from book format 1) keep every version
        self.forgets = True

    # -- rule records ------------------------------------------------------------------------
    def offer_record(self, record, cti: int) -> Decision:
        """A rules-topic record (its fields) through :meth:`offer` with the book's ``compile``."""
        return self.offer(Rule.from_record(record), cti, self.compile)

    def offer(self, rule: Rule, cti: int, compile: Callable[[Rule], MatchSettings]) -> Decision:
        """Validate ``rule`` and schedule it (``cti``: the CTI in effect when it arrived;
        ``compile``: its definition → settings, raising :class:`CtiflowError` with the reason)."""
        decision = self._judge(rule, cti, compile)
        self._bytes = None
        if decision.outcome == "rejected":
            self.rejected += 1
        else:
            self.applied += 1
            self.adjusted += decision.outcome == "adjusted"
        return decision

    def _judge(self, rule: Rule, cti: int, compile: Callable[[Rule], MatchSettings]) -> Decision:
        s = self.settings
        if rule.operator != s.operator:
            return Decision("rejected", f"the rule is for operator {rule.operator!r}; this job's rules topic "
                                        f"feeds operator {s.operator!r}")
        problem = record_problem(rule)
        if problem is not None:
            return Decision("rejected", problem)
        versions = self.timeline.get(rule.rule_id, [])
        last = versions[-1] if versions else None
        if last is not None and rule.version <= last.version:
            return Decision("rejected", f"version {rule.version} of rule {rule.rule_id!r} is not newer than "
                                        f"version {last.version} (give the next version a higher number)")
        settings = None
        if rule.action == "put":
            try:
                settings = compile(rule)
            except CtiflowError as exc:
                problems = getattr(exc, "problems", None) or [str(exc)]
                return Decision("rejected", "invalid definition: " + "; ".join(problems))
            live = sum(1 for vs in self.timeline.values() if vs[-1].settings is not None)
            if (last is None or last.settings is None) and live >= s.max_rules:
                return Decision("rejected", f"the operator already has {live} rules, its max_rules; delete "
                                            "one or raise rules.max_rules")
        elif last is None or last.settings is None:
            return Decision("rejected", f"rule {rule.rule_id!r} has no live version to delete")
        effective, outcome = rule.effective_time, "applied"
        if effective < cti:
            if s.late_rules == "reject":
                return Decision("rejected", f"late: effective_time {effective} is behind the CTI {cti} "
                                            "(events it should judge have been released); give a later "
                                            "time, or set rules.late_rules: adjust")
            effective, outcome = cti, "adjusted"
        if last is not None and effective < last.effective:
            return Decision("rejected", f"effective_time {effective} is before version {last.version}'s "
                                        f"{last.effective}: a version takes effect after the one before it")
        versions.append(RuleVersion(rule.rule_id, rule.version, effective, settings, rule.effective_time))
        self.timeline[rule.rule_id] = versions
        bisect.insort(self._times, effective)
        return Decision(outcome, effective=effective)

    # -- the timeline ------------------------------------------------------------------------
    def transitions(self, after: int, upto: int) -> list[int]:
        """The distinct effective times ``t`` with ``after < t <= upto``, in order."""
        times = self._times
        lo, hi = bisect.bisect_right(times, after), bisect.bisect_right(times, upto)
        return sorted(set(times[lo:hi]))

    def starting_at(self, time: int) -> list[tuple[RuleVersion | None, RuleVersion]]:
        """``(previous version, version)`` of every version taking effect at ``time``."""
        found = []
        for rule_id in sorted(self.timeline):
            versions = self.timeline[rule_id]
            for i, v in enumerate(versions):
                if v.effective == time:
                    found.append((versions[i - 1] if i else None, v))
        return found

    def judging(self, time: int) -> list[RuleVersion]:
        """The versions whose runs may start on an event at ``time`` (rule id order)."""
        found = []
        for rule_id in sorted(self.timeline):
            current = None
            for v in self.timeline[rule_id]:
                if v.effective > time:
                    break
                current = v
            if current is not None and current.settings is not None:
                found.append(current)
        return found

    def version(self, key: tuple[str, int]) -> RuleVersion:
        return next(v for v in self.timeline[key[0]] if v.version == key[1])

    def until(self, v: RuleVersion) -> int:
        """The time ``v`` stops judging (its successor's effective time, else +∞)."""
        versions = self.timeline[v.rule_id]
        i = versions.index(v)
        return versions[i + 1].effective if i + 1 < len(versions) else CTI_INFINITY

    def stats(self, cti: int) -> dict[str, int]:
        """Rules with a version in effect at ``cti``, versions in the timeline, and those scheduled
        after ``cti``; the records applied / adjusted / rejected (metrics and status)."""
        return {"active": len(self.judging(cti)), "versions": len(self._times),
                "scheduled": len(self._times) - bisect.bisect_right(self._times, cti),
                "applied": self.applied, "adjusted": self.adjusted, "rejected": self.rejected}

    def forget(self, cti: int, held: Collection[tuple[str, int]]) -> None:
        """Drop the versions no later event, record or chunk can need, so the timeline holds the
        live and scheduled versions (and each rule's last one): per rule, its oldest versions
        while the next one took effect at or before ``cti`` (every event they could judge has
        been released) and none of them is ``held`` — has runs in some chunk of the group, or a
        chunk that has not yet applied its transition (a chunk holds a version until it has).
        Dropping a prefix only keeps every later transition as it was for a lagging chunk; a
        rule's last version stays (later records are judged against it: ``version`` newer,
        ``effective_time`` no earlier). Deterministic: the same state and CTI forget the same."""
        if not self.forgets:
            return
        changed = False
        for versions in self.timeline.values():
            n = 0
            while n + 1 < len(versions) and versions[n + 1].effective <= cti and versions[n].key not in held:
                n += 1
            if n:
                del versions[:n]
                changed = True
        if changed:
            self._times = sorted(v.effective for vs in self.timeline.values() for v in vs)
            self._bytes = None

    # -- state -------------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        if self._bytes is None:
            self._bytes = pickle.dumps((BOOK_FORMAT, self.timeline,
                                        (self.applied, self.rejected, self.adjusted), self.forgets),
                                       protocol=pickle.HIGHEST_PROTOCOL)
        return self._bytes

    @classmethod
    def restore(cls, settings: RulesSettings, data: bytes,
                compile: Callable[[Rule], MatchSettings] | None = None) -> "RuleBook":
        """The book of a snapshot. A process restores the same bytes every micro-batch while no
        rule arrives: their timeline is decoded once and shared (its versions and settings are
        immutable; each book gets its own lists), so the versions' compiled plans
        (:func:`ctiflow.operators.cep.operator._compiled`, cached per settings object) are reused."""
        book = cls(settings, compile)
        cached = _RESTORED.get(data)
        if cached is None:
            got = snapshots.loads(data)
            snapshots.check_format("rule book", got[0], BOOK_FORMAT)
            _, timeline, counts, forgets = got
            if len(_RESTORED) >= 16:
                _RESTORED.clear()
            cached = _RESTORED[data] = (timeline, counts, forgets)
        timeline, (book.applied, book.rejected, book.adjusted), book.forgets = cached
        book.timeline = {rule_id: list(versions) for rule_id, versions in timeline.items()}
        book._times = sorted(v.effective for vs in book.timeline.values() for v in vs)
        book._bytes = data
        return book


@dataclass(frozen=True)
class RuleBookSpec:
    """How a key group makes its :class:`RuleBook` of one operator (the plan's side input of the
    rules topic): its settings and how a definition compiles (a picklable value)."""

    settings: RulesSettings
    compile: Callable[[Rule], MatchSettings]

    def new(self) -> RuleBook:
        return RuleBook(self.settings, self.compile)

    def restore(self, data: bytes) -> RuleBook:
        return RuleBook.restore(self.settings, data, self.compile)


#: snapshot bytes → (timeline, counts) decoded from them (:meth:`RuleBook.restore`)
_RESTORED: dict[bytes, tuple] = {}


@dataclass(frozen=True)
class RuledMatchSettings:
    """A match operator that takes rules: its static pattern (None: rules only), how it takes
    rules, and the record shape (``measures``: a ``MATCH_RECOGNIZE`` operator's records carry
    their measures as ``[{name, value}]``, one schema whatever queries come later)."""

    static: MatchSettings | None
    rules: RulesSettings
    measures: bool = False
    #: the per-key caps (:class:`MatchSettings`) over all of a key's rules together
    max_partial_matches: int | None = None
    max_buffered_events: int | None = None

    def pattern_object(self):  # the static pattern checked as a MatchOperator checks it
        return None if self.static is None else self.static.pattern_object()


def tag_record(record: dict, v: RuleVersion | None, measures: bool) -> dict:
    """A sub-operator's record with its rule (``rule_id`` / ``rule_version`` /
    ``rule_effective_time``: None for the static pattern); a rule version's ``match_id`` is
    prefixed ``rule_id@version/`` (two versions may match the same events). ``measures``: a
    ``MATCH_RECOGNIZE`` row → ``{key, rule…, measures: [{name, value}]}``."""
    rule = {"rule_id": None if v is None else v.rule_id, "rule_version": None if v is None else v.version,
            "rule_effective_time": None if v is None else v.effective}
    if measures:
        return {"key": record.get("__key"), **rule,
                "measures": [{"name": k, "value": _scalar(x)} for k, x in record.items() if k != "__key"]}
    record.update(rule)
    if v is not None and "match_id" in record:
        record["match_id"] = f"{v.rule_id}@{v.version}/{record['match_id']}"
    return record


def _scalar(x: Any) -> Any:
    """A measure's value as the union ``null | boolean | long | double | string`` holds it."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, np.generic):
        return x.item()
    return str(x)


class RuledMatchOperator(Operator):
    """One chunk's keys under a rule timeline (module docstring): a :class:`MatchOperator` per
    rule version with something in flight (plus the static pattern's).

    Invariant: every timeline transition at a time ``<= self.at`` has been applied (drain:
    the previous version closed; cut: advanced to the transition and dropped); events at a time
    ``t`` are fed only after the transitions up to ``t``. ``advance_to(cti)`` applies those
    before ``cti`` (a version adjusted to take effect at the CTI is still ahead)."""

    def __init__(self, settings: RuledMatchSettings) -> None:
        super().__init__(settings)
        self.book: RuleBook | None = None
        self.subs: dict[tuple[str, int], MatchOperator] = {}
        if settings.static is not None:
            self.subs[_STATIC] = MatchOperator(settings.static)
        self.at = CTI_NONE
        self._waiting: dict[tuple[str, int], tuple[bytes, bool]] = {}  # restored, waiting for the book

    def use_shared(self, book: RuleBook) -> None:
        """The group's timeline (before any other call of a batch)."""
        self.book = book
        for key, (data, closed) in self._waiting.items():
            sub = self.subs[key] = MatchOperator.restore(book.version(key).settings, data)
            sub.closed = closed
        self._waiting = {}

    # -- the Operator contract ---------------------------------------------------------------
    def process_columns(self, cols) -> list[tuple[int, Any]]:
        starts = cols.start
        n = len(starts)
        if not n:
            return []
        got: list[tuple[int, Any]] = []
        lo = 0
        for b in self.book.transitions(self.at, int(starts[-1])):
            hi = int(np.searchsorted(starts, b, "left"))
            if hi > lo:
                self._feed(cols, lo, hi, got)
                lo = hi
            outputs: list[Output] = []
            self._transition(b, outputs)
            if outputs:  # (a cut's last records) before the first event at or after the transition
                got.append((lo, outputs))
        if lo < n:
            self._feed(cols, lo, n, got)
        self.at = max(self.at, int(starts[-1]))
        got.sort(key=_ROW)  # stable: within a row, the order the subs were fed in
        return got

    def _feed(self, cols, lo: int, hi: int, got: list) -> None:
        """Rows ``lo:hi`` (one time span without transitions) into every version judging them
        and every closed one with runs in flight. A version whose start needs ``field == value``
        (:func:`ctiflow.operators.cep.operator.start_keys`) gets only the rows of those values
        and of the keys it has in flight, found through one index of the field shared by all.
        With per-key caps and several versions, the versions take each row in turn
        (:meth:`_feed_capped`); otherwise each takes its rows in one call."""
        part = cols if lo == 0 and hi == len(cols) else cols.take(np.arange(lo, hi, dtype=np.int64))
        judging = {v.key: v for v in self.book.judging(int(part.start[0]))}
        index = _StartIndex(part)
        feeds = []  # (version or None: the static pattern, its operator, its rows or None: all of them)
        for key in sorted(self.subs.keys() | judging.keys()):
            sub = self.subs.get(key)
            v = None if key == _STATIC else judging.get(key) or self.book.version(key)
            if key == _STATIC or (sub is not None and sub.closed):
                rows = None
            else:  # (a version's operator is made once it has rows to see)
                rows = index.rows(_compiled(v.settings)[0], set() if sub is None else sub.keys_held())
            if rows is not None and not len(rows):
                continue
            if sub is None:
                sub = self.subs[key] = MatchOperator(v.settings)
            feeds.append((key, v, sub, rows))
        capped = (self.settings.max_partial_matches, self.settings.max_buffered_events) != (None, None)
        if capped and len(feeds) > 1:
            self._feed_capped(part, lo, feeds, got)
        else:
            for key, v, sub, rows in feeds:
                mine = part if rows is None else part.take(rows)
                for row, r in sub.process_columns(mine):
                    got.append((lo + (row if rows is None else int(rows[row])), self._result(v, r)))
        for key, _, sub, _ in feeds:
            if sub.closed and not sub.keys_in_flight:
                del self.subs[key]

    def _result(self, v: RuleVersion | None, r):
        """A sub-operator's result for a row: records tagged with their rule, a refusal named."""
        if isinstance(r, EventRejected):
            return r if v is None else EventRejected(f"rule {v.rule_id!r} version {v.version}: {r}")
        return self._tag(v, r)

    def _feed_capped(self, part, lo: int, feeds: list, got: list) -> None:
        """The caps over all of a key's versions, at every event: the rows in order, each to
        every version that takes it (:meth:`MatchOperator.rows_to_take`) in rule order, each
        step holding the key's runs and kept events *over all its versions* to
        ``max_partial_matches`` / ``max_buffered_events`` (the others' as they stand then). So a
        key's runs over every version exceed a cap by at most what one event adds, whatever the
        batch. A row refused by several versions for the caps is one dead letter (the first)."""
        caps = self.settings.max_partial_matches, self.settings.max_buffered_events
        takes: dict[int, list[int]] = {}  # part row → the feeds taking it, in feed order
        for f, (_, _, sub, rows) in enumerate(feeds):
            mine = part if rows is None else part.take(rows)
            for j in sub.rows_to_take(mine, inert=False):
                takes.setdefault(j if rows is None else int(rows[j]), []).append(f)
        keys = part.key
        own: dict[str, list[tuple[int, int]]] = {}  # key → each feed's (runs, kept)
        total: dict[str, tuple[int, int]] = {}
        for row in sorted(takes):
            key = keys[row]
            loads = own.get(key)
            if loads is None:
                loads = own[key] = [sub.load_of(key) for _, _, sub, _ in feeds]
                total[key] = (sum(x[0] for x in loads), sum(x[1] for x in loads))
            event = part.event(row)
            refused = False
            for f in takes[row]:
                _, v, sub, _ = feeds[f]
                runs, kept = loads[f]
                all_runs, all_kept = total[key]
                try:
                    produced = sub.process_event(event, (*caps, (all_runs - runs, all_kept - kept)))
                except EventRejected as exc:
                    if exc.outputs:
                        got.append((lo + row, self._tag(v, exc.outputs)))
                    if not (refused and isinstance(exc, PartialMatchLimit)):
                        got.append((lo + row, self._result(v, exc)))
                    refused = refused or isinstance(exc, PartialMatchLimit)
                    produced = None
                if produced:
                    got.append((lo + row, self._tag(v, produced)))
                now = loads[f] = sub.load_of(key)
                total[key] = (all_runs - runs + now[0], all_kept - kept + now[1])

    def _transition(self, time: int, outputs: list) -> None:
        """The versions taking effect at ``time``: their predecessors closed (drain) or cut."""
        cut = self.settings.rules.on_change == "cut"
        for previous, _ in self.book.starting_at(time):
            if previous is None or previous.key not in self.subs:
                continue
            sub = self.subs[previous.key]
            if cut:
                outputs.extend(self._tag(previous, sub.cut(time)))
                del self.subs[previous.key]
            else:
                sub.close()
                if not sub.keys_in_flight:
                    del self.subs[previous.key]
        self.at = max(self.at, time)

    def _tag(self, v: RuleVersion | None, outputs: list) -> list:
        for o in outputs:
            # (a query's matches are its measures; its timed-out runs are timed-out match records)
            measures = self.settings.measures and o.role == "match"
            if o.role != "dead_letter":
                o.record = tag_record(o.record if not measures else {"__key": o.key, **o.record}, v, measures)
        return outputs

    def advance_to(self, cti: int) -> list[Output]:
        outputs: list[Output] = []
        for b in self.book.transitions(self.at, cti - 1):
            self._transition(b, outputs)
        for key in sorted(self.subs):
            sub = self.subs[key]
            outputs.extend(self._tag(None if key == _STATIC else self.book.version(key), sub.advance_to(cti)))
            if key != _STATIC and (cti >= CTI_INFINITY or (sub.closed and not sub.keys_in_flight)):
                del self.subs[key]
        return outputs

    def snapshot(self) -> bytes:
        subs = {key: (sub.snapshot(), sub.closed) for key, sub in self.subs.items() if key == _STATIC
                or sub.keys_in_flight or sub.live_keys()}
        subs.update(self._waiting)
        return pickle.dumps((SNAPSHOT_FORMAT, self.at, subs), protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def restore(cls, settings: RuledMatchSettings, data: bytes) -> "RuledMatchOperator":
        operator = cls(settings)
        got = snapshots.loads(data)
        snapshots.check_format("ruled match operator", got[0], SNAPSHOT_FORMAT)
        _, operator.at, subs = got
        static = subs.pop(_STATIC, None)
        if static is not None and settings.static is not None:
            operator.subs[_STATIC] = MatchOperator.restore(settings.static, static[0])
        operator._waiting = subs
        return operator

    def live_keys(self) -> set[str]:
        keys: set[str] = set()
        for sub in self.subs.values():
            keys |= sub.live_keys()
        for data, closed in self._waiting.values():
            keys |= MatchOperator.snapshot_summary(data)[0]
        return keys

    def next_due(self) -> int:
        """The subs' earliest (transitions change nothing a later event or CTI would not)."""
        due = min((sub.next_due() for sub in self.subs.values()), default=CTI_INFINITY)
        return CTI_NONE if self._waiting else due

    @classmethod
    def traits(cls, settings: RuledMatchSettings) -> Traits:
        return Traits(partitions=settings.static is None or MatchOperator.traits(settings.static).partitions)

    def partition(self, where) -> dict[int, "RuledMatchOperator"]:
        parts: dict[int, RuledMatchOperator] = {}

        def part(d: int) -> RuledMatchOperator:
            p = parts.get(d)
            if p is None:
                p = parts[d] = RuledMatchOperator(self.settings)  # (with an empty static sub)
                p.book, p.at = self.book, self.at
            return p

        for key, sub in self.subs.items():
            for d, piece in sub.partition(where).items():
                part(d).subs[key] = piece
        return parts

    def forget_keys(self, keys) -> None:
        keys = list(keys)
        for sub in self.subs.values():
            sub.forget_keys(keys)

    # -- inspection -------------------------------------------------------------------------
    @property
    def keys_in_flight(self) -> int:
        return sum(sub.keys_in_flight for sub in self.subs.values())

    def partial_match_count(self) -> int:
        return sum(sub.partial_match_count() for sub in self.subs.values())

    def tallies(self) -> dict:
        """Partial matches in flight per rule id (``""``: the operator's own pattern), counted
        from what the snapshots recorded (no key decoded for it); and ``(HELD, rule_id,
        version) → 1`` for each rule version this chunk holds (its state, or a transition it has
        yet to apply): summed over the chunks, what :meth:`RuleBook.forget` may not drop."""
        found: dict = {}
        for (rule_id, _), sub in self.subs.items():
            n = sub.runs_in_flight()
            if n:
                found[rule_id] = found.get(rule_id, 0) + n
        for (rule_id, _), (data, _) in self._waiting.items():
            found[rule_id] = found.get(rule_id, 0) + MatchOperator.snapshot_summary(data)[1]
        found = {k: v for k, v in found.items() if v}
        for key in self.subs.keys() | self._waiting.keys():
            if key != _STATIC:
                found[(HELD, *key)] = 1
        return found


class _StartIndex:
    """One segment's rows by the value of a field many versions' starts test for equality, built
    on first use per field (:func:`ctiflow.operators.cep.operator.start_keys`)."""

    def __init__(self, cols) -> None:
        self.cols = cols
        self.by_field: dict[str, dict | None] = {}
        self._by_key = None

    def _of(self, name: str) -> dict | None:
        if name not in self.by_field:
            column = self.cols.fields[name] if self.cols.dicts is None and name in self.cols.fields else None
            found: dict = {}
            if column is not None:
                try:
                    for i, value in enumerate(column.tolist()):
                        found.setdefault(value, []).append(i)
                except TypeError:  # an unhashable value: no index
                    found = None
            self.by_field[name] = None if column is None else found
        return self.by_field[name]

    def _key_rows(self):
        """Each key code's rows, ascending: ``(rows sorted by key, first position per code)``."""
        if self._by_key is None:
            codes, code_of = self.cols.key_codes()
            order = np.argsort(codes, kind="stable")
            bounds = np.searchsorted(codes[order], np.arange(len(code_of) + 1))
            self._by_key = (order, bounds)
        return self._by_key

    def rows(self, plan, held) -> np.ndarray | None:
        """The rows a version of ``plan`` holding keys ``held`` must see, ascending (None: all of
        them): those whose field has one of its start values, every later row of their keys and
        every row of the keys it holds."""
        best, fewest = None, None
        for name, values in start_keys(plan):  # the field whose values hit the fewest rows
            by_value = self._of(name)
            if by_value is not None:
                hit = [by_value[v] for v in values if v in by_value]
                size = sum(map(len, hit))
                if fewest is None or size < fewest:
                    best, fewest = hit, size
        if best is None:
            return None
        best = [r for rows in best for r in rows]
        if not best and not held:
            return np.zeros(0, np.int64)
        codes, code_of = self.cols.key_codes()
        first: dict[int, int] = {}
        for r in best:
            c = int(codes[r])
            if r < first.get(c, len(codes)):
                first[c] = r
        for k in held:
            c = code_of.get(k)
            if c is not None:
                first[c] = -1
        order, bounds = self._key_rows()
        parts = []
        for c, f in first.items():
            mine = order[bounds[c]:bounds[c + 1]]
            parts.append(mine if f < 0 else mine[mine >= f])
        rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        rows.sort()
        return rows


def _ROW(pair: tuple) -> int:
    return pair[0]
