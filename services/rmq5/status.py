"""Statuses in the SDKs' terms: `apache.rocketmq.v2.Status` with a Code and a message that
names the field and the rule. Every failure travels in-band (the response's status), as
RocketMQ's proxy answers, so the SDK raises a readable exception instead of a transport error.
"""
from __future__ import annotations

from quarry.formats.topic import TopicError, validate_group, validate_topic
from quarry.services.commitlog.storage.errors import DiskFull, Expired, InvalidArgument, NotFound, ReadOnly, StoreError
from quarry.services.rmq5.contract import Code, v2


class RmqError(Exception):
    """A refusal with its RocketMQ 5 code; `message` names the field and the rule."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{v2.Code.Name(code)}: {message}")
        self.code = code
        self.message = message


_OK = Code.OK  # looked up once: each read through protobuf's enum wrapper is a Python call


def ok() -> v2.Status:
    return v2.Status(code=_OK, message="OK")


def status_of(exc: RmqError) -> v2.Status:
    return v2.Status(code=exc.code, message=exc.message)


def _field_code(field: str, rule: str) -> int:
    """The most specific code for a store InvalidArgument, from the field it names."""
    name = field.rsplit(".", 1)[-1]
    if name == "body":
        return Code.MESSAGE_BODY_EMPTY if "empty" in rule else Code.MESSAGE_BODY_TOO_LARGE
    if name == "topic":
        return Code.ILLEGAL_TOPIC
    if name.startswith("keys"):
        return Code.ILLEGAL_MESSAGE_KEY
    if name == "tags":
        return Code.ILLEGAL_MESSAGE_TAG
    if name == "unique_key":
        return Code.ILLEGAL_MESSAGE_ID
    if "properties" in field:
        return Code.MESSAGE_PROPERTIES_TOO_LARGE if "bytes, at most" in rule else Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    return Code.BAD_REQUEST


# The store's field names, as an SDK user knows them (apache.rocketmq.v2.Message).
_SDK_FIELD = {"tags": "system_properties.tag", "unique_key": "system_properties.message_id", "keys": "system_properties.keys"}


def from_store_error(exc: StoreError) -> RmqError:
    """One mapping from the store's errors to RocketMQ 5 codes."""
    if isinstance(exc, InvalidArgument):
        head, _, index = exc.field.partition("[")
        field = _SDK_FIELD.get(head, head) + (f"[{index}" if index else "")
        return RmqError(_field_code(exc.field, exc.rule), f"{field}: {exc.rule}")
    if isinstance(exc, NotFound):
        return RmqError(Code.TOPIC_NOT_FOUND if "topic" in str(exc) else Code.NOT_FOUND, str(exc))
    if isinstance(exc, Expired):
        return RmqError(Code.MESSAGE_NOT_FOUND, str(exc))
    if isinstance(exc, ReadOnly):
        return RmqError(Code.FORBIDDEN, f"broker: {exc} (no writes accepted)")
    if isinstance(exc, DiskFull):
        return RmqError(Code.INTERNAL_SERVER_ERROR, f"broker: {exc}")
    return RmqError(Code.INTERNAL_SERVER_ERROR, str(exc))


def check_group(group: v2.Resource, field: str = "group.name") -> str:
    name = group.name
    try:
        validate_group(name, field)
    except TopicError as exc:
        raise RmqError(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from None
    if group.resource_namespace:
        raise RmqError(Code.BAD_REQUEST, f"{field.rsplit('.', 1)[0]}.resource_namespace: namespaces are not supported; leave it empty")
    return name


def check_topic(topic: v2.Resource, field: str = "topic.name") -> str:
    try:
        validate_topic(topic.name, field)
    except TopicError as exc:
        raise RmqError(Code.ILLEGAL_TOPIC, str(exc)) from None
    return topic.name
