"""Several routers, as RocketMQ runs several NameServers: a broker given `--router 'a;b'`
registers with each, and each answers on its own while the other is down."""
from __future__ import annotations

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from tests.e2e.conftest import wait_until


def _brokers(address: str) -> list[str]:
    with AdminClient(address, timeout_s=5) as admin:
        return sorted(b.broker_name for b in admin.brokers())


def _route(address: str, topic: str) -> list[str]:
    with AdminClient(address, timeout_s=5) as admin:
        return sorted(b.broker_name for b in admin.topic_route(topic).brokers)


def test_a_broker_registers_with_every_router_of_its_list(cluster_factory, launch) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(commitlog_args=["--segment-size", str(1 << 20)], indexer_args=["--hash-slots", "101", "--index-num", "1000", "--flush-interval-ms", "100"])
    first = cluster.start_router()
    second = launch("router", "--heartbeat-interval-ms", "500", host="127.0.0.52")
    both = f"{first.address};{second.address}"
    for name, host in (("broker-a", "127.0.0.53"), ("broker-b", "127.0.0.54")):
        cluster.add_broker(name, host, commitlog_args=["--router", both])
    for router in (first, second):
        wait_until(lambda: _brokers(router.address) == ["broker-a", "broker-b"], what=f"both brokers registered with {router.address}")

    with Producer(second.address) as p:
        sent = [p.send("TwoRouters", b"m%d" % i, keys=["two-routers"]) for i in range(4)]
    # The topic the brokers created reaches both routers (each broker beats to each at once).
    for router in (first, second):
        wait_until(lambda: _route(router.address, "TwoRouters") == ["broker-a", "broker-b"], what=f"route on {router.address}")

    first.stop()  # one NameServer down: the other still serves everything
    with AdminClient(second.address) as admin:
        found = wait_until(lambda: (r := admin.query_by_key("TwoRouters", "two-routers")) and len(r.messages) == 4 and r, what="all four by key")
        assert {m.offset_msg_id for m in found.messages} == {s.offset_msg_id for s in sent}
        assert found.complete
    # Clients given both (`-n 'a;b'`) pass over the dead one, for sends and queries alike.
    with Producer(both) as p, AdminClient(both) as admin:
        more = p.send("TwoRouters", b"after", keys=["two-routers"])
        assert admin.query_by_id(more.offset_msg_id).messages[0].body == b"after"
        assert len(wait_until(lambda: (r := admin.query_by_key("TwoRouters", "two-routers")) and len(r.messages) == 5 and r.messages,
                              what="five by key through the list")) == 5
    log = cluster.brokers["broker-a"].commitlog.log_path.read_text()
    assert f"router={first.address}" in log and f"router={second.address}" in log
