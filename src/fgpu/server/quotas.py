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

Over a limit the submission gets HTTP 429 (field ``workloads`` for the count, ``command``
for the bytes), the reason naming the limit, where it is set (the queue or the machine's
flag), its value and the user's figure. One submission's own command and environment are
at most ``--max-submission-bytes`` (422, field ``command``).

The figures come from the store's ``(owner_uid, queue, phase, stored_bytes)`` index
(:meth:`fgpu.store.usage.UsageStore.owner_usage`): a scan of the owner's index entries, no
workload row is read, and other users' work costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fgpu.rules.errors import BadRequest, ServiceError
from fgpu.store.records import QueueConfig
from fgpu.store.usage import OwnerUsage
from fgpu.store.validate import MIN_STORED_BYTES
from fgpu.store.validate import stored_bytes as stored_bytes

DEFAULT_MAX_ACTIVE = 10_000
"""Active workloads per user (the service benchmark queues 10,000 as one user)."""
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
    """

    max_active: int = DEFAULT_MAX_ACTIVE
    max_submission_bytes: int = DEFAULT_MAX_SUBMISSION_BYTES
    max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES

    def check(self) -> None:
        """Raises ValueError naming the flag and echoing the value when out of range."""
        if self.max_active < 1:
            raise ValueError(f"--max-active-per-user: {self.max_active} must be at least 1")
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


__all__ = ["LimitReached", "SubmissionLimits", "size_text", "stored_bytes"]
