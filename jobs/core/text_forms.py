"""The text forms a job file and a rule definition share, read the same way on the driver and on
the executors (which compile rule definitions): durations such as ``10m``, a pattern's ``within``
written as the Pattern API's ``within_ms``, and YAML read under bounds checked before any value is
built. Nothing here knows the configuration model."""

from __future__ import annotations

import re
from typing import Any

import yaml

from ctiflow.operators.errors import ConfigError

_DURATION = re.compile(r"^\s*(-?\d+)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


#: The longest duration a job may give (100 years): event times are ms since 1970 in a long.
MAX_DURATION_MS = 100 * 365 * 86_400_000


def duration_ms(value: Any) -> int:
    """Durations as ms: an int (ms) or a string like '5s', '10m', '1h', '-1ms'; at most
    :data:`MAX_DURATION_MS` either way."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of ms or a string like '5s'")
    ms = None
    if isinstance(value, int):
        ms = value
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            ms = int(m.group(1)) * _UNIT_MS[m.group(2)]
    if ms is None:
        raise ValueError(f"{value!r} is not a duration; use ms (e.g. 5000) or '5s', '10m', '1h'")
    if abs(ms) > MAX_DURATION_MS:
        raise ValueError(f"{value!r} is longer than 100 years; give a duration like '5m', '7d'")
    return ms


def pattern_durations(spec: Any, where: str) -> Any:
    """A pattern (or stage) with ``within: '10m'`` / ``window: '1m'`` written as the pattern
    API's ``within_ms`` / ``window_ms``, through its stages and groups."""
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    for short in ("within", "window"):
        if short in spec:
            if f"{short}_ms" in spec:
                raise ValueError(f"{where}: give {short} or {short}_ms, not both")
            try:
                spec[f"{short}_ms"] = duration_ms(spec.pop(short))
            except ValueError as exc:
                raise ValueError(f"{where}.{short}: {exc}") from None
    for key in ("stages", "group"):
        if isinstance(spec.get(key), list):
            spec[key] = [pattern_durations(stage, f"{where}.stage {stage.get('name')!r}"
                                            if isinstance(stage, dict) else where) for stage in spec[key]]
    return spec


#: The most values a YAML text (a job file, a rule's definition) may expand to: YAML aliases repeat
#: a node without repeating its text, so 500 bytes can stand for a billion values.
MAX_YAML_VALUES = 100_000
#: The deepest a YAML text may nest (flow ``[`` / ``{`` or indentation): PyYAML composes a node by
#: recursion, so depth is refused while composing, before it could exhaust the stack.
MAX_YAML_DEPTH = 100
#: The longest integer a YAML text may write (characters): past it no value of ours fits, and
#: Python's int() of a long digit string is slow (refused outright past 4,300 digits).
MAX_YAML_INTEGER = 100


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader under bounds checked while the node graph is composed, before any
    value is constructed: at most :data:`MAX_YAML_DEPTH` levels, at most :data:`MAX_YAML_VALUES`
    values once every alias (and merge ``<<``) counts each time it is used — counted per node once,
    so a billion-laughs text costs its own size — and no alias inside its own anchor. While values
    are constructed: integers of at most :data:`MAX_YAML_INTEGER` characters, and no key given twice
    in one mapping (PyYAML keeps the last silently): a job file's second ``delay:`` is a mistake,
    not an override."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values: dict[int, int] = {}  # id(node) → the values it expands to

    def compose_node(self, parent, index):
        if self._depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep; "
                                              "write it flatter", self.peek_event().start_mark)
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            anchor = self.anchors.get(event.anchor)
            if anchor is not None and id(anchor) not in self._values:  # (still being composed)
                raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor} is used inside its own "
                                                  "anchor (it would nest for ever)", event.start_mark)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        known = self._values.get(id(node))
        if known is None:  # (an alias returns its anchor's node, counted already)
            children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else
                        node.value if isinstance(node, yaml.SequenceNode) else [])
            known = self._values[id(node)] = 1 + sum(self._values.get(id(c), 1) for c in children)
        if known > MAX_YAML_VALUES:
            raise yaml.composer.ComposerError(
                None, None, f"expands to more than {MAX_YAML_VALUES:,} values (YAML aliases `*name` repeat "
                "what they name): write it out, or use fewer nested aliases", node.start_mark)
        return node

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # (an unhashable key: PyYAML's own check refuses it)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping (first on line {seen[key] + 1}); "
                    "keep one", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        if len(node.value) > MAX_YAML_INTEGER:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {len(node.value):,} characters (at most {MAX_YAML_INTEGER}: "
                "no setting takes a larger number)", node.start_mark)
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_yaml(text: str, origin: str) -> Any:
    """``text`` as YAML under the bounds of :class:`_BoundedLoader` (depth, values with aliases
    expanded, keys given twice), each checked before the value is built: the job file's loader
    and a rule definition's (:func:`ctiflow.jobs.core.definitions.parse_pattern`) are this one. Anything
    the text does wrong is a :class:`ConfigError` starting with ``origin``."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML: {exc}") from None
