"""The services' errors as RocketMQ 4's broker answers them: one response code per error
(docs/errors.md shows this table). The remark is the error's message (field and rule)."""
from __future__ import annotations

from quarry.services.errors import DiskFull, Expired, InvalidArgument, NotFound, ReadOnly, ServiceError, Unavailable
from quarry.services.remoting import codes
from quarry.services.remoting.server import RemotingError

RESPONSE_CODES: dict[type[ServiceError], tuple[int, str]] = {
    InvalidArgument: (codes.MESSAGE_ILLEGAL, "MESSAGE_ILLEGAL"),
    NotFound: (codes.TOPIC_NOT_EXIST, "TOPIC_NOT_EXIST"),
    Expired: (codes.SYSTEM_ERROR, "SYSTEM_ERROR"),
    ReadOnly: (codes.SERVICE_NOT_AVAILABLE, "SERVICE_NOT_AVAILABLE"),
    DiskFull: (codes.SERVICE_NOT_AVAILABLE, "SERVICE_NOT_AVAILABLE"),
    Unavailable: (codes.SYSTEM_ERROR, "SYSTEM_ERROR"),
}


def remoting_error(exc: ServiceError) -> RemotingError:
    code = next((c for t, (c, _) in RESPONSE_CODES.items() if isinstance(exc, t)), codes.SYSTEM_ERROR)
    return RemotingError(code, str(exc))
