"""Initial schema: queues, workloads, events, nodes, gpus, holds.

Revision ID: r0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "r0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

_EVENT_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create every table."""
    op.create_table(
        "queues",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("parent", sa.String(128), nullable=True),
        sa.Column("quota_gpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("quota_cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("quota_memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("limit_gpu_milli", sa.BigInteger(), nullable=True),
        sa.Column("limit_cpu_milli", sa.BigInteger(), nullable=True),
        sa.Column("limit_memory_mib", sa.BigInteger(), nullable=True),
        sa.Column("over_quota_weight", sa.Double(), nullable=False),
        sa.Column("priority", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_queues")),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner_uid", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("priority", sa.BigInteger(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=True),
        sa.Column("cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("gpu_count", sa.BigInteger(), nullable=False),
        sa.Column("gpu_milli", sa.BigInteger(), nullable=True),
        sa.Column("gpu_memory_mib", sa.BigInteger(), nullable=True),
        sa.Column("gpu_models", sa.Text(), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=False),
        sa.Column("shell", sa.Boolean(), nullable=False),
        sa.Column("cwd", sa.Text(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("grace_s", sa.Double(), nullable=False),
        sa.Column("submitted_at", sa.Double(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=True),
        sa.Column("finished_at", sa.Double(), nullable=True),
        sa.Column("exit_code", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("restarts", sa.BigInteger(), nullable=False),
        sa.Column("stop_requested_at", sa.Double(), nullable=True),
        sa.Column("cancelled_by", sa.BigInteger(), nullable=True),
        sa.Column("pid", sa.BigInteger(), nullable=True),
        sa.Column("create_time", sa.Double(), nullable=True),
        sa.Column("stdout_path", sa.Text(), nullable=True),
        sa.Column("stderr_path", sa.Text(), nullable=True),
        sa.Column("node_name", sa.String(128), nullable=True),
        sa.Column("allocation", sa.JSON(), nullable=True),
        sa.CheckConstraint(
            "phase IN ('pending', 'running', 'paused', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_workloads_phase"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workloads")),
    )
    op.create_index(op.f("ix_workloads_phase"), "workloads", ["phase"])
    op.create_index(op.f("ix_workloads_queue"), "workloads", ["queue"])
    op.create_table(
        "events",
        sa.Column("id", _EVENT_ID, autoincrement=True, nullable=False),
        sa.Column("workload_id", sa.String(32), nullable=True),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name=op.f("fk_events_workload_id_workloads")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_workload_id"), "events", ["workload_id", "id"])
    op.create_index(op.f("ix_events_time"), "events", ["time"])
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nodes")),
    )
    op.create_table(
        "gpus",
        sa.Column("node_name", sa.String(128), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("uuid", sa.String(96), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("mig_enabled", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_name"], ["nodes.name"], name=op.f("fk_gpus_node_name_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("node_name", "gpu_index", name=op.f("pk_gpus")),
        sa.UniqueConstraint("uuid", name=op.f("uq_gpus_uuid")),
    )
    op.create_table(
        "holds",
        sa.Column("workload_id", sa.String(32), nullable=False),
        sa.Column("node_name", sa.String(128), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("victims", sa.JSON(), nullable=False),
        sa.Column("since", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name=op.f("fk_holds_workload_id_workloads")
        ),
        sa.PrimaryKeyConstraint("workload_id", name=op.f("pk_holds")),
    )


def downgrade() -> None:
    """Drop every table."""
    for table in ("holds", "gpus", "nodes", "events", "workloads", "queues"):
        op.drop_table(table)
