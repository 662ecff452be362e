"""The one planner: a job's configuration → its :class:`ctiflow.jobs.core.plan.Plan`, on the driver.

Every operator is built here from its configuration (:func:`build_operator`: a configuration
class keeps only its settings), and every check that needs the job's schemas runs here, before
Spark starts. The executors receive only the plan: operator classes with their settings, and for
rules a :class:`ctiflow.jobs.core.definitions.RuleCompiler` value — never the configuration.

The path of a job file to the executors: ``config.load`` (the model, validated) →
:func:`plan_job` (fields checked, operators built, schemas derived) → the :class:`Plan`, pickled
into the adapter (:mod:`ctiflow.jobs.datapath.adapter`) → each key group's
:class:`ctiflow.jobs.core.runtime.GroupRuntime`.
"""

from __future__ import annotations

from typing import Any

from ctiflow.jobs.driver.config import BinsOp, CountOp, JobConfig, MatchOp, PassthroughOp
from ctiflow.jobs.core.definitions import RuleCompiler, pattern_settings, sql_settings
from ctiflow.jobs.driver.fields import check_fields
from ctiflow.jobs.core.plan import OperatorSpec, Plan, SideInput
from ctiflow.jobs.driver.recognize import derived_schemas, fast_source, match_target
from ctiflow.operators.bins import Binner, BinSettings
from ctiflow.operators.cep.operator import MatchOperator
from ctiflow.operators.cep.rules import RuleBookSpec, RuledMatchOperator, RuledMatchSettings, RulesSettings
from ctiflow.operators.count import CountOperator, CountSettings, compile_predicate
from ctiflow.operators.errors import ConfigError, CtiflowError
from ctiflow.operators.passthrough import Passthrough
from ctiflow.operators.reference import ReferenceJoinSettings, SyncMode
from ctiflow.operators.time import AdvanceTimeSettings, ViolationPolicy


def plan_job(cfg: JobConfig) -> Plan:
    """The plan of a job: its fields and operators checked (unknown schemas and fields, a
    pattern or query that does not compile fail here, before Spark starts), the schemas its
    operators derive registered with the plan."""
    streams = {s.name: _time_settings(s) for s in cfg.sources}
    reference = None
    fast = cfg.sources[0].name
    if cfg.reference is not None:
        fast = cfg.reference.fast
        reference = ReferenceJoinSettings(fast_stream=fast, reference_stream=cfg.reference.source,
                                          missing=cfg.reference.missing, sync=cfg.reference.sync)
        streams = reference.time_settings(streams[fast], streams[cfg.reference.source])
    check_fields(cfg, f"job {cfg.job!r}")  # unknown schemas and fields fail here, before Spark starts
    schemas = derived_schemas(cfg)
    cti_streams = (fast,) if cfg.reference is not None and cfg.reference.sync == "import" else tuple(streams)
    operators = tuple(OperatorSpec(op.name, *build_operator(op, cfg), op.roles()) for op in cfg.operators)
    side_inputs = tuple(SideInput(op.rules_stream, i,
                                  RuleBookSpec(operators[i].settings.rules, rule_compiler(op, cfg)),
                                  SyncMode(op.rules.sync).value)
                        for i, op in enumerate(cfg.operators) if op.ruled)
    cti_streams += tuple(s.stream for s in side_inputs if s.sync == "min")
    return Plan(streams=streams, fast=fast, reference=reference, operators=operators,
                late_topic=cfg.late_topic, dead_letter_topic=cfg.dead_letter_topic,
                enriched_topic=cfg.reference.output if cfg.reference else None,
                cti_streams=cti_streams, delays={s.name: s.cti.delay for s in cfg.read_sources},
                source_topics={s.name: s.topic for s in cfg.read_sources}, ttl=cfg.state.ttl,
                side_inputs=side_inputs, key_groups=cfg.key_groups, chunk_keys=cfg.state.chunk_keys,
                delta_share=cfg.state.delta_share,
                cache_chunks=cfg.state.cache_chunks, schemas=schemas)


def _time_settings(src) -> AdvanceTimeSettings:
    # In Spark the CTIs come from the watermark (ctiflow.jobs.datapath.adapter), so no generation here.
    return AdvanceTimeSettings(delay=src.cti.delay, frequency=None, flush_at_end=src.cti.flush_at_end,
                               policy=ViolationPolicy(src.cti.policy))


def build_operator(op, cfg: JobConfig) -> tuple[type, Any]:
    """``(operator class, settings)`` of one configured operator — the one place operators are
    built; a predicate, pattern or query that does not compile is a :class:`ConfigError` naming
    the field, here, before Spark starts. A match operator with ``rules`` is a
    :class:`RuledMatchOperator` around its own pattern or query, if any."""
    if isinstance(op, CountOp):
        try:
            compile_predicate(op.predicate)
        except CtiflowError as exc:
            raise ConfigError(f"operators.{op.name}.predicate: {exc}") from None
        kind, size = ("events", op.window.events) if op.window.events else ("time", op.window.time)
        return CountOperator, CountSettings(name=op.name, window_kind=kind, window=size, epsilon=op.epsilon,
                                            per_key=op.per_key, predicate=op.predicate,
                                            value_field=op.value_field, emit=op.emit)
    if isinstance(op, BinsOp):  # a late event's share follows the fast stream's policy
        return Binner, BinSettings(name=op.name, bin_size=op.bin_size, origin=op.origin,
                                   measures=tuple(op.measures), outputs=frozenset(op.outputs),
                                   policy=ViolationPolicy(fast_source(cfg).cti.policy))
    if isinstance(op, PassthroughOp):
        return Passthrough, None
    if not isinstance(op, MatchOp):
        raise TypeError(f"no operator is built from {type(op).__name__}")
    target = match_target(op, cfg)
    static = None
    if op.sql is not None:
        static = sql_settings(target, op.sql, f"operators.{op.name}.sql")[0]
    elif op.pattern is not None:
        static = pattern_settings(target, op.pattern, f"operators.{op.name}.pattern")
    if op.rules is None:
        return MatchOperator, static
    rules = RulesSettings(op.name, on_change=op.rules.on_change, late_rules=op.rules.late_rules,
                          max_rules=op.rules.max_rules)
    return RuledMatchOperator, RuledMatchSettings(static, rules, measures=op.language == "sql",
                                                  max_partial_matches=op.max_partial_matches,
                                                  max_buffered_events=op.max_buffered_events)


def rule_compiler(op: MatchOp, cfg: JobConfig) -> RuleCompiler:
    """How the rules of ``op`` compile: a value that carries no configuration to the executors."""
    return RuleCompiler(match_target(op, cfg), op.language)
