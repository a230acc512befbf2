"""The tailer indexes the Tail responses that arrived while it indexed the previous ones as
one group (one wait for the key presence watchers), in order, and reports a failed stream
after the responses that came before it."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import grpc
import pytest

from quarry.services.indexer.tailer import _grouped
from quarry.v1 import commitlog_pb2


def _response(n: int) -> commitlog_pb2.TailResponse:
    return commitlog_pb2.TailResponse(next_offset=n)


async def _stream(first: int, then: list[int], gate: asyncio.Event, fail: Exception | None = None) -> AsyncIterator[commitlog_pb2.TailResponse]:
    yield _response(first)
    await gate.wait()  # the rest arrive while the first group is being indexed
    for n in then:
        yield _response(n)
    if fail is not None:
        raise fail


def test_responses_that_arrive_during_indexing_form_one_group_in_order() -> None:
    async def run() -> list[list[int]]:
        gate, groups = asyncio.Event(), []
        async for group in _grouped(_stream(1, [2, 3, 4], gate), 30.0):
            groups.append([r.next_offset for r in group])
            if len(groups) == 1:
                gate.set()
                for _ in range(10):  # indexing the first group takes a while
                    await asyncio.sleep(0)
        return groups

    assert asyncio.run(run()) == [[1], [2, 3, 4]]


def test_a_failed_stream_is_raised_after_what_came_before_it() -> None:
    failure = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")

    seen: list[list[int]] = []

    async def collect() -> None:
        gate = asyncio.Event()
        gate.set()
        async for group in _grouped(_stream(1, [2], gate, failure), 30.0):
            seen.append([r.next_offset for r in group])

    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(collect())
    assert [n for g in seen for n in g] == [1, 2]


def test_a_stream_silent_without_ending_is_over() -> None:
    # A half-open connection never ends the stream: the commitlog sends at least an empty
    # response each second, so a long silence means the peer is gone and the tail reconnects.
    from quarry.services.silent_streams import Silent

    seen: list[int] = []

    async def collect() -> None:
        async for group in _grouped(_stream(1, [2], asyncio.Event()), silent_s=0.05):  # then silent
            seen.extend(r.next_offset for r in group)

    with pytest.raises(Silent, match="no Tail response within 0.05 s"):
        asyncio.run(collect())
    assert seen == [1]
