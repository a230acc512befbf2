"""Names of the files Quarry keeps at a commitlog store's root, beside RocketMQ's own: what
tells a store Quarry writes from a RocketMQ broker's (the commitlog's start, the indexer's
check of its --index-dir)."""
from __future__ import annotations

STORE_CHECKPOINT = "quarry-checkpoint.json"  # the commitlog's checkpoint (JSON; RocketMQ's `checkpoint` is binary)
