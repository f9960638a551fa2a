"""Workloads: ``mig_request``, what a MIG workload asks for (a profile or a memory size).

Revision ID: r0002
Revises: r0001
Create Date: 2025-02-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0002"
down_revision: str | None = "r0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column (existing workloads are not MIG workloads)."""
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("mig_request", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("mig_request")
