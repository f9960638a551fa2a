"""Wait before evict per queue (issue 28): ``queues.preempt_delay_s`` (seconds a preemptor
below priority 100 waits for capacity to free by itself before it suspends or evicts; NULL:
the service's setting, ``fgpu serve --preempt-delay``).

Revision ID: r0011
Revises: r0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0011"
down_revision: str | None = "r0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable column (every queue follows the service's setting)."""
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("preempt_delay_s", sa.Double(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("preempt_delay_s")
