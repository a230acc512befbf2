"""ConsumeQueue writes: units written one send at a time (the usual path: one pwrite into the
open file) and across file ends read back the same, in memory and after reopening."""
from __future__ import annotations

from pathlib import Path

from quarry.formats.consume_queue import CQ_UNIT
from quarry.services.commitlog.storage.consume_queue_store import ConsumeQueue


def test_units_written_one_by_one_and_in_runs_across_file_ends_read_back(tmp_path: Path) -> None:
    units_per_file = 4
    cq = ConsumeQueue(tmp_path / "T" / "0", units_per_file, read_only=False)
    expected = [(1000 + i * 100, 100, i) for i in range(23)]
    # One at a time (0..9: files start at 0, 4, 8), then runs that cross file ends (10..16, 17..22).
    for q in range(10):
        cq.write_units(q, CQ_UNIT.pack(*expected[q]))
        assert cq.max_offset == q + 1
    cq.write_units(10, b"".join(CQ_UNIT.pack(*u) for u in expected[10:17]))
    cq.write_units(17, b"".join(CQ_UNIT.pack(*u) for u in expected[17:]))
    assert cq.max_offset == 23
    assert cq.read_units(0, 100) == expected
    cq.write_units(5, CQ_UNIT.pack(1, 2, 3))  # a rewrite inside a file does not move the end
    assert cq.max_offset == 23 and cq.read_units(5, 1) == [(1, 2, 3)]
    dirty = cq.take_dirty()
    assert len(dirty) == 6  # every file written: 0, 4, 8, 12, 16, 20
    cq.close()
    reopened = ConsumeQueue(tmp_path / "T" / "0", units_per_file, read_only=True)
    assert reopened.max_offset == 23
    assert reopened.read_units(0, 100) == expected[:5] + [(1, 2, 3)] + expected[6:]
    reopened.close()


def test_a_run_whose_second_file_cannot_be_made_is_rolled_back_whole(tmp_path: Path) -> None:
    # A batch's units cross into a file the full disk will not let be made: the append fails
    # and rolls back with truncate_from_phy (storage/append.py). The part written into the
    # first file must go too, or a reopened store serves units pointing at log offsets the
    # next append reuses.
    import errno

    cq = ConsumeQueue(tmp_path / "T" / "0", 4, read_only=False)
    cq.write_units(0, b"".join(CQ_UNIT.pack(100 * i, 100, 0) for i in range(2)))
    make = cq._fd

    def disk_full(start: int, create: bool) -> int | None:
        if start > 0 and create:
            raise OSError(errno.ENOSPC, "No space left on device")
        return make(start, create)
    cq._fd = disk_full  # type: ignore[method-assign]
    try:
        cq.write_units(2, b"".join(CQ_UNIT.pack(1000 + 100 * i, 100, 0) for i in range(4)))  # units 2..5, files 0 and 4
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    else:
        raise AssertionError("the write did not fail")
    cq._fd = make  # type: ignore[method-assign]
    cq.truncate_from_phy(1000)  # the rollback: the log's write offset was 1000
    assert cq.max_offset == 2 and cq.read_units(0, 10) == [(0, 100, 0), (100, 100, 0)]
    cq.close()
    reopened = ConsumeQueue(tmp_path / "T" / "0", 4, read_only=True)
    assert reopened.max_offset == 2 and reopened.read_units(0, 10) == [(0, 100, 0), (100, 100, 0)]
    reopened.close()
