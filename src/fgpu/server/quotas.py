"""Per-user limits on what one submission may store and on how much active work one user may
have (issue 27: one user's 5,000 submissions slowed every listing; 60 commands of 0.9 MB
made the database 55 MB).

- **active workloads:** a user with :attr:`SubmissionLimits.max_active` active (pending,
  running, paused) workloads gets HTTP 429 (field ``workloads``) for one more, naming the
  limit and the count; admins too (the limit is the machine's, ``--max-active-per-user``).
- **stored bytes:** the command and the environment of one submission, as stored (UTF-8 JSON),
  at most :attr:`SubmissionLimits.max_submission_bytes`; more gets 422 (field ``command``),
  naming the limit and echoing the size (``--max-submission-bytes``).

The count comes from the store's ``(owner_uid, phase, name)`` index
(:meth:`fgpu.store.store.Store.active_holders`, in the same read as the name check): a scan
of the owner's index entries, no workload row is read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fgpu.rules.errors import BadRequest, ServiceError

DEFAULT_MAX_ACTIVE = 10_000
"""Active workloads per user (the service benchmark queues 10,000 as one user)."""
DEFAULT_MAX_SUBMISSION_BYTES = 256 * 1024
"""Bytes of command and environment one submission may store (the CLI sends the caller's
environment, commonly a few KiB)."""


class LimitReached(ServiceError):
    """A per-user limit is reached (429)."""

    status = 429


@dataclass(frozen=True, slots=True)
class SubmissionLimits:
    """The machine's per-user submission limits (flags of ``fgpu serve``).

    Attributes:
        max_active: active workloads per user.
        max_submission_bytes: bytes of command and environment per submission, as stored.
    """

    max_active: int = DEFAULT_MAX_ACTIVE
    max_submission_bytes: int = DEFAULT_MAX_SUBMISSION_BYTES

    def check(self) -> None:
        """Raises ValueError naming the flag and echoing the value when out of range."""
        if self.max_active < 1:
            raise ValueError(f"--max-active-per-user: {self.max_active} must be at least 1")
        if self.max_submission_bytes < 1024:
            raise ValueError(
                f"--max-submission-bytes: {self.max_submission_bytes} must be at least 1024"
            )

    def check_active(self, active: int, adding: int = 1) -> None:
        """Refuse ``adding`` more workloads (an array's tasks each count) of a user who has
        ``active`` active ones.

        Raises:
            LimitReached: field ``workloads``, naming the limit and the count.
        """
        if active + adding <= self.max_active:
            return
        if adding == 1:
            raise LimitReached(
                "workloads",
                f"you have {active} active workloads, the limit per user "
                f"(--max-active-per-user {self.max_active}); wait for some to finish or "
                "cancel some",
            )
        raise LimitReached(
            "workloads",
            f"this array has {adding} tasks and you have {active} active workloads: more "
            f"than the limit per user (--max-active-per-user {self.max_active}), each task "
            "counting as one; submit fewer tasks, or wait for some to finish or cancel some",
        )

    def check_size(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """Refuse a submission whose command and environment store more than the limit.

        Raises:
            BadRequest: field ``command``, echoing the size and naming the limit.
        """
        size = stored_bytes(argv, env)
        if size > self.max_submission_bytes:
            raise BadRequest(
                "command",
                f"command and env take {size} bytes as stored, over the limit of "
                f"{self.max_submission_bytes} bytes per submission (--max-submission-bytes)",
            )


def stored_bytes(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Bytes the command and the environment take in the store (compact UTF-8 JSON)."""
    dump = json.dumps([list(argv), dict(env)], ensure_ascii=False, separators=(",", ":"))
    return len(dump.encode("utf-8", errors="surrogatepass"))


__all__ = ["LimitReached", "SubmissionLimits", "stored_bytes"]
