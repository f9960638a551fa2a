"""MIG catalog and layouts: validity per model, maximal layouts against a hand enumeration,
and the placement rule."""

from __future__ import annotations

import itertools

import pytest

from fgpu.mig.catalog import (
    MIG_MODELS,
    NotMigCapableError,
    UnknownMigProfileError,
    check_catalog,
    mig_profiles,
)
from fgpu.mig.layout import (
    NoRoom,
    Placement,
    extensions,
    future_options,
    is_maximal,
    is_valid,
    layout_text,
    make_layout,
    maximal_layouts,
    place_instance,
    used_memory_slices,
)
from fgpu.model.catalog import GPU_CATALOG

# Profile names per 8-slice model: 1g, 1g with double memory, 2g, 3g, 4g, 7g.
EIGHT = {
    "A100-40GB": ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H200-141GB": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}


def L(*items: str) -> tuple[Placement, ...]:
    """``L("4g.40gb@0", "3g.40gb@4")``."""
    pairs = []
    for item in items:
        name, start = item.split("@")
        pairs.append((name, int(start)))
    return make_layout(pairs)


def test_catalog_is_consistent_with_the_gpu_catalog() -> None:
    check_catalog()
    assert set(MIG_MODELS) == {m.name for m in GPU_CATALOG.values() if m.mig_capable}


@pytest.mark.parametrize("model", sorted(EIGHT))
def test_eight_slice_models_share_ids_and_starts(model: str) -> None:
    one, double, two, three, four, seven = EIGHT[model]
    table = mig_profiles(model)
    assert (table.compute_slices, table.memory_slices) == (7, 8)
    expected = {
        one: (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        one + "+me": (20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        double: (15, 1, 2, 4, (0, 2, 4, 6)),
        two: (14, 2, 2, 3, (0, 2, 4)),
        three: (9, 3, 4, 2, (0, 4)),
        four: (5, 4, 4, 1, (0,)),
        seven: (0, 7, 8, 1, (0,)),
    }
    got = {
        p.name: (p.profile_id, p.compute_slices, p.memory_slices, p.max_count, p.starts)
        for p in table.profiles
    }
    assert got == expected


def test_a30_has_its_own_geometry() -> None:
    table = mig_profiles("A30")
    assert (table.compute_slices, table.memory_slices) == (4, 4)
    got = {p.name: (p.profile_id, p.memory_slices, p.max_count, p.starts) for p in table.profiles}
    assert got == {
        "1g.6gb": (14, 1, 4, (0, 1, 2, 3)),
        "1g.6gb+me": (21, 1, 1, (0, 1, 2, 3)),
        "2g.12gb": (5, 2, 2, (0, 2)),
        "2g.12gb+me": (6, 2, 1, (0, 2)),
        "4g.24gb": (0, 4, 1, (0,)),
    }


def test_figures_from_published_listings() -> None:
    h100 = mig_profiles("H100")  # alias
    assert h100.get("1g.20gb").sm_count == 26
    assert h100.get("1g.10gb").memory_mib == 9984  # 9.75 GiB
    assert mig_profiles("A100-80GB").get("7g.80gb").memory_mib == 80896  # 79 GiB
    assert mig_profiles("A30").get("1g.6gb").memory_mib == 5952  # 5.81 GiB, as NVML says
    assert mig_profiles("A100-40GB").get("1g.10gb").memory_mib == 9856  # 9.62 GiB


def test_unknown_profile_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownMigProfileError) as caught:
        mig_profiles("A100-80GB").get("1g.5gb")
    message = str(caught.value)
    assert message.startswith("profile: '1g.5gb' is not a MIG profile of A100-80GB")
    assert "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in message


def test_model_without_mig_is_refused() -> None:
    with pytest.raises(NotMigCapableError, match=r"gpu_model: T4 has no MIG profiles.*A30"):
        mig_profiles("T4")


# --- validity ------------------------------------------------------------------------------

VALID: list[tuple[str, tuple[str, ...]]] = [
    ("A30", ("1g.6gb@0", "1g.6gb@1", "1g.6gb@2", "1g.6gb@3")),
    ("A30", ("2g.12gb@0", "2g.12gb@2")),
    ("A30", ("2g.12gb@0", "1g.6gb@2", "1g.6gb+me@3")),
    ("A30", ("4g.24gb@0",)),
]
INVALID: list[tuple[str, tuple[str, ...], str]] = [
    ("A30", ("4g.24gb@0", "1g.6gb@3"), "4g.24gb@0 and 1g.6gb@3 overlap on memory slice 3"),
    ("A30", ("2g.12gb@1",), "start 1 is not allowed for 2g.12gb on A30 (allowed: 0, 2)"),
    ("A30", ("1g.6gb+me@0", "1g.6gb+me@1"), "2 x 1g.6gb+me: A30 holds at most 1"),
    ("A30", ("1g.10gb@0",), "'1g.10gb' is not a MIG profile of A30"),
]
for _model, (one, double, two, three, four, seven) in EIGHT.items():
    VALID += [
        (_model, (f"{four}@0", f"{three}@4")),
        (_model, (f"{three}@0", f"{three}@4")),
        (_model, tuple(f"{one}@{s}" for s in range(7))),
        (_model, tuple(f"{double}@{s}" for s in (0, 2, 4, 6))),
        (_model, (f"{two}@0", f"{two}@2", f"{two}@4", f"{one}@6")),
        (_model, (f"{four}@0", f"{two}@4", f"{one}+me@6")),
        (_model, (f"{seven}@0",)),
    ]
    INVALID += [
        (
            _model,
            (f"{three}@0", f"{four}@0"),
            f"{three}@0 and {four}@0 overlap on memory slices 0-3",
        ),
        (_model, (f"{four}@4",), f"start 4 is not allowed for {four} on {_model} (allowed: 0)"),
        (_model, (f"{three}@0", f"{three}@4", f"{one}@2"), "overlap on memory slice 2"),
        (_model, (f"{one}@7",), f"start 7 is not allowed for {one}"),
        (_model, (f"{one}+me@0", f"{one}+me@1"), f"2 x {one}+me: {_model} holds at most 1"),
        (_model, (f"{seven}@0", f"{double}@6"), "overlap on memory slices 6-7"),
    ]


@pytest.mark.parametrize(("model", "items"), VALID, ids=[f"{m}:{'+'.join(i)}" for m, i in VALID])
def test_valid_layouts(model: str, items: tuple[str, ...]) -> None:
    status = is_valid(mig_profiles(model), L(*items))
    assert status.ok, status.reason
    assert bool(status)


@pytest.mark.parametrize(
    ("model", "items", "reason"), INVALID, ids=[f"{m}:{'+'.join(i)}" for m, i, _ in INVALID]
)
def test_invalid_layouts_say_why(model: str, items: tuple[str, ...], reason: str) -> None:
    status = is_valid(mig_profiles(model), L(*items))
    assert not status
    assert status.reason is not None
    assert reason in status.reason


@pytest.mark.parametrize("model", sorted(EIGHT))
def test_seven_1g_leave_one_memory_slice_free(model: str) -> None:
    table = mig_profiles(model)
    layout = L(*(f"{EIGHT[model][0]}@{s}" for s in range(7)))
    assert is_valid(table, layout)
    assert used_memory_slices(table, layout) == 7
    assert is_maximal(table, layout)


@pytest.mark.parametrize("model", sorted(EIGHT))
def test_two_3g_fill_the_gpu(model: str) -> None:
    table = mig_profiles(model)
    three = EIGHT[model][3]
    layout = L(f"{three}@0", f"{three}@4")
    assert used_memory_slices(table, layout) == 8
    assert is_maximal(table, layout, media=True)
    for profile in table.profiles:
        assert isinstance(place_instance(table, layout, profile.name), NoRoom)


def test_compute_slices_guard_tables_read_from_devices() -> None:
    from dataclasses import replace

    table = mig_profiles("A100-80GB")
    loose = replace(
        table,
        profiles=tuple(
            replace(p, starts=(0, 2, 4, 6)) if p.name == "2g.20gb" else p for p in table.profiles
        ),
    )
    status = is_valid(loose, L("2g.20gb@0", "2g.20gb@2", "2g.20gb@4", "2g.20gb@6"))
    assert status.reason == "4 x 2g.20gb: A100-80GB holds at most 3"
    looser = replace(
        loose,
        profiles=tuple(
            replace(p, max_count=4) if p.name == "2g.20gb" else p for p in loose.profiles
        ),
    )
    status = is_valid(looser, L("2g.20gb@0", "2g.20gb@2", "2g.20gb@4", "2g.20gb@6"))
    assert status.reason == "the instances use 8 compute slices; A100-80GB has 7"


# --- maximal layouts: a hand enumeration ---------------------------------------------------
#
# On the 8-slice models no instance but the 7g crosses from memory slices 0-3 to 4-7 (every
# start and size keeps an instance in one half). So a maximal layout is either the 7g alone,
# or a maximal fill of slices 0-3 next to a maximal fill of slices 4-7 (neither half may be
# empty: a 4g fits an empty 0-3, a 3g an empty 4-7). Maximal fills, by reasoning:
#   slices 0-3: the 4g, the 3g, or slices 0-1 and 2-3 each as one 2g, one double-memory 1g,
#     or two 1g (1g at 0 and 1, at 2 and 3): 2 + 3 x 3 = 11 fills;
#   slices 4-7: the 3g, or slices 4-5 as a 2g, a double 1g or two 1g, times slices 6-7 as a
#     double 1g or one 1g at 6 (no profile starts at 7): 1 + 3 x 2 = 7 fills.
# Total: 1 + 11 x 7 = 78. A30 (4 slices): the 4g, or slices 0-1 and 2-3 each as a 2g or two
# 1g: 1 + 2 x 2 = 5.


def _hand_enumeration(model: str) -> set[tuple[Placement, ...]]:
    one, double, two, three, four, seven = EIGHT[model]
    pair_01 = [[f"{two}@0"], [f"{double}@0"], [f"{one}@0", f"{one}@1"]]
    pair_23 = [[f"{two}@2"], [f"{double}@2"], [f"{one}@2", f"{one}@3"]]
    low = [[f"{four}@0"], [f"{three}@0"]] + [a + b for a, b in itertools.product(pair_01, pair_23)]
    pair_45 = [[f"{two}@4"], [f"{double}@4"], [f"{one}@4", f"{one}@5"]]
    pair_67 = [[f"{double}@6"], [f"{one}@6"]]
    high = [[f"{three}@4"]] + [a + b for a, b in itertools.product(pair_45, pair_67)]
    assert (len(low), len(high)) == (11, 7)
    layouts = {L(f"{seven}@0")}
    layouts |= {L(*a, *b) for a, b in itertools.product(low, high)}
    return layouts


@pytest.mark.parametrize("model", sorted(EIGHT))
def test_maximal_layouts_match_the_hand_enumeration(model: str) -> None:
    got = maximal_layouts(mig_profiles(model))
    expected = _hand_enumeration(model)
    assert len(expected) == 78
    assert set(got) == expected
    assert len(got) == 78


def test_a30_maximal_layouts_match_the_hand_enumeration() -> None:
    expected = {
        L("4g.24gb@0"),
        L("2g.12gb@0", "2g.12gb@2"),
        L("2g.12gb@0", "1g.6gb@2", "1g.6gb@3"),
        L("1g.6gb@0", "1g.6gb@1", "2g.12gb@2"),
        L("1g.6gb@0", "1g.6gb@1", "1g.6gb@2", "1g.6gb@3"),
    }
    assert set(maximal_layouts(mig_profiles("A30"))) == expected


@pytest.mark.parametrize("model", MIG_MODELS)
def test_media_layouts_hold_at_most_one_media_instance(model: str) -> None:
    table = mig_profiles(model)
    with_media = maximal_layouts(table, media=True)
    assert len(with_media) > len(maximal_layouts(table))
    for layout in with_media:
        assert is_valid(table, layout)
        media = [p for p in layout if p.profile.endswith("+me")]
        # the A30 allows one 1g+me and one 2g+me
        assert len({p.profile for p in media}) == len(media)


def test_every_valid_layout_is_enumerated_once() -> None:
    table = mig_profiles("A100-80GB")
    every = list(extensions(table))
    assert len(every) == len(set(every)) == 723  # 38 fills of 0-3 x 19 of 4-7, plus the 7g
    assert all(is_valid(table, layout) for layout in every)


# --- placement rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "layout", "profile", "start"),
    [
        ("A100-80GB", (), "1g.10gb", 6),
        ("A100-80GB", (), "1g.20gb", 6),
        ("A100-80GB", (), "2g.20gb", 4),
        ("A100-80GB", (), "3g.40gb", 4),
        ("A100-80GB", (), "4g.40gb", 0),
        ("A100-80GB", (), "7g.80gb", 0),
        ("A100-80GB", ("3g.40gb@4",), "3g.40gb", 0),
        ("A100-80GB", ("1g.10gb@6",), "1g.10gb", 4),
        ("A100-80GB", ("4g.40gb@0",), "2g.20gb", 4),
        ("A30", (), "1g.6gb", 0),
        ("A30", (), "2g.12gb", 0),
    ],
)
def test_place_instance_keeps_options_open(
    model: str, layout: tuple[str, ...], profile: str, start: int
) -> None:
    table = mig_profiles(model)
    base = L(*layout)
    chosen = place_instance(table, base, profile)
    assert chosen == Placement(start, profile)
    best = future_options(table, make_layout([*base, chosen]))
    for other in table.get(profile).starts:
        grown = make_layout([*base, Placement(other, profile)])
        if is_valid(table, grown):
            score = future_options(table, grown)
            assert score < best or (score == best and other >= start)


def test_future_options_of_empty_and_full() -> None:
    table = mig_profiles("A100-80GB")
    assert future_options(table, ()) == 78
    assert future_options(table, L("7g.80gb@0")) == 1
    assert future_options(table, L("1g.10gb@6")) == 33  # 11 fills of 0-3 x 3 of 4-7


def test_no_room_says_why() -> None:
    table = mig_profiles("A100-80GB")
    full = place_instance(table, L("7g.80gb@0"), "1g.10gb")
    assert isinstance(full, NoRoom)
    assert "every allowed start (0, 1, 2, 3, 4, 5, 6) is taken" in full.reason
    counted = place_instance(table, L("1g.10gb+me@6"), "1g.10gb+me")
    assert isinstance(counted, NoRoom)
    assert counted.reason == "2 x 1g.10gb+me: A100-80GB holds at most 1"


def test_layout_text() -> None:
    assert layout_text(L("3g.40gb@4", "4g.40gb@0")) == "4g.40gb@0 + 3g.40gb@4"
    assert layout_text(()) == "(empty)"


def test_fill_layout_makes_the_free_slices_into_the_profiles_asked_for() -> None:
    from fgpu.mig.catalog import mig_profiles
    from fgpu.mig.layout import fill_layout, is_valid, make_layout

    a100 = mig_profiles("A100-80GB")
    full = fill_layout(a100, (), ["1g.10gb"])
    assert [p.profile for p in full] == ["1g.10gb"] * 7
    beside = fill_layout(a100, make_layout([("3g.40gb", 4)]), ["2g.20gb", "1g.10gb"])
    assert is_valid(a100, beside)
    assert sorted(str(p) for p in beside) == ["2g.20gb@0", "2g.20gb@2", "3g.40gb@4"]
    # a profile that does not fit leaves the layout as it was
    assert fill_layout(a100, full, ["7g.80gb"]) == full
