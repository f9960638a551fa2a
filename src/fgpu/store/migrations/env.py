"""Alembic environment: migrates on the connection :func:`fgpu.store.engine.upgrade` passes.

There is no ini file and no offline (SQL script) mode; to write a new revision, copy the
latest file in ``versions/``, give it the next ``rNNNN`` name and revision id, set
``down_revision`` to the previous one, and check it with the schema test
(``tests/unit/test_store_schema.py``), which compares the migrated database with
:mod:`fgpu.store.schema`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from fgpu.store.schema import Base


def run_migrations() -> None:
    """Run the pending migrations inside the caller's transaction."""
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("fgpu migrations run through fgpu.store.engine.upgrade(engine)")
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
