"""A covering index for pages of the workload listing (issue 27): ``(submitted_at, id,
phase, owner_uid, stored_bytes)``. A page's extent (which workloads, and how many bytes of
commands each stores) is then read from the index alone; without it SQLite reads each row
to its last column, walking the overflow pages of a long command on the way.

Revision ID: r0013
Revises: r0012
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "r0013"
down_revision: str | None = "r0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the index."""
    op.create_index(
        "ix_workloads_listing",
        "workloads",
        ["submitted_at", "id", "phase", "owner_uid", "stored_bytes"],
    )


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("ix_workloads_listing", table_name="workloads")
