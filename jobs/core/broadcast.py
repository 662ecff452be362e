"""Broadcast state in a key group (Flink's broadcast state pattern): an operator's side input —
a topic every key group reads whole (``SourceOptions.broadcast``) — feeds a
:class:`ctiflow.operators.operator.SharedState` that all the operator's instances in the group's
chunks share. The runtime knows side inputs and shared states, not what they hold (rules are one:
:class:`ctiflow.operators.cep.rules.RuleBook`).

Every group offers every record to its own copy (all decide alike: the same records at the same
CTIs); one group — the adapter's reporting group — counts them (received; then released when
taken, dead-lettered when refused), writes each refusal's dead letter (the record as it came:
its key and value bytes, its Kafka timestamp; and the reason) and each adjusted record's late
record (the time it asked for, the CTI it takes effect at instead), and reports how far it has
read each partition (``side_read``): so what the job did with every record can be read back
(``ctiflow rules list``). The states are stored in the group's header, last, in the plan's
side-input order.
"""

from __future__ import annotations

from ctiflow.jobs.core import rows
from ctiflow.jobs.core.counters import Counters
from ctiflow.jobs.core.plan import Plan, SideInput
from ctiflow.jobs.state import compat
from ctiflow.jobs.state.chunks import restoring
from ctiflow.operators.columns import EventColumns
from ctiflow.operators.operator import HELD, Output
from ctiflow.operators.time import ViolationPolicy, late_record


class SharedStates:
    """A key group's shared states, one per operator with a side input (``stored``: their
    snapshots from the header, None for a new group)."""

    def __init__(self, plan: Plan, stored: tuple[bytes, ...] | None, reports: bool = True) -> None:
        self.plan = plan
        #: whether this group counts the side inputs' records and writes their dead letters
        self.reports = reports
        self.inputs = {s.stream: s for s in plan.side_inputs}
        with restoring("the key group's shared state"):
            self.states = {s.operator: s.shared.new() if stored is None
                           else compat.restored(s.shared.restore, stored[j])
                           for j, s in enumerate(plan.side_inputs)}

    def __bool__(self) -> bool:
        return bool(self.states)

    def prepare(self, i: int, op) -> None:
        """Hand operator ``i`` of a chunk its shared state (before any other call)."""
        state = self.states.get(i)
        if state is not None:
            op.use_shared(state)

    def offer(self, side: SideInput, cols: EventColumns, cti: int, counters: Counters) -> list:
        """A batch's records of ``side``'s stream, in topic order, each offered against ``cti``;
        → the dead letters of those refused (from the reporting group)."""
        state, out = self.states[side.operator], []
        topic = self.plan.source_topics.get(side.stream, side.stream)
        for i, e in enumerate(cols.events()):
            decision = state.offer_record(e.fields, cti)
            if not self.reports:
                continue
            counters.received += 1
            counters.count(side.stream, e.partition, False)
            read = counters.side_read
            read[(side.stream, e.partition)] = max(read.get((side.stream, e.partition), 0), e.offset + 1)
            if decision.outcome == "adjusted":
                counters.late_records += 1
                out.append((self.plan.late_topic, late_record(
                    e, cti, f"{side.stage} adjusted: its time {e.start} is behind the CTI; it takes "
                            f"effect at {decision.effective}", ViolationPolicy.ADJUST), e.key))
            if decision.outcome != "rejected":
                counters.released += 1
                continue
            counters.dead_letter += 1
            key, stamp = ((e.key.encode(), None) if cols.origin is None
                          else (cols.origin[0][i], cols.origin[1][i]))
            out.append((self.plan.dead_letter_topic, Output("dead_letter", rows.dead_letter(
                topic, e.partition, e.offset, key, e.raw, f"{side.stage} refused: {decision.reason}",
                None if stamp is None or stamp < 0 else int(stamp), stage=side.stage)), e.key))
        return out

    def commit(self, cti: int, tallies: list[dict]) -> tuple:
        """The states as the header keeps them, after each forgot what no chunk holds (``tallies``:
        each operator's tallies over the stored chunks, :data:`HELD` refs among them)."""
        for i, state in self.states.items():
            state.forget(cti, {k[1:] for k in tallies[i] if isinstance(k, tuple) and k[0] == HELD})
        return tuple(state.snapshot() for state in self.states.values())

    def stats(self, cti: int) -> dict[str, dict[str, int]]:
        """Operator name → its shared state's figures, named ``<family>_<figure>``."""
        return {self.plan.operators[i].name: {f"{state.family}_{k}": v for k, v in state.stats(cti).items()}
                for i, state in self.states.items()}
