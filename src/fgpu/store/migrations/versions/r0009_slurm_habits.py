"""Slurm's habits (issue 25, point 4): a workload's time limit (``time_limit_s``), its
dependencies (``dependency``), and, for a task of an array, the array (``array_id``,
``array_name``, ``array_index``, ``array_size``, ``array_throttle``, with indexes on
``array_id`` and ``(owner_uid, array_name)``); a queue's default and maximum time limit
(``default_time_s``, ``max_time_s``). Every new column is nullable (NULL: none), so
existing rows need nothing.

Revision ID: r0009
Revises: r0008
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0009"
down_revision: str | None = "r0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable columns and the index."""
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("time_limit_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("dependency", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("array_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("array_name", sa.String(128), nullable=True))
        batch.add_column(sa.Column("array_index", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("array_size", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("array_throttle", sa.BigInteger(), nullable=True))
    op.create_index("ix_workloads_array_id", "workloads", ["array_id"])
    op.create_index("ix_workloads_owner_array_name", "workloads", ["owner_uid", "array_name"])
    with op.batch_alter_table("queues") as batch:
        batch.add_column(sa.Column("default_time_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("max_time_s", sa.Double(), nullable=True))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("queues") as batch:
        batch.drop_column("max_time_s")
        batch.drop_column("default_time_s")
    op.drop_index("ix_workloads_owner_array_name", table_name="workloads")
    op.drop_index("ix_workloads_array_id", table_name="workloads")
    with op.batch_alter_table("workloads") as batch:
        for column in (
            "array_throttle",
            "array_size",
            "array_index",
            "array_name",
            "array_id",
            "dependency",
            "time_limit_s",
        ):
            batch.drop_column(column)
