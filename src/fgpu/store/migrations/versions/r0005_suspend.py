"""Suspend to host memory (issue 28): ``workloads.suspended_on`` (the node a suspended workload
waits on, its processes frozen and checkpointed; NULL while it is not suspended) and
``workloads.suspended_host_mib`` (the host memory it holds there).

Revision ID: r0005
Revises: r0004
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0005"
down_revision: str | None = "r0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the two nullable columns (nothing is suspended)."""
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("suspended_on", sa.String(128), nullable=True))
        batch.add_column(sa.Column("suspended_host_mib", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drop the columns."""
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("suspended_host_mib")
        batch.drop_column("suspended_on")
