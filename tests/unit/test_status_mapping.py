"""The one error table: every service error maps to one status code, in sync and asyncio
servicers, unary and streaming; docs/errors.md shows exactly this table."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc
import pytest

from quarry.services.errors import Conflict, DiskFull, Expired, InvalidArgument, NotFound, ReadOnly, ServiceError, Unavailable
from quarry.services.status import STATUS_CODES, error_from_status, rpc_errors, status_code

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


class _Aborted(Exception):
    pass


class _Context:
    """Records the abort a servicer makes (grpc's context raises there too)."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise _Aborted()


class _AioContext(_Context):
    async def abort(self, code: grpc.StatusCode, details: str) -> None:  # type: ignore[override]
        super().abort(code, details)


@rpc_errors
class _Servicer:
    def Unary(self, request: ServiceError, context: _Context) -> str:
        raise request

    def Stream(self, request: ServiceError, context: _Context):  # type: ignore[no-untyped-def]
        yield "first"
        raise request

    async def AioUnary(self, request: ServiceError, context: _Context) -> str:
        raise request

    async def AioStream(self, request: ServiceError, context: _Context):  # type: ignore[no-untyped-def]
        yield "first"
        raise request

    def helper(self) -> str:
        return "not an RPC: left alone"


_CASES = [(InvalidArgument("key", "must not be empty"), grpc.StatusCode.INVALID_ARGUMENT, "key: must not be empty"),
          (NotFound("no record at 5"), grpc.StatusCode.NOT_FOUND, "no record at 5"),
          (Expired("below the minimum"), grpc.StatusCode.OUT_OF_RANGE, "below the minimum"),
          (ReadOnly("read-only"), grpc.StatusCode.FAILED_PRECONDITION, "read-only"),
          (DiskFull("no space"), grpc.StatusCode.RESOURCE_EXHAUSTED, "no space"),
          (Unavailable("commitlog did not answer"), grpc.StatusCode.UNAVAILABLE, "commitlog did not answer"),
          (Conflict("store host taken"), grpc.StatusCode.ALREADY_EXISTS, "store host taken"),
          (ServiceError("something else"), grpc.StatusCode.INTERNAL, "something else")]


@pytest.mark.parametrize("error,code,details", _CASES)
def test_every_handler_shape_reports_the_error_with_its_code(error: ServiceError, code: grpc.StatusCode, details: str) -> None:
    servicer = _Servicer()
    ctx = _Context()
    with pytest.raises(_Aborted):
        servicer.Unary(error, ctx)
    assert (ctx.code, ctx.details) == (code, details)

    ctx = _Context()
    got = []
    with pytest.raises(_Aborted):
        for item in servicer.Stream(error, ctx):
            got.append(item)
    assert got == ["first"] and (ctx.code, ctx.details) == (code, details)

    async def aio() -> list[object]:
        actx = _AioContext()
        with pytest.raises(_Aborted):
            await servicer.AioUnary(error, actx)
        seen = [(actx.code, actx.details)]
        actx = _AioContext()
        items = []
        with pytest.raises(_Aborted):
            async for item in servicer.AioStream(error, actx):
                items.append(item)
        return seen + [(actx.code, actx.details), items]

    assert asyncio.run(aio()) == [(code, details), (code, details), ["first"]]
    assert servicer.helper() == "not an RPC: left alone"


def test_a_subclass_takes_its_parents_code_and_other_exceptions_pass_through() -> None:
    class TopicMissing(NotFound):
        pass

    assert status_code(TopicMissing("x")) == grpc.StatusCode.NOT_FOUND
    with pytest.raises(KeyError):
        _Servicer.Unary(_Servicer(), KeyError("a bug"), _Context())  # type: ignore[arg-type]


def test_invalid_argument_names_field_and_rule_either_way() -> None:
    a, b = InvalidArgument("max_num", "must be >= 0"), InvalidArgument("max_num: must be >= 0")
    assert str(a) == str(b) == "max_num: must be >= 0"
    assert (a.field, a.rule) == (b.field, b.rule) == ("max_num", "must be >= 0")


def test_a_remote_status_becomes_the_same_error_and_anything_else_unavailable() -> None:
    for kind, code in STATUS_CODES.items():
        back = error_from_status(code.name, "m")
        assert type(back) is kind and back.message == "m"
    assert type(error_from_status("INTERNAL", "m")) is Unavailable
    assert type(error_from_status("DEADLINE_EXCEEDED", "m")) is Unavailable


def test_the_documented_table_is_the_mapping() -> None:
    text = DOC.read_text()
    table = text.split("<!-- status-table:begin -->")[1].split("<!-- status-table:end -->")[0]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \|", table, re.M)
    assert rows == [(kind.__name__, code.name) for kind, code in STATUS_CODES.items()]
