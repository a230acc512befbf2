"""Access control's limits on real processes (issue 33): a RocketMQ 5 authorization header is
good only near the server's clock (hole 3), and what peers that never authenticate can make a
commitlog hold on its remoting port (hole 5), measured from its RSS."""
from __future__ import annotations

import asyncio
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest

from quarry.services.remoting import codes
from quarry.services.remoting.acl import sign
from quarry.services.remoting.command import RemotingCommand, decode_frame, encode_frame, encode_header, to_ext_fields
from quarry.services.rmq5.auth import authorization_header
from quarry.services.rmq5.contract import service, service_grpc, v2
from scripts.launcher import ServiceProcess
from tests.e2e.conftest import Launch, launch_with_acl, wait_until

ACCOUNTS = [
    {"access_key": "ops", "secret_key": "ops-secret", "admin": True},
    {"access_key": "pub", "secret_key": "pub-secret", "topics": {"TopicA": ["publish"]}},
]
MIB = 1 << 20


# -- hole 3: RocketMQ 5 (gRPC) ------------------------------------------------------------------
def _rmq5_md(date_time: str, access_key: str = "pub", secret: str = "pub-secret") -> tuple[tuple[str, str], ...]:
    """What an SDK sends, signed over `date_time`."""
    return (("x-mq-date-time", date_time), ("authorization", authorization_header(access_key, secret, date_time)),
            ("x-mq-client-id", "probe@1"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"))


def _now() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _send(address: str, md: tuple[tuple[str, str], ...], n: int) -> Any:
    m = v2.Message(topic=v2.Resource(name="TopicA"), body=f"message {n}".encode())
    sp = m.system_properties
    sp.message_id, sp.message_type, sp.born_host = f"0102FC0000000163000000000{n:09X}", v2.MessageType.NORMAL, "192.0.2.2"
    sp.born_timestamp.seconds = int(time.time())
    with grpc.insecure_channel(address) as ch:
        return service_grpc.MessagingServiceStub(ch).SendMessage(service.SendMessageRequest(messages=[m]), timeout=10, metadata=md)


def test_a_rocketmq5_header_signed_long_ago_opens_nothing(tmp_path: Path, launch: Launch, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's probe: a header dated 20010101T000000Z, correctly signed by `pub`, sent three
    different messages. Now each is UNAUTHORIZED naming x-mq-date-time, nothing is stored (the
    first current send gets queue offset 0), and the router's QueryRoute refuses it alike."""
    cl = launch_with_acl(launch, tmp_path, monkeypatch, ACCOUNTS, "commitlog", "--store-dir", str(tmp_path / "store"), host="127.0.0.85")
    router = launch_with_acl(launch, tmp_path, monkeypatch, ACCOUNTS, "router", host="127.0.0.86")
    old = _rmq5_md("20010101T000000Z")
    for n in range(3):
        status = _send(cl.address, old, n).status
        assert status.code == v2.Code.UNAUTHORIZED and status.message.startswith("x-mq-date-time: 20010101T000000Z is outside"), status
    malformed = _send(cl.address, _rmq5_md("2001-01-01T00:00:00Z"), 3).status
    assert malformed.code == v2.Code.UNAUTHORIZED and "yyyyMMdd'T'HHmmss'Z'" in malformed.message
    sent = _send(cl.address, _rmq5_md(_now()), 4)
    assert sent.status.code == v2.Code.OK and sent.entries[0].offset == 0  # nothing before it was stored
    with grpc.insecure_channel(router.address) as ch:
        route = service_grpc.MessagingServiceStub(ch).QueryRoute(service.QueryRouteRequest(topic=v2.Resource(name="TopicA")), timeout=10, metadata=old)
    assert route.status.code == v2.Code.UNAUTHORIZED and "x-mq-date-time" in route.status.message
    for process in (cl, router):  # ACL without TLS: said once at start
        assert process.log_path.read_text().count("access control without TLS") == 1


def test_the_python_sdk_writing_local_time_far_from_utc_still_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK stamps x-mq-date-time with datetime.now() marked Z: on a host at UTC+05:30 that
    is 5.5 hours off UTC, accepted because some zone explains it (--rmq5-date-time-zone any)."""
    from rocketmq import Credentials, Message, Producer

    from tests.e2e.rmq5_sdk import acl_cluster, client_config

    monkeypatch.setenv("TZ", "IST-05:30")  # POSIX form: no tz database needed
    time.tzset()
    try:
        assert time.localtime().tm_gmtoff == 5.5 * 3600
        with acl_cluster(tmp_path, monkeypatch, ACCOUNTS[1:], "127.0.0.87", "127.0.0.88") as c:
            p = Producer(client_config(c, Credentials("pub", "pub-secret")), ("TopicA",))
            p.startup()
            try:
                m = Message()
                m.topic, m.body = "TopicA", b"from UTC+05:30"
                assert p.send(m).message_id
            finally:
                p.shutdown()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# -- hole 5: RocketMQ 4 remoting ---------------------------------------------------------------
def _rss_bytes(pid: int) -> int:
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert match, "no VmRSS"
    return int(match.group(1)) * 1024


def _v2_fields(topic: str) -> dict[str, Any]:
    """SendMessageRequestHeaderV2 as RocketMQ's clients fill it."""
    return {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": int(time.time() * 1000), "h": 0, "i": "", "j": 0, "k": False}


def _signed_send(address: str, source: str, body: bytes) -> RemotingCommand:
    """One SEND_MESSAGE_V2 signed by `pub`, from `source` (another host than the attackers')."""
    async def go() -> RemotingCommand:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
        try:
            cmd = RemotingCommand(codes.SEND_MESSAGE_V2, opaque=1, ext_fields=to_ext_fields(_v2_fields("TopicA")), body=body)
            sign(cmd, "pub", "pub-secret")
            writer.write(encode_frame(cmd))
            length = int.from_bytes(await reader.readexactly(4), "big")
            return decode_frame(await reader.readexactly(length))
        finally:
            writer.close()
    return asyncio.run(asyncio.wait_for(go(), 30))


def _head(fields: dict[str, str], frame_bytes: int) -> bytes:
    """A request's length fields and header, claiming a frame of `frame_bytes`."""
    header = encode_header(RemotingCommand(codes.SEND_MESSAGE_V2, opaque=9, ext_fields=fields))
    return struct.pack(">ii", frame_bytes, len(header)) + header


class Flood:
    """`n` connections from `source`, each sending the head of a 16 MiB frame and all but the
    last byte of its body, at once; `outcomes` says what each saw once it ended: "closed" (the
    server closed it) or "open" (still held at the 30 s deadline)."""

    def __init__(self, address: str, source: str, heads: list[bytes], frame_bytes: int = 16 * MIB) -> None:
        host, port = address.rsplit(":", 1)
        self.target, self.source = (host, int(port)), source
        self.outcomes: list[str] = []
        self.connected = threading.Semaphore(0)
        zeros = memoryview(bytes(frame_bytes))
        self.threads = [threading.Thread(target=self._one, args=(head, zeros[:frame_bytes - 4 - (len(head) - 8) - 1]), daemon=True) for head in heads]
        for t in self.threads:
            t.start()

    def _one(self, head: bytes, body: memoryview) -> None:
        with socket.create_connection(self.target, timeout=30, source_address=(self.source, 0)) as s:
            self.connected.release()
            try:
                s.sendall(head)
                s.sendall(body)
                self.outcomes.append("closed" if s.recv(1) == b"" else "answered")  # sent whole: wait for the server's move
            except (ConnectionError, BrokenPipeError):
                self.outcomes.append("closed")
            except socket.timeout:
                self.outcomes.append("open")

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def peak_rss(self, pid: int, meanwhile: Callable[[], None]) -> int:
        """The highest RSS of `pid` seen until every connection ended; `meanwhile` runs once all
        are connected."""
        for _ in self.threads:
            assert self.connected.acquire(timeout=30), "a flood connection was not accepted"
        peak = _rss_bytes(pid)
        meanwhile()
        pause = threading.Event()
        while self.running:
            peak = max(peak, _rss_bytes(pid))
            pause.wait(0.02)  # (a sampling interval, not a synchronisation)
        return max(peak, _rss_bytes(pid))


def test_memory_before_authentication_is_bounded(tmp_path: Path, launch: Launch, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's flood with ACL on: 24 connections, each a 16 MiB frame's header and all its
    body but the last byte (raised the commitlog from 50 to 434 MiB, held up to two minutes).
    Naming no account (unknown or missing AccessKey), each is refused from its header: the body
    is never buffered. Naming a real account with a forged signature, the body must be read to
    check it: the IP's 32 MiB cap holds two frames, the rest are closed, and the frame timeout
    closes the two. A signed client from another host is served meanwhile."""
    cl: ServiceProcess = launch_with_acl(launch, tmp_path, monkeypatch, ACCOUNTS, "commitlog", "--store-dir", str(tmp_path / "store"),
                                         "--remoting-frame-timeout-ms", "3000", host="127.0.0.81")
    assert cl.proc is not None
    pid, address = cl.proc.pid, cl.remoting_address
    for n in range(20):  # warm: the send path, its buffers and the topic exist before the baseline
        assert _signed_send(address, "127.0.0.83", b"w" * 4096).code == codes.SUCCESS
    baseline = _rss_bytes(pid)
    served: list[int] = []

    unknown = Flood(address, "127.0.0.82", [_head({"AccessKey": "mallory", "Signature": "x"} if i % 2 else {}, 16 * MIB) for i in range(24)])
    peak_unknown = unknown.peak_rss(pid, lambda: served.append(_signed_send(address, "127.0.0.83", b"during the flood").code))
    assert unknown.outcomes == ["closed"] * 24

    forged = Flood(address, "127.0.0.82", [_head(to_ext_fields({**_v2_fields("TopicA"), "AccessKey": "pub", "Signature": "forged"}), 16 * MIB)
                                           for _ in range(24)])
    peak_forged = forged.peak_rss(pid, lambda: served.append(_signed_send(address, "127.0.0.83", b"during the forged flood").code))
    assert forged.outcomes == ["closed"] * 24
    assert served == [codes.SUCCESS, codes.SUCCESS]

    print(f"commitlog RSS: baseline {baseline / MIB:.0f} MiB; 24 x 16 MiB naming no account: peak {peak_unknown / MIB:.0f} MiB "
          f"({peak_unknown / baseline:.2f}x); 24 x 16 MiB with a forged signature: peak {peak_forged / MIB:.0f} MiB ({peak_forged / baseline:.2f}x)")
    assert peak_unknown < baseline * 1.25  # before: 434 MiB from 50 (8.7x)
    assert peak_forged < baseline + 3 * 32 * MIB  # the IP's cap (32 MiB), with what reading and copying add
    log = cl.log_path.read_text()
    # Logged once for the peer, not 24 times each.
    assert log.count("limit=header") == 1 and log.count('limit="unauthenticated bytes per peer"') == 1, log
    wait_until(lambda: _rss_bytes(pid) < baseline + 3 * 32 * MIB, what="memory back once the flood ended")
