"""Telemetry: the bidirectional stream an SDK opens to every endpoint it uses.

The client writes its Settings first; the server must answer with its own (RocketMQ's proxy
echoes the client's settings with the producer policy merged in). The Node.js SDK's start()
waits for that answer, and every SDK takes max_body_size, validate_message_type and the
retry backoff from it. Other client commands (thread stack traces, verify results) are only
logged: Quarry sends no commands that would ask for them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from google.protobuf import duration_pb2

from quarry.services.log import log_event
from quarry.services.rmq5.contract import Code, v2, service
from quarry.services.rmq5.sessions import Sessions

log = logging.getLogger("quarry.rmq5.telemetry")


@dataclass(frozen=True)
class ServerPolicy:
    """What a server imposes on producers."""

    max_body_size: int
    max_attempts: int = 3
    backoff_initial_ms: int = 10
    backoff_max_ms: int = 1000
    backoff_multiplier: float = 2.0
    consumer_max_attempts: int = 17  # deliveries to a consumer group before its dead-letter topic
    consumer_batch_size: int = 32  # a PushConsumer's messages per ReceiveMessage (RocketMQ proxy's, and Quarry's most)
    consumer_long_polling_ms: int = 20_000  # how long a PushConsumer's ReceiveMessage waits for messages (the proxy's)


# A PushConsumer's redelivery delays after a failed consumption (RocketMQ's default group retry
# policy, its delay levels from 1 s): the Java SDK hides the message this long
# (ChangeInvisibleDuration), and Quarry takes no invisible duration under 1 s.
CONSUMER_RETRY_DELAYS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)


def _duration(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def server_settings(client: v2.Settings, policy: ServerPolicy) -> v2.Settings:
    """The client's settings with the server's producer policy merged in."""
    settings = v2.Settings()
    settings.CopyFrom(client)
    settings.backoff_policy.max_attempts = policy.max_attempts
    backoff = settings.backoff_policy.exponential_backoff
    backoff.initial.CopyFrom(_duration(policy.backoff_initial_ms))
    backoff.max.CopyFrom(_duration(policy.backoff_max_ms))
    backoff.multiplier = policy.backoff_multiplier
    if settings.WhichOneof("pub_sub") == "subscription":
        # A consumer's attempts are the group's deliveries before dead-lettering (RocketMQ's proxy
        # sends the group's retry policy); a SimpleConsumer polls with its own batch and timeout.
        # A PushConsumer (Java, Python) takes its batch, long polling and redelivery delays from
        # this answer, as the proxy gives them: without them it asks for 0 messages, polls
        # without waiting, and redelivers after 10 ms (refused: under 1 s).
        settings.backoff_policy.max_attempts = policy.consumer_max_attempts
        settings.backoff_policy.customized_backoff.next.extend(_duration(s * 1000) for s in CONSUMER_RETRY_DELAYS_S)
        settings.subscription.fifo = False
        settings.subscription.receive_batch_size = policy.consumer_batch_size
        settings.subscription.long_polling_timeout.CopyFrom(_duration(policy.consumer_long_polling_ms))
    if settings.WhichOneof("pub_sub") == "publishing" or client.client_type in (v2.ClientType.PRODUCER,):
        settings.publishing.max_body_size = policy.max_body_size
        settings.publishing.validate_message_type = True
    return settings


def answer(command: service.TelemetryCommand, client_id: str, sessions: Sessions, policy: ServerPolicy, peer: str) -> service.TelemetryCommand | None:
    """The server's reply to one client command, or None when none is due."""
    kind = command.WhichOneof("command")
    if kind == "settings":
        settings = command.settings
        if not client_id:
            return service.TelemetryCommand(status=v2.Status(code=Code.CLIENT_ID_REQUIRED, message="x-mq-client-id: header required on Telemetry"))
        if settings.WhichOneof("pub_sub") is None and settings.client_type == v2.ClientType.CLIENT_TYPE_UNSPECIFIED:
            return service.TelemetryCommand(status=v2.Status(code=Code.UNRECOGNIZED_CLIENT_TYPE, message="settings: client_type and publishing/subscription are missing"))
        sessions.announce(client_id, settings)
        log_event(log, "client settings", client_id=client_id, client_type=v2.ClientType.Name(settings.client_type),
                  language=v2.Language.Name(settings.user_agent.language), version=settings.user_agent.version, peer=peer)
        return service.TelemetryCommand(status=v2.Status(code=Code.OK, message="OK"), settings=server_settings(settings, policy))
    log_event(log, "telemetry command ignored", client_id=client_id or "-", command=kind or "none", peer=peer)
    return None
