"""Alembic revisions, oldest first (``rNNNN_*.py``)."""
