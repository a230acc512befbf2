"""A producer over the router's routes and the brokers' commitlogs (like DefaultMQProducer).

Example:
    with Producer("127.0.0.1:9876") as p:
        r = p.send("OrderTopic", b"paid", keys=["order-1001"], tags="paid")
        print(r)   # SendResult [sendStatus=SEND_OK, msgId=…, offsetMsgId=…, …]
"""
from __future__ import annotations

import itertools
import os
import random
import socket
import threading
from datetime import datetime
from typing import Any, Callable, Sequence

import grpc

from quarry.channels import open_channel
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from quarry.clients.batch_results import batch_send_results
from quarry.clients.errors import InvalidArgumentError, NotFoundError, QuarryError, UnavailableError, from_rpc_error
from quarry.clients.model import MessageQueue, SendResult
from quarry.clients.routers import RouterPool
from quarry.formats.properties import PropertyError, message_properties
from quarry.formats.topic import AUTO_CREATE_TOPIC_KEY, DEFAULT_TOPIC_QUEUE_NUMS, TopicError, validate_topic
from quarry.formats.unique_key import UniqueKeyGenerator
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, router_pb2

Selector = Callable[[list[MessageQueue], Any], MessageQueue]
_GENERATOR: UniqueKeyGenerator | None = None
_GEN_LOCK = threading.Lock()


def unique_key_generator() -> UniqueKeyGenerator:
    """One UNIQ_KEY generator per process, as RocketMQ's static MessageClientIDSetter."""
    global _GENERATOR
    with _GEN_LOCK:
        if _GENERATOR is None:
            try:
                ip = socket.gethostbyname(socket.gethostname())
            except OSError:
                ip = "127.0.0.1"
            # The class-loader hash of the Java client: any per-process int serves.
            _GENERATOR = UniqueKeyGenerator(ip, os.getpid(), random.getrandbits(31), datetime.now().astimezone().tzinfo)  # type: ignore[arg-type]
        return _GENERATOR


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, UnavailableError)


class Producer:
    """Sends messages to the brokers that hold a topic, retrying elsewhere when one is down."""

    def __init__(self, router_addr: str, retries: int = 2, timeout_s: float = 5.0, max_message_size: int = 4 * 1024 * 1024,
                 account: tuple[str, str] | None = None) -> None:
        """`router_addr`: host:port, or several routers as 'a:9876;b:9876' (tried in turn);
        `account`: (access key, secret key) signing every call instead of QUARRY_ACCESS_KEY's."""
        self.router_addr = router_addr
        self.account = account
        self._routers = RouterPool(router_addr, account=account)
        self.retries = retries
        self.timeout_s = timeout_s
        self.max_message_size = max_message_size
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, commitlog_pb2_grpc.CommitLogServiceStub] = {}
        self._routes: dict[str, list[tuple[MessageQueue, str]]] = {}
        # Round robin starts at a random queue, as RocketMQ's ThreadLocalIndex: producers
        # that each send a few messages (a CLI run) spread over the queues and brokers
        # instead of all starting on the first one.
        self._counter = itertools.count(random.randrange(1 << 16))
        self._lock = threading.Lock()

    # -- channels and routes --------------------------------------------------------------
    def _channel(self, addr: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(addr)
            if ch is None:
                ch = self._channels[addr] = open_channel(addr, options=[("grpc.max_send_message_length", 128 << 20)], account=self.account)
            return ch

    def _stub(self, addr: str) -> commitlog_pb2_grpc.CommitLogServiceStub:
        # One per broker: a stub makes a callable per method of the service, too dear per send.
        stub = self._stubs.get(addr)
        if stub is None:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(self._channel(addr))
            with self._lock:
                stub = self._stubs.setdefault(addr, stub)
        return stub

    def route(self, topic: str, refresh: bool = False) -> list[tuple[MessageQueue, str]]:
        """(queue, commitlog address) pairs of a topic; a topic no broker holds yet goes to
        every broker that creates topics on first send (see _auto_create_route)."""
        if not refresh and topic in self._routes:
            return self._routes[topic]
        try:
            resp = self._routers.call(lambda r: r.GetTopicRoute(router_pb2.GetTopicRouteRequest(topic=topic), timeout=self.timeout_s))
            queues = [(MessageQueue(topic, b.broker_name, q), b.commitlog_addr) for b in resp.brokers for q in range(b.queue_count)]
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                raise from_rpc_error(exc) from None
            queues = self._auto_create_route(topic)
        if not queues:
            raise UnavailableError("UNAVAILABLE", f"no live broker to send topic {topic} to")
        # Interleave brokers (a0, b0, a1, b1, …) so round robin spreads load from the first send.
        queues.sort(key=lambda q: (q[0].queue_id, q[0].broker_name))
        self._routes[topic] = queues
        return queues

    def _auto_create_route(self, topic: str) -> list[tuple[MessageQueue, str]]:
        """A topic no broker holds yet goes along TBW102's route, as RocketMQ's producer does:
        to every broker that creates topics on first send (each then holds it), using at most
        DEFAULT_TOPIC_QUEUE_NUMS queues of each."""
        try:
            resp = self._routers.call(lambda r: r.GetTopicRoute(router_pb2.GetTopicRouteRequest(topic=AUTO_CREATE_TOPIC_KEY), timeout=self.timeout_s))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                raise NotFoundError("NOT_FOUND", f"topic {topic} does not exist and no live broker creates topics on first send") from None
            raise from_rpc_error(exc) from None
        return [(MessageQueue(topic, b.broker_name, q), b.commitlog_addr) for b in resp.brokers for q in range(min(DEFAULT_TOPIC_QUEUE_NUMS, b.queue_count))]

    # -- sending --------------------------------------------------------------------------
    def _input(self, topic: str, body: bytes, keys: str | Sequence[str] | None, tags: str, properties: dict[str, str] | None, unique_key: str | None, flag: int) -> common_pb2.MessageInput:
        try:
            validate_topic(topic)
        except TopicError as exc:
            raise InvalidArgumentError("INVALID_ARGUMENT", str(exc)) from None
        if not body:
            raise InvalidArgumentError("INVALID_ARGUMENT", "body: must not be empty")
        if len(body) > self.max_message_size:
            raise InvalidArgumentError("INVALID_ARGUMENT", f"body: {len(body)} bytes exceeds the max message size {self.max_message_size}")
        # A string is split on spaces, as RocketMQ's Message.setKeys(String) stores it.
        key_list = [k for k in keys.split(" ") if k] if isinstance(keys, str) else list(keys or [])
        uid = unique_key or unique_key_generator().next_id()  # a caller-set key is kept
        pairs = list((properties or {}).items())
        try:
            message_properties(key_list, tags, uid, pairs)  # the broker's rules, checked before sending
        except PropertyError as exc:
            raise InvalidArgumentError("INVALID_ARGUMENT", str(exc)) from None
        return common_pb2.MessageInput(
            topic=topic, body=body, keys=key_list, tags=tags, unique_key=uid, flag=flag,
            properties=[common_pb2.Property(name=n, value=v) for n, v in pairs],
        )

    def _pick(self, queues: list[tuple[MessageQueue, str]], avoid: set[str], selector: Selector | None, arg: Any) -> tuple[MessageQueue, str]:
        candidates = [q for q in queues if q[0].broker_name not in avoid] or queues
        if selector is not None:
            chosen = selector([q for q, _ in candidates], arg)
            return next(q for q in candidates if q[0] == chosen)
        return candidates[next(self._counter) % len(candidates)]

    def send(
        self,
        topic: str,
        body: bytes,
        keys: str | Sequence[str] | None = None,
        tags: str = "",
        properties: dict[str, str] | None = None,
        unique_key: str | None = None,
        flag: int = 0,
        selector: Selector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send one message; retried on another broker (same UNIQ_KEY) when one is unavailable."""
        msg = self._input(topic, body, keys, tags, properties, unique_key, flag)
        return self._send_with_retry(topic, [msg], selector, arg)[0]

    def send_batch(self, topic: str, bodies: Sequence[bytes], keys: Sequence[str | Sequence[str] | None] | None = None, tags: str = "") -> list[SendResult]:
        """Send messages of one topic as one batch to one queue (one write on the broker)."""
        msgs = [self._input(topic, b, (keys[i] if keys else None), tags, None, None, 0) for i, b in enumerate(bodies)]
        return self._send_with_retry(topic, msgs, None, None)

    def _send_with_retry(self, topic: str, msgs: list[common_pb2.MessageInput], selector: Selector | None, arg: Any) -> list[SendResult]:
        avoid: set[str] = set()

        def attempt() -> list[SendResult]:
            queues = self.route(topic, refresh=bool(avoid))
            queue, addr = self._pick(queues, avoid, selector, arg)
            stub = self._stub(addr)
            for m in msgs:
                m.queue_id = queue.queue_id
            try:
                if len(msgs) == 1:
                    results = [stub.SendMessage(commitlog_pb2.SendMessageRequest(message=msgs[0]), timeout=self.timeout_s).result]
                else:
                    # The compact answer: ~10 bytes a message instead of ~100, and less work for the broker.
                    response = stub.SendBatch(commitlog_pb2.SendBatchRequest(messages=msgs, compact_results=True), timeout=self.timeout_s)
                    results = batch_send_results(response, msgs)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if isinstance(err, UnavailableError):
                    avoid.add(queue.broker_name)
                raise err from None
            return [
                SendResult(common_pb2.SendStatus.Name(r.status).removeprefix("SEND_STATUS_"), r.unique_key, r.offset_msg_id, MessageQueue(topic, r.broker_name or queue.broker_name, r.queue_id), r.queue_offset, r)
                for r in results
            ]

        # The first attempt outside tenacity (a Retrying is dear per send); after a
        # retryable failure the retry loop starts by replaying it, so the attempts and the
        # waits between them are exactly tenacity's.
        try:
            return attempt()
        except QuarryError as exc:
            if not _retryable(exc):
                raise
            failed: list[QuarryError] = [exc]

        def replay_then_attempt() -> list[SendResult]:
            if failed:
                raise failed.pop()
            return attempt()

        retrying = Retrying(retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.retries + 1), wait=wait_exponential_jitter(initial=0.05, max=1.0), reraise=True)
        try:
            return retrying(replay_then_attempt)
        except RetryError as exc:  # pragma: no cover - reraise=True re-raises the last error
            raise QuarryError("UNAVAILABLE", str(exc)) from None

    def close(self) -> None:
        self._routers.close()
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        self._stubs.clear()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
