"""A stored record as quarry.v1's StoredMessage: what the quarry.v1 doors of the commitlog and
the indexer both answer with."""
from __future__ import annotations

from quarry.formats import scheduled
from quarry.formats.body import readable_body
from quarry.formats.record import Record
from quarry.v1 import common_pb2


def to_stored(rec: Record, broker_name: str = "") -> common_pb2.StoredMessage:
    """A decoded record as the wire's StoredMessage (every MessageExt field; the body inflated
    as MessageDecoder.decode gives it, the sysFlag as stored)."""
    props = rec.properties
    schedule = scheduled.schedule_of(rec.topic, props, rec.store_timestamp)
    return common_pb2.StoredMessage(
        topic=rec.topic, flag=rec.flag, body=readable_body(rec.body, rec.sys_flag),
        properties=[common_pb2.Property(name=n, value=v) for n, v in rec.properties_pairs],
        keys=rec.keys, tags=props.get("TAGS", ""), unique_key=props.get("UNIQ_KEY", ""),
        queue_id=rec.queue_id, queue_offset=rec.queue_offset, commit_log_offset=rec.physical_offset,
        store_size=rec.store_size, sys_flag=rec.sys_flag, born_timestamp=rec.born_timestamp,
        born_host=common_pb2.HostAddress(ip=rec.born_host[0], port=rec.born_host[1]),
        store_timestamp=rec.store_timestamp,
        store_host=common_pb2.HostAddress(ip=rec.store_host[0], port=rec.store_host[1]),
        reconsume_times=rec.reconsume_times, prepared_transaction_offset=rec.prepared_transaction_offset,
        body_crc=rec.body_crc, offset_msg_id=rec.offset_msg_id, broker_name=broker_name,
        scheduled=schedule is not None, deliver_timestamp=schedule.deliver_timestamp if schedule else 0,
        real_topic=schedule.real_topic if schedule else "",
    )
