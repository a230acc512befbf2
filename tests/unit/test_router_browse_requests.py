"""The router's browse and search-offset requests: bad input refused before any broker is asked."""
from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from quarry.services.errors import InvalidArgument, NotFound
from quarry.services.query.broker_clients import BrokerClients
from quarry.services.query.browse import browse_topic, search_offset
from quarry.services.query.queries import Queries, QuerySettings
from quarry.services.query.registry import BrokerRegistry


@pytest.fixture
def queries() -> Iterator[Queries]:
    q = Queries(BrokerRegistry(expiry_ms=60_000), BrokerClients(), QuerySettings(), clock_ms=lambda: 5_000)
    yield q
    asyncio.run(q.clients.close())


@pytest.mark.parametrize("kwargs,field", [
    (dict(topic="bad topic"), "topic"),
    (dict(tags="||"), "tag_expression"),
    (dict(max_num=1025), "max_num"),
    (dict(max_num=-1), "max_num"),
    (dict(begin=-1), "begin_timestamp"),
    (dict(end=-5), "end_timestamp"),
    (dict(begin=10, end=5), "end_timestamp"),
    (dict(begin=6_000), "end_timestamp"),  # end 0 means now (5,000 here), before begin
    (dict(queue_id=-1, broker_name="b"), "queue_id"),
    (dict(queue_id=0), "queue_id"),  # a queue id names a queue of one broker
    (dict(token="not-a-token"), "continuation_token"),
])
def test_bad_browse_requests_name_the_field(queries: Queries, kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = dict(topic="T", begin=0, end=0, tags="", oldest_first=False, max_num=0, token="", broker_name="", queue_id=None)
    args.update(kwargs)
    with pytest.raises(InvalidArgument, match=field):
        asyncio.run(browse_topic(queries, args["topic"], args["begin"], args["end"], args["tags"], args["oldest_first"], args["max_num"],  # type: ignore[arg-type]
                     args["token"], 0, args["broker_name"], args["queue_id"]))  # type: ignore[arg-type]


def test_unknown_topic_or_broker_is_not_found(queries: Queries) -> None:
    with pytest.raises(NotFound, match="no route for topic T"):
        asyncio.run(browse_topic(queries, "T", 0, 0, "", False, 0, ""))
    with pytest.raises(NotFound, match="broker_name"):
        asyncio.run(browse_topic(queries, "T", 0, 0, "", False, 0, "", broker_name="broker-z", queue_id=0))
    with pytest.raises(NotFound, match="broker_name"):
        asyncio.run(search_offset(queries, "T", "broker-z", 0, 0, 0))


@pytest.mark.parametrize("args,field", [(("T", "b", -1, 0, 0), "queue_id"), (("T", "b", 0, -1, 0), "timestamp"),
                                        (("T", "b", 0, 0, 7), "boundary"), (("T", "", 0, 0, 0), "broker_name")])
def test_bad_search_offset_requests(queries: Queries, args: tuple[str, str, int, int, int], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        asyncio.run(search_offset(queries, *args))
