"""Order inside a queue: priority, then the user with less allocated, then submission time.

The rule (DESIGN.md section 5, "Ordering"; rule 2 of :mod:`fgpu.sched.decide`). Among the
pending workloads of one queue, the next one to try is chosen so:

1. **Band.** The highest band first. A band is ``(effective priority, suspended)``: higher
   effective priority first (base priority plus aging, :meth:`Scheduler.effective_priority`),
   and inside one priority suspended work before new work (rule 11: a suspended workload is
   restored before lower-ranked new work).
2. **User.** Inside the band, the user whose running work of *this queue* holds the least
   allocated GPU compute right now, in milli-GPU (:func:`user_allocation`; squeezed compute
   counts nowhere, as for the queue, :func:`fgpu.sched.accounting.counted_gpu_milli`). The
   figure moves during the round: every placement, restore or hold the round decides is
   charged to its user, every victim it frees is uncharged, so after alice's first job is
   placed bob's goes next, and a user with many jobs cannot fill the queue before the others
   get a turn (bob's one job no longer waits behind alice's six).
3. **Submission time**, then **id**: between users with equal allocation the one whose
   earliest waiting workload was submitted first; inside one user, that user's workloads in
   submission order.

A user is an opaque name (:attr:`fgpu.sched.workload.Workload.user`): the submitting Unix
user on one machine, the namespace on Kubernetes; the simulator's workloads carry the
trace's user column where it has one, else all share the empty user, and then the order is
exactly the previous priority-then-submission order.

Pure: no clock, no I/O. Cost: the per-user lists are built once per round (O(n log n)); a
:meth:`QueueOrder.pop` is O(log users) from a heap of the band's users, rebuilt (O(users))
only after an allocation changed (:class:`UserUse` counts the changes), so the many pops of
a round that places nothing cost no more than with one user.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence

from fgpu.sched.accounting import counted_gpu_milli
from fgpu.sched.workload import Workload

UserKey = tuple[str, str]
"""``(queue, user)``: whose allocation in which queue."""


class UserUse(dict[UserKey, int]):
    """``{(queue, user): milli-GPU}`` that counts its writes (:attr:`version`), so that a
    :class:`QueueOrder` knows when its heaps are stale."""

    version: int = 0

    def __setitem__(self, key: UserKey, value: int) -> None:
        super().__setitem__(key, value)
        self.version += 1


def user_allocation(
    workloads: Iterable[Workload], held: Iterable[tuple[Workload, int]] = ()
) -> UserUse:
    """GPU compute each user holds in each queue now, in milli-GPU.

    Counts running workloads that are not terminating (a victim on its way out no longer
    counts for its user, as it no longer counts for its queue); a squeezed workload counts
    0 (its compute is lent).

    Args:
        workloads: every pending and running workload of the round.
        held: ``(preemptor, milli-GPU)`` for capacity freed by preemption and held for a
            pending preemptor (rule 1 of :mod:`fgpu.sched.decide`): it counts for the
            preemptor's user, as it counts for the preemptor's queue.

    Returns:
        ``{(queue, user): milli}`` for every pair with running work (missing pairs hold 0),
        as a :class:`UserUse`.
    """
    used: dict[UserKey, int] = defaultdict(int)
    for w in workloads:
        a = w.allocation
        if a is None or w.terminating:
            continue
        used[(w.queue, w.user)] += counted_gpu_milli(a.gpu_milli, w.squeezed)
    for w, milli in held:
        used[(w.queue, w.user)] += milli
    return UserUse(used)


class QueueOrder:
    """The pending workloads of every queue of one round, handed out in the rule's order.

    Args:
        per_queue: ``{queue: pending workloads}`` (any order; the lists are not modified).
        band: a workload's band key; smaller goes first (the scheduler passes
            ``(-effective priority, not suspended)``).
        used: ``{(queue, user): milli-GPU}`` allocated now; read at every :meth:`pop`, so
            the caller keeps it current with :meth:`charge` (or by writing it directly). A
            :class:`UserUse` lets pops reuse a heap until it changes; any other mapping is
            read afresh at every pop.
    """

    def __init__(
        self,
        per_queue: Mapping[str, Sequence[Workload]],
        band: Callable[[Workload], tuple[int, bool]],
        used: MutableMapping[UserKey, int],
    ) -> None:
        self.used = used
        # per queue: bands in order, each {user: deque of workloads in submission order}
        self._bands: dict[str, list[dict[str, deque[Workload]]]] = {}
        for q, items in per_queue.items():
            grouped: dict[tuple[int, bool], dict[str, list[Workload]]] = defaultdict(
                lambda: defaultdict(list)
            )
            for w in items:
                grouped[band(w)][w.user].append(w)
            bands: list[dict[str, deque[Workload]]] = []
            for key in sorted(grouped):
                per_user = grouped[key]
                bands.append(
                    {
                        user: deque(sorted(ws, key=lambda w: (w.submitted_at, w.id)))
                        for user, ws in per_user.items()
                    }
                )
            self._bands[q] = bands
        # per queue: the heap of its first band's users and the UserUse version it reflects
        self._heaps: dict[str, tuple[int, list[tuple[int, float, str, str]]]] = {}

    def queues(self) -> list[str]:
        """The queues with pending work given at construction."""
        return list(self._bands)

    def has_next(self, queue: str) -> bool:
        """Whether ``queue`` still has a workload to hand out."""
        bands = self._bands.get(queue)
        return bool(bands)

    def pop(self, queue: str) -> Workload:
        """The next workload of ``queue`` by the rule (module docstring); removes it.

        Raises:
            IndexError: nothing is left in ``queue`` (check :meth:`has_next`).
        """
        bands = self._bands.get(queue)
        if not bands:
            raise IndexError(f"no pending workload left in queue {queue!r}")
        band = bands[0]
        used = self.used
        version = used.version if isinstance(used, UserUse) else -1
        cached = self._heaps.get(queue)
        if cached is None or cached[0] != version or version < 0:
            heap = [
                (used.get((queue, u), 0), ws[0].submitted_at, ws[0].id, u) for u, ws in band.items()
            ]
            heapq.heapify(heap)
        else:
            heap = cached[1]
        user = heapq.heappop(heap)[3]
        waiting = band[user]
        w = waiting.popleft()
        if waiting:
            nxt = waiting[0]
            heapq.heappush(heap, (used.get((queue, user), 0), nxt.submitted_at, nxt.id, user))
            self._heaps[queue] = (version, heap)
        else:
            del band[user]
            if band:
                self._heaps[queue] = (version, heap)
            else:
                bands.pop(0)
                self._heaps.pop(queue, None)
        return w

    def charge(self, workload: Workload, gpu_milli: int) -> None:
        """Add ``gpu_milli`` (negative to free) to ``workload``'s user in its queue."""
        key = (workload.queue, workload.user)
        self.used[key] = self.used.get(key, 0) + gpu_milli


__all__ = ["QueueOrder", "UserKey", "UserUse", "user_allocation"]
