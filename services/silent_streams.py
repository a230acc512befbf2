"""A stream that stops sending without ending: a peer gone without a word (a half-open
connection) leaves a read waiting for good. Streams whose sender promises something at least
every so often (the commitlog's Tail, an indexer's key presence watch) read through
`within`, and their readers open them again on `Silent`."""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

T = TypeVar("T")


class Silent(Exception):
    """A stream that stopped sending without ending."""


async def within(read: Awaitable[T], seconds: float, what: str) -> T:
    """`read`'s result, or Silent(`what`) once `seconds` pass without one."""
    try:
        async with asyncio.timeout(seconds):  # (not wait_for: on 3.11 it may swallow a cancellation)
            return await read
    except TimeoutError:
        raise Silent(what) from None
