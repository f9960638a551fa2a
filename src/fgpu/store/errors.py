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


class StoreUnwritable(StoreError):
    """The database cannot write now: its disk is full, an I/O error, a read-only file or
    folder (SQLite), or the server's disk or I/O trouble (PostgreSQL SQLSTATE classes 53 and
    58). Nothing of the change was written; the same change may succeed once the cause is
    gone.

    Attributes:
        cause: what the database said, with the database's name.
    """

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(cause)


class StoreDamaged(StoreError):
    """The database file is damaged (SQLite ``PRAGMA quick_check`` found problems, or the
    file is not a database); the service must not serve from it.

    Attributes:
        database: the file (or URL) checked.
        problems: what the check reported (the first few lines).
    """

    def __init__(self, database: str, problems: list[str]) -> None:
        self.database = database
        self.problems = problems
        super().__init__(f"{database} is damaged: {'; '.join(problems)}")


class RowDamaged(StoreError):
    """A workload's stored row does not hold what fgpu writes (a JSON column that does not
    parse or has the wrong shape, an unknown phase, text where a number belongs, a NULL where
    a value is needed): :mod:`fgpu.store.rows`. Listings skip such a row; a lookup of it
    raises this. An admin ends it with ``fgpu cancel ID`` (:meth:`Store.end_damaged`).

    Attributes:
        workload_id: the row's id.
        problem: each bad column and what is wrong with it.
    """

    def __init__(self, workload_id: str, problem: str) -> None:
        self.workload_id = workload_id
        self.problem = problem
        super().__init__(
            f"workload {workload_id}'s stored row is damaged ({problem}); an admin can end it "
            f"with `fgpu cancel {workload_id}` (run as root or an admin)"
        )

    def __reduce__(self) -> tuple[type[RowDamaged], tuple[str, str]]:
        return (type(self), (self.workload_id, self.problem))
