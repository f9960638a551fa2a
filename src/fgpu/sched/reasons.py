"""Why a pending workload waits, naming the rule that holds it (issue "Everyday use",
point 2).

:meth:`fgpu.sched.decide.Scheduler.decide` first tries to place a workload, then to make
room by preemption (rule 4: lower-priority preemptible work of its own queue) and by reclaim
(rule 5: work of queues above their fair share, while its own queue stays within its fair
share). When all of that fails, the node-fit reason alone ("0/1 nodes fit: 1 insufficient
GPU") hides which rule holds it. :func:`wait_reason` names it, in this order:

1. a hold: the free capacity that would fit it is held for another workload (capacity
   freed by preemption, or a node reserved against starvation);
2. its queue's fair share: other queues hold GPUs, but it cannot reclaim from them, since
   placing it would take its queue past its fair share ("queue team-b is at its fair share,
   2.0 of 2.0 GPUs; ...", "is above its fair share", or "holds 0.5 of its fair share of 0.99
   GPUs and 0.5 more would take it past");
3. priority and reclaim together: the GPUs are in use, with no lower-priority preemptible
   work of its queue to preempt and (with other queues) no queue above its fair share to
   reclaim from;

and the node fit only when none of these holds: nothing runs (the nodes themselves cannot
take it), or there is work to stop but stopping it would not make room. The node-fit reason is kept
in parentheses as the detail.
"""

from __future__ import annotations

from collections.abc import Mapping

from fgpu.sched.workload import Hold, Workload

Vec = list[int]


def gpus(milli: int) -> str:
    """GPUs with as many decimals as the milli-GPU need, at least one: ``2.0`` for 2000,
    ``0.99`` for 990, ``0.125`` for 125 (so that two different amounts never print alike)."""
    text = f"{milli / 1000:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def limit_text(dim: str, after: int, limit: int) -> str:
    """``2.5 > 2.0 GPUs`` for a limit of one resource, in the units users type: ``dim`` is
    ``gpu`` (milli-GPU), ``cpu`` (milli-cores) or ``memory`` (MiB)."""
    if dim == "gpu":
        return f"{gpus(after)} > {gpus(limit)} GPUs"
    if dim == "cpu":
        return f"{gpus(after)} > {gpus(limit)} CPU cores"
    return f"{after} > {limit} MiB of memory"


def wait_reason(
    w: Workload,
    need_milli: int,
    fit: str,
    *,
    allocated: Mapping[str, Vec],
    fair: Mapping[str, Vec],
    lowest: Mapping[str, int],
    within_fair_share: bool = True,
    held_for: str | None = None,
    held_node: str | None = None,
) -> str:
    """The reason a workload that found no place and no victims waits.

    Args:
        w: the pending workload.
        need_milli: the GPU it asks for, milli-GPU.
        fit: the node-fit reason from the placer.
        allocated: queue -> what it holds now (GPU milli first), this round's changes
            included.
        fair: queue -> its fair share (GPU milli first).
        lowest: queue -> the lowest priority among its running work that may be stopped
            (preemptible, not stopping, past ``min_runtime_s``); queues with none are absent.
        within_fair_share: the reclaim rule (``SchedulerConfig.reclaim_within_fair_share``):
            True, a queue reclaims only while it stays within its fair share; False, while
            it holds less than its fair share.
        held_for: the workload that capacity fitting ``w`` is held for, if any.
        held_node: the node of that hold.

    Returns:
        One line: the rule, then the node fit in parentheses.
    """
    q = w.queue
    if held_for is not None:
        return (
            f"the free capacity that fits it on {held_node} is held for workload {held_for} "
            f"(a hold: freed by preemption, or reserved against starvation); {fit}"
        )
    if not any(held[0] > 0 for held in allocated.values()):
        return fit  # nothing runs: the nodes themselves cannot take it
    use = allocated.get(q, [0])[0]
    share = fair.get(q, [0])[0]
    over = use + need_milli > share if within_fair_share else use >= share
    others_hold = any(held[0] > 0 for vq, held in allocated.items() if vq != q)
    if need_milli > 0 and over and others_hold:  # reclaim is what it would need
        if use > share:
            state = f"is above its fair share, {gpus(use)} of {gpus(share)} GPUs"
        elif use == share:
            state = f"is at its fair share, {gpus(use)} of {gpus(share)} GPUs"
        else:
            state = (
                f"holds {gpus(use)} of its fair share of {gpus(share)} GPUs and "
                f"{gpus(need_milli)} more would take it past"
            )
        return (
            f"queue {q} {state}; it may not reclaim, so it waits for free capacity (its fair "
            f"share grows as other queues' demand falls) ({fit})"
        )
    if lowest.get(q, w.priority) < w.priority:
        return fit  # there is work to preempt, but stopping it would not make room
    others = [vq for vq in fair if vq != q]
    if any(vq in lowest and allocated.get(vq, [0])[0] > fair[vq][0] for vq in others):
        return fit  # there is work to reclaim, but stopping it would not make room
    rules = [f"no lower-priority preemptible work in queue {q} to preempt (priority {w.priority})"]
    if others:
        rules.append("no queue above its fair share to reclaim from")
    return f"waits for capacity: {'; '.join(rules)} ({fit})"


class WaitReasons:
    """:func:`wait_reason` for the workloads of one round that found no place, with the
    round's final allocations, remembered: thousands of pending workloads of a few shapes and
    queues wait for the same reason (``bench/decide.py``)."""

    def __init__(
        self,
        fair: Mapping[str, Vec],
        lowest: Mapping[str, int],
        allocated: Mapping[str, Vec],
        within_fair_share: bool = True,
    ) -> None:
        self.fair = fair
        self.lowest = lowest
        self.allocated = allocated
        self.within_fair_share = within_fair_share
        self._known: dict[tuple[object, ...], str] = {}

    def explain(self, w: Workload, need_milli: int, fit: str, hold: Hold | None) -> str:
        """Why ``w`` waits (``fit`` itself when the node fit is what blocks it)."""
        key = (w.queue, w.priority, need_milli, fit, hold)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = wait_reason(
                w,
                need_milli,
                fit,
                allocated=self.allocated,
                fair=self.fair,
                lowest=self.lowest,
                within_fair_share=self.within_fair_share,
                held_for=hold.workload if hold else None,
                held_node=hold.node if hold else None,
            )
        return known


__all__ = ["WaitReasons", "gpus", "limit_text", "wait_reason"]
