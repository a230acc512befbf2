"""Typed results: messages with every MessageExt field, query results, send results."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quarry.formats.addresses import format_host_port
from quarry.v1 import common_pb2, router_pb2


@dataclass
class Message:
    """A stored message (RocketMQ MessageExt) with properties decoded and the body as bytes."""

    topic: str
    body: bytes
    properties: dict[str, str]
    property_pairs: list[tuple[str, str]]
    keys: list[str]
    tags: str
    unique_key: str
    flag: int
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int
    offset_msg_id: str
    broker_name: str
    scheduled: bool = False  # a delayed message (parked for real_topic, or carrying a delay)
    deliver_timestamp: int = 0
    real_topic: str = ""

    @classmethod
    def from_proto(cls, m: common_pb2.StoredMessage) -> "Message":
        pairs = [(p.name, p.value) for p in m.properties]
        return cls(
            topic=m.topic, body=m.body, properties={n: v for n, v in pairs if n and v}, property_pairs=pairs,
            keys=list(m.keys), tags=m.tags, unique_key=m.unique_key, flag=m.flag, queue_id=m.queue_id,
            queue_offset=m.queue_offset, commit_log_offset=m.commit_log_offset, store_size=m.store_size,
            sys_flag=m.sys_flag, born_timestamp=m.born_timestamp, born_host=_host(m.born_host),
            store_timestamp=m.store_timestamp, store_host=_host(m.store_host), reconsume_times=m.reconsume_times,
            prepared_transaction_offset=m.prepared_transaction_offset, body_crc=m.body_crc,
            offset_msg_id=m.offset_msg_id, broker_name=m.broker_name,
            scheduled=m.scheduled, deliver_timestamp=m.deliver_timestamp, real_topic=m.real_topic,
        )

    def to_json(self, with_body: bool = True) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("body", "property_pairs")}
        if with_body:
            try:
                out["body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                out["body_hex"] = self.body.hex()
        return out


def _host(h: common_pb2.HostAddress) -> str:
    return format_host_port(h.ip, h.port)


@dataclass
class BrokerOutcome:
    broker_name: str
    answered: bool
    error_code: str
    error_message: str
    latency_ms: int


@dataclass
class QueryResult:
    """What the router answered: messages plus every broker's outcome."""

    messages: list[Message]
    brokers: list[BrokerOutcome]
    complete: bool
    collisions_filtered: int = 0
    copies: int = 0
    notes: list[str] = field(default_factory=list)
    next_token: str = ""
    raw: router_pb2.QueryResult | None = field(default=None, repr=False, compare=False)  # as the router sent it
    # Browse pages: per broker, what of the window retention deleted (BrowseTopicResponse.expired).
    expired: list[common_pb2.ExpiredRange] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def from_proto(cls, r: router_pb2.QueryResult) -> "QueryResult":
        return cls(
            messages=[Message.from_proto(m) for m in r.messages],
            brokers=[BrokerOutcome(o.broker_name, o.answered, o.error_code, o.error_message, o.latency_ms) for o in r.brokers],
            complete=r.complete, collisions_filtered=r.collisions_filtered, copies=r.copies,
            notes=list(r.notes), next_token=r.next_continuation_token, raw=r,
        )

    def extended(self, page: "QueryResult") -> "QueryResult":
        """This result followed by the next page of the same query (as one answer)."""
        raw = router_pb2.QueryResult()
        if self.raw is not None:
            raw.CopyFrom(self.raw)
        if page.raw is not None:
            raw.messages.extend(page.raw.messages)
            failed = {o.broker_name for o in raw.brokers if not o.answered}
            raw.brokers.extend(o for o in page.raw.brokers if not o.answered and o.broker_name not in failed)
            raw.complete = raw.complete and page.raw.complete
            raw.collisions_filtered += page.raw.collisions_filtered
            raw.next_continuation_token = page.raw.next_continuation_token
        return QueryResult.from_proto(raw)

    @property
    def failed_brokers(self) -> list[BrokerOutcome]:
        return [b for b in self.brokers if not b.answered]


@dataclass(frozen=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


@dataclass(frozen=True)
class SendResult:
    """RocketMQ's SendResult: msgId is the unique key, offsetMsgId where it is stored."""

    send_status: str
    msg_id: str
    offset_msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    raw: common_pb2.SendResult | None = field(default=None, repr=False, compare=False)  # as the broker sent it

    def __str__(self) -> str:
        return (
            f"SendResult [sendStatus={self.send_status}, msgId={self.msg_id}, offsetMsgId={self.offset_msg_id}, "
            f"messageQueue={self.message_queue}, queueOffset={self.queue_offset}]"
        )
