"""One exception hierarchy for the whole project.

Messages say what was wrong, where, and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable


class CtiflowError(Exception):
    """Base class of every error ctiflow raises on purpose."""


def _listed(message: str, problems: list[str] | None) -> str:
    """An error's text: ``message``, or with ``problems`` a heading and them as a list (without a
    heading, one per line)."""
    if problems is None:
        return message
    return "\n".join([message, *(f"  - {p}" for p in problems)]) if message else "\n".join(problems)


class ConfigError(CtiflowError):
    """A configuration value is missing or invalid; the message names the field and the fix.
    ``problems``: each problem on its own when there are several; the message is then a heading
    followed by them as a list (or, without one, them one per line)."""

    def __init__(self, message: str = "", problems: list[str] | None = None) -> None:
        super().__init__(_listed(message, problems))
        self.problems = problems


class SchemaError(CtiflowError):
    """A record does not match its Avro schema, or a schema cannot be found or parsed."""


class DecodeError(SchemaError):
    """Bytes on a topic could not be decoded into a record (the reason goes to dead-letter)."""


class EventRejected(CtiflowError, ValueError):
    """An operator refuses one event because of its *data* (a measure that is not a finite
    number, an expression that fails on the record, an event that cannot be prorated). The
    job writes the event to the dead-letter topic with this message and keeps running; every
    other exception from an operator is a bug and fails the micro-batch. (Also a ValueError,
    which these refusals were before.) ``outputs``: records the operator emitted for the same
    call before it refused the event (e.g. matches released by time passing); the job writes
    them as usual."""

    outputs: list = []


class PatternError(CtiflowError):
    """A CEP pattern is malformed (names the stage and the problem). ``problems``: each problem
    on its own when several were found at once (as :class:`ConfigError`'s)."""

    def __init__(self, message: str = "", problems: list[str] | None = None) -> None:
        super().__init__(_listed(message, problems))
        self.problems = problems


class StackError(CtiflowError):
    """The embedded stack (broker) could not be started, reached or stopped."""


def invalid_choice(field: str, value: object, valid: Iterable[object],
                   error: type[CtiflowError] | None = None, where: str = "") -> CtiflowError:
    """The one "invalid choice" message: ``[where: ]Invalid "field" value: 'x'. Valid choices
    are: a, b.`` — returned (as ``error``, a :class:`ConfigError` by default) for the caller to
    raise."""
    prefix = f"{where}: " if where else ""
    choices = ", ".join(str(v) for v in valid)
    return (error or ConfigError)(f'{prefix}Invalid "{field}" value: {value!r}. Valid choices are: '
                                  f'{choices}.')


class StateError(CtiflowError):
    """A snapshot that cannot be restored (damaged, or written by another version or
    configuration of the job). Never dead-lettered: the micro-batch fails and says what to do."""
