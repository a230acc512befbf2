"""The one translation between the services' errors and gRPC status codes.

`rpc_errors` (a class decorator) wraps every RPC method of a servicer, sync or asyncio,
unary or streaming: a `ServiceError` raised inside becomes an abort with the status code of
STATUS_CODES and the error's message. `error_from_status` is the reverse, for a service
reading another's answer. The table is documented in docs/errors.md (tested equal).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

import grpc

from quarry.services.errors import Conflict, DiskFull, Expired, InvalidArgument, NotFound, ReadOnly, ServiceError, Unavailable

STATUS_CODES: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Expired: grpc.StatusCode.OUT_OF_RANGE,
    ReadOnly: grpc.StatusCode.FAILED_PRECONDITION,
    DiskFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    Conflict: grpc.StatusCode.ALREADY_EXISTS,
}
# Any other ServiceError: INTERNAL.


def status_code(exc: ServiceError) -> grpc.StatusCode:
    """The status code a ServiceError is reported with."""
    for kind in type(exc).__mro__:
        code = STATUS_CODES.get(kind)  # type: ignore[call-overload]
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def error_from_status(code_name: str, message: str) -> ServiceError:
    """The ServiceError for a status another service answered with (by code name); a code
    without an entry is Unavailable: the other side failed, not the caller."""
    for kind, code in STATUS_CODES.items():
        if code.name == code_name and kind is not Unavailable:
            return kind(message)
    return Unavailable(message)


T = TypeVar("T")


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def agen(self: Any, request: Any, context: Any) -> Any:
            try:
                async for item in method(self, request, context):
                    yield item
            except ServiceError as exc:
                await context.abort(status_code(exc), exc.message)
        return agen
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def coro(self: Any, request: Any, context: Any) -> Any:
            try:
                return await method(self, request, context)
            except ServiceError as exc:
                await context.abort(status_code(exc), exc.message)
        return coro
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def gen(self: Any, request: Any, context: Any) -> Any:
            try:
                yield from method(self, request, context)
            except ServiceError as exc:
                context.abort(status_code(exc), exc.message)
        return gen

    @functools.wraps(method)
    def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return method(self, request, context)
        except ServiceError as exc:
            context.abort(status_code(exc), exc.message)
    return unary


def rpc_errors(cls: type[T]) -> type[T]:
    """Class decorator: every RPC method (a public method named in CamelCase) reports
    ServiceErrors as status codes through STATUS_CODES."""
    for name, member in list(vars(cls).items()):
        if callable(member) and name[:1].isupper() and not name.startswith("_"):
            setattr(cls, name, _wrap(member))
    return cls
