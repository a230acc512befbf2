"""What the store reads of a message handed to it, and the rules a message must pass.

The store takes messages as they come: a front door's own message objects (the quarry.v1
protobuf MessageInput) or `NewMessage` (in-process callers, the RocketMQ 4 and 5 doors), both
read through `MessageFields`, so no per-message object is built between the request and the
log bytes. The append (`append.py`) checks every message in its one pass with cheap guards;
when a guard trips, `reject` runs the rules in order and raises the error naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, Sequence

from quarry.formats.properties import PropertyError, stored_properties
from quarry.formats.record import host_bytes
from quarry.formats.topic import TopicError, validate_topic
from quarry.services.commitlog.storage.errors import InvalidArgument


class PropertyFields(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> str: ...


class HostFields(Protocol):
    @property
    def ip(self) -> str: ...  # "": the caller's address (the append's `peer`)
    @property
    def port(self) -> int: ...


class MessageFields(Protocol):
    """The fields of a message the store reads (RocketMQ `Message` plus the born fields)."""

    @property
    def topic(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def keys(self) -> Sequence[str]: ...
    @property
    def tags(self) -> str: ...
    @property
    def unique_key(self) -> str: ...
    @property
    def properties(self) -> Sequence[PropertyFields]: ...
    @property
    def flag(self) -> int: ...
    @property
    def queue_id(self) -> int: ...  # -1: the store picks
    @property
    def born_timestamp(self) -> int: ...  # 0: the store time
    @property
    def born_host(self) -> HostFields: ...
    @property
    def sys_flag(self) -> int: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def prepared_transaction_offset(self) -> int: ...


class Host(NamedTuple):
    ip: str
    port: int


class Property(NamedTuple):
    name: str
    value: str


@dataclass(slots=True)
class NewMessage:
    """A message built in process (a MessageFields); plain (ip, port) and (name, value) tuples
    are taken for the born host and the properties."""

    topic: str
    body: bytes
    keys: list[str] = field(default_factory=list)
    tags: str = ""
    unique_key: str = ""
    properties: list[Property] = field(default_factory=list)
    flag: int = 0
    queue_id: int = -1
    born_timestamp: int = 0
    born_host: Host = Host("127.0.0.1", 0)
    sys_flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    def __post_init__(self) -> None:
        if type(self.born_host) is not Host:
            self.born_host = Host(*self.born_host)
        if self.properties and type(self.properties[0]) is not Property:
            self.properties = [Property(*p) for p in self.properties]


INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def not_one_topic(index: int, first_topic: str) -> InvalidArgument:
    """The error of a batch (which holds one topic) whose message `index` names another."""
    return InvalidArgument(f"messages[{index}].topic", f"a batch holds one topic ({first_topic!r})")


def queue_out_of_range(field_prefix: str, queue_id: int, topic: str, queues: int) -> InvalidArgument:
    """The error of a message asking for a queue its topic does not have."""
    return InvalidArgument(f"{field_prefix}queue_id", f"{queue_id} out of range: topic {topic} has queues 0..{queues - 1}")


def reject(msg: MessageFields, field_prefix: str, max_message_size: int, peer: tuple[str, int] | None) -> None:
    """Raise InvalidArgument naming the first field of `msg` that breaks a rule (the append
    calls this only once a cheap check failed; it returns if every rule holds)."""
    try:
        validate_topic(msg.topic, f"{field_prefix}topic")
    except TopicError as exc:
        raise InvalidArgument(str(exc).split(":", 1)[0], str(exc).split(": ", 1)[1]) from None
    body = msg.body
    if not body:
        raise InvalidArgument(f"{field_prefix}body", "must not be empty")
    if len(body) > max_message_size:
        raise InvalidArgument(f"{field_prefix}body", f"{len(body)} bytes exceeds the max message size {max_message_size}")
    if msg.queue_id < -1:
        raise InvalidArgument(f"{field_prefix}queue_id", "must be >= 0, or -1 to let the broker choose")
    if msg.born_timestamp < 0:
        raise InvalidArgument(f"{field_prefix}born_timestamp", "must be >= 0")
    if msg.reconsume_times < 0:
        raise InvalidArgument(f"{field_prefix}reconsume_times", "must be >= 0")
    if msg.prepared_transaction_offset < 0:
        raise InvalidArgument(f"{field_prefix}prepared_transaction_offset", "must be >= 0")
    # The record's widths (RocketMQ's): what does not fit is refused, not cut.
    if msg.born_timestamp > INT64_MAX:
        raise InvalidArgument(f"{field_prefix}born_timestamp", f"must be at most {INT64_MAX} (ms, a 64-bit field)")
    if msg.prepared_transaction_offset > INT64_MAX:
        raise InvalidArgument(f"{field_prefix}prepared_transaction_offset", f"must be at most {INT64_MAX} (a 64-bit field)")
    if msg.reconsume_times > INT32_MAX:
        raise InvalidArgument(f"{field_prefix}reconsume_times", f"must be at most {INT32_MAX} (a 32-bit field)")
    if not -INT32_MAX - 1 <= msg.flag <= INT32_MAX:
        raise InvalidArgument(f"{field_prefix}flag", f"must be {-INT32_MAX - 1}..{INT32_MAX} (a 32-bit field, as RocketMQ's Message.flag)")
    host = msg.born_host
    ip, port = (host.ip, host.port) if host.ip or peer is None else peer
    if not 0 <= port <= 65535:
        raise InvalidArgument(f"{field_prefix}born_host.port", "must be 0..65535")
    try:
        stored_properties(msg.keys, msg.tags, msg.unique_key, msg.properties, field_prefix)
    except PropertyError as exc:
        name, _, rule = str(exc).partition(": ")
        raise InvalidArgument(name, rule) from None
    try:
        host_bytes((ip, port))
    except ValueError as exc:
        raise InvalidArgument(f"{field_prefix}born_host", str(exc)) from None
