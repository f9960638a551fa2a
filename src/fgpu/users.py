"""Users as messages name them: by user name, as ``fgpu ls`` shows them, with the uid where
the machine has no such user."""

from __future__ import annotations

import pwd


def user_text(uid: int) -> str:
    """``alice`` for a uid with a user entry, else ``uid 1001`` (read at each call)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


__all__ = ["user_text"]
