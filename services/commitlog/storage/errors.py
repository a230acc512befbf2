"""The store's errors: the services' shared domain errors (services/errors.py), under the
names the store code uses. `StoreError` is their base; the server maps them in one place
(services/status.py)."""
from __future__ import annotations

from quarry.services.errors import DamagedRecord, DiskFull, Expired, InvalidArgument, NotFound, ReadOnly
from quarry.services.errors import ServiceError as StoreError

__all__ = ["DamagedRecord", "DiskFull", "Expired", "InvalidArgument", "NotFound", "ReadOnly", "StoreError"]
