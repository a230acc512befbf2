"""Store errors, each mapped to one gRPC status by the server (the store knows no gRPC)."""
from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store reports to callers."""


class InvalidArgument(StoreError):
    """Bad input: names the field and the rule. Nothing was stored."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class NotFound(StoreError):
    """No record, topic or queue where the caller pointed."""


class Expired(StoreError):
    """The offset lies below the minimum: its segment was deleted by retention."""


class ReadOnly(StoreError):
    """The store was opened read-only."""


class DiskFull(StoreError):
    """No space left: nothing from this call was acknowledged."""
