"""A queue's limit on running workloads per user (issue 27: one user's hundreds of tiny
running workloads each held a root-owned runner process): additive only.

- ``queues.max_running_per_user``: most workloads one user may have running at once in
  the queue (NULL: the machine's, ``fgpu serve --max-running-per-user``).

Revision ID: r0017
Revises: r0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0017"
down_revision: str | None = "r0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the column."""
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("max_running_per_user", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drop what :func:`upgrade` added."""
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("max_running_per_user")
