"""Work that waits (rules 6, 10 and 11 of :mod:`fgpu.sched.decide`): the wait before
evicting, the restore of suspended work on its node and GPUs, and reservations against
starvation with the reasons of work that stays pending."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.sched.config import SchedulerConfig
from fgpu.sched.placer import Placer
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import Hold, QueueTree, Restore, Wait, Workload


def preempt_delay_note(
    config: SchedulerConfig, queues: QueueTree, w: Workload, now: float
) -> str | None:
    """Rule 10: what the reason of preemptor ``w`` ends with while it must wait before it
    looks for victims (its queue's ``preempt_delay_s``, else the scheduler's, since it was
    submitted; none for priorities from ``preempt_wait_below``), or None when it may now."""
    if w.priority >= config.preempt_wait_below:
        return None
    chosen = queues[w.queue].preempt_delay_s
    delay = config.preempt_delay_s if chosen is None else chosen
    waited = now - w.submitted_at
    if delay <= 0 or waited >= delay:
        return None
    return (
        f"; waiting for capacity to free before it looks for work to preempt (waited "
        f"{max(waited, 0.0):.0f} s of {delay:.0f} s; looks in "
        f"{delay - max(waited, 0.0):.0f} s)"
    )


def restore(
    work: ClusterState, placer: Placer, w: Workload, reserved: np.ndarray
) -> Restore | Wait:
    """Rule 11: restore suspended ``w`` on the node it is suspended on when it fits there
    now (not on a node reserved or held for other work), on the GPUs it was checkpointed
    from unless the node's driver restores onto other GPUs; else keep it waiting."""
    name = w.suspended_on
    assert name is not None
    where = f"suspended on {name} (host {w.suspended_host_mib} MiB)"
    if name not in work.node_index:
        return Wait(w.id, f"{where}; that node is gone, so it cannot be restored")
    if w.nodes is not None and name not in w.nodes:
        return Wait(w.id, f"{where}; its node constraints no longer allow that node")
    node = work.node_index[name]
    own = w.suspended_gpus
    if own and not work.nodes[node].restore_other_gpus:
        listed = ", ".join(str(g) for g in own)
        if reserved[node]:
            return Wait(
                w.id,
                f"{where}; restores when that node has room on GPUs {listed}, the ones it "
                "was checkpointed from (the node is reserved for other work now)",
            )
        try:
            allocation = work.allocate(w.request, node, own)
        except InvalidRequestError as exc:
            return Wait(
                w.id,
                f"{where}; restores when that node has room on GPUs {listed}, the ones it "
                f"was checkpointed from ({exc.reason})",
            )
        placer.policy.on_allocate(work, allocation)
        return Restore(w.id, allocation, f"restored on {name}, GPUs {listed}: they have room again")
    result = placer.place(
        w.request,
        explain=True,
        exclude=reserved if reserved.any() else None,
        allowed=work.node_mask(frozenset((name,))),
    )
    if isinstance(result, Allocation):
        return Restore(w.id, result, f"restored on {name}: its GPUs have room again")
    return Wait(w.id, f"{where}; restores when that node has room ({result.reason})")


def reservation_node(
    work: ClusterState,
    request: Request,
    reserved: np.ndarray,
    allowed: np.ndarray | None = None,
) -> int | None:
    """The node to reserve: could hold ``request`` when empty, most free GPU first; only
    among ``allowed`` nodes when given."""
    need = work.gpu_need(request)
    big_enough = (
        (work.cpu_capacity >= request.cpu_milli)
        & (work.memory_capacity >= request.memory_mib)
        & (
            (
                (work.gpu_milli_capacity >= need.milli) & (work.gpu_memory_capacity >= need.memory)
            ).sum(axis=1)
            >= request.gpu_count
        )
        & ~reserved
    )
    if request.gpu_models:
        big_enough &= work.model_mask(request.gpu_models)
    if allowed is not None:
        big_enough &= allowed
    candidates = np.flatnonzero(big_enough)
    if candidates.size == 0:
        return None
    free = work.gpu_free_total[candidates]
    return int(candidates[np.argmax(free)])


def holder(
    work: ClusterState,
    request: Request,
    exclude: np.ndarray | None,
    holds: Mapping[str, Hold],
) -> Hold | None:
    """The reservation that keeps ``request`` off free capacity that would fit it (a node
    left out of this placement), or None."""
    if exclude is None:
        return None
    ok, _ = work.feasible(request)
    for i in np.flatnonzero(ok & exclude):
        name = work.node_names[int(i)]
        for hold in holds.values():
            if hold.node == name:
                return hold
    return None


def reserve_or_wait(
    config: SchedulerConfig,
    work: ClusterState,
    w: Workload,
    fit: str,
    reserved: np.ndarray,
    allowed: np.ndarray | None,
    exclude: np.ndarray | None,
    holds: dict[str, Hold],
    could_fit: dict[tuple[Request, frozenset[str] | None], bool],
    now: float,
) -> tuple[Wait, bool, Hold | None]:
    """``w`` found no place and no victims (``fit``: why no node fits): rule 6 reserves a
    node for it (``reserved`` and ``holds`` updated) when it is large and has waited long
    enough; else it waits.

    Returns:
        Its :class:`Wait`; whether the rule that holds it is to be named once the round is
        decided (:class:`fgpu.sched.reasons.WaitReasons`: not when no allowed node could take
        it even empty, so that the node fit is the reason, nor for a reservation); and the
        reservation that keeps it off free capacity, if any.
    """
    own = w.id in holds and holds[w.id].is_reservation
    if (
        config.reservation_after_s is not None
        and w.request.gpu_count >= config.reservation_min_gpus
        and now - w.submitted_at >= config.reservation_after_s
        and w.id not in holds
    ):
        spot = reservation_node(work, w.request, reserved, allowed)
        if spot is not None:
            reserved[spot] = True
            holds[w.id] = Hold(w.id, work.node_names[spot], (), (), now)
            why = f"reserved node {work.node_names[spot]}; waiting for it to drain ({fit})"
            return Wait(w.id, why), False, None
    if own:
        return Wait(w.id, f"reserved node {holds[w.id].node}; waiting for it to drain"), False, None
    ever_key = (w.request, w.nodes)
    ever = could_fit.get(ever_key)
    if ever is None:
        none_reserved = np.zeros_like(reserved)
        spot = reservation_node(work, w.request, none_reserved, allowed)
        ever = could_fit[ever_key] = spot is not None
    keeper = holder(work, w.request, exclude, holds) if ever else None
    return Wait(w.id, fit), ever, keeper


__all__ = ["holder", "preempt_delay_note", "reservation_node", "reserve_or_wait", "restore"]
