"""Queues: ``default_for``, whose default queue it is (users and ``@groups``; issue 25).

Additive: one nullable JSON column; existing queues are nobody's default (NULL), so plain
submissions keep going to ``default`` until an admin sets ``fgpu queue set Q --default-for``.

Revision ID: r0010
Revises: r0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0010"
down_revision: str | None = "r0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the column (NULL: nobody's default)."""
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("default_for", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop the column."""
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("default_for")
