"""The indexer's metrics (its own registry; see quarry.services.metrics)."""
from __future__ import annotations

from quarry.services.metrics import ServiceMetrics

METRICS = ServiceMetrics("indexer")
INDEX_ENTRIES = METRICS.counter("quarry_indexer_entries_total", "IndexFile entries written")
INDEX_LAG_BYTES = METRICS.gauge("quarry_indexer_lag_bytes", "Commitlog bytes not yet indexed")
INDEX_LAG_SECONDS = METRICS.gauge("quarry_indexer_lag_seconds", "Seconds between now and the store time of the last indexed record, while behind")
KEY_FILTER_BYTES = METRICS.gauge("quarry_indexer_key_filter_bytes", "Memory of the key filter (Bloom filters of sealed IndexFiles)")
KEY_FILTER_PENDING = METRICS.gauge("quarry_indexer_key_filter_pending_files", "Sealed IndexFiles whose key filter is not built yet (walked by every key query)")
TAIL_CONNECTED = METRICS.gauge("quarry_indexer_tail_connected", "1 while the Tail stream from the commitlog is connected")
INDEX_DROPPED = METRICS.counter("quarry_indexer_entries_dropped_total", "Index entries dropped because the log no longer holds their records (cut or restored below them)")
