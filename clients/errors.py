"""Typed client errors carrying the server's status code and message."""
from __future__ import annotations

import grpc


class QuarryError(Exception):
    """Base: `code` is the gRPC status name, `message` the server's words."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class NotFoundError(QuarryError):
    """No such message, topic or broker."""


class InvalidArgumentError(QuarryError):
    """Bad input; the message names the field and the rule."""


class UnavailableError(QuarryError):
    """A service did not answer (down, unreachable or out of time)."""


def from_rpc_error(exc: grpc.RpcError) -> QuarryError:
    code = exc.code()  # type: ignore[attr-defined]
    message = exc.details() or ""  # type: ignore[attr-defined]
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE):
        return NotFoundError(code.name, message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgumentError(code.name, message)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return UnavailableError(code.name, message)
    return QuarryError(code.name, message)
