"""--event-loop: each service runs its main coroutine on the loop the setting names."""
from __future__ import annotations

import asyncio

import pytest
import uvloop

from quarry.services import event_loop
from quarry.services.commitlog.config import parse_args as commitlog_args
from quarry.services.indexer.config import parse_args as indexer_args
from quarry.services.query.config import parse_args as router_args


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_by_default_and_asyncio_on_request() -> None:
    assert issubclass(event_loop.run(_loop_type(), "uvloop"), uvloop.Loop)
    assert not issubclass(event_loop.run(_loop_type(), "asyncio"), uvloop.Loop)


@pytest.mark.parametrize("parse", [commitlog_args, indexer_args, router_args])
def test_every_service_has_the_setting_with_uvloop_as_default(parse, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("QUARRY_EVENT_LOOP", raising=False)
    base = ["--index-dir", "/tmp/x", "--commitlog", "127.0.0.1:1"] if parse is indexer_args else []
    assert parse(base).event_loop == "uvloop"
    monkeypatch.setenv("QUARRY_EVENT_LOOP", "asyncio")
    assert parse(base).event_loop == "asyncio"
