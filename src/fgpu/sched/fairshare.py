"""Fair share of a queue tree (DESIGN.md section 5).

For each resource dimension separately (milli-GPU, milli-cores, MiB), and for each set of
sibling queues with the capacity of their parent (the cluster for top-level queues):

1. every queue gets ``min(quota, demand)``, its guarantee;
2. the rest is divided among queues that still want more, highest queue priority first;
   inside one priority, in proportion to ``over_quota_weight`` (water-filling: a queue that
   wants less than its proportional part gets what it wants and the remainder is divided
   again among the others);
3. queues with weight 0 get surplus only after every weighted queue is satisfied, in equal
   parts;
4. a parent's fair share is the capacity its children divide.

Demand = allocated + pending, capped by the queue's limit; a parent's demand is the sum of
its children's, capped by its own limit.

**Quotas above capacity.** When the guarantees in demand (step 1) add up to more than the
capacity, each guarantee is scaled down in proportion to the queue's quota (integer parts,
remainders to the largest fractions, ties by name), nothing is left for surplus, and a
warning is reported. A sum of configured quotas above capacity is reported as a warning
even while demand is low.

All amounts are integers and the shares of siblings never add up to more than their
parent's capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from fgpu.sched.workload import RESOURCES, QueueTree, Resources


@dataclass(frozen=True, slots=True)
class FairShare:
    """Result of :func:`fair_share`.

    Attributes:
        share: queue name -> fair share (every queue, parents included).
        demand: queue name -> demand used (capped by limits).
        warnings: configuration warnings (quotas above capacity), for people.
    """

    share: dict[str, Resources]
    demand: dict[str, Resources]
    warnings: list[str]


def _largest_remainder(
    total: int, weights: Mapping[str, float], caps: Mapping[str, int]
) -> dict[str, int]:
    """Split ``total`` units in proportion to ``weights`` without exceeding ``caps``.

    Water-filling: queues whose proportional part exceeds what they want get what they want
    and leave the rest to the others. Integer parts first, then one unit each by largest
    fractional part (ties by name).
    """
    give = dict.fromkeys(weights, 0)
    active = {q for q, w in weights.items() if w > 0 and caps[q] > 0}
    remaining = total
    while remaining > 0 and active:
        weight_sum = sum(weights[q] for q in active)
        ideal = {q: remaining * weights[q] / weight_sum for q in active}
        satisfied = [q for q in active if caps[q] - give[q] <= ideal[q]]
        if satisfied:
            for q in sorted(satisfied):
                amount = caps[q] - give[q]
                give[q] += amount
                remaining -= amount
                active.discard(q)
            continue
        floors = {q: math.floor(ideal[q]) for q in active}
        for q, amount in floors.items():
            give[q] += amount
        leftover = remaining - sum(floors.values())
        order = sorted(active, key=lambda q: (-(ideal[q] - floors[q]), q))
        for q in order[:leftover]:
            give[q] += 1
        remaining = 0
    return give


def _divide(
    capacity: int,
    names: list[str],
    quota: Mapping[str, int],
    demand: Mapping[str, int],
    weight: Mapping[str, float],
    priority: Mapping[str, int],
) -> tuple[dict[str, int], bool]:
    """One dimension, one sibling set. Returns (shares, guarantees_exceeded_capacity)."""
    guaranteed = {q: min(quota[q], demand[q]) for q in names}
    total = sum(guaranteed.values())
    if total > capacity:
        scaled = _largest_remainder(capacity, {q: float(quota[q]) for q in names}, guaranteed)
        return scaled, True
    share = dict(guaranteed)
    remaining = capacity - total
    for level in sorted({priority[q] for q in names}, reverse=True):
        if remaining <= 0:
            break
        group = [q for q in names if priority[q] == level]
        want = {q: demand[q] - share[q] for q in group}
        extra = _largest_remainder(remaining, {q: weight[q] for q in group}, want)
        for q, amount in extra.items():
            share[q] += amount
            remaining -= amount
    if remaining > 0:
        zero = [q for q in names if weight[q] == 0 and demand[q] > share[q]]
        extra = _largest_remainder(
            remaining, dict.fromkeys(zero, 1.0), {q: demand[q] - share[q] for q in zero}
        )
        for q, amount in extra.items():
            share[q] += amount
    return share, False


def config_warnings(queues: QueueTree, capacity: Resources) -> list[str]:
    """Warnings about the queue configuration alone (no demand needed): top-level quotas
    that add up to more than ``capacity``, and child quotas that add up to more than their
    parent's quota. Neither is an error: guarantees are then scaled in proportion to quota
    when demand exceeds what there is.

    Returns:
        One sentence per finding, top level first, then parents by name.
    """
    specs = queues.specs
    warnings: list[str] = []
    top = queues.children.get(None, [])

    def amount(dim: str, value: int) -> str:
        if dim == "gpu_milli":
            return f"{value / 1000:g} GPU{'' if value == 1000 else 's'}"
        return f"{value} {'milli-CPU' if dim == 'cpu_milli' else 'MiB of memory'}"

    for i, dim in enumerate(RESOURCES):
        total = sum(specs[q].quota.as_tuple()[i] for q in top)
        if total > capacity.as_tuple()[i]:
            warnings.append(
                f"quotas add up to {amount(dim, total)}, above the capacity of "
                f"{amount(dim, capacity.as_tuple()[i])}; guarantees are scaled down in "
                "proportion to quota when demand exceeds capacity"
            )
    for parent in sorted(q for q in queues.children if q is not None):
        kids = queues.children[parent]
        for i, dim in enumerate(RESOURCES):
            total = sum(specs[k].quota.as_tuple()[i] for k in kids)
            own = specs[parent].quota.as_tuple()[i]
            if kids and total > own:
                warnings.append(
                    f"the quotas under {parent} add up to {amount(dim, total)}, above its own "
                    f"quota of {amount(dim, own)}; the children's guarantees are scaled down "
                    "to fit it"
                )
    return warnings


def fair_share(
    queues: QueueTree,
    capacity: Resources,
    allocated: Mapping[str, Resources],
    pending: Mapping[str, Resources],
) -> FairShare:
    """Fair share of every queue.

    Args:
        queues: the tree.
        capacity: the cluster's total resources.
        allocated: leaf queue -> resources its running work holds (missing: none).
        pending: leaf queue -> resources its pending work asks for (missing: none).

    Returns:
        Shares and demands for every queue, and configuration warnings.
    """
    specs = queues.specs
    names = list(specs)
    dims = len(RESOURCES)
    demand_vec: dict[str, list[int]] = {}

    def leaf_demand(q: str) -> list[int]:
        a = allocated.get(q, Resources()).as_tuple()
        p = pending.get(q, Resources()).as_tuple()
        return [a[i] + p[i] for i in range(dims)]

    def compute_demand(q: str) -> list[int]:
        kids = queues.children.get(q, [])
        raw = (
            [sum(compute_demand(k)[i] for k in kids) for i in range(dims)]
            if kids
            else leaf_demand(q)
        )
        limit = specs[q].limit
        if limit is not None:
            raw = [min(raw[i], limit.as_tuple()[i]) for i in range(dims)]
        demand_vec[q] = raw
        return raw

    for top in queues.children.get(None, []):
        compute_demand(top)

    warnings = config_warnings(queues, capacity)

    share_vec: dict[str, list[int]] = {q: [0] * dims for q in names}

    def assign(parent: str | None, cap: list[int]) -> None:
        kids = queues.children.get(parent, [])
        if not kids:
            return
        for i, dim in enumerate(RESOURCES):
            shares, exceeded = _divide(
                cap[i],
                kids,
                {k: specs[k].quota.as_tuple()[i] for k in kids},
                {k: demand_vec[k][i] for k in kids},
                {k: specs[k].over_quota_weight for k in kids},
                {k: specs[k].priority for k in kids},
            )
            if exceeded:
                where = f"under {parent}" if parent else "at the top level"
                warnings.append(
                    f"{dim}: guarantees in demand {where} exceed the capacity of {cap[i]}; "
                    "scaled in proportion to quota"
                )
            for k in kids:
                share_vec[k][i] = shares[k]
        for k in kids:
            assign(k, share_vec[k])

    assign(None, list(capacity.as_tuple()))
    return FairShare(
        share={q: Resources(*share_vec[q]) for q in names},
        demand={q: Resources(*demand_vec.get(q, [0, 0, 0])) for q in names},
        warnings=warnings,
    )
