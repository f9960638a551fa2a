"""Workload names: the default name of a submission, unique names among a user's active
workloads, and finding a workload by id, unique id prefix or name (issue "Everyday use").

A reference (what a user types where an id goes) means:

1. the workload with exactly that id, when there is one; else
2. the one candidate among the workloads it names and the workloads whose id starts with it.
   The workload a name names is the caller's own of that name (the active one; else the most
   recent), else the one workload of another user with that name (the active one when
   several have it). A name that is also the prefix of another workload's id fits both, so
   it is refused: a name never silently wins over an id prefix, nor a prefix over a name.

A reference that fits several workloads is refused with the candidates listed (id, name,
owner, phase, and whether it matched by name or by id prefix), never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Sequence

from fgpu.rules.errors import BadRequest, Conflict, NotFoundError
from fgpu.store.records import WorkloadRecord
from fgpu.users import user_text

INTERPRETERS = frozenset(
    {"python", "python3", "bash", "sh", "zsh", "node", "ruby", "perl", "julia", "Rscript"}
)
"""Commands whose first operand (a script) names the work better than they do."""

_VERSIONED = re.compile(r"^(python|python3|pypy3?)(\.\d+)*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_CANDIDATES = 10


def base_name(argv: Sequence[str], shell: bool) -> str:
    """The default name of a command: its program's base name, or for an interpreter
    (``python train.py``, ``bash run.sh``) its script's base name without the extension;
    ``python -m pkg.mod`` gives ``mod``. Characters other than letters, digits, ``.``, ``_``
    and ``-`` become ``-``; never empty (``workload``)."""
    words = argv[0].split() if shell and argv else list(argv)
    if not words:
        return "workload"
    program = words[0].rsplit("/", 1)[-1]
    name = program
    if program in INTERPRETERS or _VERSIONED.match(program):
        rest = words[1:]
        for i, word in enumerate(rest):
            if word == "-m" and i + 1 < len(rest):
                name = rest[i + 1].rsplit(".", 1)[-1]
                break
            if word == "-c":
                break
            if not word.startswith("-"):
                script = word.rsplit("/", 1)[-1]
                name = script.rsplit(".", 1)[0] if "." in script[1:] else script
                break
    name = _UNSAFE.sub("-", name).strip("-.")
    return name or "workload"


def unique_name(base: str, taken: Iterable[str], limit: int) -> str:
    """``base``, or ``base-2``, ``base-3``, ... the first not in ``taken`` (at most
    ``limit`` characters)."""
    used = set(taken)
    if base[:limit] not in used:
        return base[:limit]
    n = 2
    while True:
        suffix = f"-{n}"
        candidate = base[: limit - len(suffix)] + suffix
        if candidate not in used:
            return candidate
        n += 1


def check_name_free(name: str, holder: tuple[str, str] | None) -> None:
    """Refuse a name when ``holder`` (``(id, phase)`` of the owner's active workload of that
    name, from :meth:`fgpu.server.core.ServiceCore._active_holders`) exists.

    Raises:
        Conflict: field ``name``, naming the workload that has it.
    """
    if holder is not None:
        wid, phase = holder
        raise Conflict(
            "name",
            f"you already have an active workload named {name!r} ({wid}, {phase}); "
            "choose another --name, or cancel that one first",
        )


def _suffixed(base: str, n: int, limit: int) -> str:
    suffix = f"-{n}"
    return base[: limit - len(suffix)] + suffix


class NamePicker:
    """Default names without reading a user's whole backlog: ``base`` when free, else
    ``base-N`` for the N after the last one given for that user and base (one indexed
    lookup each); when that one is taken (a restart, or names given by hand), the first
    free among the user's active names with that base (one query for the names only).

    Freed names below the last given are not reused until then: a name is unique, not
    the smallest. Call under the service's names lock.

    Args:
        limit: longest name.
        capacity: how many (user, base) hints to keep before starting afresh.
    """

    def __init__(self, limit: int, capacity: int = 10_000) -> None:
        self.limit = limit
        self.capacity = capacity
        self._next: dict[tuple[int, str], int] = {}

    def pick(
        self,
        owner_uid: int,
        base: str,
        taken: Callable[[list[str]], Collection[str]],
        names_like: Callable[[str], set[str]],
    ) -> str:
        """A name for a new workload of ``owner_uid`` from ``base``.

        Args:
            taken: which of the given names the owner's active workloads have (one lookup
                for ``base`` and the next suffix together).
            names_like: the owner's active names that start with a given prefix.
        """
        first = base[: self.limit]
        key = (owner_uid, base)
        n = self._next.get(key, 2)
        candidate = _suffixed(base, n, self.limit)
        used = taken([first, candidate])
        if first not in used:
            return first
        if candidate in used:
            used = names_like(base[: max(1, self.limit - 8)])
            n = 2
            while (candidate := _suffixed(base, n, self.limit)) in used:
                n += 1
        if len(self._next) >= self.capacity:
            self._next.clear()
        self._next[key] = n + 1
        return candidate


def resolve(ref: str, records: Sequence[WorkloadRecord], caller_uid: int) -> WorkloadRecord:
    """The workload ``ref`` means (see the module's docstring for the order).

    Args:
        ref: an id, a unique id prefix or a name.
        records: every workload (oldest first).
        caller_uid: who asks (their own names come first).

    Raises:
        NotFoundError: nothing fits (field ``id``).
        BadRequest: several fit (field ``id``), with the candidates listed.
    """
    for record in records:
        if record.id == ref:
            return record
    named = _named(ref, records, caller_uid)
    by_name = {r.id for r in named}
    candidates = [*named, *(r for r in records if r.id.startswith(ref) and r.id not in by_name)]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise _ambiguous(ref, candidates, by_name)
    tasks = [r for r in records if r.array is not None and ref in (r.array.id, r.array.name)]
    if tasks:
        mine = [r for r in tasks if r.owner_uid == caller_uid]
        array = (mine or tasks)[0].array
        assert array is not None
        whose = (
            "an array"
            if mine
            else f"an array of {user_text(tasks[0].owner_uid)} (only they or an admin may "
            "cancel it)"
        )
        raise NotFoundError(
            "id",
            f"{ref!r} is {whose} ({array.id}, {array.size} tasks named {array.name}_INDEX), "
            f"not one workload: name a task (e.g. {array.name}_{array.index}), see them all "
            "with fgpu ls --expand",
        )
    raise NotFoundError("id", f"no workload with the id, id prefix or name {ref!r}")


def _named(ref: str, records: Sequence[WorkloadRecord], caller_uid: int) -> list[WorkloadRecord]:
    """The workloads the name ``ref`` may mean for ``caller_uid``: one, none, or several
    (then ``ref`` is ambiguous as a name alone)."""
    named = [r for r in records if r.name == ref]
    own = [r for r in named if r.owner_uid == caller_uid]
    if own:
        active = [r for r in own if r.is_active]
        return active if active else own[-1:]  # several active: from before names were unique
    active = [r for r in named if r.is_active]
    return active if active else named


def _ambiguous(ref: str, candidates: Sequence[WorkloadRecord], by_name: set[str]) -> BadRequest:
    listed = "; ".join(
        f"{r.id} ({r.name}, {user_text(r.owner_uid)}, {r.phase}; "
        f"{'by name' if r.id in by_name else 'by id prefix'})"
        for r in candidates[:MAX_CANDIDATES]
    )
    more = len(candidates) - MAX_CANDIDATES
    if more > 0:
        listed += f"; and {more} more"
    return BadRequest(
        "id",
        f"{ref!r} fits {len(candidates)} workloads (a name or an id prefix): {listed}; "
        "give the full id",
    )


__all__ = ["NamePicker", "base_name", "check_name_free", "resolve", "unique_name"]
