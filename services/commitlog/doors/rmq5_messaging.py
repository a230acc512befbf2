"""MessagingService at a commitlog: SendMessage and EndTransaction for this broker's queues,
QueryAssignment (asked of a router: assignment.py), the consumer RPCs (ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue: services/commitlog/doors/rmq5_consume.py), plus the client lifecycle RPCs. asyncio flavour: it runs on the commitlog's event loop and
stores through the broker's send path (same store, same fsync wait, same
metrics), translating the store's errors to in-band codes.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Sequence

from quarry.channels import parse_peer
from quarry.formats.record import Record
from quarry.services.log import log_event
from quarry.services.rmq5 import client_calls, telemetry
from quarry.services.commitlog.doors.rmq5_assignment import RouterAssignments
from quarry.services.security import Account
from quarry.services.rmq5.auth import Authenticator
from quarry.services.commitlog.doors.rmq5_consume import Consumption
from quarry.services.rmq5.status import check_group
from quarry.services.rmq5.contract import Code, service, service_grpc, v2
from quarry.services.commitlog.doors.rmq5_send import TRANSACTION, answer, to_new_message
from quarry.services.rmq5.sessions import Sessions
from quarry.services.rmq5.status import RmqError, ok
from quarry.services.commitlog.broker.core import Broker
from quarry.services.commitlog.broker.transactions import Transactions
from quarry.services.commitlog.doors.rmq5_transaction import claim, half_message, orphan_command
from quarry.services.rmq5.unsupported import fill_unsupported

if TYPE_CHECKING:
    from quarry.services.commitlog.broker.transaction_check import CheckRequest

log = logging.getLogger("quarry.rmq5")
MAX_MESSAGES = 1024


class CommitLogMessagingServicer(service_grpc.MessagingServiceServicer):
    def __init__(self, core: Broker, auth: Authenticator, policy: telemetry.ServerPolicy, routers: Sequence[str] = ()) -> None:
        """`core`: the broker (its store, send path and transactions); `routers`: the routers it
        registers with (QueryAssignment asks them)."""
        self.core = core
        self.auth = auth
        self.policy = policy
        self.sessions = Sessions()
        self.transactions = core.transactions  # one per store: every door resolves a half once
        self.consumption = Consumption(core, policy.consumer_max_attempts)
        self.assignments = RouterAssignments(routers)
        # Each open Telemetry stream's queue -> (its client id, the account that opened it)
        self.outboxes: dict[asyncio.Queue[service.TelemetryCommand], tuple[str, Account | None]] = {}
        self._closing = asyncio.Event()

    def close(self) -> None:
        """End open Telemetry streams (they would otherwise hold the stop's grace period)."""
        self._closing.set()

    async def QueryRoute(self, request: service.QueryRouteRequest, context: Any) -> service.QueryRouteResponse:
        return service.QueryRouteResponse(status=v2.Status(
            code=Code.ILLEGAL_ACCESS_POINT,
            message="this is a broker endpoint: point the SDK's endpoints at the router (the access point, host:port of quarry-router)"))

    async def SendMessage(self, request: service.SendMessageRequest, context: Any) -> service.SendMessageResponse:
        try:
            md = client_calls.metadata(context)
            self.auth.caller(md, "SendMessage")  # who, before anything about the request is said
            messages = request.messages
            if not messages:
                raise RmqError(Code.BAD_REQUEST, "messages: must not be empty")
            if len(messages) > MAX_MESSAGES:
                raise RmqError(Code.BAD_REQUEST, f"messages: at most {MAX_MESSAGES}, got {len(messages)}")
            topic = messages[0].topic.name
            if len(messages) > 1:
                for i, m in enumerate(messages):
                    if m.topic.name != topic:
                        raise RmqError(Code.MESSAGE_CORRUPTED, f"messages[{i}].topic.name: one request holds one topic ({topic!r})")
            self.auth.check(md, "SendMessage", "publish", [topic])
            peer = parse_peer(context.peer())
            msgs, halves = [], []
            for i, m in enumerate(messages):
                is_half = m.system_properties.message_type == TRANSACTION
                msgs.append(half_message(m, peer, f"messages[{i}]") if is_half else to_new_message(m, peer, f"messages[{i}]"))
                halves.append(is_half)
            if len(msgs) == 1 and not halves[0]:  # how the SDKs send: a message a call
                appended = await self.core.sending.append_in_turn(msgs[0], "rmq5.SendMessage")
            else:
                appended = await self.core.sending.append_flushed(msgs, rpc="rmq5.SendMessage", same_topic=False)
        except Exception as exc:  # never an unanswered call
            return service.SendMessageResponse(status=client_calls.in_band(exc, "SendMessage"))
        # (rows: DispatchInfo's fields; [4] the queue offset, [7] UNIQ_KEY, [0] the physical offset)
        response = answer([(row[7] or "", row[4], appended.offset_msg_id(row[0]) if is_half else "") for row, is_half in zip(appended.rows, halves)])
        if appended.flushed:
            return response
        for entry in response.entries:
            entry.status.CopyFrom(v2.Status(code=Code.MASTER_PERSISTENCE_TIMEOUT, message="stored, but not flushed to disk within the SYNC flush timeout"))
        response.status.CopyFrom(v2.Status(code=Code.MASTER_PERSISTENCE_TIMEOUT, message="not flushed within the SYNC flush timeout"))
        return response

    async def EndTransaction(self, request: service.EndTransactionRequest, context: Any) -> service.EndTransactionResponse:
        half = None
        try:
            self.auth.check(client_calls.metadata(context), "EndTransaction", "publish", [request.topic.name])
            if request.resolution not in (v2.TransactionResolution.COMMIT, v2.TransactionResolution.ROLLBACK):
                raise RmqError(Code.BAD_REQUEST, "resolution: must be COMMIT or ROLLBACK")
            half = await asyncio.to_thread(claim, self.transactions, request)  # (reads, and on first use the op records: off the loop)
            commit = request.resolution == v2.TransactionResolution.COMMIT
            await self.core.sending.append_flushed(Transactions.resolution(half, commit), rpc="rmq5.EndTransaction", same_topic=False)
        except Exception as exc:  # never an unanswered call; a failed resolution frees the half for a retry
            if half is not None:
                self.transactions.release(half)
            return service.EndTransactionResponse(status=client_calls.in_band(exc, "EndTransaction"))
        return service.EndTransactionResponse(status=ok())

    async def QueryAssignment(self, request: service.QueryAssignmentRequest, context: Any) -> service.QueryAssignmentResponse:
        """Asked here by PushConsumers (a broker of the route), answered by a router (assignment.py)."""
        try:
            md = client_calls.metadata(context)
            self.auth.check(md, "QueryAssignment", "query", [request.topic.name], group=request.group.name)
            check_group(request.group)
            return await self.assignments.query(request, md)
        except Exception as exc:  # never an unanswered call
            return service.QueryAssignmentResponse(status=client_calls.in_band(exc, "QueryAssignment"))

    async def ReceiveMessage(self, request: service.ReceiveMessageRequest, context: Any) -> AsyncIterator[service.ReceiveMessageResponse]:
        try:
            self.auth.check(client_calls.metadata(context), "ReceiveMessage", "query", [request.message_queue.topic.name], group=request.group.name)
            async for response in self.consumption.receive(request, context):
                yield response
        except Exception as exc:  # never an unanswered call
            yield service.ReceiveMessageResponse(status=client_calls.in_band(exc, "ReceiveMessage"))

    async def AckMessage(self, request: service.AckMessageRequest, context: Any) -> service.AckMessageResponse:
        return await self._consumer_call("AckMessage", request, context, service.AckMessageResponse, self.consumption.ack)

    async def ChangeInvisibleDuration(self, request: service.ChangeInvisibleDurationRequest, context: Any) -> service.ChangeInvisibleDurationResponse:
        return await self._consumer_call("ChangeInvisibleDuration", request, context, service.ChangeInvisibleDurationResponse,
                                         self.consumption.change_invisible)

    async def ForwardMessageToDeadLetterQueue(self, request: service.ForwardMessageToDeadLetterQueueRequest, context: Any) -> service.ForwardMessageToDeadLetterQueueResponse:
        return await self._consumer_call("ForwardMessageToDeadLetterQueue", request, context, service.ForwardMessageToDeadLetterQueueResponse,
                                         self.consumption.forward_to_dlq)

    async def _consumer_call(self, rpc: str, request: Any, context: Any, response: Callable[..., Any],
                             action: Callable[[Any], Awaitable[Any]]) -> Any:
        """A unary consumer RPC: the group's topic needs `query` permission, the group `sub`; every failure in band."""
        try:
            self.auth.check(client_calls.metadata(context), rpc, "query", [request.topic.name], group=request.group.name)
            return await action(request)
        except Exception as exc:  # never an unanswered call
            return response(status=client_calls.in_band(exc, rpc))

    async def Heartbeat(self, request: service.HeartbeatRequest, context: Any) -> service.HeartbeatResponse:
        return client_calls.heartbeat(self.auth, self.sessions, request, client_calls.metadata(context))

    async def NotifyClientTermination(self, request: service.NotifyClientTerminationRequest, context: Any) -> service.NotifyClientTerminationResponse:
        return client_calls.terminate(self.auth, self.sessions, request, client_calls.metadata(context), context.peer())

    async def Telemetry(self, request_iterator: AsyncIterator[service.TelemetryCommand], context: Any) -> AsyncIterator[service.TelemetryCommand]:
        async for reply in client_calls.telemetry_stream(self.auth, self.sessions, self.policy, request_iterator, context, self._closing, self.outboxes):
            yield reply

    def ask_producer(self, half: Record, request: "CheckRequest") -> bool:
        """The transaction check's asker for this door (on the event loop): a
        RecoverOrphanedTransactionCommand on the Telemetry stream of one live producer that
        publishes the half's topic (RocketMQ 5's producer group of a topic is the topic);
        False when none is connected here."""
        for outbox, (client_id, account) in list(self.outboxes.items()):
            # The half goes only to a stream whose account may publish its topic (what a
            # client announces in its settings is its own word, not a permission).
            if account is not None and not account.allows("publish", [request.real_topic]):
                continue
            session = self.sessions.get(client_id)
            settings = session.settings if session is not None else None
            if settings is None or settings.WhichOneof("pub_sub") != "publishing":
                continue
            if request.real_topic not in {t.name for t in settings.publishing.topics}:
                continue
            host = self.core.store.config.store_host
            outbox.put_nowait(orphan_command(half, f"{host[0]}:{host[1]}"))
            log_event(log, "transaction check sent", client_id=client_id, topic=request.real_topic, msg_id=request.msg_id, check=request.check)
            return True
        return False


fill_unsupported(CommitLogMessagingServicer, aio=True)
