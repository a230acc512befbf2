"""The CommitLog record codec: RocketMQ 4.x's on-disk message layout, encoded and decoded.

What an index or queue needs of a record (the dispatch rule) is in `dispatch`; the body of a
MessageBatch in `batch_body`.

Layout (big-endian): TOTALSIZE i32, MAGIC i32, BODYCRC i32, QUEUEID i32, FLAG i32,
QUEUEOFFSET i64 @20, PHYSICALOFFSET i64 @28, SYSFLAG i32 @36, BORNTIMESTAMP i64 @40,
BORNHOST (4+4, or 16+4 with sysflag 0x10), STORETIMESTAMP i64, STOREHOST (4+4, or 16+4
with sysflag 0x20), RECONSUMETIMES i32, PREPAREDTRANSACTIONOFFSET i64, BODYLEN i32 + body,
TOPICLEN i8 + topic, PROPLEN i16 + properties. Size = 91 + body + topic + properties,
plus 12 for each IPv6 host.
"""
from __future__ import annotations

import functools
import mmap
import struct
from dataclasses import dataclass, field

from quarry.formats.crc import crc32
from quarry.formats.offset_msg_id import create as create_offset_msg_id
from quarry.formats.offset_msg_id import ip_bytes, java_host_address
from quarry.formats.properties import KEYS, TAGS, UNIQ_KEY, decode_pairs, key_tokens, properties_map

MESSAGE_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
BLANK_HEADER_SIZE = 8  # a segment always keeps room for this end-of-file marker
FIXED_SIZE = 91
IPV6_EXTRA = 12

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_TRANSACTION_NOT_TYPE = 0x0
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

QUEUE_ID_POS = 12
QUEUE_OFFSET_POS = 20
PHYSICAL_OFFSET_POS = 28
SYSFLAG_POS = 36
BORN_HOST_POS = 48

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_HEAD = struct.Struct(">iIiiiqqiq")  # TOTALSIZE..BORNTIMESTAMP (48 bytes)
_SIZE_MAGIC = struct.Struct(">iI")
_TAIL = struct.Struct(">iq")  # RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET
Host = tuple[str, int]


class CorruptRecordError(ValueError):
    """Bytes at `offset` are not a valid record; `reason` says which check failed."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"corrupt record at physical offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def body_crc(body: bytes | memoryview) -> int:
    """BODYCRC: CRC32 of the stored body & 0x7FFFFFFF (0 for an empty body)."""
    return crc32(body) & 0x7FFFFFFF if body else 0


def transaction_type(sys_flag: int) -> int:
    return sys_flag & SYSFLAG_TRANSACTION_MASK


def takes_queue_offset(sys_flag: int) -> bool:
    """Prepared and rollback records are stored at queue offset 0 and do not advance the queue."""
    return transaction_type(sys_flag) not in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK)


@functools.lru_cache(maxsize=4096)
def host_bytes(host: Host) -> bytes:
    """IP (4 or 16 bytes) + port i32, as a record stores a host (cached: hosts repeat).
    ValueError for a text that is no IP address."""
    return ip_bytes(host[0]) + _I32.pack(host[1])


def host_sys_flag(sys_flag: int, born: bytes, store: bytes) -> int:
    """SYSFLAG as stored: the IPv6 bits follow the hosts' address families (as the CommitLog sets them)."""
    return (sys_flag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)) | (SYSFLAG_BORNHOST_V6 if len(born) == 20 else 0) | (SYSFLAG_STOREHOST_V6 if len(store) == 20 else 0)


def record_size(body_len: int, topic_field_len: int, props_len: int, born_len: int, store_len: int) -> int:
    """TOTALSIZE: the fixed fields (91 bytes with IPv4 hosts, TOPICLEN included), body, topic, properties."""
    return FIXED_SIZE - 1 + body_len + topic_field_len + props_len + (born_len - 8) + (store_len - 8)


@functools.lru_cache(maxsize=1024)
def record_struct(middle_len: int, body_len: int, topic_field_len: int, props_len: int) -> struct.Struct:
    """The whole record as one Struct, for records of these field lengths (cached: a producer's
    records mostly repeat a few). pack_into's values, in order: TOTALSIZE, MAGIC, BODYCRC,
    QUEUEID, FLAG, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, the middle (`record_middle`: born
    time and host, store time and host, reconsume times, prepared offset, packed on their own),
    BODYLEN, body, TOPICLEN + topic (`topic_field`), PROPLEN, properties. One pack writes a
    record: a quarter of the time of packing the fixed fields and copying the rest in three
    slices, which the send path pays per message."""
    return struct.Struct(f">iIiiiqqi{middle_len}si{body_len}s{topic_field_len}sh{props_len}s")


@functools.lru_cache(maxsize=16)
def _middle_struct(born_len: int, store_len: int) -> struct.Struct:
    # A host is 8 bytes for IPv4 and 20 for IPv6 (ip + port i32).
    return struct.Struct(f">q{born_len}sq{store_len}siq")


def middle_size(born_host_len: int, store_host_len: int) -> int:
    """The length of `record_middle` for hosts of these lengths."""
    return _middle_struct(born_host_len, store_host_len).size


def record_middle(born_timestamp: int, born_host: bytes, store_timestamp: int, store_host: bytes, reconsume_times: int,
                  prepared_transaction_offset: int) -> bytes:
    """BORNTIMESTAMP, BORNHOST, STORETIMESTAMP, STOREHOST, RECONSUMETIMES and
    PREPAREDTRANSACTIONOFFSET (hosts as `host_bytes`), packed for `record_struct`: the records
    of a batch mostly share them, so the send path packs them once for all such records (big-
    endian 64-bit integers are struct's slowest values to pack)."""
    return _middle_struct(len(born_host), len(store_host)).pack(born_timestamp, born_host, store_timestamp, store_host, reconsume_times,
                                                                 prepared_transaction_offset)


def encode_record(
    *,
    topic: str,
    body: bytes,
    properties: str | bytes,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: Host,
    store_timestamp: int,
    store_host: Host,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """One record, byte for byte as RocketMQ's CommitLog writes it.

    The IPv6 sysflag bits are set from the hosts' address families, as the CommitLog does.
    `properties` may be given already UTF-8 encoded. The send path (services/commitlog/append)
    packs the same fields with the same `record_struct`, a batch at a time.
    """
    born = host_bytes(born_host)
    store = host_bytes(store_host)
    sys_flag = host_sys_flag(sys_flag, born, store)
    tf = topic_field(topic)
    props_b = properties.encode("utf-8") if isinstance(properties, str) else properties
    if len(props_b) > 32767:
        raise ValueError(f"properties: at most 32767 bytes, got {len(props_b)}")
    size = record_size(len(body), len(tf), len(props_b), len(born), len(store))
    if crc is None:
        crc = body_crc(body)
    middle = record_middle(born_timestamp, born, store_timestamp, store, reconsume_times, prepared_transaction_offset)
    return record_struct(len(middle), len(body), len(tf), len(props_b)).pack(
        size, MESSAGE_MAGIC, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, middle, len(body), body, tf, len(props_b), props_b)


@functools.lru_cache(maxsize=4096)
def topic_field(topic: str) -> bytes:
    """TOPICLEN (signed byte) + topic bytes (cached: a store holds few topics)."""
    topic_b = topic.encode("utf-8")
    if len(topic_b) > 127:
        raise ValueError(f"topic: at most 127 bytes, got {len(topic_b)}")
    return bytes((len(topic_b),)) + topic_b


def store_timestamp_pos(sys_flag: int) -> int:
    """Where STORETIMESTAMP sits (it follows the born host, whose size depends on its family)."""
    return BORN_HOST_POS + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)


def blank_record(remaining: int) -> bytes:
    """The 8-byte end-of-segment header: TOTALSIZE = bytes left in the segment, BLANK magic."""
    return _SIZE_MAGIC.pack(remaining, BLANK_MAGIC)


@dataclass(slots=True)
class Record:
    """A decoded record: every field of RocketMQ's MessageExt as stored."""

    store_size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties_text: str
    _properties: dict[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def properties_pairs(self) -> list[tuple[str, str]]:
        return decode_pairs(self.properties_text)

    @property
    def properties(self) -> dict[str, str]:
        """The properties as RocketMQ's reader sees them, parsed once per record (do not modify)."""
        props = self._properties
        if props is None:
            props = self._properties = properties_map(self.properties_text)
        return props

    @property
    def keys_text(self) -> str | None:
        return self.properties.get(KEYS)

    @property
    def keys(self) -> list[str]:
        return key_tokens(self.keys_text)

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def unique_key(self) -> str | None:
        return self.properties.get(UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        return create_offset_msg_id(self.store_host[0], self.store_host[1], self.physical_offset)


def _read_host(buf: bytes | mmap.mmap | memoryview, pos: int, v6: bool) -> tuple[Host, int]:
    n = 16 if v6 else 4
    raw = bytes(buf[pos:pos + n])
    port = _I32.unpack_from(buf, pos + n)[0]
    return (java_host_address(raw), port), pos + n + 4


def read_size_and_magic(buf: bytes | mmap.mmap | memoryview, pos: int) -> tuple[int, int]:
    """TOTALSIZE and MAGIC of whatever starts at pos (needs 8 bytes)."""
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return size, magic


def decode_record(buf: bytes | mmap.mmap | memoryview, pos: int = 0, *, physical_offset: int | None = None, check_crc: bool = True) -> Record:
    """Decode the record at buf[pos:], validating magic, sizes and (by default) the body CRC.

    `physical_offset` is the record's log offset, for error messages and a consistency
    check against PHYSICALOFFSET; CorruptRecordError says what failed.
    """
    where = pos if physical_offset is None else physical_offset
    avail = len(buf) - pos
    if avail < FIXED_SIZE:
        raise CorruptRecordError(where, f"only {avail} bytes left, a record needs at least {FIXED_SIZE}")
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC:
        raise CorruptRecordError(where, f"bad magic code 0x{magic:08X}")
    if size < FIXED_SIZE or size > avail:
        raise CorruptRecordError(where, f"TOTALSIZE {size} outside {FIXED_SIZE}..{avail}")
    (_, _, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = _HEAD.unpack_from(buf, pos)
    if physical_offset is not None and phys != physical_offset:
        raise CorruptRecordError(where, f"PHYSICALOFFSET {phys} does not match the record's position")
    end = pos + size
    p = pos + BORN_HOST_POS
    v6_hosts = bool(sys_flag & SYSFLAG_BORNHOST_V6) + bool(sys_flag & SYSFLAG_STOREHOST_V6)
    if size < FIXED_SIZE + IPV6_EXTRA * v6_hosts:
        raise CorruptRecordError(where, "TOTALSIZE too small for its IPv6 hosts")
    born_host, p = _read_host(buf, p, bool(sys_flag & SYSFLAG_BORNHOST_V6))
    store_ts = _I64.unpack_from(buf, p)[0]
    store_host, p = _read_host(buf, p + 8, bool(sys_flag & SYSFLAG_STOREHOST_V6))
    reconsume, prepared = _TAIL.unpack_from(buf, p)
    p += 12
    body_len = _I32.unpack_from(buf, p)[0]
    p += 4
    if body_len < 0 or p + body_len + 3 > end:
        raise CorruptRecordError(where, f"BODYLEN {body_len} does not fit in TOTALSIZE {size}")
    body = bytes(buf[p:p + body_len])
    p += body_len
    topic_len = struct.unpack_from(">b", buf, p)[0]
    p += 1
    if topic_len < 0 or p + topic_len + 2 > end:
        raise CorruptRecordError(where, f"TOPICLEN {topic_len} does not fit in TOTALSIZE {size}")
    topic_b = bytes(buf[p:p + topic_len])
    p += topic_len
    props_len = struct.unpack_from(">h", buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len != end:
        raise CorruptRecordError(where, f"PROPLEN {props_len} does not end at TOTALSIZE {size}")
    props_b = bytes(buf[p:p + props_len])
    if check_crc and body_len and body_crc(body) != crc:
        raise CorruptRecordError(where, f"body CRC {body_crc(body)} != stored BODYCRC {crc}")
    try:
        topic = topic_b.decode("utf-8")
        props = props_b.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(where, f"topic or properties are not UTF-8: {exc}") from None
    return Record(size, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_host, store_ts, store_host, reconsume, prepared, body, topic, props)


def decode_dispatch_fields(buf: bytes | memoryview, pos: int, physical_offset: int, checked: bool = False) -> tuple[int, str, int, int, int, int, int, str]:
    """(size, topic, queue_id, queue_offset, store_timestamp, sys_flag, prepared_transaction_offset,
    properties text) of the record at buf[pos:], without copying its body.

    For streaming what is already in the log (Tail): the frame is still validated (magic,
    sizes, position), so garbage never passes as a record; CRC is checked by reads and recovery.
    `checked` checks what decode_record checks besides (the body CRC, UTF-8): a key query's
    check of the records it hands out.
    """
    avail = len(buf) - pos
    if avail < FIXED_SIZE:
        raise CorruptRecordError(physical_offset, f"only {avail} bytes left, a record needs at least {FIXED_SIZE}")
    (size, magic, crc, queue_id, _flag, queue_offset, phys, sys_flag, _born_ts) = _HEAD.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC:
        raise CorruptRecordError(physical_offset, f"bad magic code 0x{magic:08X}")
    if size < FIXED_SIZE or size > avail or phys != physical_offset:
        raise CorruptRecordError(physical_offset, f"TOTALSIZE {size} or PHYSICALOFFSET {phys} inconsistent")
    end = pos + size
    if size < FIXED_SIZE + IPV6_EXTRA * (bool(sys_flag & SYSFLAG_BORNHOST_V6) + bool(sys_flag & SYSFLAG_STOREHOST_V6)):
        raise CorruptRecordError(physical_offset, "TOTALSIZE too small for its IPv6 hosts")
    p = pos + BORN_HOST_POS + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
    store_ts = _I64.unpack_from(buf, p)[0]
    p += 8 + (20 if sys_flag & SYSFLAG_STOREHOST_V6 else 8)
    prepared = _I64.unpack_from(buf, p + 4)[0]  # after RECONSUMETIMES
    p += 12
    body_len = _I32.unpack_from(buf, p)[0]
    p += 4 + body_len
    if body_len < 0 or p + 3 > end:
        raise CorruptRecordError(physical_offset, f"BODYLEN {body_len} does not fit in TOTALSIZE {size}")
    if checked and body_len and (got := body_crc(buf[p - body_len:p])) != crc:
        raise CorruptRecordError(physical_offset, f"body CRC {got} != stored BODYCRC {crc}")
    topic_len = buf[p]
    if topic_len > 127 or p + 1 + topic_len + 2 > end:
        raise CorruptRecordError(physical_offset, f"TOPICLEN {topic_len} does not fit in TOTALSIZE {size}")
    errors = "strict" if checked else "replace"
    try:
        topic = bytes(buf[p + 1:p + 1 + topic_len]).decode("utf-8", errors)
        p += 1 + topic_len
        props_len = _I16.unpack_from(buf, p)[0]
        if props_len < 0 or p + 2 + props_len != end:
            raise CorruptRecordError(physical_offset, f"PROPLEN {props_len} does not end at TOTALSIZE {size}")
        props_text = bytes(buf[p + 2:end]).decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(physical_offset, f"topic or properties are not UTF-8: {exc}") from None
    return size, topic, queue_id, queue_offset, store_ts, sys_flag, prepared, props_text
