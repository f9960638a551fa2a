"""Alembic migrations of the store, run by :func:`fgpu.store.engine.upgrade`."""
