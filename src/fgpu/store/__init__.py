"""Persistence: workloads, queues, events, holds and the GPU inventory (DESIGN.md section 8).

SQLAlchemy 2 with Alembic migrations shipped in the package; SQLite in WAL mode by default
(:func:`default_db_path`), PostgreSQL by URL. Open with :meth:`Store.open`, which migrates the
database to the newest schema.
"""

from fgpu.store.base import Clock, random_id
from fgpu.store.engine import database_url, default_db_path, make_engine, upgrade
from fgpu.store.errors import NotFound, PermissionDenied, StoreConflict, StoreError
from fgpu.store.records import (
    ACTIVE_PHASES,
    CANCELLED,
    FAILED,
    FINAL_PHASES,
    HOLDING_PHASES,
    LOST_REASON,
    PAUSED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    UNCAPPED,
    EventRecord,
    GpuRecord,
    NodeRecord,
    QueueConfig,
    QueueLimit,
    QueueRecord,
    StoredAllocation,
    WorkloadRecord,
    to_core,
)
from fgpu.store.store import DEFAULT_GRACE_S, Store

__all__ = [
    "ACTIVE_PHASES",
    "CANCELLED",
    "DEFAULT_GRACE_S",
    "FAILED",
    "FINAL_PHASES",
    "HOLDING_PHASES",
    "LOST_REASON",
    "PAUSED",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "UNCAPPED",
    "Clock",
    "EventRecord",
    "GpuRecord",
    "NodeRecord",
    "NotFound",
    "PermissionDenied",
    "QueueConfig",
    "QueueLimit",
    "QueueRecord",
    "Store",
    "StoreConflict",
    "StoreError",
    "StoredAllocation",
    "WorkloadRecord",
    "database_url",
    "default_db_path",
    "make_engine",
    "random_id",
    "to_core",
    "upgrade",
]
