"""Every outgoing Quarry channel: plaintext, TLS or mutual TLS, plus ACL credentials.

Shared by the services (calls between them) and the clients: neither owns it. Chosen by
environment, so services and tools in one deployment share it:
  QUARRY_TLS_CA            CA bundle to verify servers (set → TLS)
  QUARRY_TLS_CLIENT_CERT   client certificate, QUARRY_TLS_CLIENT_KEY its key (mutual TLS)
  QUARRY_TLS_SERVER_NAME   expected server name when addresses are IPs
  QUARRY_ACCESS_KEY / QUARRY_SECRET_KEY   ACL credentials: every call is signed (quarry.signing)
"""
from __future__ import annotations

import functools
import os
from urllib.parse import unquote
from pathlib import Path
from typing import Any

import grpc

from quarry.formats.addresses import split_host_port
from quarry.signing import AioSigningInterceptor, AioStreamSigningInterceptor, SigningInterceptor


@functools.lru_cache(maxsize=4096)  # one peer string per connection, read on every call
def parse_peer(peer: str) -> tuple[str, int]:
    """gRPC's peer string ('ipv4:1.2.3.4:5', 'ipv6:%5B::1%5D:5', zone ids escaped as %25) as
    (ip, port); ('127.0.0.1', 0) when it is not an address (a unix socket, or unknown)."""
    _, _, rest = (peer or "").partition(":")
    try:
        # gRPC escapes an IPv6 peer as a URI: 'ipv6:%5B::1%5D:5' (a zone as %25eth0).
        host, port = split_host_port(unquote(rest))
    except ValueError:
        return "127.0.0.1", 0
    return host.split("%")[0], port


# Keepalive pings on every connection with a call in flight: a peer gone without a word (a
# host that vanished, a network cut: a half-open connection) is found within time + timeout,
# and its calls fail, instead of hanging until TCP gives up (~15 min). Quarry's servers accept
# pings this often (services/serving.py, MIN_PING_INTERVAL_MS). The timeout is gRPC's default:
# gRPC also makes it the socket's TCP_USER_TIMEOUT, so data unacknowledged this long ends the
# connection, and a shorter one would turn a brief network stall into failed calls.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 20_000


def _keepalive(opts: list[tuple[str, Any]]) -> None:
    """Keepalive options added to `opts`, unless the caller set its own."""
    given = {k for k, _ in opts}
    for key, value in (("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS), ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                       # gRPC 1.76 waits for a ping's answer this long (60 s by default), whatever
                       # keepalive_timeout_ms says
                       ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                       ("grpc.http2.max_pings_without_data", 0)):  # a quiet stream is watched too
        if key not in given:
            opts.append((key, value))


def _read(env: str) -> bytes | None:
    path = os.environ.get(env)
    return Path(path).read_bytes() if path else None


def _credentials(opts: list[tuple[str, Any]]) -> grpc.ChannelCredentials | None:
    """TLS credentials when configured (adding the server-name override to opts), else None."""
    ca = _read("QUARRY_TLS_CA")
    if ca is None:
        return None
    if os.environ.get("QUARRY_TLS_SERVER_NAME"):
        opts.append(("grpc.ssl_target_name_override", os.environ["QUARRY_TLS_SERVER_NAME"]))
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=_read("QUARRY_TLS_CLIENT_KEY"), certificate_chain=_read("QUARRY_TLS_CLIENT_CERT"))


def _account() -> tuple[str, str] | None:
    """The ACL account (access key, secret key) calls are signed with, when configured."""
    access, secret = os.environ.get("QUARRY_ACCESS_KEY"), os.environ.get("QUARRY_SECRET_KEY")
    return (access, secret) if access and secret else None


def uses_tls() -> bool:
    """Whether channels opened here use TLS (QUARRY_TLS_CA is set)."""
    return bool(os.environ.get("QUARRY_TLS_CA"))


def signs_calls() -> bool:
    """Whether channels opened here sign every call (an ACL account is configured)."""
    return _account() is not None


def open_aio_channel(address: str, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    """open_channel for asyncio callers (a service on grpc.aio calling another): same TLS and
    ACL settings (unary and server-streaming calls signed); create it inside the event loop
    that uses it."""
    opts = list(options or [])
    _keepalive(opts)
    creds = _credentials(opts)
    account = _account()
    interceptors: list[Any] | None = [AioSigningInterceptor(*account), AioStreamSigningInterceptor(*account)] if account else None
    if creds is not None:
        return grpc.aio.secure_channel(address, creds, options=opts, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)


def open_channel(address: str, options: list[tuple[str, Any]] | None = None, account: tuple[str, str] | None = None) -> grpc.Channel:
    """A channel to `address` with the deployment's TLS and ACL settings (see module doc);
    `account` (access key, secret key) signs its calls instead of the environment's: a
    console signing as the operator who logged in."""
    opts = list(options or [])
    _keepalive(opts)
    creds = _credentials(opts)
    channel = grpc.secure_channel(address, creds, options=opts) if creds is not None else grpc.insecure_channel(address, options=opts)
    account = account or _account()
    return grpc.intercept_channel(channel, SigningInterceptor(*account)) if account else channel
