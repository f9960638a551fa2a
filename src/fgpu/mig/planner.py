"""MIG planner: which instances to destroy and create, GPU by GPU, to serve a demand.

Input: the GPUs (:class:`~fgpu.mig.inventory.MigGpu`: model, MIG mode, current instances and
which are in use) and the demand (:class:`~fgpu.mig.demand.MigRequest`: profiles by name,
GPU fractions, memory sizes). Output: a :class:`MigPlan`, per GPU the instances to destroy
and to create with their starts, which request each instance serves, and an explanation.

**Rules.** An instance in use is never destroyed. A GPU whose MIG mode is off may be planned
with MIG on (``enable_mig``) unless a workload uses it whole. Every instance the plan creates
serves a request; an existing idle instance may serve a request that it fits, stay idle, or
be destroyed to make room.

**Objective**, in this order (each a tie-break of the ones before):

1. serve the most requested instances;
2. change the fewest GPUs (a GPU changes when it gets any destroy, create or MIG-mode change);
3. waste the fewest slices: a request served by a larger profile than its smallest fitting
   one wastes the extra compute plus memory slices (:mod:`fgpu.mig.demand`);
4. the fewest operations (destroys + creates + MIG enables);
5. leave unserved the requests that come later in the demand (earlier ones first);
6. keep the most future options: the sum over GPUs of the maximal layouts each can still
   reach (:func:`fgpu.mig.layout.future_options`, the placement rule of
   :func:`~fgpu.mig.layout.place_instance` applied to the whole plan);
7. the first of the rest in a fixed order (GPU index, layouts sorted): the result is
   deterministic.

**Method.** Per GPU, every final layout is enumerated (valid layouts that keep the in-use
instances, optionally keep each idle one, and add instances of profiles some request can
use), with each way of assigning its free instances to the requests; per served-count vector
the cheapest is kept. A dynamic programme over the GPUs, whose state is the demand still
unserved, then finds the optimum exactly. When that state space times the options exceeds
:data:`EXACT_BUDGET`, the plan is built greedily instead (each GPU in index order takes the
option serving the most of what is left, then the cheapest) and marked ``exact=False``.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict, deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TypeVar

from fgpu.mig.catalog import MigProfileTable
from fgpu.mig.demand import MigRequest, fitting_profiles
from fgpu.mig.inventory import MigGpu, MigInputError, MigInstanceState, check_inventory
from fgpu.mig.layout import Layout, Placement, extensions, future_options, layout_text

EXACT_BUDGET = 4_000_000
"""Most (demand states x GPU options) steps the exact programme may take before the planner
falls back to the greedy one."""

OBJECTIVE = (
    "most requests served, then fewest GPUs changed, then fewest wasted slices, then fewest "
    "operations, then earlier requests first, then most future layout options"
)


@dataclass(frozen=True, slots=True)
class Assignment:
    """One requested instance and the instance that serves it.

    Attributes:
        request: the request as written (``"1g.10gb"``, ``"0.25"``, ``"20GiB"``).
        gpu_index: the GPU.
        profile: the serving instance's profile.
        start: its first memory slice.
        new: the plan creates it (else it exists, idle, and is reused).
        uuid: the existing instance's uuid, when reused and known.
        waste: slices above the request's smallest fitting profile.
    """

    request: str
    gpu_index: int
    profile: str
    start: int
    new: bool
    uuid: str | None = None
    waste: int = 0


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What the plan does to one GPU.

    Attributes:
        index: the GPU index.
        model: catalog model name.
        mig_enabled: MIG mode is on now.
        enable_mig: MIG mode is off now and must be turned on first.
        before: its instances now.
        destroy: instances to destroy (all idle), before any create.
        create: instances to create, with explicit starts.
        assignments: the requests this GPU serves.
        explanation: sentences for people.
    """

    index: int
    model: str
    mig_enabled: bool
    enable_mig: bool
    before: tuple[MigInstanceState, ...]
    destroy: tuple[MigInstanceState, ...]
    create: tuple[Placement, ...]
    assignments: tuple[Assignment, ...]
    explanation: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.enable_mig or bool(self.destroy) or bool(self.create)

    @property
    def operations(self) -> int:
        return len(self.destroy) + len(self.create) + int(self.enable_mig)

    @property
    def mig_enabled_after(self) -> bool:
        return self.mig_enabled or self.enable_mig

    @property
    def after(self) -> Layout:
        """The layout once the plan is applied."""
        gone = {d.placement for d in self.destroy}
        kept = [b.placement for b in self.before if b.placement not in gone]
        return tuple(sorted([*kept, *self.create]))


@dataclass(frozen=True, slots=True)
class Unserved:
    """``count`` instances of ``request`` the plan cannot serve, and why."""

    request: str
    count: int
    reason: str


@dataclass(frozen=True, slots=True)
class MigPlan:
    """A plan for a set of GPUs (see the module docstring for the objective).

    Attributes:
        gpus: one :class:`GpuPlan` per GPU, by index (unchanged GPUs included).
        unserved: requests left out; empty when everything fits.
        requested: instances requested.
        served: instances served.
        changed_gpus: GPUs that change.
        wasted_slices: slices above the smallest fitting profiles.
        operations: destroys + creates + MIG enables.
        future_options: maximal layouts still reachable, summed over the GPUs.
        exact: the optimum was proven (False: the greedy fallback was used).
        explanation: a readable account, first line the summary.
    """

    gpus: tuple[GpuPlan, ...]
    unserved: tuple[Unserved, ...]
    requested: int
    served: int
    changed_gpus: int
    wasted_slices: int
    operations: int
    future_options: int
    exact: bool
    explanation: tuple[str, ...]

    @property
    def assignments(self) -> tuple[Assignment, ...]:
        return tuple(a for g in self.gpus for a in g.assignments)

    @property
    def objective(self) -> tuple[int, int, int, int]:
        """``(served, changed_gpus, wasted_slices, operations)``: what the planner optimises
        first, in order (more served is better, the rest lower is better)."""
        return (self.served, self.changed_gpus, self.wasted_slices, self.operations)


# --- per-GPU options ---------------------------------------------------------------------

Fits = tuple[tuple[tuple[str, int], ...], ...]
"""Per request class: (profile, waste) pairs that can serve it on one model."""


@dataclass(frozen=True, slots=True)
class _Option:
    supply: tuple[int, ...]
    cost: tuple[int, int, int, int]  # changed, waste, operations, -future options
    final: Layout
    destroyed: tuple[Placement, ...]
    created: tuple[Placement, ...]
    served: tuple[tuple[int, Placement, bool, int], ...]  # class, instance, new, waste

    def key(self) -> tuple[object, ...]:
        return (self.cost, self.final, self.served)


def _compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``parts`` non-negative integers, in a fixed order."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total, -1, -1):
        for rest in _compositions(total - first, parts - 1):
            yield (first, *rest)


_Served = tuple[tuple[int, Placement, bool, int], ...]


def _ways(
    new: list[Placement], old: list[Placement], pairs: list[tuple[int, int]], classes: int
) -> list[tuple[tuple[int, ...], int, _Served]]:
    """The ways to hand one profile's free instances to the classes that accept it: every
    new instance serves a class, each old (idle) one may. Items: (supply, waste, served)."""
    pool = [(p, True) for p in new] + [(p, False) for p in old]
    ways: list[tuple[tuple[int, ...], int, _Served]] = []
    for count in range(len(new), len(pool) + 1):
        for split in _compositions(count, len(pairs)):
            supply = [0] * classes
            waste = 0
            served: list[tuple[int, Placement, bool, int]] = []
            position = 0
            for (c, w), n in zip(pairs, split, strict=True):
                supply[c] += n
                waste += n * w
                served.extend(
                    (c, placement, is_new, w) for placement, is_new in pool[position : position + n]
                )
                position += n
            ways.append((tuple(supply), waste, tuple(served)))
    return ways


@lru_cache(maxsize=4096)
def _options(
    table: MigProfileTable,
    existing: Layout,
    in_use: frozenset[Placement],
    mig_enabled: bool,
    gpu_in_use: bool,
    fits: Fits,
    demand: tuple[int, ...],
    by_layout: bool = False,
) -> tuple[_Option, ...]:
    """Every useful outcome of one GPU, the cheapest per served-count vector (with
    ``by_layout``: per served-count vector and profile counts of the final layout)."""
    classes = len(fits)
    zero = tuple([0] * classes)
    if not mig_enabled and gpu_in_use:
        return (_Option(zero, (0, 0, 0, -future_options(table, ())), (), (), (), ()),)
    accept: dict[str, list[tuple[int, int]]] = {}
    for c, pairs in enumerate(fits):
        for name, waste in pairs:
            accept.setdefault(name, []).append((c, waste))
    fixed = tuple(sorted(p for p in existing if p in in_use))
    idle = tuple(sorted(p for p in existing if p not in in_use))
    candidates = set(idle)
    for name in accept:
        profile = table.get(name)
        candidates.update(Placement(s, profile.name) for s in profile.starts)
    room = {name: sum(demand[c] for c, _ in pairs) for name, pairs in accept.items()}
    best: dict[tuple[object, ...], _Option] = {}
    for final in extensions(table, fixed, candidates=sorted(candidates)):
        members = set(final)
        kept = [p for p in idle if p in members]
        destroyed = tuple(p for p in idle if p not in members)
        created = tuple(p for p in final if p not in in_use and p not in idle)
        new_by_profile = Counter(p.profile for p in created)
        if any(n > room.get(name, 0) for name, n in new_by_profile.items()):
            continue  # an instance created for nobody
        enable = not mig_enabled and bool(created)
        changed = bool(destroyed or created)
        ops = len(destroyed) + len(created) + int(enable)
        futures = future_options(table, final)
        per_profile = [
            _ways(
                [p for p in created if p.profile == name],
                [p for p in kept if p.profile == name],
                accept[name],
                classes,
            )
            for name in sorted(
                set(new_by_profile) | {p.profile for p in kept if p.profile in accept}
            )
        ]
        for combo in itertools.product(*per_profile):
            total = tuple(sum(parts) for parts in zip(zero, *(w[0] for w in combo), strict=True))
            if any(s > d for s, d in zip(total, demand, strict=True)):
                continue
            option = _Option(
                total,
                (int(changed), sum(w[1] for w in combo), ops, -futures),
                final,
                destroyed,
                created,
                tuple(sorted(item for w in combo for item in w[2])),
            )
            slot: tuple[object, ...] = (
                (total, tuple(sorted(Counter(p.profile for p in final).items())))
                if by_layout
                else (total,)
            )
            current = best.get(slot)
            if current is None or option.key() < current.key():
                best[slot] = option
    return tuple(sorted(best.values(), key=lambda o: (o.supply, o.key())))


# --- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Class:
    request: MigRequest
    count: int


def _classes(demand: Sequence[MigRequest]) -> list[_Class]:
    merged: dict[tuple[str, str], _Class] = {}
    for request in demand:
        found = merged.get(request.key)
        merged[request.key] = _Class(
            found.request if found else request, (found.count if found else 0) + request.count
        )
    return list(merged.values())


def check_demand(
    gpus: Sequence[MigGpu], demand: Sequence[MigRequest], field: str = "--demand"
) -> None:
    """Check that every request could fit some GPU of the inventory, were it empty.

    Raises:
        MigInputError: a profile name that no GPU model of the inventory has (the message
            lists each model's valid profiles), or a fraction or memory size larger than any
            profile of those models.
    """
    tables = {g.profiles().model: g.profiles() for g in gpus}
    for request in demand:
        if any(fitting_profiles(t, request) for t in tables.values()):
            continue
        valid = "; ".join(f"{m}: {', '.join(t.names())}" for m, t in sorted(tables.items()))
        if request.profile is not None:
            raise MigInputError(
                field,
                f"{request.profile!r} is not a MIG profile of "
                f"{' or '.join(sorted(tables))}; valid: {valid}",
            )
        largest = "; ".join(
            f"{m}: {t.profiles[-1].name} ({t.profiles[-1].memory_mib} MiB)"
            for m, t in sorted(tables.items())
        )
        raise MigInputError(
            field,
            f"{request.text!r} can never fit: it is larger than every MIG profile of the "
            f"inventory's GPUs (largest: {largest})",
        )


def plan(
    gpus: Sequence[MigGpu], demand: Sequence[MigRequest], *, budget: int = EXACT_BUDGET
) -> MigPlan:
    """Plan MIG instances on ``gpus`` for ``demand`` (objective in the module docstring).

    Args:
        gpus: the inventory; indexes unique.
        demand: requests; the same request may appear several times (counts add up).
        budget: see :data:`EXACT_BUDGET`.

    Returns:
        The plan; requests that do not fit are in ``unserved`` (not an error).

    Raises:
        MigInputError: no GPU, the inventory is not valid (:func:`check_inventory`), or a
            request can never fit (:func:`check_demand`).
    """
    if not gpus:
        raise MigInputError("gpus", "no MIG-capable GPU to plan for")
    check_inventory(gpus)
    check_demand(gpus, demand)
    ordered = sorted(gpus, key=lambda g: g.index)
    classes = _classes(demand)
    counts = tuple(c.count for c in classes)
    options = [_gpu_options(g, classes, counts) for g in ordered]
    reach = [
        sum(max((o.supply[c] for o in opts), default=0) for opts in options)
        for c in range(len(classes))
    ]
    clipped = tuple(min(n, r) for n, r in zip(counts, reach, strict=True))
    states = math.prod(n + 1 for n in clipped)
    work = states * sum(len(o) for o in options)
    exact = work <= budget
    chosen = _exact(options, clipped) if exact else _greedy(options, clipped)
    return _build(ordered, classes, chosen, exact)


def _gpu_options(
    gpu: MigGpu, classes: Sequence[_Class], counts: tuple[int, ...], by_layout: bool = False
) -> tuple[_Option, ...]:
    table = gpu.profiles()
    fits = tuple(fitting_profiles(table, c.request) for c in classes)
    existing = gpu.layout()
    in_use = frozenset(i.placement for i in gpu.instances if i.in_use)
    return _options(table, existing, in_use, gpu.mig_enabled, gpu.in_use, fits, counts, by_layout)


_Cost = tuple[int, int, int, int]
_Path = tuple[_Option, "_Path"] | None
_Step = tuple[_Cost, _Path]


def _add(a: _Cost, b: _Cost) -> _Cost:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def _exact(options: Sequence[tuple[_Option, ...]], demand: tuple[int, ...]) -> list[_Option]:
    """Dynamic programme over the GPUs; state: demand still unserved."""
    states: dict[tuple[int, ...], _Step] = {demand: ((0, 0, 0, 0), None)}
    for gpu_options in options:
        following: dict[tuple[int, ...], _Step] = {}
        for state, (cost, path) in states.items():
            for option in gpu_options:
                if any(s > r for s, r in zip(option.supply, state, strict=True)):
                    continue
                left = tuple(r - s for r, s in zip(state, option.supply, strict=True))
                total = _add(cost, option.cost)
                found = following.get(left)
                if found is None or total < found[0]:
                    following[left] = (total, (option, path))
        states = following

    def rank(item: tuple[tuple[int, ...], _Step]) -> tuple[object, ...]:
        left, (cost, _) = item
        return (sum(left), cost[:3], left, cost[3])

    path = min(states.items(), key=rank)[1][1]
    chosen: list[_Option] = []
    while path is not None:
        chosen.append(path[0])
        path = path[1]
    return chosen[::-1]


def _greedy(options: Sequence[tuple[_Option, ...]], demand: tuple[int, ...]) -> list[_Option]:
    """Each GPU in turn takes the option serving the most of what is left, then the
    cheapest."""
    left = demand
    chosen: list[_Option] = []
    for gpu_options in options:
        fitting = [
            o for o in gpu_options if all(s <= r for s, r in zip(o.supply, left, strict=True))
        ]
        best = min(fitting, key=lambda o: (-sum(o.supply), o.cost, o.supply))
        chosen.append(best)
        left = tuple(r - s for r, s in zip(left, best.supply, strict=True))
    return chosen


def _build(
    gpus: Sequence[MigGpu], classes: Sequence[_Class], chosen: Sequence[_Option], exact: bool
) -> MigPlan:
    served_per_class = [0] * len(classes)
    gpu_plans: list[GpuPlan] = []
    for gpu, option in zip(gpus, chosen, strict=True):
        by_placement = {i.placement: i for i in gpu.instances}
        assignments = tuple(
            Assignment(
                classes[c].request.text,
                gpu.index,
                placement.profile,
                placement.start,
                new,
                None if new else by_placement[placement].uuid,
                waste,
            )
            for c, placement, new, waste in option.served
        )
        for c, *_ in option.served:
            served_per_class[c] += 1
        gpu_plan = GpuPlan(
            gpu.index,
            gpu.profiles().model,
            gpu.mig_enabled,
            not gpu.mig_enabled and bool(option.created),
            gpu.instances,
            tuple(by_placement[p] for p in option.destroyed),
            option.created,
            assignments,
        )
        gpu_plans.append(replace(gpu_plan, explanation=_explain_gpu(gpu, gpu_plan)))
    unserved = tuple(
        Unserved(c.request.text, c.count - n, _why_unserved(gpus, c.request, n))
        for c, n in zip(classes, served_per_class, strict=True)
        if n < c.count
    )
    requested = sum(c.count for c in classes)
    served = sum(served_per_class)
    changed = sum(1 for g in gpu_plans if g.changed)
    waste = sum(a.waste for g in gpu_plans for a in g.assignments)
    ops = sum(g.operations for g in gpu_plans)
    futures = -sum(o.cost[3] for o in chosen)
    lines = [
        f"serves {served} of {requested} requested instances; changes {changed} of "
        f"{len(gpu_plans)} GPUs with {ops} operations; {waste} wasted slices"
        + ("" if exact else " (greedy plan: the input was too large to prove the optimum)"),
        f"objective: {OBJECTIVE}",
    ]
    for g in gpu_plans:
        lines.extend(g.explanation)
    for u in unserved:
        lines.append(f"not served: {u.count} x {u.request}: {u.reason}")
    return MigPlan(
        tuple(gpu_plans),
        unserved,
        requested,
        served,
        changed,
        waste,
        ops,
        futures,
        exact,
        tuple(lines),
    )


def _explain_gpu(gpu: MigGpu, plan: GpuPlan) -> tuple[str, ...]:
    head = f"GPU {plan.index} ({plan.model})"
    lines: list[str] = []
    if not plan.changed:
        if not gpu.mig_enabled:
            state = "MIG off" + (", in use as a whole GPU" if gpu.in_use else "")
        else:
            state = ", ".join(str(i) for i in plan.before) or "no instances"
        lines.append(f"{head}: unchanged ({state})")
    else:
        steps: list[str] = []
        if plan.enable_mig:
            steps.append("enable MIG mode")
        steps.extend(f"destroy idle {d.profile}@{d.start}" for d in plan.destroy)
        steps.extend(f"create {p}" for p in plan.create)
        lines.append(f"{head}: " + "; ".join(steps) + f" -> {layout_text(plan.after)}")
        kept_in_use = [str(b) for b in plan.before if b.in_use]
        if kept_in_use:
            lines.append(f"  keeps the instances in use: {', '.join(kept_in_use)}")
    for a in plan.assignments:
        how = "new" if a.new else "existing idle"
        extra = f", {a.waste} slices more than the smallest fitting profile" if a.waste else ""
        lines.append(f"  {a.request} -> {how} {a.profile}@{a.start}{extra}")
    return tuple(lines)


def _why_unserved(gpus: Sequence[MigGpu], request: MigRequest, served: int) -> str:
    able = [g for g in gpus if fitting_profiles(g.profiles(), request)]
    where = ", ".join(str(g.index) for g in able)
    one = len(able) == 1
    takers = []
    if any(i.in_use for g in able for i in g.instances) or any(
        g.in_use and not g.mig_enabled for g in able
    ):
        takers.append("work in use")
    takers.append(f"the {'other ' if served else ''}requests served")
    return (
        f"no room left: {'GPU' if one else 'GPUs'} {where} could hold it, but "
        f"{'its' if one else 'their'} memory slices go to {' and '.join(takers)}"
    )


Requester = TypeVar("Requester", bound=Hashable)


def hand_out(
    planned: MigPlan, demand: Sequence[tuple[Requester, MigRequest]]
) -> dict[Requester, Assignment]:
    """Give the plan's assignments to the requesters whose requests made the demand: the
    requesters of one request (same text) take its assignments in demand order, so the
    earlier ones are served first. Requesters left out are not served by the plan."""
    waiting: dict[str, deque[Requester]] = defaultdict(deque)
    for who, request in demand:
        waiting[request.text].append(who)
    served: dict[Requester, Assignment] = {}
    for a in planned.assignments:
        line = waiting.get(a.request)
        if line:
            served[line.popleft()] = a
    return served


def plan_layout(gpu: MigGpu, counts: dict[str, int], field: str = "mig-devices") -> GpuPlan:
    """A plan that leaves ``gpu`` with exactly ``counts`` instances per profile (what a
    mig-parted config asks), keeping the instances in use and as many idle ones as possible,
    then the most future options.

    Raises:
        MigInputError: an unknown profile or a negative count, or no valid layout holds
            exactly these instances beside the ones in use (the message says which).
    """
    table = gpu.profiles()
    wanted: dict[str, int] = {}
    for name, count in counts.items():
        profile = table.find(name)
        if profile is None:
            valid = ", ".join(table.names())
            raise MigInputError(
                field, f"{name!r} is not a MIG profile of {table.model}; valid: {valid}"
            )
        if count < 0:
            raise MigInputError(field, f"{name}: count must be >= 0, got {count}")
        if count:
            wanted[profile.name] = wanted.get(profile.name, 0) + count
    busy = Counter(i.profile for i in gpu.instances if i.in_use)
    for name, n in busy.items():
        if n > wanted.get(name, 0):
            held = ", ".join(str(i) for i in gpu.instances if i.in_use and i.profile == name)
            raise MigInputError(
                field,
                f"GPU {gpu.index}: asks for {wanted.get(name, 0)} x {name}, but {held} in use",
            )
    names = sorted(wanted)
    missing = {n: wanted[n] - busy.get(n, 0) for n in names if wanted[n] > busy.get(n, 0)}
    classes = [_Class(MigRequest(profile=n, count=c), c) for n, c in missing.items()]
    demand = tuple(missing.values())
    options = _gpu_options(gpu, classes, demand, by_layout=True)
    exact = [
        o
        for o in options
        if o.supply == demand and Counter(p.profile for p in o.final) == Counter(wanted)
    ]
    if not exact:
        asked = ", ".join(f"{wanted[n]} x {n}" for n in names) or "no instances"
        held = ", ".join(str(i) for i in gpu.instances if i.in_use)
        raise MigInputError(
            field,
            f"GPU {gpu.index} ({table.model}): no valid layout holds exactly {asked}"
            + (f" beside the instances in use ({held})" if held else ""),
        )
    best = min(exact, key=lambda o: (o.cost[2], o.cost[3], o.final))
    built = _build([gpu], classes, [best], True)
    return built.gpus[0]
