"""MIG layouts: which sets of GPU instances fit on one GPU, and where to put the next one.

A **layout** is a tuple of :class:`Placement` (profile name, start), sorted by start then
name. It is valid when (``../shared/mig-profiles.md``, NVIDIA MIG user guide):

1. every profile is one of the model's profiles;
2. every instance starts at one of its profile's allowed starts;
3. no two instances share a memory slice (an instance covers ``[start, start + size)``);
4. no profile appears more often than its ``max_count`` (this binds only for ``+me``
   profiles on the catalog's GPUs: one per GPU);
5. the compute slices add up to at most the GPU's (7; A30: 4). With the catalog's starts
   this never binds; it guards tables read from a device.

A layout is **maximal** when no instance of any of the considered profiles can be added.
Enumeration leaves the ``+me`` profiles out unless asked: a ``+me`` instance has the
geometry of its plain profile, so it only relabels a layout.

**Placement rule** (:func:`place_instance`): among the free allowed starts, choose the one
after which the GPU can still reach the most maximal layouts (:func:`future_options`); ties
go to the lowest start. On an empty A100 this puts a 1g at slice 6 (33 maximal layouts stay
reachable, against 22 at 4-5 and 21 at 0-3), a 3g at slice 4 (the 4g at 0 stays possible)
and a 2g at slice 4.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from fgpu.mig.catalog import MigProfile, MigProfileTable


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    """One GPU instance in a layout: ``profile`` starting at memory slice ``start``."""

    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"


Layout = tuple[Placement, ...]
"""Instances of one GPU, sorted (see :func:`make_layout`)."""


@dataclass(frozen=True, slots=True)
class LayoutStatus:
    """The answer of :func:`is_valid`: ``ok``, or the first ``reason`` it is not.

    Truthy when valid, so ``if is_valid(t, layout):`` reads naturally.
    """

    ok: bool
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True, slots=True)
class NoRoom:
    """:func:`place_instance` found no free allowed start; ``reason`` says why."""

    reason: str


def make_layout(items: Iterable[Placement | tuple[str, int]]) -> Layout:
    """A sorted layout from placements or ``(profile, start)`` pairs."""
    out = [p if isinstance(p, Placement) else Placement(p[1], p[0].strip().lower()) for p in items]
    return tuple(sorted(out))


def layout_text(layout: Sequence[Placement]) -> str:
    """``"4g.40gb@0 + 3g.40gb@4"``; ``"(empty)"`` for none."""
    return " + ".join(str(p) for p in layout) or "(empty)"


def _slices(start: int, size: int) -> str:
    last = start + size - 1
    return f"memory slice {start}" if size == 1 else f"memory slices {start}-{last}"


def is_valid(table: MigProfileTable, layout: Sequence[Placement]) -> LayoutStatus:
    """Check ``layout`` against ``table``'s geometry (rules 1-5 of the module docstring).

    Returns:
        ``LayoutStatus(True)``, or ``LayoutStatus(False, reason)`` with the first broken rule,
        naming the instances and slices, e.g. ``"4g.40gb@0 and 3g.40gb@0 overlap on memory
        slices 0-3"`` or ``"3g.40gb@2: start 2 is not allowed for 3g.40gb (allowed: 0, 4)"``.
    """
    owner: list[Placement | None] = [None] * table.memory_slices
    counts: Counter[str] = Counter()
    compute = 0
    for placement in sorted(layout):
        profile = table.find(placement.profile)
        if profile is None:
            return LayoutStatus(
                False,
                f"{placement}: {placement.profile!r} is not a MIG profile of {table.model}; "
                f"valid: {', '.join(table.names())}",
            )
        if placement.start not in profile.starts:
            allowed = ", ".join(str(s) for s in profile.starts)
            return LayoutStatus(
                False,
                f"{placement}: start {placement.start} is not allowed for {profile.name} "
                f"on {table.model} (allowed: {allowed})",
            )
        for s in range(placement.start, placement.start + profile.memory_slices):
            other = owner[s]
            if other is not None:
                other_size = table.get(other.profile).memory_slices
                low = max(other.start, placement.start)
                high = min(other.start + other_size, placement.start + profile.memory_slices)
                return LayoutStatus(
                    False, f"{other} and {placement} overlap on {_slices(low, high - low)}"
                )
            owner[s] = placement
        counts[profile.name] += 1
        compute += profile.compute_slices
    for name, count in counts.items():
        profile = table.get(name)
        if count > profile.max_count:
            return LayoutStatus(
                False,
                f"{count} x {name}: {table.model} holds at most {profile.max_count}",
            )
    if compute > table.compute_slices:
        return LayoutStatus(
            False,
            f"the instances use {compute} compute slices; {table.model} has {table.compute_slices}",
        )
    return LayoutStatus(True)


def used_memory_slices(table: MigProfileTable, layout: Sequence[Placement]) -> int:
    """Memory slices covered by the instances of a valid ``layout``."""
    return sum(table.get(p.profile).memory_slices for p in layout)


# --- enumeration -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Candidate:
    placement: Placement
    mask: int
    compute: int
    profile: str
    max_count: int


def _candidate(table: MigProfileTable, profile: MigProfile, start: int) -> _Candidate:
    mask = ((1 << profile.memory_slices) - 1) << start
    return _Candidate(
        Placement(start, profile.name),
        mask,
        profile.compute_slices,
        profile.name,
        profile.max_count,
    )


def _state(table: MigProfileTable, layout: Sequence[Placement]) -> tuple[int, int, Counter[str]]:
    mask = 0
    compute = 0
    counts: Counter[str] = Counter()
    for p in layout:
        profile = table.get(p.profile)
        mask |= ((1 << profile.memory_slices) - 1) << p.start
        compute += profile.compute_slices
        counts[profile.name] += 1
    return mask, compute, counts


def _profiles(
    table: MigProfileTable, profiles: Iterable[str] | None, media: bool
) -> list[MigProfile]:
    if profiles is None:
        return [p for p in table.profiles if media or not p.media]
    wanted = {name.strip().lower() for name in profiles}
    return [p for p in table.profiles if p.name in wanted]


def _fits(c: _Candidate, mask: int, compute: int, counts: Counter[str], total: int) -> bool:
    return not (c.mask & mask) and compute + c.compute <= total and counts[c.profile] < c.max_count


def extensions(
    table: MigProfileTable,
    base: Sequence[Placement] = (),
    *,
    profiles: Iterable[str] | None = None,
    media: bool = False,
    candidates: Sequence[Placement] | None = None,
) -> Iterator[Layout]:
    """Every valid layout that contains ``base`` and adds instances of ``profiles``.

    Args:
        table: the GPU model's profiles.
        base: a valid layout that every result contains (e.g. the instances in use).
        profiles: names allowed for added instances; None means every profile (``+me``
            ones only with ``media=True``).
        media: with ``profiles=None``, include the ``+me`` profiles.
        candidates: instead of ``profiles``, exactly these placements may be added (each at
            most once); used by the planner to offer the existing idle instances.

    Yields:
        Sorted layouts, ``base`` itself included, in a deterministic order.

    Raises:
        ValueError: ``base`` is not valid (the message is :func:`is_valid`'s reason).
    """
    status = is_valid(table, base)
    if not status:
        raise ValueError(f"layout: {status.reason}")
    mask, compute, counts = _state(table, base)
    if candidates is not None:
        pool = [_candidate(table, table.get(c.profile), c.start) for c in sorted(set(candidates))]
    else:
        pool = [
            _candidate(table, profile, start)
            for profile in _profiles(table, profiles, media)
            for start in profile.starts
        ]
        pool.sort(key=lambda c: c.placement)
    pool = [c for c in pool if c.placement not in base]
    chosen: list[Placement] = list(base)
    total = table.compute_slices

    def walk(i: int, mask: int, compute: int) -> Iterator[Layout]:
        if i == len(pool):
            yield tuple(sorted(chosen))
            return
        c = pool[i]
        if _fits(c, mask, compute, counts, total):
            chosen.append(c.placement)
            counts[c.profile] += 1
            yield from walk(i + 1, mask | c.mask, compute + c.compute)
            counts[c.profile] -= 1
            chosen.pop()
        yield from walk(i + 1, mask, compute)

    yield from walk(0, mask, compute)


def is_maximal(
    table: MigProfileTable,
    layout: Sequence[Placement],
    *,
    profiles: Iterable[str] | None = None,
    media: bool = False,
) -> bool:
    """True when no instance of ``profiles`` (default: all but ``+me``) can be added to the
    valid ``layout``."""
    mask, compute, counts = _state(table, layout)
    for profile in _profiles(table, profiles, media):
        for start in profile.starts:
            if _fits(
                _candidate(table, profile, start), mask, compute, counts, table.compute_slices
            ):
                return False
    return True


@lru_cache(maxsize=64)
def maximal_layouts(table: MigProfileTable, *, media: bool = False) -> tuple[Layout, ...]:
    """Every maximal valid layout of the model, sorted.

    ``media=False`` (default) uses the profiles without ``+me``; ``media=True`` adds them,
    and a layout is then maximal when nothing at all can be added.

    On the catalog: 78 layouts on A100 / H100 / H200 (one 7g, or 11 fills of memory slices
    0-3 times 7 fills of 4-7) and 5 on A30 (a 4g, or 2 x 2 fills of the halves).
    """
    return tuple(
        sorted(
            layout
            for layout in extensions(table, media=media)
            if layout and is_maximal(table, layout, media=media)
        )
    )


@lru_cache(maxsize=8192)
def future_options(table: MigProfileTable, layout: Layout) -> int:
    """How many maximal layouts (profiles without ``+me``) the GPU can still reach from the
    valid ``layout`` by adding instances; 1 when ``layout`` is itself maximal.

    ``layout`` must be sorted (a :data:`Layout`); it may hold ``+me`` instances.
    """
    return sum(1 for grown in extensions(table, layout) if is_maximal(table, grown))


def place_instance(
    table: MigProfileTable, layout: Sequence[Placement], profile: str
) -> Placement | NoRoom:
    """Where to create one more ``profile`` instance on a GPU holding ``layout``.

    The rule (module docstring): the free allowed start that keeps the most maximal layouts
    reachable (:func:`future_options`), the lowest such start on ties.

    Returns:
        The :class:`Placement`, or :class:`NoRoom` with the reason (every allowed start
        overlaps, or the profile's count is used up).

    Raises:
        UnknownMigProfileError: ``profile`` is not one of the model's profiles.
        ValueError: ``layout`` is not valid.
    """
    chosen = table.get(profile)
    base = make_layout(layout)
    status = is_valid(table, base)
    if not status:
        raise ValueError(f"layout: {status.reason}")
    held = sum(1 for p in base if p.profile == chosen.name)
    if held >= chosen.max_count:
        return NoRoom(f"{held + 1} x {chosen.name}: {table.model} holds at most {chosen.max_count}")
    best: tuple[int, int] | None = None
    for start in chosen.starts:
        grown = make_layout([*base, Placement(start, chosen.name)])
        if not is_valid(table, grown):
            continue
        score = future_options(table, grown)
        if best is None or score > best[0]:
            best = (score, start)
    if best is None:
        return NoRoom(
            f"no room for {chosen.name} on {table.model} beside {layout_text(base)}: "
            f"every allowed start ({', '.join(str(s) for s in chosen.starts)}) is taken"
        )
    return Placement(best[1], chosen.name)


def fill_layout(
    table: MigProfileTable, layout: Sequence[Placement], profiles: Sequence[str]
) -> Layout:
    """``layout`` with as many more instances of ``profiles`` as fit, taken in that order
    (each as many times as it fits, where :func:`place_instance` puts it), so that the rest
    of a GPU being reconfigured for some instances is made into free instances of the
    profiles in demand rather than left as slices no instance covers.

    Raises:
        UnknownMigProfileError: a profile the model does not have.
        ValueError: ``layout`` is not valid.
    """
    out = make_layout(layout)
    for profile in profiles:
        while True:
            spot = place_instance(table, out, profile)
            if isinstance(spot, NoRoom):
                break
            out = make_layout([*out, spot])
    return out
