"""The four queries of the router: by key, by unique key, by offsetMsgId, by queue offset.

Orchestration only: the registry says whom to ask, `fanout` asks them, `merge` filters
and orders, formats decode ids. Errors are the services' own (services/errors.py); services/status.py
maps them to gRPC status codes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import grpc

from quarry.formats.addresses import format_host_port
from quarry.formats import offset_msg_id
from quarry.v1 import commitlog_pb2, common_pb2, indexer_pb2
from quarry.services.errors import InvalidArgument, NotFound, ServiceError, Unavailable, checked_topic
from quarry.services.status import error_from_status
from quarry.services.query.broker_clients import BrokerClients
from quarry.services.query import presence
from quarry.services.query.fanout import BrokerCall, BrokerError, FanOut, Outcome
from quarry.services.query.merge import (
    BadTokenError, decode_token, encode_token, key_matches, of_topic, merge_key_answers, order_copies, query_digest, unique_key_matches,
)
from quarry.services.query.registry import Broker, BrokerRegistry, UnknownBrokerError
from quarry.services.query.unique_key_window import search_window

MAX_NUM_CAP = 2048  # per page; brokers are read in batches of INDEX_BATCH
INDEX_BATCH = 64  # RocketMQ's maxMsgsNumBatch: what one indexer call returns at most
UNIQUE_KEY_MAX_NUM = 32  # as the RocketMQ broker does for unique-key queries
MAX_KEY_BYTES = 4096


@dataclass
class Answer:
    """A merged answer with every broker's outcome."""

    messages: list[common_pb2.StoredMessage] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    collisions: int = 0
    copies: int = 0
    begin: int = 0
    end: int = 0
    notes: list[str] = field(default_factory=list)
    next_token: str = ""
    damaged: dict[str, list[int]] = field(default_factory=dict)  # broker -> offsets of damaged candidate records

    @property
    def complete(self) -> bool:
        """Every broker answered, and no candidate record was damaged (a match may be among them)."""
        return all(o.ok for o in self.outcomes) and not any(self.damaged.values())

    def note_damaged(self, outcomes: list[Outcome]) -> "Answer":
        """Carry the indexers' damaged candidates into the answer: incomplete, and said why."""
        for o in outcomes:
            offsets = list(o.value.damaged) if o.ok and isinstance(o.value, Scan) else []
            if offsets:
                self.damaged[o.key] = offsets
                shown = ", ".join(str(x) for x in offsets[:5]) + (", …" if len(offsets) > 5 else "")
                self.notes.append(f"{o.key}: {len(offsets)} index entr{'y' if len(offsets) == 1 else 'ies'} under this key point at "
                                  f"damaged records (physical offsets {shown}); a match may be among them (see the broker's store status)")
            gone = sorted(o.value.gone) if o.ok and isinstance(o.value, Scan) else []
            if gone:
                # The index answers by hash: a gone record may have been another key's, so this
                # is said, not counted against completeness.
                self.notes.append(f"{o.key}: {len(gone)} index entr{'y' if len(gone) == 1 else 'ies'} under this key point at records the "
                                  f"log no longer holds (physical offsets {gone[0]}..{gone[-1]}): expired (or cut), so messages of this key "
                                  f"stored there may be gone")
        return self


@dataclass
class Scan:
    """One broker's index read for a query: its matches, the collisions and out-of-window
    entries it skipped, and the offset below which its index may hold more (0: none)."""

    matched: list[common_pb2.StoredMessage] = field(default_factory=list)
    skipped: int = 0
    more_below: int = 0
    damaged: list[int] = field(default_factory=list)  # candidate records the commitlog found damaged
    gone: list[int] = field(default_factory=list)  # candidates the log no longer holds (expired, or cut)

    def __len__(self) -> int:
        return len(self.matched)


def iso_ms(ms: int) -> str:
    """Epoch ms as ISO-8601 UTC with milliseconds, for messages read by people."""
    # (time.gmtime: half the cost of a datetime, and a unique-key query formats several)
    return time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(ms // 1000)) + f"{ms % 1000:03d}Z"


def missing_outcome(broker: Broker, now_ms: int) -> Outcome:
    """A broker that stopped heartbeating: not asked, reported as not answering."""
    return Outcome(
        key=broker.name, error_code="UNAVAILABLE",
        error_message=f"broker {broker.name} is missing: no heartbeat since {iso_ms(broker.last_heartbeat_ms)} "
                      f"({(now_ms - broker.last_heartbeat_ms) // 1000} s ago); `quarry unregisterBroker -b {broker.name}` forgets it",
    )


BODIES_FROM_INDEXER = "indexer"  # an indexer answers key queries with the records, read from its commitlog
BODIES_FROM_COMMITLOG = "commitlog"  # an indexer answers offsets; the router reads the records itself


@dataclass
class QuerySettings:
    query_timeout_ms: int = 3000
    broker_call_timeout_ms: int = 1000
    clock_skew_ms: int = 3_600_000
    fallback_window_ms: int = 7 * 24 * 3_600_000
    bodies_from: str = BODIES_FROM_INDEXER
    key_presence: bool = True  # skip the brokers whose key presence filter rules a key out


def _now_ms() -> int:
    return int(time.time() * 1000)


def _raise_unless_ok(outcome: Outcome, broker: Broker) -> None:
    """A single-broker read that failed: the broker's own verdict, or UNAVAILABLE."""
    if outcome.ok:
        return
    if outcome.error_code in ("NOT_FOUND", "OUT_OF_RANGE", "INVALID_ARGUMENT"):
        raise error_from_status(outcome.error_code, f"broker {broker.name}: {outcome.error_message}")
    raise Unavailable(f"broker {broker.name} did not answer: {outcome.error_code}: {outcome.error_message}")


def _check_topic(topic: str) -> None:
    checked_topic(topic)


def _timeout_s(timeout_ms: int, settings: QuerySettings) -> float:
    if timeout_ms < 0:
        raise InvalidArgument("timeout_ms: must be >= 0 (0 means the router default)")
    return (timeout_ms or settings.query_timeout_ms) / 1000.0


class Queries:
    """The router's query engine over a registry and broker channels."""

    def __init__(self, registry: BrokerRegistry, clients: BrokerClients, settings: QuerySettings, clock_ms: Callable[[], int] = _now_ms) -> None:
        self.registry = registry
        self.clients = clients
        self.settings = settings
        self.fanout = FanOut()
        self.clock_ms = clock_ms

    # -- by key ---------------------------------------------------------------------------
    async def by_key(self, topic: str, key: str, max_num: int, begin: int, end: int, timeout_ms: int = 0, token: str = "") -> Answer:
        _check_topic(topic)
        _timeout_s(timeout_ms, self.settings)  # validated before any broker is asked
        if not key:
            raise InvalidArgument("key: must not be empty")
        if " " in key:
            raise InvalidArgument("key: must not contain a space (KEYS are split on spaces)")
        if len(key.encode()) > MAX_KEY_BYTES:
            raise InvalidArgument(f"key: at most {MAX_KEY_BYTES} bytes")
        if max_num < 0 or max_num > MAX_NUM_CAP:
            raise InvalidArgument(f"max_num: must be 0..{MAX_NUM_CAP} (0 means 64)")
        max_num = max_num or INDEX_BATCH
        if begin < 0:
            raise InvalidArgument("begin_timestamp: must be >= 0")
        # The token binds the window as asked: "until now" stays "until now" across pages.
        digest = query_digest(topic, key, begin, end)
        end = end or self.clock_ms()
        if end < begin:
            raise InvalidArgument(f"end_timestamp: must be >= begin_timestamp ({begin})")
        after = None
        if token:
            try:
                after = decode_token(token, digest)
            except BadTokenError as exc:
                raise InvalidArgument(str(exc)) from exc
        brokers = self._holding(topic)
        if after is not None:
            brokers = [b for b in brokers if after.bounds.get(b.name, 0) != -1]
        requests = {
            b.name: indexer_pb2.QueryMessageRequest(
                topic=topic, key=key, max_num=INDEX_BATCH, begin_timestamp=begin, end_timestamp=end,
                before_phy_offset=after.bounds.get(b.name, 0) if after else 0,
            )
            for b in brokers
        }
        outcomes = await self._scan(brokers, requests, max_num, lambda m: key_matches(m, topic, key, begin, end), timeout_ms)
        scans = {o.key: o.answer() for o in outcomes if o.ok}
        page = merge_key_answers({b: sc.matched for b, sc in scans.items()}, {b: sc.more_below for b, sc in scans.items()}, max_num, after, digest)
        return Answer(
            messages=page.messages,
            outcomes=outcomes,
            collisions=sum(sc.skipped for sc in scans.values()),
            begin=begin,
            end=end,
            next_token=encode_token(page.next_token) if page.next_token else "",
        ).note_damaged(outcomes)

    # -- by unique key --------------------------------------------------------------------
    async def by_unique_key(self, topic: str, unique_key: str, return_all: bool = False, timeout_ms: int = 0, begin: int = 0, end: int = 0) -> Answer:
        """The id's own window first, then the whole retained index (newest first), unless
        the caller gave [begin, end]; NOT_FOUND says every window searched."""
        _check_topic(topic)
        if not unique_key:
            raise InvalidArgument("unique_key: must not be empty")
        _timeout_s(timeout_ms, self.settings)
        if len(unique_key) > 128:
            raise InvalidArgument("unique_key: at most 128 characters")
        if begin < 0:
            raise InvalidArgument("begin_timestamp: must be >= 0")
        if end and end < begin:
            raise InvalidArgument(f"end_timestamp: must be >= begin_timestamp ({begin})")
        timeout_s = _timeout_s(timeout_ms, self.settings)
        direct = await self._try_as_offset_msg_id(topic, unique_key, timeout_s)
        if direct is not None:
            direct.notes.insert(0, "id decoded as an offsetMsgId of a registered broker: read directly")
            return direct
        now = self.clock_ms()
        if begin or end:
            windows = [(begin, end or now, f"searched the given window {iso_ms(begin)}..{iso_ms(end or now)}")]
        else:
            window = search_window(unique_key, now, self.settings.clock_skew_ms, self.settings.fallback_window_ms)
            whole_end = now + self.settings.clock_skew_ms
            windows = [(window.begin, window.end, window.note)]
            if window.begin > 0 or window.end < whole_end:
                windows.append((0, whole_end, f"not in that window: searched the whole retained index (store times up to {iso_ms(whole_end)}), newest first"))
        brokers = self._holding(topic)
        notes: list[str] = []
        searched: list[str] = []
        answer = Answer()
        for w_begin, w_end, note in windows:
            notes.append(note)
            searched.append(f"{iso_ms(w_begin)}..{iso_ms(w_end)}")
            request = indexer_pb2.QueryMessageRequest(
                topic=topic, key=unique_key, max_num=UNIQUE_KEY_MAX_NUM, begin_timestamp=w_begin, end_timestamp=w_end, unique_key_flag=True
            )
            def matches(m: common_pb2.StoredMessage, lo: int = w_begin, hi: int = w_end) -> bool:
                return unique_key_matches(m, topic, unique_key, lo, hi)

            outcomes = await self._scan(brokers, {b.name: request for b in brokers}, UNIQUE_KEY_MAX_NUM, matches, timeout_ms)
            copies = order_copies(m for o in outcomes if o.ok for m in o.answer().matched)
            answer = Answer(
                messages=copies if return_all else copies[:1],
                outcomes=outcomes,
                collisions=sum(o.answer().skipped for o in outcomes if o.ok),
                copies=len(copies),
                begin=w_begin,
                end=w_end,
                notes=list(notes),
            ).note_damaged(outcomes)
            if copies:
                return answer
        failed = [f"{o.key} ({o.error_code}: {o.error_message})" for o in answer.outcomes if not o.ok]
        if failed:
            raise Unavailable(f"unique key {unique_key} not found on the brokers that answered (searched store times {' then '.join(searched)}); no answer from: {', '.join(failed)}")
        damaged = "".join(f"; {note}" for note in answer.notes if "damaged records" in note)
        raise NotFound(f"no message with unique key {unique_key} in topic {topic} on {', '.join(b.name for b in brokers)} (searched store times {' then '.join(searched)}){damaged}")

    async def _try_as_offset_msg_id(self, topic: str, text: str, timeout_s: float) -> Answer | None:
        try:
            decoded = offset_msg_id.decode(text)
        except ValueError:
            return None
        broker = self.registry.by_store_host(decoded.ip, decoded.port)
        if broker is None or broker.missing:
            return None
        try:
            answer = await self._view(broker, decoded.offset, timeout_s)
        except ServiceError:
            return None
        if answer.messages and of_topic(answer.messages[0], topic):
            answer.copies = 1
            return answer
        return None

    # -- by offsetMsgId -------------------------------------------------------------------
    async def by_id(self, msg_id: str, timeout_ms: int = 0) -> Answer:
        if not msg_id:
            raise InvalidArgument("offset_msg_id: must not be empty")
        try:
            decoded = offset_msg_id.decode(msg_id)
        except ValueError as exc:
            raise InvalidArgument(f"offset_msg_id: {exc}") from exc
        broker = self.registry.by_store_host(decoded.ip, decoded.port)
        if broker is None:
            raise NotFound(f"offset_msg_id {msg_id}: no registered broker advertises store host {format_host_port(decoded.ip, decoded.port)}")
        self._live(broker)
        return await self._view(broker, decoded.offset, _timeout_s(timeout_ms, self.settings))

    async def _view(self, broker: Broker, offset: int, timeout_s: float) -> Answer:
        stub = self.clients.commitlog(broker.commitlog_addr)
        request = commitlog_pb2.ViewMessageRequest(physical_offset=offset)
        async def view(t: float) -> common_pb2.StoredMessage:
            return (await stub.ViewMessage(request, timeout=t)).message

        [outcome] = await self.fanout.run({broker.name: view}, timeout_s, self.settings.broker_call_timeout_ms / 1000.0)
        _raise_unless_ok(outcome, broker)
        msg = outcome.answer()
        msg.broker_name = broker.name
        return Answer(messages=[msg], outcomes=[outcome])

    # -- one named broker ------------------------------------------------------------------
    def named_broker(self, broker_name: str) -> Broker:
        """The registered broker an operator named (-b), or InvalidArgument / NotFound naming the field."""
        if not broker_name:
            raise InvalidArgument("broker_name: must not be empty")
        try:
            return self.registry.get(broker_name)
        except UnknownBrokerError as exc:
            raise NotFound(f"broker_name: {exc}") from exc

    async def one_broker_call(self, broker: Broker, call: BrokerCall[Any], timeout_ms: int = 0) -> Outcome:
        """One call to one broker within the query deadline; its failure raised as the broker's error."""
        [outcome] = await self.fanout.run({broker.name: call}, _timeout_s(timeout_ms, self.settings), self.settings.broker_call_timeout_ms / 1000.0)
        _raise_unless_ok(outcome, broker)
        return outcome

    # -- by queue offset ------------------------------------------------------------------
    async def by_offset(self, topic: str, broker_name: str, queue_id: int, queue_offset: int, timeout_ms: int = 0) -> Answer:
        _check_queue_position(topic, queue_id, queue_offset)
        broker = self.named_broker(broker_name)
        self._live(broker)
        stub = self.clients.commitlog(broker.commitlog_addr)
        request = commitlog_pb2.PullMessagesRequest(topic=topic, queue_id=queue_id, queue_offset=queue_offset, max_count=1)
        outcome = await self.one_broker_call(broker, lambda t: stub.PullMessages(request, timeout=t), timeout_ms)
        pulled: commitlog_pb2.PullMessagesResponse = outcome.answer()
        if not pulled.messages:
            raise NotFound(
                f"no message at queue offset {queue_offset} of {topic}/{broker.name}/{queue_id}; valid range is "
                f"[{pulled.min_queue_offset}, {pulled.max_queue_offset})",
            )
        msg = pulled.messages[0]
        msg.broker_name = broker.name
        outcome.value = [msg]
        return Answer(messages=[msg], outcomes=[outcome])

    async def track(self, topic: str, broker_name: str, queue_id: int, queue_offset: int, timeout_ms: int = 0) -> tuple[list[common_pb2.GroupConsumeStatus], Outcome]:
        """Every consumer group's status of one stored message, from the broker that stores it."""
        _check_queue_position(topic, queue_id, queue_offset)
        broker = self.named_broker(broker_name)
        stub = self.clients.commitlog(broker.commitlog_addr)
        request = commitlog_pb2.ConsumeStatusRequest(topic=topic, queue_id=queue_id, queue_offset=queue_offset)
        outcome = await self.one_broker_call(broker, lambda t: stub.ConsumeStatus(request, timeout=t), timeout_ms)
        groups = list(outcome.answer().groups)
        outcome.value = groups
        return groups, outcome

    # -- shared ---------------------------------------------------------------------------
    def _holding(self, topic: str) -> list[Broker]:
        brokers = self.registry.holding(topic)
        if not brokers:
            raise NotFound(f"no route for topic {topic}: no live broker holds it")
        return brokers

    def _live(self, broker: Broker) -> None:
        """A single-broker read of a missing broker fails at once, saying so."""
        if broker.missing:
            o = missing_outcome(broker, self.clock_ms())
            raise Unavailable(o.error_message)

    async def _scan(
        self, brokers: list[Broker], requests: dict[str, indexer_pb2.QueryMessageRequest], want: int,
        matches: Callable[[common_pb2.StoredMessage], bool], timeout_ms: int,
    ) -> list[Outcome]:
        """Ask every live broker's indexer, in batches, until `want` entries match or its index
        has no more; missing brokers are reported without a call. One Outcome[Scan] per broker."""
        timeout_s = _timeout_s(timeout_ms, self.settings)
        now = self.clock_ms()
        live = [b for b in brokers if not b.missing]
        ruled_out: dict[str, Outcome] = {}
        if self.settings.key_presence and live:
            # Brokers whose key presence filter rules the key out (query/presence.py) answer nothing.
            first = next(iter(requests.values()))  # every broker's request names the same key
            hashes = presence.key_hashes(first.topic, first.key)
            copies = self.clients.presence
            ruled_out = {b.name: Outcome(key=b.name, value=Scan(), ruled_out=True, ruled_out_at=copies.position(b.indexer_addr)) for b in live
                         if b.indexer_addr and copies.rules_out(b.indexer_addr, hashes)}
        calls = {b.name: self._scan_call(b, requests[b.name], want, matches) for b in live if b.name not in ruled_out}
        outcomes = {o.key: o for o in await self.fanout.run(calls, timeout_s, self.settings.broker_call_timeout_ms / 1000.0)} if calls else {}
        outcomes.update(ruled_out)
        for b in brokers:
            if b.missing:
                outcomes[b.name] = missing_outcome(b, now)
        return [outcomes[b.name] for b in sorted(brokers, key=lambda b: b.name)]

    def _scan_call(
        self, broker: Broker, first: indexer_pb2.QueryMessageRequest, want: int, matches: Callable[[common_pb2.StoredMessage], bool]
    ) -> BrokerCall[Scan]:
        if not broker.indexer_addr:
            async def _none(_t: float) -> Scan:
                raise LookupError(f"broker {broker.name} has no indexer registered")
            return _none
        stub = self.clients.indexer(broker.indexer_addr)
        direct = self.settings.bodies_from == BODIES_FROM_COMMITLOG
        commitlog = self.clients.commitlog(broker.commitlog_addr) if direct else None
        begin, end = first.begin_timestamp, first.end_timestamp or self.clock_ms()

        async def run(timeout_s: float) -> Scan:
            request = indexer_pb2.QueryMessageRequest()
            request.CopyFrom(first)
            request.offsets_only = direct
            scan = Scan()
            while True:
                response = await stub.QueryMessage(request, timeout=timeout_s)
                # Its key presence copy is not trusted below what this answer saw (query/presence.py).
                self.clients.presence.seen(broker.indexer_addr, response.index_last_update_phy_offset, response.index_epoch)
                if direct:
                    messages, damaged, gone = await self._read_records(broker, commitlog, response.physical_offsets, begin, end, timeout_s)
                else:
                    messages, damaged, gone = response.messages, response.damaged_offsets, response.gone_offsets
                scan.skipped += response.collisions_filtered  # (what the indexer already left out)
                for msg in messages:
                    msg.broker_name = broker.name
                    if matches(msg):
                        scan.matched.append(msg)
                    else:
                        scan.skipped += 1
                scan.damaged.extend(damaged)
                scan.gone.extend(gone)
                scan.more_below = response.next_before_phy_offset
                # Collisions do not count toward the page: read on while the index has more.
                if not scan.more_below or len(scan.matched) >= want:
                    return scan
                request.before_phy_offset = scan.more_below

        return run

    @staticmethod
    async def _read_records(broker: Broker, stub: Any, offsets: Sequence[int], begin: int, end: int,
                            timeout_s: float) -> tuple[list[common_pb2.StoredMessage], Sequence[int], Sequence[int]]:
        """The records at the offsets an indexer answered, read from the broker's commitlog, and
        the offsets found damaged, and those the log no longer holds. Records stored outside [begin, end] (the index holds whole
        seconds) are dropped here, as the indexer drops them when it reads: not collisions."""
        if not offsets:
            return [], (), ()
        try:
            got = await stub.GetMessages(commitlog_pb2.GetMessagesRequest(physical_offsets=offsets), timeout=timeout_s)
        except grpc.RpcError as exc:
            # Never an empty success when the messages cannot be read (the indexer's own words).
            raise BrokerError("UNAVAILABLE", f"commitlog of {broker.name} did not answer: {exc.code().name}: {exc.details()}") from None  # type: ignore[attr-defined]
        return [m for m in got.messages if begin <= m.store_timestamp <= end], got.damaged, got.not_found


def _check_queue_position(topic: str, queue_id: int, queue_offset: int) -> None:
    _check_topic(topic)
    if queue_id < 0:
        raise InvalidArgument("queue_id: must be >= 0")
    if queue_offset < 0:
        raise InvalidArgument("queue_offset: must be >= 0")
