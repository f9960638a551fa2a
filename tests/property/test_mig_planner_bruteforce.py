"""The MIG planner against brute force: on inputs small enough to enumerate, the planner's
plan must be as good as the best of every combination of final layouts.

The brute force here shares no code with the planner's search: it enumerates each GPU's
final layouts with its own overlap check, takes every combination across the GPUs, assigns
free instances to requests one by one, and ranks by the planner's documented objective
(served, GPUs changed, wasted slices, operations, earlier requests first, future options).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fgpu.mig.catalog import MIG_MODELS, MigProfileTable, mig_profiles
from fgpu.mig.demand import MigRequest, fitting_profiles
from fgpu.mig.inventory import MigGpu, MigInstanceState
from fgpu.mig.layout import extensions, future_options, is_valid, make_layout
from fgpu.mig.planner import MigPlan, plan

Spot = tuple[str, int]  # (profile, start)


def _mask(table: MigProfileTable, spot: Spot) -> int:
    size = table.get(spot[0]).memory_slices
    return ((1 << size) - 1) << spot[1]


def _layouts(
    table: MigProfileTable,
    fixed: Sequence[Spot],
    optional: Sequence[Spot],
    caps: dict[str, int],
    fresh: frozenset[Spot],
) -> Iterator[tuple[Spot, ...]]:
    """Every set ``fixed + some of optional`` without overlap, over-count or too much compute,
    holding at most ``caps[profile]`` of the ``fresh`` (new) placements per profile."""
    base_mask = 0
    for spot in fixed:
        base_mask |= _mask(table, spot)

    def ok(chosen: list[Spot]) -> bool:
        counts = Counter(name for name, _ in chosen)
        compute = sum(table.get(name).compute_slices for name, _ in chosen)
        return compute <= table.compute_slices and all(
            n <= table.get(name).max_count for name, n in counts.items()
        )

    def walk(
        i: int, mask: int, chosen: list[Spot], new: Counter[str]
    ) -> Iterator[tuple[Spot, ...]]:
        if i == len(optional):
            if ok(chosen):
                yield tuple(chosen)
            return
        spot = optional[i]
        m = _mask(table, spot)
        is_new = spot in fresh
        if not m & mask and (not is_new or new[spot[0]] < caps.get(spot[0], 0)):
            grown = new + Counter([spot[0]]) if is_new else new
            yield from walk(i + 1, mask | m, [*chosen, spot], grown)
        yield from walk(i + 1, mask, chosen, new)

    yield from walk(0, base_mask, list(fixed), Counter())


def brute_force(gpus: Sequence[MigGpu], demand: Sequence[MigRequest]) -> tuple[object, ...]:
    """The best objective key over every combination of final layouts."""
    keys: list[tuple[str, str]] = []
    counts: dict[tuple[str, str], int] = {}
    first: dict[tuple[str, str], MigRequest] = {}
    for r in demand:
        if r.key not in counts:
            keys.append(r.key)
            first[r.key] = r
        counts[r.key] = counts.get(r.key, 0) + r.count
    need = tuple(counts[k] for k in keys)
    tables = [g.profiles() for g in gpus]
    fits_per_gpu = [[dict(fitting_profiles(t, first[k])) for k in keys] for t in tables]
    fits_key = tuple(tuple(tuple(sorted(f.items())) for f in fits) for fits in fits_per_gpu)
    best: list[tuple[object, ...]] = []

    @cache
    def outcomes(position: int, cap_items: tuple[tuple[str, int], ...]) -> list[tuple[object, ...]]:
        return list(_outcomes(position, dict(cap_items)))

    def _outcomes(position: int, caps: dict[str, int]) -> Iterator[tuple[object, ...]]:
        gpu, table = gpus[position], tables[position]
        if not gpu.mig_enabled and gpu.in_use:
            yield ((), (), 0, 0, future_options(table, ()))
            return
        usable = sorted({name for f in fits_per_gpu[position] for name in f})
        in_use = [(i.profile, i.start) for i in gpu.instances if i.in_use]
        idle = [(i.profile, i.start) for i in gpu.instances if not i.in_use]
        fresh = [
            (name, s)
            for name in usable
            for s in table.get(name).starts
            if (name, s) not in idle and (name, s) not in in_use
        ]
        for final in _layouts(table, in_use, idle + fresh, caps, frozenset(fresh)):
            kept = tuple(s for s in final if s in idle)
            new = tuple(s for s in final if s not in idle and s not in in_use)
            destroyed = len(idle) - len(kept)
            enable = int(not gpu.mig_enabled and bool(new))
            changed = int(bool(new) or destroyed > 0)
            ops = destroyed + len(new) + enable
            layout = make_layout(final)
            yield (kept, new, changed, ops, future_options(table, layout))

    def caps_for(position: int, used: Counter[str]) -> tuple[tuple[str, int], ...]:
        # a new instance of a profile serves one request of a class that accepts it
        caps: dict[str, int] = {}
        for c, fits in enumerate(fits_per_gpu[position]):
            for name in fits:
                caps[name] = caps.get(name, 0) + need[c]
        return tuple(sorted((name, max(0, cap - used[name])) for name, cap in caps.items()))

    def walk(position: int, chosen: list[tuple[object, ...]], used: Counter[str]) -> None:
        if position == len(gpus):
            evaluate(chosen)
            return
        for outcome in outcomes(position, caps_for(position, used)):
            new = outcome[1]
            assert isinstance(new, tuple)
            if sum(used.values()) + len(new) > sum(need):
                continue
            walk(position + 1, [*chosen, outcome], used + Counter(n for n, _ in new))

    def evaluate(combo: list[tuple[object, ...]]) -> None:
        free: list[tuple[int, str, bool]] = []  # gpu position, profile, new
        for position, (kept, new, *_rest) in enumerate(combo):
            assert isinstance(kept, tuple)
            assert isinstance(new, tuple)
            free += [(position, name, True) for name, _ in new]
            free += [(position, name, False) for name, _ in kept]
        assigned = _assign(tuple(free), need, fits_key)
        if assigned is None:
            return
        served, waste, left = assigned
        changed = sum(int(o[2]) for o in combo)  # type: ignore[call-overload]
        ops = sum(int(o[3]) for o in combo)  # type: ignore[call-overload]
        futures = sum(int(o[4]) for o in combo)  # type: ignore[call-overload]
        key = (-served, changed, waste, ops, left, -futures)
        if not best or key < best[0]:
            best[:] = [key]

    walk(0, [], Counter())
    assert best
    return best[0]


@cache
def _assign(
    free: tuple[tuple[int, str, bool], ...],
    need: tuple[int, ...],
    fits: tuple[tuple[tuple[tuple[str, int], ...], ...], ...],
) -> tuple[int, int, tuple[int, ...]] | None:
    """Best (served, waste, left) assigning the free instances one by one: each new one must
    serve a request, each idle one may."""
    if not free:
        return (0, 0, need)
    (position, name, new), rest = free[0], free[1:]
    results = []
    if not new:
        results.append(_assign(rest, need, fits))
    for c, pairs in enumerate(fits[position]):
        waste = dict(pairs).get(name)
        if waste is None or need[c] == 0:
            continue
        left = (*need[:c], need[c] - 1, *need[c + 1 :])
        sub = _assign(rest, left, fits)
        if sub is not None:
            results.append((sub[0] + 1, sub[1] + waste, sub[2]))
    results = [r for r in results if r is not None]
    if not results:
        return None
    return min(results, key=lambda r: (-r[0], r[1], r[2]))


def planner_key(result: MigPlan, demand: Sequence[MigRequest]) -> tuple[object, ...]:
    order: list[str] = []
    for r in demand:
        if r.text not in order:
            order.append(r.text)
    unserved = {u.request: u.count for u in result.unserved}
    left = tuple(unserved.get(text, 0) for text in order)
    return (
        -result.served,
        result.changed_gpus,
        result.wasted_slices,
        result.operations,
        left,
        -result.future_options,
    )


def check_plan(gpus: Sequence[MigGpu], demand: Sequence[MigRequest], result: MigPlan) -> None:
    """Plan sanity, whatever the optimum: valid layouts, in-use kept, counts add up."""
    assert [g.index for g in result.gpus] == sorted(g.index for g in gpus)
    by_index = {g.index: g for g in gpus}
    for gpu_plan in result.gpus:
        gpu = by_index[gpu_plan.index]
        table = gpu.profiles()
        assert is_valid(table, gpu_plan.after)
        assert all(not d.in_use for d in gpu_plan.destroy)
        in_use = {i.placement for i in gpu.instances if i.in_use}
        assert in_use <= set(gpu_plan.after)
        for a in gpu_plan.assignments:
            assert (a.profile, a.start) in {(p.profile, p.start) for p in gpu_plan.after}
        assert len({(a.profile, a.start) for a in gpu_plan.assignments}) == len(
            gpu_plan.assignments
        )
        created = {(p.profile, p.start) for p in gpu_plan.create}
        assert created == {(a.profile, a.start) for a in gpu_plan.assignments if a.new}
    total = sum(r.count for r in demand)
    assert result.served + sum(u.count for u in result.unserved) == total


def _profile_demands(table: MigProfileTable, most: int) -> Iterator[list[MigRequest]]:
    names = table.names(media=False)
    for size in range(1, most + 1):
        for combo in itertools.combinations_with_replacement(names, size):
            yield [MigRequest(profile=n, count=c) for n, c in Counter(combo).items()]


@pytest.mark.parametrize(
    ("model", "count"), [("A30", 1), ("A100-80GB", 1), ("A30", 2)], ids=["A30x1", "A100x1", "A30x2"]
)
def test_every_profile_demand_up_to_seven_on_empty_gpus(model: str, count: int) -> None:
    table = mig_profiles(model)
    gpus = [MigGpu(i, model) for i in range(count)]
    checked = 0
    for demand in _profile_demands(table, 7):
        result = plan(gpus, demand)
        check_plan(gpus, demand, result)
        assert planner_key(result, demand) == brute_force(gpus, demand), demand
        checked += 1
    assert checked == (119 if model == "A30" else 1715)


@st.composite
def situations(draw: st.DrawFn, model: str) -> tuple[list[MigGpu], list[MigRequest]]:
    table = mig_profiles(model)
    every = _valid_layouts(table)
    gpus = []
    for index in range(draw(st.integers(1, 2))):
        mode = draw(st.sampled_from(["empty", "layout", "layout", "off", "off-busy"]))
        if mode.startswith("off"):
            gpus.append(MigGpu(index, model, mig_enabled=False, in_use=mode == "off-busy"))
            continue
        layout = every[draw(st.integers(0, len(every) - 1))] if mode == "layout" else ()
        instances = tuple(
            MigInstanceState(
                p.profile, p.start, in_use=draw(st.booleans()), uuid=f"MIG-{index}-{p}"
            )
            for p in layout
        )
        gpus.append(MigGpu(index, model, instances=instances))
    names = table.names()
    if len(gpus) == 2:  # two GPUs: profile requests (the brute force grows fast with fractions)
        profiles = st.builds(lambda n: MigRequest(profile=n), st.sampled_from(names))
        return gpus, draw(st.lists(profiles, min_size=1, max_size=7))
    item = st.one_of(
        st.builds(lambda n: MigRequest(profile=n), st.sampled_from(names)),
        st.builds(
            lambda m: MigRequest(compute_milli=m), st.sampled_from([100, 250, 300, 500, 1000])
        ),
        st.builds(lambda m: MigRequest(memory_mib=m), st.sampled_from([5120, 10240, 19456, 40960])),
    )
    demand = draw(st.lists(item, min_size=1, max_size=7))
    return gpus, demand


@cache
def _valid_layouts(table: MigProfileTable) -> list[tuple]:
    return list(extensions(table, media=True))


@pytest.mark.parametrize("model", MIG_MODELS)
def test_planner_matches_brute_force_on_one_and_two_gpus(model: str) -> None:
    @settings(
        max_examples=100,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(situations(model))
    def check(case: tuple[list[MigGpu], list[MigRequest]]) -> None:
        gpus, demand = case
        fitting = [r for r in demand if any(fitting_profiles(g.profiles(), r) for g in gpus)]
        if not fitting:
            return
        result = plan(gpus, fitting)
        check_plan(gpus, fitting, result)
        assert planner_key(result, fitting) == brute_force(gpus, fitting)

    check()
