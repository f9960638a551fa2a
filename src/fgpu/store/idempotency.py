"""Idempotent submissions (issue 27): a submission may carry an ``Idempotency-Key``; the store
keeps, per user and key, the fingerprint of the submission's body and the workload it
created, for :data:`KEY_TTL_S`. A retry with the same key and body gets that workload back
instead of a second one; the same key with another body is refused. Keys are per user: two
users' keys never collide.

The key is written in the same transaction as the workload it names
(:meth:`fgpu.store.store.Store.submit`), so a key exists exactly when its workload does. The
semantics follow the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field"
(draft-ietf-httpapi-idempotency-key-header): a key reused with another payload is an error
(422 there), keys expire after a period the resource announces.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import bindparam, delete, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from fgpu.store.base import StoreBase
from fgpu.store.errors import StoreConflict
from fgpu.store.schema import IdempotencyKeyRow

KEY_TTL_S = 24 * 3600.0
"""How long a submission's key is kept (seconds): a retry within this time returns the first
answer; after it the key is free again."""


class KeyReused(StoreConflict):
    """The key was used by the same user for a submission with another body.

    Attributes:
        workload_id: the workload the key names.
    """

    def __init__(self, key: str, workload_id: str) -> None:
        self.workload_id = workload_id
        super().__init__(
            f"the key {key!r} was used for another submission (workload {workload_id}); a "
            "retry must send the same body, a new submission a new key"
        )


def fingerprint(body: Mapping[str, Any]) -> str:
    """SHA-256 (hex, 64 characters) of ``body`` as canonical JSON (sorted keys, no spaces):
    equal bodies give equal fingerprints whatever the order of their fields."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


_KEY_ROW = select(
    IdempotencyKeyRow.created_at, IdempotencyKeyRow.fingerprint, IdempotencyKeyRow.workload_id
).where(
    IdempotencyKeyRow.owner_uid == bindparam("owner_uid"),
    IdempotencyKeyRow.key == bindparam("key"),
)  # built once: every keyed submission (the CLI's all are) looks its key up


SWEEP_EVERY_S = 60.0
"""How often (seconds, at most) a keyed submission also deletes the expired keys of all."""


def _upsert(dialect_insert: Any) -> Any:
    """``INSERT ... ON CONFLICT (owner_uid, key) DO UPDATE ... WHERE`` the stored row expired
    (SQLite 3.35+ and PostgreSQL 9.5+ have it, with ``RETURNING``; a kept row is left as it
    is and no row comes back)."""
    table = IdempotencyKeyRow.__table__
    statement = dialect_insert(table).values(
        owner_uid=bindparam("owner_uid"),
        key=bindparam("key"),
        fingerprint=bindparam("fingerprint"),
        workload_id=bindparam("workload_id"),
        created_at=bindparam("created_at"),
    )
    upsert = statement.on_conflict_do_update(
        index_elements=[table.c.owner_uid, table.c.key],
        set_={
            "fingerprint": statement.excluded.fingerprint,
            "workload_id": statement.excluded.workload_id,
            "created_at": statement.excluded.created_at,
        },
        where=table.c.created_at < bindparam("cutoff"),
    )
    return upsert.returning(table.c.owner_uid)  # no row back: the key is kept


_UPSERTS = {"sqlite": _upsert(sqlite_insert), "postgresql": _upsert(postgresql_insert)}


class IdempotencyStore(StoreBase):
    """The store's idempotency keys (see the module docstring)."""

    _keys_swept_at = float("-inf")
    """When :meth:`_claim_key` last deleted the expired keys (store clock)."""

    def keyed_workload(self, owner_uid: int, key: str, body_fingerprint: str) -> str | None:
        """The id of the workload an earlier submission of ``owner_uid`` with ``key``
        created, while that key is kept; None when the key is new or expired.

        Raises:
            KeyReused: the key was used with another body.
        """
        cutoff = self._clock() - KEY_TTL_S
        with self._read() as session:  # a point lookup of the key's primary key
            row = session.connection().execute(_KEY_ROW, {"owner_uid": owner_uid, "key": key})
            found = row.first()
        if found is None or found.created_at < cutoff:
            return None
        if found.fingerprint != body_fingerprint:
            raise KeyReused(key, found.workload_id)
        return str(found.workload_id)

    def _claim_key(
        self, session: Session, owner_uid: int, key: str, body_fingerprint: str, workload_id: str
    ) -> None:
        """In the submission's transaction: record this key, one statement, an upsert that
        takes over only an expired row of the same key; a key still kept conflicts (the
        caller's transaction fails with :class:`StoreConflict` and writes nothing). Expired
        keys of others are dropped at most every :data:`SWEEP_EVERY_S` (an index range on
        ``created_at``), not on each submission."""
        now = self._clock()
        connection = session.connection()
        if now - self._keys_swept_at >= SWEEP_EVERY_S or now < self._keys_swept_at:
            connection.execute(
                delete(IdempotencyKeyRow).where(IdempotencyKeyRow.created_at < now - KEY_TTL_S)
            )
            self._keys_swept_at = now
        dialect = connection.dialect.name
        upsert = _UPSERTS.get(dialect)
        if upsert is None:
            raise RuntimeError(f"idempotency keys: no upsert for the {dialect} dialect")
        values = {
            "owner_uid": owner_uid,
            "key": key,
            "fingerprint": body_fingerprint,
            "workload_id": workload_id,
            "created_at": now,
            "cutoff": now - KEY_TTL_S,
        }
        if connection.execute(upsert, values).first() is None:
            raise StoreConflict(f"the key {key!r} of uid {owner_uid} is kept already")

    def key_count(self, owner_uid: int | None = None) -> int:
        """Keys kept (of ``owner_uid``, or of everyone)."""
        query = select(IdempotencyKeyRow.key)
        if owner_uid is not None:
            query = query.where(IdempotencyKeyRow.owner_uid == owner_uid)
        with self._read() as session:
            return len(session.scalars(query).all())


__all__ = ["KEY_TTL_S", "SWEEP_EVERY_S", "IdempotencyStore", "KeyReused", "fingerprint"]
