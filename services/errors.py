"""Errors every service raises, in the services' own words: no gRPC vocabulary here.

Storage, indexing and query code raise these; `services/status.py` is the one place that
maps them to gRPC status codes (docs/errors.md has the table). The message is what the
caller reads: it names the field and the rule, or what was not found and where.
"""
from __future__ import annotations

from quarry.formats.topic import TopicError, validate_topic


class ServiceError(Exception):
    """Base of every error reported to a caller; `message` is sent as the status details."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def prefixed(self, prefix: str) -> "ServiceError":
        """The same error with `prefix` before its message (where in a stream it happened)."""
        self.message = prefix + self.message
        return self


class InvalidArgument(ServiceError):
    """Bad input: names the field and the rule. Nothing was changed."""

    def __init__(self, field: str, rule: str | None = None) -> None:
        # InvalidArgument("key", "must not be empty"), or a message already naming its field.
        super().__init__(field if rule is None else f"{field}: {rule}")
        self.field = field if rule is not None else field.partition(":")[0]
        self.rule = rule if rule is not None else field.partition(": ")[2]


class NotFound(ServiceError):
    """No record, topic, queue, broker or message where the caller pointed."""


class DamagedRecord(NotFound):
    """A record is there but damaged (its CRC or frame fails): it cannot be served, and a
    query that needed it must say so rather than answer as if nothing matched."""


class Expired(ServiceError):
    """The offset lies outside what is kept: below the minimum (retention) or past the end."""


class ReadOnly(ServiceError):
    """The store was opened read-only, or is closed: it takes no writes."""


class DiskFull(ServiceError):
    """No space left: nothing from this call was acknowledged."""


class Conflict(ServiceError):
    """What the request claims is already held by another (a store host another live broker
    announced); nothing was changed."""


class Unavailable(ServiceError):
    """A service this one depends on did not answer; the same call may succeed later."""


def checked_topic(topic: str, field: str = "topic") -> str:
    """`topic`, or InvalidArgument naming `field` and the RocketMQ topic rule it breaks."""
    try:
        validate_topic(topic, field)
    except TopicError as exc:
        raise InvalidArgument(str(exc)) from None
    return topic
