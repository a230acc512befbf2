"""The RocketMQ 4 clients a broker knows from their heartbeats: producer and consumer groups,
consumer subscriptions. A client is known per connection, as RocketMQ's broker keeps a
ClientChannelInfo per channel: a heartbeat or unregister touches only its own connection's
entry, so no one can replace or remove another connection's client by sending its clientID.
A client leaves on unregister, when its connection closes, or after two minutes without a
heartbeat (RocketMQ's channel expiry)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

EXPIRY_MS = 120_000


@dataclass
class _Client:
    client_id: str
    connection: object
    last_seen_ms: int
    producer_groups: set[str] = field(default_factory=set)
    consumer_groups: set[str] = field(default_factory=set)
    account: object = None  # the account that signed its heartbeat (ACL on)
    consumer_data: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> its ConsumerData, as the heartbeat said


# A SubscriptionData's fields as RocketMQ 4.9's client sends them (ConsumerConnection echoes them).
_SUBSCRIPTION_FIELDS = ("classFilterMode", "codeSet", "expressionType", "subString", "subVersion", "tagsSet", "topic")


@dataclass
class ConsumerGroupView:
    """A consumer group as its live clients' heartbeats describe it (RocketMQ's ConsumerGroupInfo):
    the clients (id, connection), and the newest heartbeat's consume type, message model, where
    to consume from and subscriptions (topic -> SubscriptionData)."""

    clients: list[tuple[str, object]]
    consume_type: str
    message_model: str
    consume_from_where: str
    subscriptions: dict[str, dict[str, Any]]


class ClientTable:
    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._clients: dict[tuple[str, object], _Client] = {}  # (client id, connection) -> client
        # (group, topic) -> (expression, expression type) from the newest heartbeat
        self.subscriptions: dict[tuple[str, str], tuple[str, str]] = {}

    def heartbeat(self, data: dict[str, Any], connection: object, account: object = None) -> list[str]:
        """Record a HeartbeatData body (signed by `account`, ACL on); returns the consumer groups it names."""
        client_id = str(data.get("clientID") or "")
        if not client_id:
            raise ValueError("heartbeat body field clientID: missing")
        client = _Client(client_id, connection, self._clock(), account=account)
        for p in data.get("producerDataSet") or []:
            if isinstance(p, dict) and p.get("groupName"):
                client.producer_groups.add(str(p["groupName"]))
        for c in data.get("consumerDataSet") or []:
            if not isinstance(c, dict) or not c.get("groupName"):
                continue
            group = str(c["groupName"])
            client.consumer_groups.add(group)
            subs = [{k: sub[k] for k in _SUBSCRIPTION_FIELDS if k in sub} for sub in c.get("subscriptionDataSet") or []
                    if isinstance(sub, dict) and sub.get("topic")]
            client.consumer_data[group] = {"consumeType": str(c.get("consumeType") or ""), "messageModel": str(c.get("messageModel") or ""),
                                           "consumeFromWhere": str(c.get("consumeFromWhere") or ""), "subscriptions": subs}
            for sub in c.get("subscriptionDataSet") or []:
                if isinstance(sub, dict) and sub.get("topic"):
                    self.subscriptions[(group, str(sub["topic"]))] = (str(sub.get("subString") or "*"), str(sub.get("expressionType") or "TAG"))
        self._clients[(client_id, connection)] = client
        return sorted(client.consumer_groups)

    def unregister(self, client_id: str, connection: object, groups: list[str] | None = None) -> None:
        """The client on `connection` leaves `groups` (None: all of them); gone once it is in none."""
        key = (client_id, connection)
        client = self._clients.get(key)
        if client is None:
            return
        if groups is None:
            del self._clients[key]
            return
        client.producer_groups.difference_update(groups)
        client.consumer_groups.difference_update(groups)
        if not client.producer_groups and not client.consumer_groups:
            del self._clients[key]

    def topics_of(self, group: str) -> list[str]:
        """The topics `group` subscribes to, as its consumers' heartbeats said."""
        return sorted({t for g, t in self.subscriptions if g == group})

    def connection_closed(self, connection: object) -> list[str]:
        """Forget the clients of a closed connection; the consumer groups they were in."""
        groups: set[str] = set()
        for key in [key for key, c in self._clients.items() if c.connection is connection]:
            groups |= self._clients.pop(key).consumer_groups
        return sorted(groups)

    def consumer_groups_of(self, client_id: str, connection: object) -> set[str]:
        """The consumer groups `client_id` is in on `connection` (none when it is unknown there):
        what a heartbeat adds beyond these is a group it joins."""
        client = self._clients.get((client_id, connection))
        return set(client.consumer_groups) if client is not None else set()

    def consumer_connections(self, group: str) -> list[object]:
        """The connection of each live consumer of `group` (where the broker tells them of changes)."""
        now = self._clock()
        return [c.connection for c in self._clients.values() if group in c.consumer_groups and now - c.last_seen_ms <= EXPIRY_MS]

    def producers(self, group: str) -> list[tuple[str, object, object]]:
        """(client id, connection, account) of each live client whose heartbeat named producer `group`."""
        now = self._clock()
        return sorted(((c.client_id, c.connection, c.account) for c in self._clients.values()
                       if group in c.producer_groups and now - c.last_seen_ms <= EXPIRY_MS), key=lambda t: t[0])

    def consumer_group(self, group: str) -> ConsumerGroupView | None:
        """`group` as its live consumers describe it; None when none is live."""
        now = self._clock()
        live = sorted((c for c in self._clients.values() if group in c.consumer_groups and now - c.last_seen_ms <= EXPIRY_MS),
                      key=lambda c: c.client_id)
        if not live:
            return None
        newest = max(live, key=lambda c: c.last_seen_ms).consumer_data.get(group, {})
        return ConsumerGroupView([(c.client_id, c.connection) for c in live], newest.get("consumeType", ""), newest.get("messageModel", ""),
                                 newest.get("consumeFromWhere", ""), {str(s["topic"]): s for s in newest.get("subscriptions", [])})

    def consumers(self, group: str) -> list[str]:
        now = self._clock()
        for key in [key for key, c in self._clients.items() if now - c.last_seen_ms > EXPIRY_MS]:
            del self._clients[key]
        return sorted({c.client_id for c in self._clients.values() if group in c.consumer_groups})
