"""Every MessagingService RPC a servicer does not implement answers in-band NOT_IMPLEMENTED,
naming the RPC and what Quarry serves, and is logged: never gRPC's bare UNIMPLEMENTED, never
silence. A servicer that implements an RPC (as the consumer path will) simply defines it.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from google.protobuf.descriptor import MethodDescriptor

from quarry.services.log import log_event
from quarry.services.rmq5.contract import SERVICE_NAME, Code, service, v2

log = logging.getLogger("quarry.rmq5")
METHODS = service.DESCRIPTOR.services_by_name["MessagingService"].methods


def refusal(method: MethodDescriptor, served: list[str]) -> Any:
    response_type = getattr(service, method.output_type.name)
    why = f"{SERVICE_NAME}/{method.name} is not implemented by this Quarry endpoint (it serves {', '.join(served)})"
    return response_type(status=v2.Status(code=Code.NOT_IMPLEMENTED, message=why)), why


def _handler(method: MethodDescriptor, served: list[str], aio: bool) -> Callable[..., Any]:
    response, why = refusal(method, served)

    def _log(context: Any) -> None:
        log_event(log, "unsupported rpc", logging.WARNING, rpc=method.name, peer=context.peer())

    if method.server_streaming:
        if aio:
            async def astream(_self: Any, _request: Any, context: Any) -> Any:
                _log(context)
                yield response
            return astream

        def stream(_self: Any, _request: Any, context: Any) -> Any:
            _log(context)
            yield response
        return stream
    if aio:
        async def aunary(_self: Any, _request: Any, context: Any) -> Any:
            _log(context)
            return response
        return aunary

    def unary(_self: Any, _request: Any, context: Any) -> Any:
        _log(context)
        return response
    return unary


def fill_unsupported(cls: type, aio: bool) -> type:
    """Give `cls` an answering handler for every RPC it does not define itself."""
    served = [m.name for m in METHODS if m.name in cls.__dict__]
    for m in METHODS:
        if m.name not in cls.__dict__:
            setattr(cls, m.name, _handler(m, served, aio))
    return cls
