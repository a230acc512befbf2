"""Where producers send, on real processes: a random first queue, and new topics created on
every broker a producer sends to, never on one that does not auto-create (RocketMQ's TBW102)."""
from __future__ import annotations

from quarry.clients.admin import AdminClient
from quarry.clients.producer import Producer
from tests.e2e.conftest import run_quarry, wait_until


def test_new_topics_spread_over_the_brokers_that_create_topics(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(commitlog_args=["--segment-size", str(1 << 20)], indexer_args=["--hash-slots", "101", "--index-num", "1000"])
    router = cluster.start_router()
    cluster.add_broker("broker-a", "127.0.0.41")
    cluster.add_broker("broker-b", "127.0.0.42")
    cluster.add_broker("broker-c", "127.0.0.43", commitlog_args=["--auto-create-topics", "false"])
    with AdminClient(router.address) as admin:
        wait_until(lambda: len(admin.brokers()) == 3, what="three brokers registered")
        auto = admin.topic_route("TBW102")
        assert sorted(b.broker_name for b in auto.brokers) == ["broker-a", "broker-b"]

        with Producer(router.address) as p:
            sent = [p.send("FreshTopic", b"order %d" % i) for i in range(16)]
        assert {r.send_status for r in sent} == {"SEND_OK"}
        # Every broker of TBW102's route got messages and so holds the topic; broker-c none.
        assert {(r.message_queue.broker_name, r.message_queue.queue_id) for r in sent} == {(b, q) for b in ("broker-a", "broker-b") for q in range(4)}
        wait_until(lambda: sorted(b.broker_name for b in admin.topic_route("FreshTopic").brokers) == ["broker-a", "broker-b"], what="FreshTopic routed on both brokers")

        # A batch goes to one queue and is answered compactly; each rebuilt SendResult finds its message by id.
        with Producer(router.address) as p_batch:
            batch = p_batch.send_batch("FreshTopic", [b"batch %d" % i for i in range(5)], keys=[f"bk{i}" for i in range(5)])
        assert len({(r.message_queue.broker_name, r.message_queue.queue_id) for r in batch}) == 1
        assert [r.queue_offset - batch[0].queue_offset for r in batch] == list(range(5))
        for i, r in enumerate(batch):
            found = admin.query_by_id(r.offset_msg_id).messages
            assert [(m.body, m.unique_key, m.queue_offset, m.broker_name) for m in found] == [(b"batch %d" % i, r.msg_id, r.queue_offset, r.message_queue.broker_name)]

        # CLI runs (one message each) start at a random queue, not all at broker-a queue 0.
        placed = set()
        for i in range(6):
            out = run_quarry(router.address, "sendMessage", "-t", "FreshTopic", "-p", f"cli {i}")
            assert out.returncode == 0, out.stderr
            placed.add(out.stdout.split("messageQueue=")[1].split("]")[0])
        assert len(placed) > 1, placed  # (1/8)^5 odds of one queue by chance
