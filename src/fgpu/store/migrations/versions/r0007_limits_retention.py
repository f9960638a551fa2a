"""Per-user limits per queue, stored bytes per workload, event coalescing and retention
(issue 27): additive only.

- ``queues.max_active_per_user``, ``queues.max_stored_bytes``: the queue's per-user limits
  (NULL: the machine's, ``fgpu serve --max-active-per-user / --max-stored-bytes``);
- ``workloads.stored_bytes``: bytes of command, environment and working directory as
  stored, backfilled here for the rows already there; index ``(owner_uid, queue, phase,
  stored_bytes)`` answers a user's active count and stored bytes (per queue and in all)
  from the index alone;
- index ``workloads (finished_at)``: retention finds the oldest finished workloads;
- ``events.count``, ``events.last_time``: one row stands for several like events.

Revision ID: r0007
Revises: r0010
Create Date: 2026-12-06
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "r0007"
down_revision: str | None = "r0010"
branch_labels: str | None = None
depends_on: str | None = None

_BATCH = 500


def _stored_bytes(argv: Any, env: Any, cwd: Any) -> int:
    # as fgpu.store.validate.stored_bytes (copied: a revision must not change with the code)
    argv = json.loads(argv) if isinstance(argv, str) else argv
    env = json.loads(env) if isinstance(env, str) else env
    dump = json.dumps(
        [list(argv or []), dict(env or {})], ensure_ascii=False, separators=(",", ":")
    )
    size = len(dump.encode("utf-8", errors="surrogatepass"))
    return size + len(str(cwd or "").encode("utf-8", errors="surrogatepass"))


def upgrade() -> None:
    """Add the columns and indexes; fill ``stored_bytes`` of the workloads already stored."""
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("max_active_per_user", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("max_stored_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("stored_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("count", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("last_time", sa.Double(), nullable=True))
    op.create_index(
        "ix_workloads_owner_queue_phase",
        "workloads",
        ["owner_uid", "queue", "phase", "stored_bytes"],
    )
    op.create_index("ix_workloads_finished_at", "workloads", ["finished_at"])
    workloads = sa.table(
        "workloads",
        sa.column("id", sa.String()),
        sa.column("argv", sa.Text()),
        sa.column("env", sa.Text()),
        sa.column("cwd", sa.Text()),
        sa.column("stored_bytes", sa.BigInteger()),
    )
    bind = op.get_bind()
    while True:
        rows = bind.execute(
            sa.select(workloads.c.id, workloads.c.argv, workloads.c.env, workloads.c.cwd)
            .where(workloads.c.stored_bytes.is_(None))
            .limit(_BATCH)
        ).all()
        if not rows:
            break
        for wid, argv, env, cwd in rows:
            bind.execute(
                workloads.update()
                .where(workloads.c.id == wid)
                .values(stored_bytes=_stored_bytes(argv, env, cwd))
            )


def downgrade() -> None:
    """Drop what :func:`upgrade` added."""
    op.drop_index("ix_workloads_finished_at", table_name="workloads")
    op.drop_index("ix_workloads_owner_queue_phase", table_name="workloads")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("last_time")
        batch.drop_column("count")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("stored_bytes")
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("max_stored_bytes")
        batch.drop_column("max_active_per_user")
