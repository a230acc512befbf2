"""The list of IndexFiles of one broker (RocketMQ's IndexService), over `quarry.formats.index_file`.

Files are named by creation time (yyyyMMddHHmmssSSS) and ordered by it. When the newest is
full, a new one continues where it ended. A message is indexed under `topic#UNIQ_KEY` and
`topic#k` for every non-empty space-separated KEYS token; rollback records are not indexed;
a record below what is already indexed is skipped, so re-delivery after a crash is harmless.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Protocol, Sequence

from quarry.formats.java_hash_batch import index_key_hashes
from quarry.formats.index_file import IndexFile, IndexFileError, file_size
from quarry.formats.java_hash import index_key_hash
from quarry.formats.index_keys import INDEX_FILE_NAME, index_file_name, index_names, is_indexed, key_hashes_under, key_name
from quarry.services.log import log_event
from quarry.services.indexer.key_filter import StackedKeyFilter
from quarry.services.indexer.metrics import INDEX_ENTRIES

log = logging.getLogger("quarry.index")


class Dispatch(Protocol):
    """What indexing needs of a record (a DispatchRecord proto or formats DispatchInfo); read
    only, so a record whose keys are never None qualifies too."""

    @property
    def physical_offset(self) -> int: ...
    @property
    def topic(self) -> str: ...
    @property
    def keys(self) -> str | None: ...
    @property
    def unique_key(self) -> str | None: ...
    @property
    def store_timestamp(self) -> int: ...
    @property
    def sys_flag(self) -> int: ...


@dataclass
class IndexStoreConfig:
    hash_slot_num: int = 5_000_000
    index_num: int = 20_000_000
    max_msgs_num_batch: int = 64
    read_only: bool = False
    max_files: int = 0  # 0: unbounded; otherwise the oldest files are dropped beyond this


@dataclass
class PreparedBatch:
    """Index entries of a batch of records, hashed, not yet written (IndexStore.prepare_records)."""

    entries: list[tuple[int, int, int]]  # (key hash, physical offset, store time)
    last_offset: int
    last_timestamp: int

    @property
    def key_hashes(self) -> list[int]:
        return [h for h, _, _ in self.entries]


@dataclass
class FileInfo:
    name: str
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    entries: int


def new_epoch() -> int:
    """A random index epoch, never 0 (an indexer that keeps none)."""
    return secrets.randbits(63) or 1


@dataclass
class IndexStore:
    """IndexFiles oldest first; not thread-safe (the indexer serialises access)."""

    directory: Path
    config: IndexStoreConfig
    files: list[IndexFile] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    last_update_timestamp: int = 0
    last_update_phy_offset: int = -1
    # Random per process, renewed whenever last_update_phy_offset moves back (drop_after):
    # positions compare only within one epoch (key presence, query/presence.py).
    epoch: int = field(default_factory=lambda: new_epoch())
    rebuild_from: int | None = None  # set when corrupt files were set aside: tail from here
    _unsynced: list[IndexFile] = field(default_factory=list)  # sealed since the last flush
    # Which sealed files may hold a key (see key_filter). A query walks the candidates it
    # names and every file in `unfiltered`: the file being written and sealed files whose
    # column is not built yet (on open, all of them), so answers never wait for the filter.
    key_filter: StackedKeyFilter[IndexFile] = field(init=False, repr=False)
    unfiltered: list[IndexFile] = field(init=False, repr=False)  # oldest first
    filtered: dict[IndexFile, tuple[int, int]] = field(init=False, repr=False)  # file -> (column, entries covered)
    filter_refused: set[IndexFile] = field(init=False, repr=False)  # unreadable for a filter: always walked
    # Set when a sealed file lacks a filter: wakes the builder (filter_builder.py).
    filters_wanted: threading.Event = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.key_filter = StackedKeyFilter(self.config.index_num)
        self.unfiltered, self.filtered, self.filter_refused = [], {}, set()
        self._seq: dict[IndexFile, int] = {}  # attach order
        self._next_seq = 0
        self.filters_wanted = threading.Event()

    @property
    def read_only(self) -> bool:
        return self.config.read_only

    @classmethod
    def open(cls, directory: Path, config: IndexStoreConfig) -> "IndexStore":
        """Open every IndexFile in `directory`; corrupt ones are reported and set aside."""
        store = cls(directory, config)
        if not config.read_only:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if directory.is_dir():
            expected = file_size(config.hash_slot_num, config.index_num)
            corrupt_seen = False
            for path in sorted(p for p in directory.iterdir() if INDEX_FILE_NAME.match(p.name)):
                if corrupt_seen:
                    # Newer than a corrupt file: set aside too, so the tail rebuilds the range in order.
                    store._set_aside(path, "newer than a corrupt file", suffix=".superseded")
                    continue
                try:
                    if path.stat().st_size != expected:
                        raise IndexFileError(f"size {path.stat().st_size} != {expected} for the configured slots/entries")
                    f = IndexFile(path, config.hash_slot_num, config.index_num, read_only=config.read_only, create=False)
                except (IndexFileError, OSError) as exc:
                    store._set_aside(path, str(exc))
                    corrupt_seen = not config.read_only
                    continue
                problems = f.header_problems()
                if problems:
                    f.close()
                    store._set_aside(path, "; ".join(problems))
                    corrupt_seen = not config.read_only
                    continue
                store.attach(f)
            if corrupt_seen:
                # Re-index from the last record the remaining files cover (a record start).
                store.rebuild_from = store.files[-1].header.end_phy_offset if store.files and store.files[-1].entries else 0
        for f in store.files:
            if f.entries:
                store.last_update_phy_offset = max(store.last_update_phy_offset, f.header.end_phy_offset)
                store.last_update_timestamp = max(store.last_update_timestamp, f.header.end_timestamp)
        return store

    def _set_aside(self, path: Path, why: str, suffix: str = ".corrupt") -> None:
        problem = f"index file {path.name} {'is corrupt' if suffix == '.corrupt' else 'set aside'} ({why})"
        if not self.config.read_only:
            os.replace(path, path.with_name(path.name + suffix))
            problem += "; moved aside, its range is re-indexed from the commitlog"
        self.problems.append(problem)
        log_event(log, "index file corrupt", logging.ERROR, file=path.name, problem=why)

    def _writable(self) -> IndexFile:
        if self.files and not self.files[-1].is_write_full():
            return self.files[-1]
        end_phy, end_ts = 0, 0
        if self.files:
            end_phy, end_ts = self.files[-1].header.end_phy_offset, self.files[-1].header.end_timestamp
            # Sealed: its header now, its fsync with the next flush (off the loop, no lock).
            self.files[-1].write_header()
            self._unsynced.append(self.files[-1])
        now = int(time.time() * 1000)
        name = index_file_name(now)
        while (self.directory / name).exists() or (self.files and name <= self.files[-1].path.name):
            now += 1
            name = index_file_name(now)
        f = IndexFile(self.directory / name, self.config.hash_slot_num, self.config.index_num, end_phy, end_ts)
        self.attach(f)
        if self.config.max_files and len(self.files) > self.config.max_files:
            oldest = self.files[0]
            self.detach(oldest)
            oldest.close()
            os.unlink(oldest.path)
            problem = f"index disk cap of {self.config.max_files} files reached: dropped {oldest.path.name} (offsets {oldest.header.begin_phy_offset}..{oldest.header.end_phy_offset} no longer indexed)"
            self.problems.append(problem)
            log_event(log, "index disk cap reached: oldest file dropped", logging.WARNING, file=oldest.path.name, max_files=self.config.max_files)
        log_event(log, "index file created", file=name)
        return f

    def index_record(self, d: Dispatch) -> None:
        """Index one record's UNIQ_KEY and KEYS tokens (see module doc for what is skipped)."""
        if not is_indexed(d.sys_flag):
            return
        if d.physical_offset < self.last_update_phy_offset:
            return
        names = index_names(d.topic, d.keys, d.unique_key)
        if d.physical_offset == self.last_update_phy_offset:
            # A crash may have cut this record's keys short: add only the missing ones.
            names = [n for n in names if d.physical_offset not in self.query_name(n)]
        for name in names:
            f = self._writable()
            if not f.put_key(name, d.physical_offset, d.store_timestamp):
                f = self._writable()
                f.put_key(name, d.physical_offset, d.store_timestamp)
        if names:
            self.sync(f)
        self.last_update_phy_offset = d.physical_offset
        self.last_update_timestamp = d.store_timestamp

    def query_name(self, name: str) -> list[int]:
        """Every offset under an exact index name in the newest file (for crash repair)."""
        return self.files[-1].select_phy_offsets(name, 2**31 - 1, 0, 2**63 - 1) if self.files else []

    def index_records(self, records: Sequence[Dispatch]) -> None:
        """index_record for a batch, with one IndexFile header write per file touched."""
        self.write_prepared(self.prepare_records(records))

    def prepare_records(self, records: Sequence[Dispatch]) -> "PreparedBatch":
        """What index_records would write for `records`, hashed, without writing it: the key
        hashes are told to key presence watchers (presence.py) before the entries become
        visible. Valid until the next write."""
        items: list[tuple[str, int, int]] = []  # (topic#key, offset, store time)
        last, last_ts = self.last_update_phy_offset, self.last_update_timestamp
        for d in records:
            if not is_indexed(d.sys_flag) or d.physical_offset < last:
                continue
            off, ts = d.physical_offset, d.store_timestamp
            if off == self.last_update_phy_offset:
                names = [n for n in index_names(d.topic, d.keys, d.unique_key) if off not in self.query_name(n)]
                items.extend((n, off, ts) for n in names)
            else:
                items.extend((n, off, ts) for n in index_names(d.topic, d.keys, d.unique_key))
            last, last_ts = off, ts
        # Hash the whole batch at once (numpy): hashing is most of an index put's cost.
        hashes = index_key_hashes([n for n, _, _ in items])
        return PreparedBatch([(h, off, ts) for h, (_, off, ts) in zip(hashes, items)], last, last_ts)

    def write_prepared(self, batch: "PreparedBatch") -> None:
        """Write a prepared batch's entries (visible to queries from here on)."""
        hashed = batch.entries
        INDEX_ENTRIES.inc(len(hashed))
        while hashed:
            f = self._writable()
            done = f.put_keys(hashed)
            hashed = hashed[done:]
        if batch.entries:
            self.sync(self.files[-1])
        self.last_update_phy_offset, self.last_update_timestamp = batch.last_offset, batch.last_timestamp

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int, below: int | None = None) -> list[int]:
        """Offsets under topic#key with time in [begin, end] (and below `below`), newest files first, capped."""
        return self.query_page(topic, key, max_num, begin, end, below)[0]

    def query_page(self, topic: str, key: str, max_num: int, begin: int, end: int, below: int | None = None) -> tuple[list[int], int]:
        """(offsets, next_below): offsets under topic#key whose entry time may hold a store
        time in [begin, end] (entries keep whole seconds: callers check each record's own
        time), newest files first, capped; next_below > 0 when more may lie below it."""
        return self._hash_page(index_key_hash(key_name(topic, key)), max_num, begin, end, below)

    def _hash_page(self, key_hash: int, max_num: int, begin: int, end: int, below: int | None) -> tuple[list[int], int]:
        cap = min(max_num, self.config.max_msgs_num_batch)
        out = self._walk(key_hash, cap, *IndexFile.entry_time_window(begin, end), below)
        return (list(dict.fromkeys(out)) if out else out), (min(out) if len(out) >= cap and out else 0)

    def _walk(self, key_hash: int, cap: int, begin: int, end: int, below: int | None) -> list[int]:
        """Offsets under key_hash, newest files first, up to cap (a record may be listed twice:
        two of its keys with one hash); begin/end is the entry time window."""
        out: list[int] = []
        # Hashed once; one probe of the stacked filter names the sealed files that may hold
        # the key, so the cost does not grow with the files kept. Only those are walked, with
        # the files the filter does not cover (usually just the newest), newest first.
        found, rest = self.key_filter.candidates(key_hash), self.unfiltered
        walk: Iterable[IndexFile]
        if not found:
            walk = reversed(rest)
        elif len(rest) == 1 and self._seq[rest[0]] > self._seq[found[0]]:
            walk = rest + found
        else:
            walk = sorted(found + rest, key=self._seq.__getitem__, reverse=True)
        for f in walk:
            if len(out) >= cap:
                break
            h = f.header
            if below is not None and h.begin_phy_offset >= below and f.entries:
                continue
            # The header's time range is in memory: a file outside the window is not touched.
            if f.is_time_matched(begin, end):
                f.select_phy_offsets(key_hash, cap, begin, end, into=out, below=below)
            if h.begin_timestamp < begin:
                break  # older files hold older entries only
        return out

    def query_topics(self, topics: Sequence[str], key: str, max_num: int, begin: int, end: int, below: int | None = None) -> list[int]:
        """query() over several topics (a topic and its parking topics): the newest offsets of
        all, highest first, capped; each list is already its own newest, so the cap is exact."""
        return self.query_topics_page(topics, key, max_num, begin, end, below)[0]

    def query_topics_page(self, topics: Sequence[str], key: str, max_num: int, begin: int, end: int, below: int | None = None) -> tuple[list[int], int]:
        """query_topics with where to continue (as query_page). A topic whose list was full has
        all it left unread below its lowest offset, which is at or below the merged page's
        lowest: continuing below the page's lowest misses nothing."""
        hashes = key_hashes_under(topics, key)
        if len(hashes) == 1:
            return self._hash_page(hashes[0], max_num, begin, end, below)
        cap = min(max_num, self.config.max_msgs_num_batch)
        window = IndexFile.entry_time_window(begin, end)
        found = [out for out in (self._walk(h, cap, *window, below) for h in hashes) if out]
        if not found:
            return [], 0
        # (one list is already newest first; several are merged)
        merged = list(dict.fromkeys(found[0])) if len(found) == 1 else sorted(set().union(*found), reverse=True)
        page = merged[:cap]
        more = len(merged) > cap or any(len(out) >= cap for out in found)
        return page, (min(page) if more and page else 0)

    # -- the file list and the key filter ---------------------------------------------------
    def attach(self, f: IndexFile) -> None:
        """Append `f` (newer than every file held); queries walk it until its filter is built."""
        self.files.append(f)
        self._seq[f] = self._next_seq
        self._next_seq += 1
        self.unfiltered.append(f)
        if len(self.files) > 1 or f.is_write_full():
            self.filters_wanted.set()  # the file before it is sealed now

    def detach(self, f: IndexFile) -> None:
        """Stop holding `f` (the caller closes or deletes it)."""
        self.files.remove(f)
        del self._seq[f]
        self.filter_refused.discard(f)
        col = self.filtered.pop(f, (None, 0))[0]
        if col is None:
            self.unfiltered.remove(f)
        else:
            self.key_filter.release(col)

    def seq(self, f: IndexFile) -> int:
        """`f`'s place in attach order (higher: newer)."""
        return self._seq[f]

    def sealed(self, f: IndexFile) -> bool:
        """No more entries will be written to `f`: full, or a newer file exists."""
        return f.is_write_full() or f is not self.files[-1]

    def sync(self, f: IndexFile) -> None:
        """After puts, or after another process's puts were read with reload_header: a file
        whose entries moved past its filter is walked again until it is rebuilt."""
        if f in self.filtered:
            col, covered = self.filtered[f]
            if f.entries != covered:
                del self.filtered[f]
                self.key_filter.release(col)
                self.unfiltered.append(f)
                self.unfiltered.sort(key=self._seq.__getitem__)
                self.filters_wanted.set()
        elif f.is_write_full():
            self.filters_wanted.set()

    def filter_pending(self) -> list[IndexFile]:
        """Sealed files without a filter, newest first (the builder's queue)."""
        return [f for f in reversed(self.unfiltered) if self.sealed(f) and f not in self.filter_refused]

    def file_infos(self) -> list[FileInfo]:
        return [
            FileInfo(f.path.name, f.header.begin_timestamp, f.header.end_timestamp, f.header.begin_phy_offset,
                     f.header.end_phy_offset, f.header.hash_slot_count, f.entries)
            for f in self.files
        ]

    def delete_below(self, min_phy_offset: int) -> int:
        """Drop files whose newest entry lies below the commitlog's minimum offset (expired)."""
        dropped = 0
        while len(self.files) > 1 and self.files[0].header.end_phy_offset < min_phy_offset:
            f = self.files[0]
            self.detach(f)
            f.close()
            os.unlink(f.path)
            dropped += 1
            log_event(log, "index file expired with its segments", file=f.path.name, end_phy_offset=f.header.end_phy_offset, log_min_offset=min_phy_offset)
        return dropped

    def entry_at(self, position: int) -> tuple[int, int, int]:
        """(keyHash, phyOffset, entry time) of the `position`-th entry of the whole list (0: the
        oldest held), in log order: what a search for the last entry the log still holds walks."""
        for f in self.files:
            if position < f.entries:
                return f.entry(position + 1)
            position -= f.entries
        raise IndexError(position)

    def entry_count(self) -> int:
        return sum(f.entries for f in self.files)

    def drop_after(self, phy_offset: int, timestamp: int) -> int:
        """Forget every entry whose record lies after `phy_offset`, the last record the log still
        holds as it was indexed (stored at `timestamp`; -1: none): the log was cut below them.
        Whole files go, the file holding the cut is cut, and indexing goes on from there.
        Returns how many entries were dropped."""
        dropped = 0
        while self.files and (not self.files[-1].entries or self.files[-1].entry(1)[1] > phy_offset):
            f = self.files[-1]
            dropped += f.entries
            self.detach(f)
            f.close()
            os.unlink(f.path)
            log_event(log, "index file dropped: the log no longer holds its records", logging.WARNING, file=f.path.name)
        if self.files:
            f = self.files[-1]
            dropped += f.truncate_entries(f.last_entry_at_or_below(phy_offset), timestamp)
            self.sync(f)  # a filter built over the dropped entries no longer covers the file
            if f not in self._unsynced:
                self._unsynced.append(f)
        held = bool(self.files and self.files[-1].entries)
        self.epoch = new_epoch()  # the position moves back: positions of before say nothing of after
        self.last_update_phy_offset = self.files[-1].header.end_phy_offset if held else -1
        self.last_update_timestamp = self.files[-1].header.end_timestamp if held else 0
        return dropped

    def prepare_flush(self) -> list[IndexFile]:
        """The fast half of a flush (the tailer's), under the caller's lock: write the headers of
        the files holding entries not yet on disk (the one being written, and those sealed since
        the last flush) and return them; their `sync` (the disk write) needs no lock, and nothing
        may index into them until it is done if the flush is to cover what the caller checkpoints."""
        held = set(self._seq)
        targets = [f for f in self._unsynced if f in held]
        self._unsynced.clear()
        if self.files and self.files[-1] not in targets:
            targets.append(self.files[-1])
        for f in targets:
            f.write_header()
        return targets

    def close(self) -> None:
        for f in list(self.files):
            if not self.read_only:
                f.flush()
            f.close()
            self.detach(f)
