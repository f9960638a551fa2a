"""Index ``workloads (owner_uid, phase, name)``: a submission's name check (is the name free
among its owner's active workloads?) and its owner's active count are index lookups instead
of reading every active workload of the owner (issue 27).

Revision ID: r0006
Revises: r0005
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "r0006"
down_revision: str | None = "r0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create the index (no data changes)."""
    op.create_index("ix_workloads_owner_phase_name", "workloads", ["owner_uid", "phase", "name"])


def downgrade() -> None:
    """Drop the index."""
    op.drop_index("ix_workloads_owner_phase_name", table_name="workloads")
