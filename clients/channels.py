"""Every outgoing Quarry channel: plaintext, TLS or mutual TLS, plus ACL credentials.

Chosen by environment, so services and tools in one deployment share it:
  QUARRY_TLS_CA            CA bundle to verify servers (set → TLS)
  QUARRY_TLS_CLIENT_CERT   client certificate, QUARRY_TLS_CLIENT_KEY its key (mutual TLS)
  QUARRY_TLS_SERVER_NAME   expected server name when addresses are IPs
  QUARRY_ACCESS_KEY / QUARRY_SECRET_KEY   ACL credentials: every call is signed
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import grpc

ACCESS_KEY_HEADER = "x-quarry-access-key"
TIMESTAMP_HEADER = "x-quarry-timestamp"
SIGNATURE_HEADER = "x-quarry-signature"


def sign(secret_key: str, method: str, timestamp_ms: int, access_key: str) -> str:
    """HMAC-SHA256 over the call's method, timestamp and access key (hex)."""
    message = f"{method}\n{timestamp_ms}\n{access_key}".encode()
    return hmac.new(secret_key.encode(), message, hashlib.sha256).hexdigest()


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: Any


class SigningInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds access key, timestamp and signature metadata to every call."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self.access_key = access_key
        self.secret_key = secret_key

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        ts = int(time.time() * 1000)
        metadata = list(details.metadata or []) + [
            (ACCESS_KEY_HEADER, self.access_key),
            (TIMESTAMP_HEADER, str(ts)),
            (SIGNATURE_HEADER, sign(self.secret_key, details.method, ts, self.access_key)),
        ]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials, getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Callable, details: grpc.ClientCallDetails, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation: Callable, details: grpc.ClientCallDetails, request_iterator: Any) -> Any:
        return continuation(self._details(details), request_iterator)


def _read(env: str) -> bytes | None:
    path = os.environ.get(env)
    return Path(path).read_bytes() if path else None


def open_channel(address: str, options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A channel to `address` with the deployment's TLS and ACL settings (see module doc)."""
    opts = list(options or [])
    ca = _read("QUARRY_TLS_CA")
    if ca is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=_read("QUARRY_TLS_CLIENT_KEY"), certificate_chain=_read("QUARRY_TLS_CLIENT_CERT"))
        if os.environ.get("QUARRY_TLS_SERVER_NAME"):
            opts.append(("grpc.ssl_target_name_override", os.environ["QUARRY_TLS_SERVER_NAME"]))
        channel = grpc.secure_channel(address, creds, options=opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    access, secret = os.environ.get("QUARRY_ACCESS_KEY"), os.environ.get("QUARRY_SECRET_KEY")
    if access and secret:
        return grpc.intercept_channel(channel, SigningInterceptor(access, secret))
    return channel
