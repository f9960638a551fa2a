"""Queues: ``default_for``, whose default queue it is (users and ``@groups``); workloads:
``preempted_by`` and ``preempted_kind``, who put a pending workload back and how (issue 25).

Additive: nullable columns only. Existing queues are nobody's default (NULL), so plain
submissions keep going to ``default`` until an admin sets ``fgpu queue set Q --default-for``;
existing workloads name no preemptor.

Revision ID: r0010
Revises: r0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0010"
down_revision: str | None = "r0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the columns (NULL: nobody's default; no preemptor known)."""
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("default_for", sa.JSON(), nullable=True))
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("preempted_by", sa.String(128), nullable=True))
        batch.add_column(sa.Column("preempted_kind", sa.String(16), nullable=True))


def downgrade() -> None:
    """Drop the columns."""
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("preempted_kind")
        batch.drop_column("preempted_by")
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("default_for")
