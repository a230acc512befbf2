"""--follow-index: the indexer answers from IndexFiles another process writes (a RocketMQ
broker's index/), re-reading headers, picking up new files once whole, dropping deleted ones."""
from __future__ import annotations

from pathlib import Path

from quarry.formats.index_file import IndexFile, file_size
from quarry.services.indexer.index_follow import refresh
from quarry.services.indexer.index_store import IndexStore, IndexStoreConfig

SLOTS, NUM = 11, 10


def test_refresh_follows_the_writers_files(tmp_path: Path) -> None:
    d = tmp_path / "index"
    d.mkdir()
    index = IndexStore.open(d, IndexStoreConfig(hash_slot_num=SLOTS, index_num=NUM, read_only=True))
    assert index.files == [] and not refresh(index)

    broker = IndexFile(d / "20261123100000000", SLOTS, NUM)  # the broker's own file, written as we read
    broker.put_key("T#a", 100, 1_700_000_000_000)
    assert refresh(index)
    assert index.query("T", "a", 64, 0, 2**62) == [100]
    broker.put_key("T#b", 200, 1_700_000_001_000)
    refresh(index)
    assert index.query("T", "b", 64, 0, 2**62) == [200] and index.last_update_phy_offset == 200

    partial = d / "20261123100000001"
    partial.write_bytes(bytes(file_size(SLOTS, NUM) // 2))  # being created: not yet its full size
    assert not refresh(index) and len(index.files) == 1
    partial.unlink()

    (d / "20261123100000000").unlink()  # the broker expired it
    assert refresh(index) and index.files == []
    broker.close()
    index.close()
