"""Per-user limits on what one submission may store and on how much work one user may hold
(issue 27: one user's 5,000 submissions slowed every listing; 60 commands of 0.9 MB made
the database 55 MB).

Two levels, both checked at each submission:

- **the machine's** (flags of ``fgpu serve``), over all queues: ``--max-active-per-user``
  active (pending, running, paused) workloads and ``--max-stored-bytes`` bytes of commands
  and environments of stored workloads (active ones and finished ones until retention prunes
  them, ``--retention``);
- **the queue's**, where an admin set them (``fgpu queue create|set --max-active-per-user N
  --max-stored-bytes SIZE``), counting the user's work in that queue only. A queue without
  its own value has only the machine's limit (the machine's default is the fallback).

A third limit is the scheduler's, not the submission's: ``--max-running-per-user`` (the
machine's, :data:`DEFAULT_MAX_RUNNING`) and a queue's ``max_running_per_user`` bound how
many workloads one user has running at once; more wait pending with a reason naming the
limit (:func:`running_gate`, applied before each round of the decision core).

Over a limit the submission gets HTTP 429 (field ``workloads`` for the count, ``command``
for the bytes), the reason naming the limit, where it is set (the queue or the machine's
flag), its value and the user's figure. One submission's own command and environment are
at most ``--max-submission-bytes`` (422, field ``command``).

The figures come from the store's ``(owner_uid, queue, phase, stored_bytes)`` index
(:meth:`fgpu.store.usage.UsageStore.owner_usage`): a scan of the owner's index entries, no
workload row is read, and other users' work costs nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fgpu.rules.errors import BadRequest, ServiceError
from fgpu.store.records import QueueConfig, WorkloadRecord
from fgpu.store.usage import OwnerUsage
from fgpu.store.validate import MIN_STORED_BYTES
from fgpu.store.validate import stored_bytes as stored_bytes
from fgpu.users import user_text

DEFAULT_MAX_ACTIVE = 10_000
"""Active workloads per user (the service benchmark queues 10,000 as one user)."""
DEFAULT_MAX_RUNNING = 64
"""Workloads one user may have running at once, all queues. Each running workload holds a
runner process of the (root) server, about 10 MB of host memory, and the governor's work
grows with their number, while a user's own ulimits do not bound them (issue 27: 455
runners of 0.001 GPU took 4.3 GB). 64 runners are about 0.6 GB per user, and 64 is more
than the shares one user usefully runs on a machine of up to 8 GPUs at a few shares each;
an admin raises it (``--max-running-per-user``) or lowers it per queue."""
DEFAULT_MAX_SUBMISSION_BYTES = 256 * 1024
"""Bytes of command and environment one submission may store (the CLI sends the caller's
environment, commonly a few KiB)."""
DEFAULT_MAX_STORED_BYTES = 256 * 2**20
"""Bytes of commands and environments one user's stored workloads may take (10,000
submissions of the CLI's usual few KiB fit; a few hundred of the largest do not)."""


class LimitReached(ServiceError):
    """A per-user limit is reached (429)."""

    status = 429


def size_text(size: int) -> str:
    """``268435456`` -> ``256 MiB (268435456 bytes)``; below 1 KiB just the bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g} {unit} ({size} bytes)"
    return f"{size} bytes"


@dataclass(frozen=True, slots=True)
class SubmissionLimits:
    """The machine's per-user limits (flags of ``fgpu serve``).

    Attributes:
        max_active: active workloads per user, all queues.
        max_submission_bytes: bytes of command and environment per submission, as stored.
        max_stored_bytes: bytes of commands and environments of one user's stored workloads,
            all queues.
        max_running: workloads one user may have running (or paused, or suspended in
            place) at once, all queues; the scheduler keeps more pending
            (:func:`running_gate`), no submission is refused for it.
    """

    max_active: int = DEFAULT_MAX_ACTIVE
    max_submission_bytes: int = DEFAULT_MAX_SUBMISSION_BYTES
    max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES
    max_running: int = DEFAULT_MAX_RUNNING

    def check(self) -> None:
        """Raises ValueError naming the flag and echoing the value when out of range."""
        if self.max_active < 1:
            raise ValueError(f"--max-active-per-user: {self.max_active} must be at least 1")
        if self.max_running < 1:
            raise ValueError(f"--max-running-per-user: {self.max_running} must be at least 1")
        if self.max_submission_bytes < 1024:
            raise ValueError(
                f"--max-submission-bytes: {self.max_submission_bytes} must be at least 1024"
            )
        if self.max_stored_bytes < max(MIN_STORED_BYTES, self.max_submission_bytes):
            raise ValueError(
                f"--max-stored-bytes: {self.max_stored_bytes} must be at least "
                f"--max-submission-bytes ({self.max_submission_bytes}): a user could store "
                "nothing"
            )

    def check_active(self, active: int, adding: int = 1) -> None:
        """Refuse ``adding`` more workloads (an array's tasks each count) of a user who has
        ``active`` active ones (the machine's limit only; :meth:`check_usage` checks the
        queue's too).

        Raises:
            LimitReached: field ``workloads``, naming the limit and the count.
        """
        if active + adding <= self.max_active:
            return
        if adding == 1:
            raise LimitReached(
                "workloads",
                f"you have {active} active workloads, the limit per user on this machine "
                f"(--max-active-per-user {self.max_active}); wait for some to finish or "
                "cancel some",
            )
        raise LimitReached(
            "workloads",
            f"this array has {adding} tasks and you have {active} active workloads: more "
            f"than the limit per user (--max-active-per-user {self.max_active}), each task "
            "counting as one; submit fewer tasks, or wait for some to finish or cancel some",
        )

    def check_usage(
        self, usage: OwnerUsage, queue: QueueConfig, size: int, adding: int = 1
    ) -> None:
        """Refuse a submission of ``adding`` workloads (an array's tasks) of ``size`` stored
        bytes each to ``queue`` by a user who holds ``usage``: the queue's limits where it
        sets them, then the machine's.

        Raises:
            LimitReached: field ``workloads`` (active count) or ``command`` (stored bytes),
                naming the limit, where it is set, its value and the user's figure.
        """
        cap = queue.max_active_per_user
        if cap is not None and usage.active_in_queue + adding > cap:
            raise LimitReached(
                "workloads",
                f"you have {usage.active_in_queue} active workloads in queue {queue.name}, "
                f"its limit per user (max_active_per_user {cap}, set with 'fgpu queue set "
                f"{queue.name} --max-active-per-user N'); wait for some to finish or cancel "
                "some",
            )
        self.check_active(usage.active, adding)
        size *= adding
        cap = queue.max_stored_bytes
        if cap is not None and usage.stored_bytes_in_queue + size > cap:
            raise LimitReached(
                "command",
                f"your workloads in queue {queue.name} store "
                f"{size_text(usage.stored_bytes_in_queue)} of commands and environments; "
                f"this one's {size} bytes would pass the queue's limit per user "
                f"(max_stored_bytes {size_text(cap)}, set with 'fgpu queue set {queue.name} "
                "--max-stored-bytes SIZE'); finished workloads count until they are pruned; "
                "cancel some, or submit with a smaller environment",
            )
        if usage.stored_bytes + size > self.max_stored_bytes:
            raise LimitReached(
                "command",
                f"your workloads store {size_text(usage.stored_bytes)} of commands and "
                f"environments; this one's {size} bytes would pass the limit per user on "
                f"this machine (--max-stored-bytes {size_text(self.max_stored_bytes)}); "
                "finished workloads count until they are pruned; cancel some, or submit "
                "with a smaller environment",
            )

    def check_size(self, argv: Sequence[str], env: Mapping[str, str], cwd: str = "") -> int:
        """Refuse a submission whose command, environment and working directory store more
        than the limit; returns the stored size (bytes).

        Raises:
            BadRequest: field ``command``, echoing the size and naming the limit.
        """
        size = stored_bytes(argv, env, cwd)
        if size > self.max_submission_bytes:
            raise BadRequest(
                "command",
                f"command, env and cwd take {size} bytes as stored, over the limit of "
                f"{self.max_submission_bytes} bytes per submission (--max-submission-bytes)",
            )
        return size


def running_gate(
    running: Iterable[WorkloadRecord],
    pending: Sequence[WorkloadRecord],
    queues: Mapping[str, QueueConfig],
    machine_cap: int,
) -> dict[str, str]:
    """The pending workloads a round leaves out for their owner's running limits, with the
    reason each waits (the per-user cap on running workloads: a scheduler's rule, never a
    refusal at submission).

    Each owner may have at most ``machine_cap`` workloads running at once over all queues
    (``fgpu serve --max-running-per-user``) and at most a queue's ``max_running_per_user``
    in that queue. Of an owner's pending work, the round lets through as many as the room
    under both caps, in the order the decision core prefers them (higher priority first,
    then earlier submission); the rest wait with a reason that names the limit and the flag
    that sets it.

    Args:
        running: the workloads that count as running: those holding an allocation
            (running, paused) and those suspended in place (restored where they were).
        pending: the pending workloads the round would otherwise consider.
        queues: queue configurations by name.
        machine_cap: the machine's limit per user.

    Returns:
        workload id -> the reason it waits (empty: no limit is reached). Cost: one pass over
        both lists; an owner's pending work is sorted only when a limit binds for them.
    """
    owner_running: Counter[int] = Counter()
    queue_running: Counter[tuple[int, str]] = Counter()
    for record in running:
        owner_running[record.owner_uid] += 1
        queue_running[(record.owner_uid, record.queue)] += 1
    by_owner: dict[int, list[WorkloadRecord]] = {}
    for record in pending:
        by_owner.setdefault(record.owner_uid, []).append(record)
    reasons: dict[str, str] = {}
    for owner, waiting in by_owner.items():
        in_queue = Counter(r.queue for r in waiting)
        binds = owner_running[owner] + len(waiting) > machine_cap
        for q, n in in_queue.items():
            cap = _queue_cap(queues, q)
            binds = binds or (cap is not None and queue_running[(owner, q)] + n > cap)
        if not binds:
            continue
        who = user_text(owner)
        total = owner_running[owner]
        per_queue = {q: queue_running[(owner, q)] for q in in_queue}
        for record in sorted(waiting, key=lambda r: (-r.priority, r.submitted_at, r.id)):
            cap = _queue_cap(queues, record.queue)
            if total >= machine_cap:
                reasons[record.id] = (
                    f"waits: {who} runs {_workloads(total)}, the most this machine allows a "
                    f"user at once (fgpu serve --max-running-per-user {machine_cap})"
                )
            elif cap is not None and per_queue[record.queue] >= cap:
                q = record.queue
                reasons[record.id] = (
                    f"waits: {who} runs {_workloads(per_queue[q])} in queue {q}, the most queue "
                    f"{q} allows a user at once (max_running_per_user {cap}; fgpu queue set "
                    f"{q} --max-running-per-user N)"
                )
            else:
                total += 1
                per_queue[record.queue] += 1
    return reasons


def _workloads(count: int) -> str:
    return f"{count} workload" if count == 1 else f"{count} workloads"


def _queue_cap(queues: Mapping[str, QueueConfig], name: str) -> int | None:
    queue = queues.get(name)
    return None if queue is None else queue.max_running_per_user


__all__ = [
    "DEFAULT_MAX_RUNNING",
    "LimitReached",
    "SubmissionLimits",
    "running_gate",
    "size_text",
    "stored_bytes",
]
