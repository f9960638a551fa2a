"""Per-user output limit per queue (issue 27): ``queues.max_output_bytes`` (bytes of output,
the logs, one user's workloads of the queue may keep; NULL: only the machine's limit,
``fgpu serve --max-output-bytes``). Additive only.

Revision ID: r0012
Revises: r0011
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0012"
down_revision: str | None = "r0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column (every queue has only the machine's limit)."""
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("max_output_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("max_output_bytes")
