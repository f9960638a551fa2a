"""Table ``idempotency_keys`` (issue 27): a submission's ``Idempotency-Key`` per user, the
fingerprint of its body and the workload it created, so that a retry whose first answer was
lost returns that workload instead of creating a second one. Keys are kept a bounded time
(:data:`fgpu.store.idempotency.KEY_TTL_S`), found by their creation time.

Revision ID: r0008
Revises: r0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0008"
down_revision: str | None = "r0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the table and its index on ``created_at`` (no data changes)."""
    op.create_table(
        "idempotency_keys",
        sa.Column("owner_uid", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("workload_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("owner_uid", "key", name="pk_idempotency_keys"),
    )
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"])


def downgrade() -> None:
    """Drop the table."""
    op.drop_index("ix_idempotency_keys_created_at", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
