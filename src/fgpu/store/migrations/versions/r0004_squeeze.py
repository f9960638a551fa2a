"""Squeeze before evict: ``workloads.squeezed_by`` (who took a running workload's compute;
NULL while it is not squeezed) and ``queues.squeeze`` (the queue's switch; NULL: the
service's setting).

Revision ID: r0004
Revises: r0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0004"
down_revision: str | None = "r0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the two nullable columns (nothing is squeezed; queues follow the service)."""
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("squeezed_by", sa.JSON(), nullable=True))
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("squeeze", sa.Boolean(), nullable=True))


def downgrade() -> None:
    """Drop the columns."""
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("squeeze")
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("squeezed_by")
