"""The corrupt-record policy: fail naming file and offset (default), or skip and report.

A task that meets a corrupt record under the fail policy raises `CorruptRecordError`; the
error crosses Spark as text, so its message carries a marker the driver finds again in
whatever exception Spark raises (`from_spark_error`).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

MARKER = "QUARRY-CORRUPT-RECORD"
_MARKER_RE = re.compile(MARKER + r"\[(?P<broker>[^\]\t]*)\t(?P<file>[^\]\t]*)\t(?P<offset>-?\d+)\t(?P<reason>[^\]]*)\]")


@dataclass(frozen=True)
class CorruptReport:
    """Where a corrupt record is and what was done about it."""

    broker: str
    file: str  # segment file path
    offset: int  # physical offset of the record in the CommitLog
    reason: str  # bad magic, bad CRC, truncated, …
    action: str = ""  # what skipping did: "record skipped", "rest of segment skipped (N bytes)"

    @property
    def offset_in_file(self) -> int:
        try:
            return self.offset - int(self.file.rsplit("/", 1)[-1])
        except ValueError:
            return self.offset

    def describe(self) -> str:
        where = f"{self.broker} {self.file} at offset {self.offset} (byte {self.offset_in_file} of the file)"
        return f"{where}: {self.reason}" + (f"; {self.action}" if self.action else "")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CorruptRecordError(Exception):
    """A corrupt record under the fail policy. `str()` names the file and the offset."""

    def __init__(self, report: CorruptReport) -> None:
        self.report = report
        safe = report.reason.replace("]", ")").replace("\t", " ")
        super().__init__(
            f"corrupt record in {report.file} at offset {report.offset} (broker {report.broker}): {report.reason} "
            f"-- rerun with --skip-corrupt to skip and report it "
            f"{MARKER}[{report.broker}\t{report.file}\t{report.offset}\t{safe}]"
        )

    def message(self) -> str:
        r = self.report
        return (
            f"corrupt record in {r.file} at offset {r.offset} (byte {r.offset_in_file} of the file, broker {r.broker}): "
            f"{r.reason}. Rerun with --skip-corrupt to skip corrupt records and report them."
        )


def from_spark_error(exc: BaseException) -> CorruptRecordError | None:
    """The CorruptRecordError a task raised, recovered from a Spark exception's text."""
    for text in (str(exc), repr(exc), str(getattr(exc, "java_exception", ""))):
        m = _MARKER_RE.search(text)
        if m:
            return CorruptRecordError(CorruptReport(m["broker"], m["file"], int(m["offset"]), m["reason"]))
    return None


@dataclass(frozen=True)
class CorruptPolicy:
    """`skip`: report and go on; otherwise the first corrupt record fails the job."""

    skip: bool = False

    def handle(self, report: CorruptReport, sink: list[CorruptReport]) -> None:
        if not self.skip:
            raise CorruptRecordError(report)
        sink.append(report)
