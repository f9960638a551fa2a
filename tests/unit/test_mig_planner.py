"""MIG planner: the rules and the objective order, as scenarios; demand and inventory input."""

from __future__ import annotations

import pytest

from fgpu.mig.catalog import mig_profiles
from fgpu.mig.demand import MigRequest, fitting_profiles, parse_demand, smallest_fitting
from fgpu.mig.inventory import (
    MigGpu,
    MigInputError,
    MigInstanceState,
    inventory_from_data,
    inventory_to_data,
    parse_gpu_spec,
)
from fgpu.mig.layout import Placement
from fgpu.mig.planner import plan, plan_layout


def gpu(index: int, *instances: str, model: str = "A100-80GB", **kw: bool) -> MigGpu:
    """``gpu(0, "3g.40gb@0!", "1g.10gb@6")``: ``!`` marks an instance in use."""
    states = []
    for item in instances:
        busy = item.endswith("!")
        name, start = item.rstrip("!").split("@")
        states.append(MigInstanceState(name, int(start), busy, f"MIG-{index}-{name}-{start}"))
    return MigGpu(index, model, instances=tuple(states), **kw)


def P(text: str) -> Placement:
    name, start = text.split("@")
    return Placement(int(start), name)


# --- demand --------------------------------------------------------------------------------


def test_parse_demand_reads_profiles_fractions_and_memory() -> None:
    got = parse_demand(" 3x1g.10gb, 2X3G.40GB ,0.25,2x20GiB,1g.10gb+me,1")
    assert got == [
        MigRequest(profile="1g.10gb", count=3),
        MigRequest(profile="3g.40gb", count=2),
        MigRequest(compute_milli=250),
        MigRequest(memory_mib=20480, count=2),
        MigRequest(profile="1g.10gb+me"),
        MigRequest(compute_milli=1000),
    ]
    assert [r.text for r in got] == ["1g.10gb", "3g.40gb", "0.25", "20GiB", "1g.10gb+me", "1"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--demand: empty"),
        ("1g.10gb,,2g.20gb", "--demand: empty part"),
        ("0x1g.10gb", "--demand: count must be positive in '0x1g.10gb'"),
        ("1.5", "--demand: '1.5': a GPU fraction must be in (0, 1]"),
        ("20PB", "--demand: '20PB': unknown unit 'PB'"),
    ],
)
def test_parse_demand_errors_name_the_field(spec: str, message: str) -> None:
    with pytest.raises(MigInputError) as caught:
        parse_demand(spec)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("model", "request_", "smallest"),
    [
        ("A100-80GB", MigRequest(compute_milli=100), "1g.10gb"),
        ("A100-80GB", MigRequest(compute_milli=140), "1g.20gb"),  # 1/8 memory is too little
        ("A100-80GB", MigRequest(compute_milli=250), "2g.20gb"),
        ("A100-80GB", MigRequest(compute_milli=500), "4g.40gb"),
        ("A100-80GB", MigRequest(compute_milli=1000), "7g.80gb"),
        ("A100-80GB", MigRequest(memory_mib=19 * 1024), "1g.20gb"),
        ("A100-80GB", MigRequest(memory_mib=20 * 1024), "3g.40gb"),  # 1g.20gb has 19.5 GiB
        ("A100-40GB", MigRequest(memory_mib=20 * 1024), "7g.40gb"),
        ("A30", MigRequest(compute_milli=500), "2g.12gb"),
        ("A30", MigRequest(memory_mib=30 * 1024), None),
        ("A100-80GB", MigRequest(profile="1g.5gb"), None),
    ],
)
def test_smallest_fitting_profile(model: str, request_: MigRequest, smallest: str | None) -> None:
    assert smallest_fitting(mig_profiles(model), request_) == smallest


def test_larger_fitting_profiles_count_their_waste() -> None:
    fits = dict(fitting_profiles(mig_profiles("A100-80GB"), MigRequest(compute_milli=100)))
    assert fits["1g.10gb"] == 0
    assert fits["1g.20gb"] == 1
    assert fits["2g.20gb"] == 2
    assert fits["7g.80gb"] == 13
    assert "1g.10gb+me" not in fits


# --- inventory -----------------------------------------------------------------------------


def test_gpu_spec() -> None:
    gpus = parse_gpu_spec("2xA100-80GB, h100")
    assert [(g.index, g.model, g.mig_enabled, g.instances) for g in gpus] == [
        (0, "A100-80GB", True, ()),
        (1, "A100-80GB", True, ()),
        (2, "H100-80GB", True, ()),
    ]
    with pytest.raises(MigInputError, match=r"^--gpus: T4 has no MIG profiles"):
        parse_gpu_spec("2xT4")
    with pytest.raises(MigInputError, match=r"^--gpus: unknown GPU model 'B9'"):
        parse_gpu_spec("B9")


def test_inventory_round_trip() -> None:
    gpus = [gpu(0, "3g.40gb@0!", "1g.10gb@6"), MigGpu(1, "A30", mig_enabled=False, in_use=True)]
    assert inventory_from_data(inventory_to_data(gpus)) == gpus


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {
                "gpus": [
                    {
                        "model": "A100-80GB",
                        "instances": [
                            {"profile": "4g.40gb", "start": 0},
                            {"profile": "3g.40gb", "start": 0},
                        ],
                    }
                ]
            },
            "inventory.gpus[0].instances: GPU 0: 3g.40gb@0 and 4g.40gb@0 overlap on memory "
            "slices 0-3",
        ),
        (
            {"gpus": [{"model": "A100-80GB", "instances": [{"profile": "1g.5gb", "start": 0}]}]},
            "inventory.gpus[0].instances[0].profile: '1g.5gb' is not a MIG profile of A100-80GB",
        ),
        ({"gpus": [{"model": "A100-80GB", "colour": 1}]}, "inventory.gpus[0].colour: unknown"),
        ({"gpus": [{"model": "A100-80GB", "index": "0"}]}, "inventory.gpus[0].index: expected"),
        ({"gpus": [{"index": 0}]}, "inventory.gpus[0].model: missing"),
        (
            {
                "gpus": [
                    {
                        "model": "A30",
                        "mig_enabled": False,
                        "instances": [{"profile": "4g.24gb", "start": 0}],
                    }
                ]
            },
            "inventory.gpus[0].instances: GPU 0 has MIG off",
        ),
        ({"gpus": [{"model": "A30"}, {"model": "A30", "index": 0}]}, "index 0 appears twice"),
        ([], "inventory: expected an object with a 'gpus' list"),
    ],
)
def test_bad_inventory_names_the_field(data: object, message: str) -> None:
    with pytest.raises(MigInputError) as caught:
        inventory_from_data(data)
    assert message in str(caught.value)


# --- planning rules ------------------------------------------------------------------------


def test_an_instance_in_use_is_never_destroyed() -> None:
    # 1g.10gb@3 in use blocks the 4g and a 3g at 0; the idle 1g.10gb@5 may go.
    gpus = [gpu(0, "1g.10gb@3!", "1g.10gb@5")]
    result = plan(gpus, parse_demand("4g.40gb,3g.40gb"))
    only = result.gpus[0]
    assert [str(d) for d in only.destroy] == ["1g.10gb@5"]
    assert only.create == (P("3g.40gb@4"),)
    assert P("1g.10gb@3") in only.after
    assert [(u.request, u.count) for u in result.unserved] == [("4g.40gb", 1)]
    assert "work in use" in result.unserved[0].reason


def test_an_idle_instance_makes_room() -> None:
    result = plan([gpu(0, "1g.10gb@3")], parse_demand("4g.40gb"))
    assert [str(d) for d in result.gpus[0].destroy] == ["1g.10gb@3"]
    assert result.gpus[0].create == (P("4g.40gb@0"),)
    assert result.unserved == ()


def test_the_plan_changes_one_gpu_rather_than_two() -> None:
    gpus = [gpu(0, "1g.10gb@0!"), gpu(1)]
    result = plan(gpus, parse_demand("2x3g.40gb"))
    assert result.changed_gpus == 1
    assert not result.gpus[0].changed
    assert result.gpus[1].create == (P("3g.40gb@0"), P("3g.40gb@4"))
    assert result.gpus[0].explanation[0] == "GPU 0 (A100-80GB): unchanged (1g.10gb@0 (in use))"


def test_an_idle_instance_that_fits_is_reused_without_change() -> None:
    gpus = [gpu(0, "2g.20gb@4"), gpu(1)]
    result = plan(gpus, parse_demand("0.1"))
    assert result.changed_gpus == 0
    assert result.operations == 0
    [assignment] = result.assignments
    assert (assignment.profile, assignment.start, assignment.new) == ("2g.20gb", 4, False)
    assert assignment.uuid == "MIG-0-2g.20gb-4"
    assert assignment.waste == 2  # changing no GPU comes before wasting no slice
    assert result.wasted_slices == 2


def test_a_partly_used_gpu_is_filled_before_an_empty_one() -> None:
    gpus = [gpu(0), gpu(1, "3g.40gb@0!")]
    result = plan(gpus, parse_demand("1g.10gb"))
    assert not result.gpus[0].changed
    assert result.gpus[1].create == (P("1g.10gb@6"),)


def test_most_requests_served_first() -> None:
    result = plan([gpu(0)], parse_demand("7g.80gb,7x1g.10gb"))
    assert result.served == 7
    assert [(u.request, u.count) for u in result.unserved] == [("7g.80gb", 1)]


def test_earlier_requests_are_served_first_on_ties() -> None:
    # Only memory slices 4-5 are free: one 2g.20gb or one 1g.20gb, whichever comes first.
    busy = [gpu(0, "3g.40gb@0!", "1g.20gb@6!")]
    first = plan(busy, parse_demand("2g.20gb,1g.20gb"))
    assert [a.profile for a in first.assignments] == ["2g.20gb"]
    assert [u.request for u in first.unserved] == ["1g.20gb"]
    second = plan(busy, parse_demand("1g.20gb,2g.20gb"))
    assert [a.profile for a in second.assignments] == ["1g.20gb"]
    # ... but never at the cost of serving fewer: two small ones beat the first big one.
    more = plan([gpu(0, "3g.40gb@0!")], parse_demand("3g.40gb,2g.20gb,2x1g.10gb"))
    assert more.served == 2
    assert [(u.request, u.count) for u in more.unserved] == [("3g.40gb", 1), ("1g.10gb", 1)]


def test_fractions_and_memory_use_the_smallest_fitting_profile() -> None:
    result = plan([gpu(0)], parse_demand("0.25,19GiB"))
    assert sorted((a.request, a.profile, a.waste) for a in result.assignments) == [
        ("0.25", "2g.20gb", 0),
        ("19GiB", "1g.20gb", 0),
    ]


def test_mixed_fleet_sends_a_profile_where_it_exists() -> None:
    gpus = [gpu(0, model="A100-80GB"), gpu(1, model="A100-40GB")]
    result = plan(gpus, parse_demand("1g.5gb,1g.20gb"))
    assert {(a.request, a.gpu_index) for a in result.assignments} == {
        ("1g.5gb", 1),
        ("1g.20gb", 0),
    }


def test_mig_off_gpu_is_enabled_when_needed_and_a_busy_one_is_left_alone() -> None:
    gpus = [
        MigGpu(0, "A100-80GB", mig_enabled=False, in_use=True),
        MigGpu(1, "A100-80GB", mig_enabled=False),
    ]
    result = plan(gpus, parse_demand("3g.40gb"))
    assert not result.gpus[0].changed
    assert result.gpus[1].enable_mig
    assert result.gpus[1].operations == 2
    assert "enable MIG mode" in result.gpus[1].explanation[0]
    assert "in use as a whole GPU" in result.gpus[0].explanation[0]


def test_explanation_reads_as_a_summary() -> None:
    result = plan(parse_gpu_spec("2xA100-80GB"), parse_demand("3x1g.10gb,2x3g.40gb"))
    assert result.explanation[0] == (
        "serves 5 of 5 requested instances; changes 2 of 2 GPUs with 5 operations; 0 wasted slices"
    )
    assert result.explanation[1].startswith("objective: most requests served, then fewest GPUs")
    assert any(line.strip() == "3g.40gb -> new 3g.40gb@4" for line in result.explanation)


def test_the_plan_is_deterministic() -> None:
    gpus = [gpu(0, "1g.10gb@2!", "2g.20gb@4"), gpu(1, "1g.20gb@6")]
    demand = parse_demand("2x1g.10gb,0.25,3g.40gb,20GiB")
    assert plan(gpus, demand) == plan(list(reversed(gpus)), demand)


def test_greedy_fallback_still_gives_a_valid_plan() -> None:
    gpus = parse_gpu_spec("4xA100-80GB")
    demand = parse_demand("9x1g.10gb,3x3g.40gb,2x2g.20gb")
    exact = plan(gpus, demand)
    greedy = plan(gpus, demand, budget=0)
    assert exact.exact
    assert not greedy.exact
    assert "greedy plan" in greedy.explanation[0]
    assert greedy.served == exact.served == 14
    assert exact.objective <= greedy.objective or exact.served > greedy.served


def test_a_node_of_eight_gpus_is_planned_exactly() -> None:
    gpus = [gpu(i, "3g.40gb@0!") if i % 2 else gpu(i) for i in range(8)]
    demand = parse_demand("20x1g.10gb,6x3g.40gb,4x0.25,2x7g.80gb")
    result = plan(gpus, demand)
    assert result.exact
    assert result.served >= plan(gpus, demand, budget=0).served
    assert result.served + sum(u.count for u in result.unserved) == 32
    for gpu_plan in result.gpus:
        assert all(not d.in_use for d in gpu_plan.destroy)


# --- errors --------------------------------------------------------------------------------


def test_unknown_profile_lists_the_valid_ones() -> None:
    with pytest.raises(MigInputError) as caught:
        plan(parse_gpu_spec("A100-80GB"), parse_demand("1g.5gb"))
    message = str(caught.value)
    assert message.startswith("--demand: '1g.5gb' is not a MIG profile of A100-80GB; valid: ")
    assert "A100-80GB: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb" in message


def test_a_request_that_can_never_fit_is_an_error() -> None:
    with pytest.raises(MigInputError) as caught:
        plan(parse_gpu_spec("2xA30"), parse_demand("30GiB"))
    assert str(caught.value) == (
        "--demand: '30GiB' can never fit: it is larger than every MIG profile of the "
        "inventory's GPUs (largest: A30: 4g.24gb (24064 MiB))"
    )


def test_no_gpu_is_an_error() -> None:
    with pytest.raises(MigInputError, match=r"^gpus: no MIG-capable GPU"):
        plan([], parse_demand("1g.10gb"))


def test_overlapping_inventory_is_refused() -> None:
    with pytest.raises(MigInputError, match=r"^gpus\[0\].instances: GPU 0: .* overlap"):
        plan([gpu(0, "4g.40gb@0", "3g.40gb@0")], parse_demand("1g.10gb"))


# --- exact layouts (mig-parted configs) ---------------------------------------------------


def test_plan_layout_keeps_in_use_and_idle_instances_it_can() -> None:
    source = gpu(0, "1g.10gb@0!", "2g.20gb@4")
    result = plan_layout(source, {"1g.10gb": 3, "3g.40gb": 1})
    assert [str(d) for d in result.destroy] == ["2g.20gb@4"]
    assert result.create == (P("1g.10gb@1"), P("1g.10gb@2"), P("3g.40gb@4"))
    kept = plan_layout(source, {"1g.10gb": 1, "2g.20gb": 1})
    assert not kept.changed


def test_plan_layout_refuses_to_drop_an_instance_in_use() -> None:
    with pytest.raises(MigInputError, match=r"asks for 0 x 1g.10gb, but 1g.10gb@0 \(in use\)"):
        plan_layout(gpu(0, "1g.10gb@0!"), {"3g.40gb": 2})
    with pytest.raises(MigInputError, match=r"exactly 1 x 1g.10gb, 2 x 3g.40gb beside the inst"):
        plan_layout(gpu(0, "1g.10gb@0!"), {"3g.40gb": 2, "1g.10gb": 1})
