"""Errors of the store.

Bad input (an unknown queue at submission, a negative quota, a queue cycle) is reported with
:class:`fgpu.model.types.InvalidRequestError`, as everywhere else in fgpu. The errors here are
about the state already stored: a record that does not exist, a transition from the wrong
phase, a caller who may not do what they ask. Whenever one is raised, nothing was written.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of the store's own errors."""


class NotFound(StoreError, LookupError):
    """No workload, queue or node by that name or id.

    Attributes:
        kind: ``"workload"``, ``"queue"`` or ``"node"``.
        key: the id or name looked up.
    """

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        super().__init__(f"no {kind} {key!r}")

    def __reduce__(self) -> tuple[type[NotFound], tuple[str, str]]:
        return (type(self), (self.kind, self.key))


class StoreConflict(StoreError):
    """A change that does not fit the stored state: a transition from the wrong phase, a
    duplicate queue name, a queue still in use. The message says what was found.
    """


class PermissionDenied(StoreError, PermissionError):
    """The caller may not make this change (another user's workload)."""
