"""The query requests exactly as RocketMQ 4.9's mqadmin builds them (MQAdminImpl.queryMessage,
MQClientAPIImpl.queryMessage/viewMessage), over the suite's small remoting client.

queryMsgByKey (maxNum 64) / queryMsgByUniqueKey (maxNum 32), both over [0, Long.MAX_VALUE] as
QueryMsgByKeySubCommand and QueryMsgByUniqueKeySubCommand call them: route from the NameServer, QUERY_MESSAGE with
QueryMessageRequestHeader {topic, key, maxNum, beginTimestamp, endTimestamp} and the
extField _UNIQUE_KEY_QUERY to the master of every BrokerData, records decoded as
MessageDecoder.decodes does, then MQAdminImpl's filter (KEYS contain the key / the message's
UNIQ_KEY equals it). queryMsgById: the offsetMsgId names the broker address and the offset;
VIEW_MESSAGE_BY_ID with ViewMessageRequestHeader {offset} goes there.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from quarry.formats import offset_msg_id
from quarry.formats.record import Record, decode_record
from quarry.services.remoting import codes
from tests.remoting_client import RemotingClient

LONG_MAX = (1 << 63) - 1


@dataclass
class BrokerAnswer:
    address: str
    code: int
    index_last_update_timestamp: int | None
    index_last_update_phy_offset: int | None
    body: bytes
    records: list[Record]
    raw: list[bytes]


def decodes(body: bytes) -> list[Record]:
    """MessageDecoder.decodes: consecutive records until the body ends."""
    return [rec for rec, _ in decodes_raw(body)]


def decodes_raw(body: bytes) -> list[tuple[Record, bytes]]:
    """decodes, with each record's own bytes."""
    out, pos = [], 0
    while pos < len(body):
        rec = decode_record(body, pos)
        out.append((rec, body[pos:pos + rec.store_size]))
        pos += rec.store_size
    return out


async def route(namesrv: str, topic: str, **auth: Any) -> dict:  # type: ignore[type-arg]
    async with RemotingClient(namesrv, **auth) as ns:
        resp = await ns.call(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert resp.code == codes.SUCCESS, (resp.code, resp.remark)
    return json.loads(resp.body)


async def query_message(namesrv: str, topic: str, key: str, max_num: int, begin: int, end: int, unique: bool, **auth: Any) -> tuple[list[Record], list[BrokerAnswer]]:
    """`auth` may also carry serialize_type: RocketMQ's clients send ROCKETMQ binary headers
    when -Drocketmq.serialize.type=ROCKETMQ is set."""
    data = await route(namesrv, topic, **auth)
    addrs = [bd["brokerAddrs"]["0"] for bd in data["brokerDatas"] if "0" in bd["brokerAddrs"]]

    async def one(addr: str) -> BrokerAnswer:
        async with RemotingClient(addr, **auth) as broker:
            req = broker.request(codes.QUERY_MESSAGE, {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin, "endTimestamp": end})
            req.ext_fields[codes.UNIQUE_KEY_QUERY_FLAG] = "true" if unique else "false"
            resp = await broker.invoke(req)
        ts, phy = resp.ext_fields.get("indexLastUpdateTimestamp"), resp.ext_fields.get("indexLastUpdatePhyoffset")
        pairs = decodes_raw(resp.body) if resp.code == codes.SUCCESS else []
        return BrokerAnswer(addr, resp.code, int(ts) if ts is not None else None, int(phy) if phy is not None else None, resp.body,
                            [r for r, _ in pairs], [b for _, b in pairs])

    answers = await asyncio.gather(*(one(a) for a in addrs))
    kept = []
    for a in answers:
        for rec in a.records:
            if unique:
                if rec.unique_key == key:
                    kept.append(rec)
            elif rec.keys_text is not None and key in rec.keys_text.split(" "):
                kept.append(rec)
    return kept, list(answers)


async def view_message(msg_id: str, **auth: str) -> tuple[int, str | None, bytes]:
    decoded = offset_msg_id.decode(msg_id)
    async with RemotingClient(f"{decoded.ip}:{decoded.port}", **auth) as broker:
        resp = await broker.call(codes.VIEW_MESSAGE_BY_ID, {"offset": decoded.offset})
    return resp.code, resp.remark, resp.body
