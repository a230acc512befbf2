"""Request signing, shared by the callers that sign (every outgoing channel) and the services
that verify (services/security.py): the headers, the call signature bound to the request's
bytes, the chained signature of each streamed message, and the client interceptor.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Any, Callable, NamedTuple, Sequence

import grpc

ACCESS_KEY_HEADER = "x-quarry-access-key"
TIMESTAMP_HEADER = "x-quarry-timestamp"
NONCE_HEADER = "x-quarry-nonce"
SIGNATURE_HEADER = "x-quarry-signature"
# A streamed request carries no digest in the call's signature: each message carries its own
# signature (field `signature`), chained to the call's.
STREAMED = "stream"


def request_digest(serialized: bytes) -> str:
    """SHA-256 (hex) of one serialized request: what the call's signature is bound to."""
    return hashlib.sha256(serialized).hexdigest()


def sign(secret_key: str, method: str, timestamp_ms: int, access_key: str, nonce: str, digest: str) -> str:
    """HMAC-SHA256 (hex) over the method, timestamp, access key, nonce and the request's
    digest (`request_digest`, or STREAMED for a streamed request)."""
    message = f"{method}\n{timestamp_ms}\n{access_key}\n{nonce}\n{digest}".encode()
    return hmac.new(secret_key.encode(), message, hashlib.sha256).hexdigest()


def unsigned_bytes(message: Any) -> bytes:
    """A streamed message serialized with its `signature` field empty: what that signature covers."""
    if not message.signature:
        return message.SerializeToString()
    copy = type(message)()
    copy.CopyFrom(message)
    copy.signature = ""
    return copy.SerializeToString()


def sign_stream_item(secret_key: str, call_signature: str, index: int, message: Any) -> str:
    """The signature of the `index`-th (from 0) message of a streamed call: bound to the call
    (its signature), to the position (no reordering, no splicing) and to the message bytes."""
    text = f"{call_signature}\n{index}\n{request_digest(unsigned_bytes(message))}".encode()
    return hmac.new(secret_key.encode(), text, hashlib.sha256).hexdigest()


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Sequence[tuple[str, str]] | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: Any


class SigningInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor, grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Signs every call: access key, timestamp, a fresh nonce and a signature bound to the
    request's bytes (a streamed request: each message signed in turn)."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self.access_key = access_key
        self.secret_key = secret_key

    def _details(self, details: grpc.ClientCallDetails, digest: str) -> tuple[_CallDetails, str]:
        ts = int(time.time() * 1000)
        nonce = secrets.token_hex(8)
        # grpc.aio hands the method over as bytes, the thread-pool channel as str: sign the text.
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        signature = sign(self.secret_key, method, ts, self.access_key, nonce, digest)
        metadata = list(details.metadata or []) + [
            (ACCESS_KEY_HEADER, self.access_key),
            (TIMESTAMP_HEADER, str(ts)),
            (NONCE_HEADER, nonce),
            (SIGNATURE_HEADER, signature),
        ]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials, getattr(details, "wait_for_ready", None), getattr(details, "compression", None)), signature

    def _signed_items(self, call_signature: str, request_iterator: Any) -> Any:
        for index, message in enumerate(request_iterator):
            yield _signed_item(self.secret_key, call_signature, index, message)

    def intercept_unary_unary(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details, request_digest(request.SerializeToString()))[0], request)

    def intercept_unary_stream(self, continuation: Callable, details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details, request_digest(request.SerializeToString()))[0], request)

    def intercept_stream_unary(self, continuation: Callable, details: grpc.ClientCallDetails, request_iterator: Any) -> Any:
        signed, call_signature = self._details(details, STREAMED)
        return continuation(signed, self._signed_items(call_signature, request_iterator))

    def intercept_stream_stream(self, continuation: Callable, details: grpc.ClientCallDetails, request_iterator: Any) -> Any:
        signed, call_signature = self._details(details, STREAMED)
        return continuation(signed, self._signed_items(call_signature, request_iterator))


def _aio_signed(sync: SigningInterceptor, details: grpc.aio.ClientCallDetails, digest: str) -> tuple[grpc.aio.ClientCallDetails, str]:
    """`details` signed for a request with this digest (or STREAMED), as grpc.aio takes them,
    and the call's signature (what a streamed call's messages are chained to)."""
    signed, call_signature = sync._details(details, digest)
    aio = grpc.aio.ClientCallDetails(signed.method, signed.timeout, grpc.aio.Metadata(*signed.metadata or []), signed.credentials, signed.wait_for_ready)
    return aio, call_signature


class AioSigningInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """SigningInterceptor for asyncio channels (unary calls: what the services call each other with)."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self._sync = SigningInterceptor(access_key, secret_key)

    async def intercept_unary_unary(self, continuation: Callable, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        return await continuation(_aio_signed(self._sync, details, request_digest(request.SerializeToString()))[0], request)


class AioStreamSigningInterceptor(grpc.aio.UnaryStreamClientInterceptor):
    """The same for server-streaming calls (the indexer's Tail, the key presence watch). A grpc.aio channel files each
    interceptor under the first call kind it is an instance of, so this is a second object."""

    def __init__(self, access_key: str, secret_key: str) -> None:
        self._sync = SigningInterceptor(access_key, secret_key)

    async def intercept_unary_stream(self, continuation: Callable, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        return await continuation(_aio_signed(self._sync, details, request_digest(request.SerializeToString()))[0], request)


def _signed_item(secret_key: str, call_signature: str, index: int, message: Any) -> Any:
    if "signature" not in message.DESCRIPTOR.fields_by_name:
        return message  # a type that cannot carry one: the server refuses it, saying so
    signed = type(message)()
    signed.CopyFrom(message)
    signed.signature = sign_stream_item(secret_key, call_signature, index, message)
    return signed
