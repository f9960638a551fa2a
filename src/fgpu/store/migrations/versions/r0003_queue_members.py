"""Queues: ``members`` (who may submit), ``max_priority`` and ``nonpreemptible`` (what
non-admin members may ask for).

Queues that exist already keep admitting everyone (``["*"]``, as before this revision), but
their non-admin members are held to ``normal`` priority and preemptible work from now on:
an admin grants more with ``fgpu queue set NAME --max-priority ... --nonpreemptible``.

Revision ID: r0003
Revises: r0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0003"
down_revision: str | None = "r0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the three columns, filled for the existing queues, then drop the fill-in
    defaults (the store always writes them)."""
    with op.batch_alter_table("queues") as batch:
        batch.add_column(
            sa.Column("members", sa.JSON(), nullable=False, server_default=sa.text("'[\"*\"]'"))
        )
        batch.add_column(
            sa.Column("max_priority", sa.BigInteger(), nullable=False, server_default="50")
        )
        batch.add_column(
            sa.Column("nonpreemptible", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("queues") as batch:
        batch.alter_column("members", server_default=None)
        batch.alter_column("max_priority", server_default=None)
        batch.alter_column("nonpreemptible", server_default=None)


def downgrade() -> None:
    """Drop the columns."""
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("nonpreemptible")
        batch.drop_column("max_priority")
        batch.drop_column("members")
