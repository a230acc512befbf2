"""A key whose messages expired with their segments is answered with a note naming the gone
offsets on that broker (issue 36: answers stay honest when the broker deletes files), whether
the indexer or the router reads the records."""
from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from quarry.services.query.queries import BODIES_FROM_COMMITLOG, BODIES_FROM_INDEXER, QuerySettings
from quarry.services.query.registry import BrokerRegistry
from tests.servicers import Blocking, InProcessBroker, in_process_router, send


@pytest.mark.parametrize("bodies_from", [BODIES_FROM_INDEXER, BODIES_FROM_COMMITLOG])
def test_a_key_whose_messages_expired_says_so(tmp_path: Path, bodies_from: str) -> None:
    broker = InProcessBroker("broker-g", tmp_path, ("127.0.0.72", 10911), segment_size=4096).start()
    try:
        with grpc.insecure_channel(broker.commitlog_addr) as ch:
            old = [send(broker, ch, "GoneT", b"x" * 600, keys=["order-1"]).physical_offset for _ in range(12)]
            new = send(broker, ch, "GoneT", b"y" * 600, keys=["order-1"]).physical_offset
        assert broker.store is not None
        broker.index_all()
        assert broker.store is not None and broker.store.delete_expired(now_s=10**10) > 0  # the old segments expire
        gone = [o for o in old if o < broker.store.state.min_offset]
        assert gone
        registry = BrokerRegistry(expiry_ms=600_000)
        registry.register(broker.registration())
        settings = QuerySettings(query_timeout_ms=2000, broker_call_timeout_ms=1000, bodies_from=bodies_from)
        with in_process_router(registry, settings) as (_address, queries):
            answer = Blocking(queries).by_key("GoneT", "order-1", 64, 0, 0)
        assert new in {m.commit_log_offset for m in answer.messages}
        notes = [n for n in answer.notes if "no longer holds" in n]
        assert len(notes) == 1 and "broker-g" in notes[0] and "expired" in notes[0], answer.notes
        assert f"{min(gone)}..{max(gone)}" in notes[0]
    finally:
        broker.close()
