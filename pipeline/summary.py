"""The one-screen summary every job ends with (and its JSON form for scripts)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarry.pipeline.corrupt import CorruptReport
from quarry.pipeline.progress import StageResult, human_bytes

MAX_CORRUPT_SHOWN = 8


@dataclass
class Summary:
    job: str
    master: str = ""
    seconds: float = 0.0
    records: int = 0  # records read (non-blank)
    bytes: int = 0  # segment bytes read
    files: int = 0  # files written
    output: str = ""
    inputs: list[str] = field(default_factory=list)  # one line per broker
    details: list[tuple[str, str]] = field(default_factory=list)  # (label, text) lines
    skipped: dict[str, int] = field(default_factory=dict)  # reason → count
    corrupt: list[CorruptReport] = field(default_factory=list)
    corrupt_count: int = 0
    stages: list[StageResult] = field(default_factory=list)
    ok: bool = True
    error: str = ""

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def render(self) -> str:
        status = "done" if self.ok else "FAILED"
        lines = [f"quarry-pipeline {self.job}: {status} in {self.seconds:.1f} s on {self.master}"]
        if self.inputs:
            lines.append(f"  {'input':<9} " + self.inputs[0])
            lines += [f"  {'':<9} {text}" for text in self.inputs[1:]]
        lines.append(f"  {'records':<9} {self.records:,} read, {human_bytes(self.bytes)} of segments")
        rate_mb = self.bytes / self.seconds / 1048576 if self.seconds > 0 else 0.0
        lines.append(f"  {'rate':<9} {self.records_per_s:,.0f} records/s, {rate_mb:,.1f} MiB/s")
        if self.output or self.files:
            lines.append(f"  {'output':<9} {self.files:,} files in {self.output}")
        for label, text in self.details:
            lines.append(f"  {label:<9} {text}")
        if self.stages:
            lines.append(f"  {'stages':<9} " + " | ".join(f"{s.name} {s.seconds:.1f} s" + (f" ({s.records:,} records)" if s.records else "") for s in self.stages))
        if self.skipped:
            lines.append(f"  {'skipped':<9} " + "; ".join(f"{n:,} {why}" for why, n in sorted(self.skipped.items())))
        else:
            lines.append(f"  {'skipped':<9} nothing")
        if self.corrupt_count:
            lines.append(f"  {'corrupt':<9} {self.corrupt_count:,} corrupt record(s) skipped (--skip-corrupt):")
            for report in self.corrupt[:MAX_CORRUPT_SHOWN]:
                lines.append(f"  {'':<9}   {report.describe()}")
            if self.corrupt_count > MAX_CORRUPT_SHOWN:
                lines.append(f"  {'':<9}   … and {self.corrupt_count - MAX_CORRUPT_SHOWN:,} more (all in --summary-json)")
        else:
            lines.append(f"  {'corrupt':<9} none")
        if self.error:
            lines.append(f"  {'error':<9} {self.error}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "ok": self.ok,
            "error": self.error,
            "master": self.master,
            "seconds": round(self.seconds, 3),
            "records": self.records,
            "bytes": self.bytes,
            "records_per_s": round(self.records_per_s, 1),
            "files": self.files,
            "output": self.output,
            "inputs": self.inputs,
            "details": {label: text for label, text in self.details},
            "skipped": self.skipped,
            "corrupt_count": self.corrupt_count,
            "corrupt": [r.as_dict() for r in self.corrupt],
            "stages": [{"name": s.name, "seconds": round(s.seconds, 3), "records": s.records, "bytes": s.bytes, "tasks": s.tasks} for s in self.stages],
        }

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")
