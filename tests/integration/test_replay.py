"""The dynamic simulator: event engine, report and ``fgpu sim replay`` end to end."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fgpu.model.types import Allocation, Node, Request
from fgpu.plugins import create_policy
from fgpu.sched.decide import Decision, Scheduler, SchedulerConfig
from fgpu.sched.placer import Placer, Unschedulable
from fgpu.sched.policy import PlacementPolicy
from fgpu.sched.state import ClusterState
from fgpu.sched.workload import Holds, Place, Preempt, QueueTree, Wait, Workload
from fgpu.sim.replay import (
    DutyCycles,
    GpuSpecError,
    ReplayError,
    ReplayResult,
    parse_gpus,
    run_replay,
    tenant_queues,
)
from fgpu.sim.replay_report import (
    evictions_by_shape,
    jain_index,
    summarize_replay,
    weighted_percentile,
)
from fgpu.sim.workloads import SimWorkload
from tests.builders import pod

SUMMARY_KEYS = {
    "gpu_allocation_pct",
    "queueing_delay_s",
    "completion_time_s",
    "preemptions",
    "reclaims",
    "evictions",
    "squeezes",
    "evictions_by_shape",
    "wasted_gpu_hours",
    "suspends",
    "restores",
    "copy_gpu_hours",
    "goodput_pct",
    "jain_fairness",
    "finished",
    "unfinished",
    "arrived",
    "queues",
    "rounds",
    "warnings",
    "simulated_hours",
    "wall_s",
    "config",
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def gpu_node(name: str, gpus: int, cores: int = 32) -> Node:
    return Node(name, cores * 1000, 256 * 1024, gpus, "A100-80GB", 80 * 1024)


def work(
    wid: str,
    submit: float,
    duration: float,
    gpu: float | str = 1,
    queue: str = "a",
    priority: int = 50,
    cores: float = 1,
) -> SimWorkload:
    request = pod().gpu(gpu).cpu(cores).build()
    return SimWorkload(wid, queue, request, priority, float(submit), float(duration))


def core() -> Scheduler:
    # preemption at once: these replays pin exact eviction times (the wait before evicting
    # has its own tests below)
    return Scheduler(create_policy("best-fit"), SchedulerConfig(preempt_delay_s=0.0))


def replay(
    nodes: list[Node],
    workloads: Sequence[SimWorkload],
    seconds: float,
    queues: Sequence[str] = ("a",),
    scheduler: object | None = None,
    **kwargs: object,
) -> ReplayResult:
    return run_replay(
        nodes,
        tenant_queues(list(queues), nodes),
        workloads,
        scheduler or core(),  # type: ignore[arg-type]
        seconds / 3600,
        debug=True,
        **kwargs,  # type: ignore[arg-type]
    )


def starts(result: ReplayResult) -> dict[str, tuple[list[float], float | None]]:
    return {r.id: (r.starts, r.finish_s) for r in result.records}


# ----------------------------------------------------------------------------- --gpus
@pytest.mark.parametrize(
    ("text", "sizes", "models"),
    [
        ("64xA100-80GB", [8] * 8, {"A100-80GB"}),
        ("12xA100-80GB", [8, 4], {"A100-80GB"}),
        ("2xA100-40GB,1xH100-80GB", [2, 1], {"A100-40GB", "H100-80GB"}),
        (" 8 x h100 , 8xH100-80GB", [8, 8], {"H100-80GB"}),
    ],
    ids=["64-a100", "remainder-node", "mixed-list", "alias-and-spaces"],
)
def test_parse_gpus_builds_nodes(text: str, sizes: list[int], models: set[str]) -> None:
    nodes = parse_gpus(text)
    assert [n.gpu_count for n in nodes] == sizes
    assert {n.gpu_model for n in nodes} == models
    assert len({n.name for n in nodes}) == len(nodes)
    for n in nodes:
        assert n.cpu_milli == 16_000 * n.gpu_count  # 128 cores per 8 GPUs
        assert n.memory_mib == 128 * 1024 * n.gpu_count  # 1 TiB per 8 GPUs


def test_parse_gpus_names_nodes_per_model() -> None:
    names = [n.name for n in parse_gpus("16xA100-80GB,4xH100-80GB,8xA100-80GB")]
    assert names == ["a100-80gb-1", "a100-80gb-2", "h100-80gb-1", "a100-80gb-3"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--gpus: empty; expected COUNTxMODEL, e.g. 64xA100-80GB"),
        ("64", "--gpus: '64' is not COUNTxMODEL"),
        ("A100x64", "--gpus: 'A100x64' is not COUNTxMODEL"),
        ("0xA100-80GB", "--gpus: '0xA100-80GB': the GPU count must be at least 1"),
        ("8xB300", "--gpus: unknown GPU model 'B300'; known models:"),
        ("8xA100-80GB,", "--gpus: '' is not COUNTxMODEL"),
    ],
    ids=["empty", "no-model", "reversed", "zero", "unknown-model", "trailing-comma"],
)
def test_parse_gpus_rejects_bad_values(text: str, message: str) -> None:
    with pytest.raises(GpuSpecError) as caught:
        parse_gpus(text)
    assert str(caught.value).startswith(message)


def test_tenant_queues_split_every_resource_equally() -> None:
    nodes = parse_gpus("64xA100-80GB")
    tree = tenant_queues(["t1", "t2", "t3"], nodes)
    assert tree.leaves == ["t1", "t2", "t3"]
    for name in tree.leaves:
        quota = tree[name].quota
        assert quota.gpu_milli == 64_000 // 3
        assert quota.cpu_milli == 8 * 128_000 // 3
        assert quota.memory_mib == 8 * 1024 * 1024 // 3
        assert tree[name].over_quota_weight == 1.0


# ----------------------------------------------------------------------------- engine
def test_three_workloads_on_two_gpus_run_at_exact_times() -> None:
    """a and b take one GPU each; c needs both and starts when a (the longer one) ends."""
    nodes = [gpu_node("n1", 2)]
    day = [work("a", 0, 100), work("b", 10, 50), work("c", 20, 30, gpu=2)]
    result = replay(nodes, day, 200)
    assert starts(result) == {
        "a": ([0.0], 100.0),
        "b": ([10.0], 60.0),
        "c": ([100.0], 130.0),
    }
    assert [s.time_s for s in result.timeline] == [0.0, 0.0, 10.0, 20.0, 60.0, 100.0, 130.0]
    assert [s.allocated_milli for s in result.timeline] == [
        (0,),
        (1000,),
        (2000,),
        (2000,),
        (1000,),
        (2000,),
        (0,),
    ]
    assert [s.pending for s in result.timeline] == [0, 0, 0, 1, 1, 0, 0]
    assert result.rounds == 6
    c = next(r for r in result.records if r.id == "c")
    assert c.evictions == 0

    summary = summarize_replay(result, wall_s=0.5)
    assert set(summary) == SUMMARY_KEYS
    # 10 s x 1 + 50 s x 2 + 40 s x 1 + 30 s x 2 GPUs over 200 s x 2 GPUs = 52.5 %
    assert summary["gpu_allocation_pct"] == {"mean": 52.5, "p95": 100.0}
    assert summary["goodput_pct"] == 52.5  # nothing evicted, nothing copied
    delays = summary["queueing_delay_s"]
    assert delays["all"] == {"p50": 0.0, "p95": 72.0, "count": 3, "not_started": 0}
    assert delays["per_queue"]["a"] == delays["all"]
    assert delays["per_priority"] == {"normal": delays["all"]}
    assert summary["completion_time_s"] == {
        "p50": 100.0,
        "p95": 109.0,
        "count": 3,
        "per_priority": {"normal": {"p50": 100.0, "p95": 109.0, "mean": 86.667, "count": 3}},
    }
    assert (summary["squeezes"], summary["wasted_gpu_hours"]) == (0, 0.0)
    assert (summary["finished"], summary["unfinished"], summary["arrived"]) == (3, 0, 3)
    assert (summary["preemptions"], summary["reclaims"], summary["evictions"]) == (0, 0, 0)
    assert summary["simulated_hours"] == round(200 / 3600, 3)
    assert summary["wall_s"] == 0.5
    assert summary["jain_fairness"] == 1.0  # one queue: always fair to itself


@pytest.mark.parametrize("grace", [0.0, 30.0, 45.5])
def test_victim_exits_after_the_grace_period_and_restarts_from_scratch(grace: float) -> None:
    """A low-priority whole-GPU victim makes room for a normal one in the same queue."""
    nodes = [gpu_node("n1", 1)]
    day = [work("v", 0, 1000, priority=40), work("p", 100, 50, priority=50)]
    result = replay(nodes, day, 3000, grace_s=grace)
    exit_at = 100 + grace
    assert starts(result) == {
        "v": ([0.0, exit_at + 50], exit_at + 50 + 1000),  # the whole 1000 s again
        "p": ([exit_at], exit_at + 50),
    }
    assert (result.preemptions, result.reclaims, result.evictions) == (1, 0, 1)
    v = next(r for r in result.records if r.id == "v")
    assert v.evictions == 1
    # while the victim is terminating it still holds its GPU
    during = [s for s in result.timeline if 100 <= s.time_s < exit_at]
    assert all(s.allocated_milli == (1000,) for s in during)


def test_reclaim_across_queues_is_counted_as_a_reclaim() -> None:
    """Queue a borrows b's GPU while b is idle; b's arrival takes it back after the grace."""
    nodes = [gpu_node("n1", 2)]
    day = [
        work("a1", 0, 500, queue="a"),
        work("a2", 1, 500, queue="a"),
        work("b1", 10, 100, queue="b"),
    ]
    result = replay(nodes, day, 2000, queues=("a", "b"), grace_s=30)
    assert (result.preemptions, result.reclaims, result.evictions) == (0, 1, 1)
    runs = starts(result)
    assert runs["b1"] == ([40.0], 140.0)
    assert runs["a1"] == ([0.0], 500.0)  # the most recently started one is the victim
    assert runs["a2"] == ([1.0, 140.0], 640.0)


def test_the_replay_shares_a_queue_between_the_trace_users() -> None:
    """Issue 25: the simulator runs the same core, so a trace's users share their queue: on
    two GPUs alice runs two of her four jobs; bob's one, submitted after all of hers, starts
    at the first free GPU because alice holds more than he does (the rule weighs what each
    user holds now, so at equal holdings the older submission goes first)."""
    nodes = [gpu_node("n1", 2)]
    day = [replace(work(f"a{i}", i, 100), user="alice") for i in range(4)]
    day.append(replace(work("b0", 5, 100), user="bob"))
    runs = starts(replay(nodes, day, 1000))
    assert {w: runs[w][0] for w in runs} == {
        "a0": [0.0],
        "a1": [1.0],
        "b0": [100.0],  # alice holds a1 then, bob nothing
        "a2": [101.0],
        "a3": [200.0],
    }
    # the same day without users: strict submission order, as before
    plain = starts(replay(nodes, [replace(w, user="") for w in day], 1000))
    assert plain["b0"][0] == [200.0]
    assert (plain["a2"][0], plain["a3"][0]) == ([100.0], [101.0])


class FifoCore:
    """Test stand-in for the decision core: places pending work first come, first served
    (best-fit), and preempts as scripted: ``{time: [(victim, preemptor), ...]}``."""

    def __init__(
        self, preempt: dict[float, list[tuple[str, str]]] | None = None, answer: bool = True
    ) -> None:
        self.policy: PlacementPolicy = create_policy("best-fit")
        self.preempt = preempt or {}
        self.answer = answer

    def decide(
        self,
        now: float,
        state: ClusterState,
        queues: QueueTree,
        workloads: Sequence[Workload],
        holds: Holds | None = None,
    ) -> Decision:
        placer = Placer(state.copy(), self.policy)
        actions: list[Place | Preempt | Wait] = [
            Preempt(victim, preemptor, "preemption", "scripted")
            for victim, preemptor in self.preempt.get(now, [])
        ]
        for w in sorted(workloads, key=lambda w: (w.submitted_at, w.id)):
            if w.allocation is not None:
                continue
            result = placer.place(w.request)
            if isinstance(result, Unschedulable):
                if self.answer:
                    actions.append(Wait(w.id, result.reason))
            else:
                actions.append(Place(w.id, result))
        return Decision(actions, {}, {}, {})


def test_a_victim_that_ends_within_its_grace_period_finishes_normally() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("v", 0, 10), work("p", 5, 20)]
    result = replay(nodes, day, 100, scheduler=FifoCore({5.0: [("v", "p")]}), grace_s=30)
    assert starts(result) == {"v": ([0.0], 10.0), "p": ([10.0], 30.0)}
    assert next(r for r in result.records if r.id == "v").evictions == 0
    assert result.evictions == 1


def test_workloads_past_the_horizon_are_unfinished_or_not_arrived() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("long", 0, 500), work("late", 50, 10), work("never", 120, 10)]
    result = replay(nodes, day, 100, scheduler=FifoCore())
    assert starts(result) == {"long": ([0.0], None), "late": ([], None), "never": ([], None)}
    assert next(r for r in result.records if r.id == "late").wait_reason.startswith("0/1 nodes")
    summary = summarize_replay(result, 0.0)
    assert (summary["arrived"], summary["finished"], summary["unfinished"]) == (2, 0, 2)
    assert summary["queueing_delay_s"]["all"] == {
        "p50": 0.0,
        "p95": 0.0,
        "count": 1,
        "not_started": 1,
    }
    assert summary["completion_time_s"] == {
        "p50": None,
        "p95": None,
        "count": 0,
        "per_priority": {"normal": {"p50": None, "p95": None, "mean": None, "count": 0}},
    }
    assert summary["gpu_allocation_pct"] == {"mean": 100.0, "p95": 100.0}


def test_ticks_add_rounds_while_work_waits() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("a", 0, 300), work("b", 10, 10)]
    result = replay(nodes, day, 1000, scheduler=FifoCore(), tick_s=60)
    times = [s.time_s for s in result.timeline[1:]]
    # 310: b's finish and the last tick, one round (no new tick once nothing waits)
    assert times == [0.0, 10.0, 70.0, 130.0, 190.0, 250.0, 300.0, 310.0]
    assert starts(result)["b"] == ([300.0], 310.0)


class PlaceOnGpuZero(FifoCore):
    """A broken core: puts every pending workload on GPU 0 of node 0."""

    def decide(
        self,
        now: float,
        state: ClusterState,
        queues: QueueTree,
        workloads: Sequence[Workload],
        holds: Holds | None = None,
    ) -> Decision:
        alloc = Allocation(0, "n1", (0,), (1000,), (81920,), 1000, 0)
        actions: list[Place | Preempt | Wait] = [
            Place(w.id, alloc) for w in workloads if w.allocation is None
        ]
        return Decision(actions, {}, {}, {})


def test_an_impossible_place_stops_the_replay_with_the_details() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("a", 0, 100), work("b", 10, 100)]
    with pytest.raises(ReplayError, match=r"t=10\.0: Place of b .* GPU 0 of n1 lacks 1000 milli"):
        replay(nodes, day, 200, scheduler=PlaceOnGpuZero())


def test_preempting_a_pending_workload_stops_the_replay() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("a", 0, 100), work("b", 5, 100)]
    core = FifoCore({5.0: [("b", "a")]})
    with pytest.raises(ReplayError, match=r"t=5\.0: Preempt of b for a, which is pending"):
        replay(nodes, day, 200, scheduler=core)


def test_debug_mode_wants_a_reason_for_every_pending_workload() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("a", 0, 100), work("b", 5, 100)]
    with pytest.raises(ReplayError, match="no Place or Wait for pending workload"):
        replay(nodes, day, 200, scheduler=FifoCore(answer=False))


@pytest.mark.parametrize(
    ("day", "message"),
    [
        ([work("a", 0, 1, queue="zz")], "workload a: queue 'zz' is not a leaf queue"),
        ([work("a", 0, 1), work("a", 1, 1)], "duplicate workload id 'a'"),
    ],
    ids=["unknown-queue", "duplicate-id"],
)
def test_bad_workload_lists_are_rejected(day: list[SimWorkload], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replay([gpu_node("n1", 1)], day, 10)


def test_capacity_of_a_terminating_victim_is_not_used_by_others() -> None:
    """v (12 cores) is preempted for p (2 cores); x (12 cores, no GPU) must wait for v's exit:
    the node has 16 cores, so until then only 4 are free."""
    nodes = [gpu_node("n1", 1, cores=16)]
    day = [
        work("v", 0, 1000, priority=40, cores=12),
        work("p", 100, 50, priority=50, cores=2),
        SimWorkload("x", "a", Request(cpu_milli=12_000), 50, 100.5, 10),
    ]
    result = replay(nodes, day, 2000, grace_s=30)
    assert starts(result)["x"] == ([130.0], 140.0)


# ----------------------------------------------------------------------------- suspend
def test_a_suspended_victim_keeps_its_progress_and_the_copies_cost_goodput() -> None:
    """v (whole GPU, 80 GiB) is suspended for p at t=20 (its progress stops: 80 s left); its
    memory goes to host in 10 s at 8 GiB/s, so p starts at 30 and ends at 80; v is restored
    at 80, runs again from 90 after the copy back, and ends at 170 having lost nothing.
    Goodput: 170 GPU-s allocated minus 20 s of copies, over 200 s."""
    nodes = [replace(gpu_node("n1", 1), suspend_host_memory_mib=256 * 1024)]
    day = [work("v", 0, 100, gpu=1, priority=40), work("p", 20, 50, gpu=1, priority=50)]
    result = replay(nodes, day, 200, suspendable=True, host_link_mib_s=8192.0)
    assert starts(result) == {"v": ([0.0], 170.0), "p": ([30.0], 80.0)}
    assert (result.suspends, result.restores, result.evictions) == (1, 1, 0)
    assert result.wasted_gpu_hours == 0.0
    assert result.copy_gpu_hours == pytest.approx(20 / 3600)
    summary = summarize_replay(result, 0.0)
    assert summary["gpu_allocation_pct"]["mean"] == 85.0
    assert summary["goodput_pct"] == 75.0
    assert summary["queues"]["a"]["copy_gpu_hours"] == pytest.approx(20 / 3600, abs=1e-3)


@pytest.mark.parametrize(("other_gpus", "v_ends"), [(False, 320.0), (True, 150.0)])
def test_a_suspended_victim_comes_back_on_its_own_gpu_unless_the_driver_can_move_it(
    other_gpus: bool, v_ends: float
) -> None:
    """Two GPUs: s (priority 100, 60 s) and v (40, 100 s) start at 0; p (50, 200 s) arrives
    at 20 and suspends v (10 s copy), starting at 30 on v's GPU. s's GPU frees at 60: v comes
    back there only where the driver restores onto other GPUs (at 60, copy back until 70,
    80 s left: ends at 150); else it waits for its own GPU (p ends at 230: ends at 320)."""
    node = replace(
        gpu_node("n1", 2), suspend_host_memory_mib=256 * 1024, restore_other_gpus=other_gpus
    )
    day = [
        work("s", 0, 60, gpu=1, priority=100),
        work("v", 0, 100, gpu=1, priority=40),
        work("p", 20, 200, gpu=1, priority=50),
    ]
    result = replay([node], day, 400, suspendable=True, host_link_mib_s=8192.0)
    assert starts(result) == {"s": ([0.0], 60.0), "v": ([0.0], v_ends), "p": ([30.0], 230.0)}
    assert (result.suspends, result.restores, result.evictions) == (1, 1, 0)


def test_without_a_budget_the_same_victim_is_evicted_and_its_work_is_lost() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("v", 0, 100, gpu=1, priority=40), work("p", 20, 50, gpu=1, priority=50)]
    result = replay(nodes, day, 300, suspendable=True, grace_s=0.0)
    assert starts(result) == {"v": ([0.0, 70.0], 170.0), "p": ([20.0], 70.0)}
    assert (result.suspends, result.evictions) == (0, 1)
    summary = summarize_replay(result, 0.0)
    # 170 GPU-s allocated, 20 of them lost to the eviction, over 300 s
    assert summary["goodput_pct"] == 50.0


def test_a_preemptor_below_100_waits_for_capacity_before_it_evicts() -> None:
    nodes = [gpu_node("n1", 1)]
    day = [work("v", 0, 1000, gpu=1, priority=40), work("p", 20, 50, gpu=1, priority=50)]
    waiting = Scheduler(create_policy("best-fit"), SchedulerConfig(preempt_delay_s=100.0))
    result = replay(nodes, day, 2000, scheduler=waiting, grace_s=0.0, tick_s=10.0)
    # it evicts v only at 20 + 100 s (at once, it would have started at 20)
    assert starts(result)["p"] == ([120.0], 170.0)
    assert result.evictions == 1


# ----------------------------------------------------------------------------- report pieces
def test_jain_index() -> None:
    assert jain_index(np.array([1.0, 1.0]), np.array([2.0, 2.0])) == 1.0
    assert jain_index(np.array([2.0, 0.0]), np.array([2.0, 2.0])) == 0.5
    assert jain_index(np.array([0.0, 0.0]), np.array([2.0, 2.0])) == 1.0
    assert jain_index(np.array([5.0, 1.0]), np.array([0.0, 2.0])) == 1.0  # only queue 2
    assert jain_index(np.array([5.0]), np.array([0.0])) is None


def test_weighted_percentile() -> None:
    values = np.array([10.0, 50.0, 100.0])
    weights = np.array([90.0, 4.0, 6.0])
    assert weighted_percentile(values, weights, 0.5) == 10.0
    assert weighted_percentile(values, weights, 0.94) == 50.0
    assert weighted_percentile(values, weights, 0.95) == 100.0


# ----------------------------------------------------------------------------- CLI
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli
p00,4000,8192,1,500
p01,2000,4096,1,250
p02,8000,16384,2,1000
p03,1000,2048,0,0
p04,4000,8192,1,1000
p05,6000,8192,4,1000
p06,2000,4096,1,320
"""


def fgpu(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fgpu", "sim", "replay", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def pods_file(tmp_path: Path) -> Path:
    path = tmp_path / "pods.csv"
    path.write_text(PODS)
    return path


def without_timing(summary: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in summary.items() if k not in ("wall_s", "config")}


def test_cli_replays_a_generated_day_and_writes_every_file(tmp_path: Path, pods_file: Path) -> None:
    out = tmp_path / "out"
    args = ["--gpus", "16xA100-80GB", "--hours", "2", "--seed", "3", "--policy", "fgd"]
    done = fgpu(
        "--pods", pods_file, "--tenants", "2", "--load", "0.9", *args, "--out", out, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    for name in ("summary.json", "timeline.csv", "allocation.png", "delays.png", "workloads.csv"):
        assert (out / name).is_file(), name
    assert not list(out.glob(".*.tmp"))
    for name in ("allocation.png", "delays.png"):
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert set(summary["gpu_allocation_pct"]) == {"mean", "p95"}
    assert set(summary["queueing_delay_s"]) == {"all", "per_queue", "per_priority"}
    assert set(summary["queueing_delay_s"]["per_queue"]) == {"tenant-1", "tenant-2"}
    for stats in summary["queueing_delay_s"]["per_queue"].values():
        assert {"p50", "p95"} <= set(stats)
    assert set(summary["completion_time_s"]) == {"p50", "p95", "count", "per_priority"}
    assert summary["simulated_hours"] == 2.0
    assert summary["arrived"] == summary["finished"] + summary["unfinished"] > 0
    assert 0 < summary["gpu_allocation_pct"]["mean"] <= 100
    assert summary["config"]["capacity_gpus"] == 16
    with open(out / "timeline.csv", newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == [
        "time_s",
        "pending",
        "running",
        "allocated_milli",
        "allocated_milli.tenant-1",
        "fair_share_milli.tenant-1",
        "allocated_milli.tenant-2",
        "fair_share_milli.tenant-2",
    ]
    assert len(rows) == summary["rounds"] + 2  # header and the sample at time 0
    assert "tenant-1" in done.stdout
    assert "wrote" in done.stdout

    # the saved day replays to the same figures
    again = tmp_path / "again"
    done = fgpu("--workloads", out / "workloads.csv", *args, "--out", again, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    replayed = json.loads((again / "summary.json").read_text())
    assert without_timing(replayed) == without_timing(summary)
    assert not (again / "workloads.csv").exists()
    # by default suspended work may come back on any GPU of its node (a CUDA 13 driver);
    # --restore-own-gpus replays older drivers
    assert summary["config"]["restore_other_gpus"] is True
    own = tmp_path / "own"
    done = fgpu(
        "--workloads", out / "workloads.csv", *args, "--restore-own-gpus", "--out", own,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((own / "summary.json").read_text())["config"]["restore_other_gpus"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "8xB300"], "--gpus: unknown GPU model 'B300'"),
        (["--load", "0"], "--load: must be a number above 0, got 0"),
        (["--hours", "-1"], "--hours: must be a number above 0, got -1"),
        (["--grace", "nan"], "--grace: must be a number at least 0, got nan"),
        (["--tenants", "0"], "--tenants: must be at least 1, got 0"),
        (["--policy", "nope"], "--policy: "),
        (["--workloads", "{bad}", "--tenants", "3"], "--tenants: not used with --workloads"),
        (["--workloads", "{bad}"], "bad.csv:2: column 'duration_s': must be positive (got 0)"),
    ],
    ids=["gpus", "load", "hours", "grace", "tenants", "policy", "tenants-with-file", "bad-file"],
)
def test_cli_bad_options_exit_2_naming_the_option(
    tmp_path: Path, pods_file: Path, args: list[str], message: str
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "id,submit_s,duration_s,queue,priority,gpu,gpu_memory,cpu,memory\nx,0,0,q,50,1,,1,1GiB\n"
    )
    args = [a.replace("{bad}", str(bad)) for a in args]
    if "--workloads" not in args:
        args = ["--pods", str(pods_file), *args]
    extra = [] if "--hours" in args else ["--hours", "0.5"]
    done = fgpu(*args, *extra, "--out", tmp_path / "o", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in " ".join(done.stderr.split())
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_cli_replays_the_issue_day_on_the_real_trace(tmp_path: Path, trace_dir: Path) -> None:
    """3 tenants on 64 A100-80GB at 0.9 offered load for 24 h (the issue's command)."""
    out = tmp_path / "day"
    done = fgpu(
        "--pods",
        trace_dir / "openb_pod_list_default.csv",
        "--gpus",
        "64xA100-80GB",
        "--tenants",
        "3",
        "--load",
        "0.9",
        "--hours",
        "24",
        "--seed",
        "1",
        "--debug",
        "--out",
        out,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated_hours"] == 24.0
    assert 40 < summary["gpu_allocation_pct"]["mean"] < 100
    assert summary["jain_fairness"] is not None
    assert 0.5 < summary["jain_fairness"] <= 1
    assert summary["finished"] > 1000
    assert math.isfinite(summary["wall_s"])


# ----------------------------------------------------------------- squeeze before evict
def _squeeze_day(low_memory: str | None) -> list[SimWorkload]:
    """Two low jobs at 0.5 from t=0 (100 s each) and a critical 0.5 (16 GiB) at t=10 (50 s)."""
    low = pod().gpu(0.5)
    low_request = (low.gpu_memory(low_memory) if low_memory else low).build()
    crit = pod().gpu(0.5).gpu_memory("16GiB").build()
    return [
        SimWorkload("l1", "q", low_request, 40, 0.0, 100.0),
        SimWorkload("l2", "q", low_request, 40, 0.0, 100.0),
        SimWorkload("c", "q", crit, 125, 10.0, 50.0),
    ]


def _run_squeeze_day(low_memory: str | None, squeeze: bool = True) -> ReplayResult:
    nodes = parse_gpus("1xA100-80GB")
    scheduler = Scheduler(
        create_policy("best-fit"), SchedulerConfig(squeeze=squeeze, preempt_delay_s=0.0)
    )
    return run_replay(
        nodes,
        tenant_queues(["q"], nodes),
        _squeeze_day(low_memory),
        scheduler,
        1.0,
        grace_s=0.0,
        debug=True,
        duty=DutyCycles(inference_duty=0.5),
    )


def test_squeezed_work_progresses_at_the_rate_its_squeezers_leave_it() -> None:
    result = _run_squeeze_day("16GiB")
    finish = {r.id: r.finish_s for r in result.records}
    # l1 is squeezed at t=10 (10 s done), runs half the time while c lives (25 s more, to
    # t=60), then at full rate: 65 s left -> t=125; l2 and c are not slowed
    assert finish == {"l1": 125.0, "l2": 100.0, "c": 60.0}
    assert (result.squeezes, result.evictions, result.wasted_gpu_hours) == (1, 0, 0.0)
    assert [r.squeezes for r in result.records] == [1, 0, 0]


def test_evicted_work_loses_what_it_had_done() -> None:
    for low_memory, squeeze in ((None, True), ("16GiB", False)):
        result = _run_squeeze_day(low_memory, squeeze)  # memory too short, or switched off
        assert (result.squeezes, result.evictions) == (0, 1)
        (victim,) = [r for r in result.records if r.evictions]
        assert victim.wasted_s == 10.0  # it had run 10 s and starts over
        assert result.wasted_gpu_hours == pytest.approx(10.0 * 500 / 1000 / 3600)
        assert victim.finish_s is not None
        assert victim.finish_s > 100.0


def test_every_eviction_is_logged_and_counted_by_shape() -> None:
    """The log names preemptor and victim; the breakdown bounds what squeezing could replace."""
    result = _run_squeeze_day(None)  # memory too short: c evicts one low job
    (e,) = result.eviction_log
    assert (e.time_s, e.kind, e.preemptor) == (10.0, "preemption", "c")
    assert e.victim in {"l1", "l2"}
    shapes = evictions_by_shape(result)
    assert shapes["pairs"] == {"preemption fractional > fractional": 1}
    assert (shapes["squeezable_at_most"], shapes["ratio_at_least"]) == (1, 0.0)
    assert (shapes["victims"], shapes["repeat_victim_evictions"], shapes["most_per_victim"]) == (
        1,
        0,
        1,
    )


def test_whole_gpu_and_reclaim_evictions_are_not_squeezable() -> None:
    nodes = [gpu_node("n1", 2)]
    day = [
        work("a1", 0, 500, queue="a", priority=40),
        work("a2", 1, 500, queue="a", gpu=0.5, priority=40),
        work("a3", 5, 100, queue="a", priority=50),  # whole over the most recent: a2
        work("b1", 10, 100, queue="b"),  # reclaims a1
    ]
    result = replay(nodes, day, 2000, queues=("a", "b"), grace_s=30)
    assert [(e.kind, e.preemptor, e.victim) for e in result.eviction_log] == [
        ("preemption", "a3", "a2"),
        ("reclaim", "b1", "a1"),
    ]
    shapes = summarize_replay(result, 0.0)["evictions_by_shape"]
    assert shapes["pairs"] == {
        "preemption whole > fractional": 1,
        "reclaim whole > whole": 1,
    }
    assert (shapes["squeezable_at_most"], shapes["ratio_at_least"]) == (0, 1.0)
