"""Who may submit what to which queue on one machine (DESIGN.md section 5, "Who may do what").

The rules, checked at submission for callers who are not admins (admins may do anything):

1. **Membership.** A queue admits the users and groups it lists
   (:attr:`fgpu.store.records.QueueConfig.members`): a user name or uid, ``@group`` (a Unix
   group name or gid, matched against the caller's primary and supplementary groups from the
   user database), or ``*`` for everyone. An empty list admits admins only. The ``default``
   queue lists ``*`` when the service creates it, so one-user setups need no configuration.
2. **Priority.** A member may submit up to the queue's ``max_priority`` (``normal``, 50,
   unless an admin raises it).
3. **Non-preemptible work** (a class at or above ``high``, 100, unless marked preemptible, or
   any priority with ``preemptible: false``) needs a queue that grants it
   (``nonpreemptible``): such work may not be stopped for others, and at or above ``high``
   it preempts lower-priority work of the queue's members.

Each refusal is a :class:`fgpu.rules.errors.Forbidden` (403) naming the field, the rule and
the command an admin runs to allow it.
"""

from __future__ import annotations

import grp
import os
import pwd
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fgpu.rules.errors import BadRequest, Forbidden
from fgpu.sched.reasons import gpus
from fgpu.sched.workload import NON_PREEMPTIBLE_FROM, PRIORITY_CLASSES
from fgpu.store.records import EVERYONE, QueueConfig, QueueRecord


@dataclass(frozen=True, slots=True)
class Identity:
    """A caller as the user database knows them.

    Attributes:
        uid: the caller's uid (peer credentials of the Unix socket).
        user: the user name, None when the uid has no entry.
        gids: the primary and supplementary group ids (empty without an entry).
        groups: the names of those groups that have names.
    """

    uid: int
    user: str | None
    gids: frozenset[int]
    groups: frozenset[str]

    @property
    def shown(self) -> str:
        """``uid 1001 (alice)``, or ``uid 1001`` without a user entry."""
        return f"uid {self.uid}" + (f" ({self.user})" if self.user else "")


IDENTITY_TTL_S = 2.0
"""How long :func:`identity_of` keeps what it read for a uid while ``/etc/passwd`` and
``/etc/group`` are unchanged (seconds): user databases other than those files (LDAP, SSSD)
change nothing a program can watch."""

_USER_FILES = ("/etc/passwd", "/etc/group")
_identities: dict[int, tuple[Identity, tuple[tuple[int, int, int], ...], float]] = {}


def _files_stamp() -> tuple[tuple[int, int, int], ...]:
    stamps = []
    for path in _USER_FILES:
        try:
            found = os.stat(path)
        except OSError:
            stamps.append((0, 0, 0))
        else:
            stamps.append((found.st_ino, found.st_mtime_ns, found.st_size))
    return tuple(stamps)


def identity_of(uid: int) -> Identity:
    """The caller ``uid`` with their user name and groups, from the user database (``pwd``,
    ``os.getgrouplist``, ``grp``). Read again when ``/etc/passwd`` or ``/etc/group``
    changed (a group change there counts at once) or after :data:`IDENTITY_TTL_S`: reading
    them took 0.2-0.3 ms of each submission (``getgrouplist`` and ``getgrgid`` parse
    ``/etc/group`` at each call)."""
    stamp = _files_stamp()
    now = time.monotonic()
    kept = _identities.get(uid)
    if kept is not None and kept[1] == stamp and now - kept[2] < IDENTITY_TTL_S:
        return kept[0]
    found = _read_identity(uid)
    if len(_identities) >= 4096:  # bounded: uids seen by one server
        _identities.clear()
    _identities[uid] = (found, stamp, now)
    return found


def _read_identity(uid: int) -> Identity:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return Identity(uid, None, frozenset(), frozenset())
    try:
        gids = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        gids = frozenset({entry.pw_gid})
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return Identity(uid, entry.pw_name, gids, frozenset(names))


def is_member(queue: QueueConfig, who: Identity) -> bool:
    """Whether ``who`` is listed by ``queue`` (by user name or uid, by group, or ``*``)."""
    for entry in queue.members:
        if entry == EVERYONE:
            return True
        if entry.startswith("@"):
            group = entry[1:]
            if group in who.groups or (group.isdigit() and int(group) in who.gids):
                return True
        elif entry == who.user or (entry.isdigit() and int(entry) == who.uid):
            return True
    return False


def default_queue_of(queues: Iterable[QueueRecord], who: Identity, fallback: str) -> str:
    """The queue a submission of ``who`` without a queue goes to.

    The rule: the queue whose ``default_for`` names the user (user name or uid) wins; else
    the one queue whose ``default_for`` names one of the user's groups (``@name`` or
    ``@gid``); else ``fallback`` (``default``).

    Raises:
        BadRequest: field ``queue``: the user's groups name several different default queues
            (each is named, with the group; give ``-q``, or an admin names the user on one).
    """
    by_group: dict[str, list[str]] = {}
    for record in queues:
        config = record.config
        for entry in config.default_for:
            if entry.startswith("@"):
                group = entry[1:]
                if group in who.groups or (group.isdigit() and int(group) in who.gids):
                    by_group.setdefault(config.name, []).append(entry)
            elif entry == who.user or (entry.isdigit() and int(entry) == who.uid):
                return config.name
    if len(by_group) == 1:
        return next(iter(by_group))
    if by_group:
        named = "; ".join(f"{', '.join(g)} -> queue {q}" for q, g in sorted(by_group.items()))
        raise BadRequest(
            "queue",
            f"no queue given and the groups of {who.shown} have different default queues "
            f"({named}); give -q/--queue, or an admin makes one the default of "
            f"{who.user or who.uid} by name (fgpu queue set QUEUE --default-for NAME)",
        )
    return fallback


def unknown_members(members: tuple[str, ...]) -> list[str]:
    """The entries of a member list that name no user or group of this machine (numeric
    uids and gids always count as known: a user may be added before the account)."""
    unknown = []
    for entry in members:
        if entry == EVERYONE or entry.lstrip("@").isdigit():
            continue
        try:
            if entry.startswith("@"):
                grp.getgrnam(entry[1:])
            else:
                pwd.getpwnam(entry)
        except KeyError:
            unknown.append(entry)
    return unknown


def priority_name(priority: int) -> str:
    """``critical (125)`` for a class, else the number."""
    for name, value in PRIORITY_CLASSES.items():
        if value == priority:
            return f"{name} ({value})"
    return str(priority)


def check_submission(
    queue: QueueConfig,
    uid: int,
    *,
    admin: bool,
    priority: int,
    preemptible: bool | None,
    gpu_milli: int = 0,
) -> None:
    """Refuse a submission the caller may not make (see the module docstring).

    Args:
        queue: the queue submitted to.
        uid: the caller.
        admin: the caller is root, the server's user or an ``--admin``: nothing is checked.
        priority: the workload's numeric priority.
        preemptible: the submission's flag; None takes the default of its priority
            (non-preemptible from ``high``, 100).
        gpu_milli: the GPU compute the request counts against quotas (milli-GPU): where
            the queue's quota could not hold it as non-preemptible work, an admin's fix
            named in a refusal raises the quota too, so that the fix works
            (:func:`check_within_quota` would refuse it next).

    Raises:
        Forbidden: field ``queue`` (not a member), ``priority`` (above the queue's
            ``max_priority``) or ``preemptible`` (non-preemptible work without the queue's
            grant).
    """
    if admin:
        return
    who = identity_of(uid)
    name = queue.name
    whom = who.user or str(uid)
    if not is_member(queue, who):
        listed = ", ".join(queue.members) if queue.members else "none (admins only)"
        raise Forbidden(
            "queue",
            f"{who.shown} is not a member of queue {name} (members: {listed}); rule: a queue "
            f"takes work from its members and admins; an admin adds you with "
            f"'fgpu queue set {name} --add-member {whom}'",
        )
    nonpreemptible = (
        not preemptible if preemptible is not None else priority >= NON_PREEMPTIBLE_FROM
    )
    too_high = priority > queue.max_priority
    pinned = nonpreemptible and not queue.nonpreemptible
    # the class name where there is one: what the user typed (-p critical), not 125
    asked = next((n for n, v in PRIORITY_CLASSES.items() if v == priority), str(priority))
    quota = queue.quota.gpu_milli
    # non-preemptible work runs only within the quota: a grant alone would not do
    raise_quota = f" --quota {gpus(gpu_milli)}" if pinned and gpu_milli > quota else ""
    if too_high:
        fixes = f"--max-priority {asked}" + (" --nonpreemptible" if pinned else "") + raise_quota
        also = (
            "; and non-preemptible work (its default from high) needs the queue's grant: "
            "non-preemptible work is never stopped for others"
            if pinned
            else ""
        )
        # --preemptible alone would not do: the priority is still above max_priority. What
        # works without an admin is the queue's highest priority (preemptible where the
        # queue grants no non-preemptible work).
        top = next(
            (n for n, v in PRIORITY_CLASSES.items() if v == queue.max_priority),
            str(queue.max_priority),
        )
        lower_pinned = not queue.nonpreemptible and (
            preemptible is False
            or (preemptible is None and queue.max_priority >= NON_PREEMPTIBLE_FROM)
        )
        lower = f"-p {top}" + (" --preemptible" if lower_pinned else "")
        raise Forbidden(
            "priority",
            f"priority {priority_name(priority)} is above what queue {name} allows its "
            f"members ({priority_name(queue.max_priority)}); rule: users who are not admins "
            f"submit up to the queue's max_priority{also}; an admin grants it with "
            f"'fgpu queue set {name} {fixes}'; or submit it with {lower}"
            + (" (--preemptible alone keeps the priority too high)" if pinned else ""),
        )
    if pinned:
        why = (
            "preemptible is false"
            if preemptible is False
            else f"priority {priority_name(priority)} is non-preemptible by default"
        )
        raise Forbidden(
            "preemptible",
            f"non-preemptible work ({why}) needs an admin or a queue that grants it, and "
            f"queue {name} does not; rule: non-preemptible work is never stopped for "
            f"others, so an admin grants it with "
            f"'fgpu queue set {name} --nonpreemptible{raise_quota}'; or submit it --preemptible",
        )


def check_within_quota(
    queue: QueueConfig,
    *,
    gpu_milli: int,
    priority: int,
    preemptible: bool | None,
) -> None:
    """Refuse non-preemptible work that its queue's GPU quota could never hold.

    The decision core starts non-preemptible work only within its queue's GPU quota
    (``fgpu.sched.decide``, rule 3), whoever submits it (admins too): a request above the
    quota would wait forever.

    Args:
        queue: the (leaf) queue submitted to.
        gpu_milli: the GPU compute the request counts against quotas (milli-GPU,
            :func:`fgpu.sched.decide.request_resources`).
        priority: the workload's numeric priority.
        preemptible: the submission's flag; None takes the default of its priority.

    Raises:
        BadRequest: field ``preemptible``, naming the queue's quota and the request.
    """
    nonpreemptible = (
        not preemptible if preemptible is not None else priority >= NON_PREEMPTIBLE_FROM
    )
    quota = queue.quota.gpu_milli
    if not nonpreemptible or gpu_milli <= quota:
        return
    why = (
        "preemptible is false"
        if preemptible is False
        else f"priority {priority_name(priority)} is non-preemptible by default"
    )
    raise BadRequest(
        "preemptible",
        f"non-preemptible work ({why}) asking for {gpus(gpu_milli)} GPUs can never start "
        f"in queue {queue.name}: its GPU quota is {gpus(quota)}; rule: non-preemptible work "
        "runs only within its queue's GPU quota, since it is never stopped for others; "
        f"submit it --preemptible, or an admin raises the quota with "
        f"'fgpu queue set {queue.name} --quota {gpus(max(gpu_milli, quota))}'",
    )


__all__ = [
    "Identity",
    "check_submission",
    "check_within_quota",
    "default_queue_of",
    "identity_of",
    "is_member",
    "priority_name",
    "unknown_members",
]
