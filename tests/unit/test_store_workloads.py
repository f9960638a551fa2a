"""Workload lifecycle in the store: each transition, its event, and the wrong ones refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fgpu.model.types import Allocation, InvalidRequestError, Request
from fgpu.sched.workload import Hold, Workload
from fgpu.store import (
    LOST_REASON,
    NotFound,
    PermissionDenied,
    Store,
    StoreConflict,
    WorkloadRecord,
    to_core,
)
from fgpu.store.records import StoredAllocation, StoredMigInstance, StoredMigRequest
from fgpu.users import user_text
from tests.unit.test_store_support import (
    T0,
    allocation_for,
    half_gpu,
    open_store,
    snapshot,
    submit,
    with_default_queue,
)

CANCELLED_BY = f"cancelled by {user_text(1000)}"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with with_default_queue(open_store(tmp_path / "fgpu.db")) as opened:
        yield opened


def kinds(store: Store, workload_id: str) -> list[str]:
    return [e.kind for e in store.events(workload_id)]


def run(store: Store, record: WorkloadRecord, **kwargs: object) -> WorkloadRecord:
    return store.mark_running(record.id, allocation_for(record.request), **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------- happy paths
def test_submit_stores_a_pending_workload_with_an_event(store: Store) -> None:
    request = Request(
        cpu_milli=1500,
        memory_mib=2048,
        gpu_count=2,
        gpu_milli=300,
        gpu_memory_mib=12288,
        gpu_models=frozenset({"A100-80GB", "H100-80GB"}),
    )
    record = store.submit(
        owner_uid=1000,
        queue="default",
        request=request,
        argv=["python", "train.py", "--lr", "0.1"],
        name="train",
        priority="high",
        preemptible=True,
        shell=False,
        cwd="/home/ada",
        env={"PATH": "/usr/bin", "HOME": "/home/ada"},
        grace_s=5,
    )
    assert record.id == "w0001"
    assert (record.name, record.owner_uid, record.queue, record.phase) == (
        "train",
        1000,
        "default",
        "pending",
    )
    assert (record.priority, record.preemptible, record.grace_s) == (100, True, 5.0)
    assert record.request == request
    assert record.argv == ("python", "train.py", "--lr", "0.1")
    assert record.env == {"PATH": "/usr/bin", "HOME": "/home/ada"}
    assert (record.restarts, record.allocation, record.pid) == (0, None, None)
    assert store.get(record.id) == record
    [event] = store.events(record.id)
    assert (event.kind, event.time, event.message) == (
        "submitted",
        record.submitted_at,
        "submitted to queue default",
    )


def test_submit_names_the_workload_after_its_id_by_default(store: Store) -> None:
    assert submit(store).name == "w0001"


def test_mark_running_records_allocation_process_and_logs(store: Store) -> None:
    w = submit(store, request=Request(gpu_count=2, gpu_milli=1000))
    placed = Allocation(3, "gpu-box", (1, 2), (1000, 1000), (81920, 81920), 0, 0)
    running = store.mark_running(
        w.id,
        placed,
        gpu_uuids=["GPU-a", "GPU-b"],
        pid=4242,
        create_time=T0 + 0.5,
        stdout_path="/logs/w.out",
        stderr_path="/logs/w.err",
        reason="placed by fgd",
    )
    assert running.phase == "running"
    assert running.allocation == StoredAllocation(
        "gpu-box", 3, (1, 2), ("GPU-a", "GPU-b"), (1000, 1000), (81920, 81920), 0, 0
    )
    assert (running.pid, running.create_time) == (4242, T0 + 0.5)
    assert (running.stdout_path, running.stderr_path) == ("/logs/w.out", "/logs/w.err")
    assert running.started_at is not None
    assert running.started_at > w.submitted_at
    assert running.reason == "placed by fgd"
    assert store.get(w.id) == running
    last = store.events(w.id)[-1]
    assert (last.kind, last.reason) == ("started", "placed by fgd")
    # the GPUs as fgpu ls names them (issue 25, point 6)
    assert last.message == "started on gpu-box/1: 1 (80GiB), gpu-box/2: 1 (80GiB)"


def test_attach_process_after_the_placement_is_committed(store: Store) -> None:
    w = run(store, submit(store))
    assert w.pid is None
    attached = store.attach_process(w.id, 77, T0 + 3, stdout_path="/l/o", stderr_path="/l/e")
    assert (attached.pid, attached.create_time, attached.stdout_path) == (77, T0 + 3, "/l/o")
    assert kinds(store, w.id) == ["submitted", "started", "process"]


def test_pause_and_resume(store: Store) -> None:
    w = run(store, submit(store))
    assert store.mark_paused(w.id, "critical workload busy on GPU 0").phase == "paused"
    resumed = store.mark_resumed(w.id, "critical workload idle")
    assert (resumed.phase, resumed.reason) == ("running", "critical workload idle")
    assert resumed.allocation == w.allocation
    assert kinds(store, w.id) == ["submitted", "started", "paused", "resumed"]


def test_squeeze_and_release_are_stored_with_events_and_reach_the_core(store: Store) -> None:
    w = run(store, submit(store, priority="low"))
    squeezed = store.mark_squeezed(w.id, ("crit-1",), "squeezed by crit-1")
    assert squeezed.squeezed_by == ("crit-1",)
    core = squeezed.to_core()
    assert (core.squeezed, core.squeezed_by) == (True, ("crit-1",))
    again = store.mark_squeezed(w.id, ("crit-1", "crit-2"), "also by crit-2")
    assert store.get(w.id).squeezed_by == ("crit-1", "crit-2")
    assert again.phase == "running"  # the phase is the governor's; a squeeze keeps it
    released = store.mark_squeezed(w.id, None, "compute returned")
    assert released.squeezed_by is None
    assert released.to_core().squeezed is False
    assert kinds(store, w.id) == ["submitted", "started", "squeezed", "squeezed", "released"]
    # bad input: a workload cannot squeeze itself; a pending one cannot be squeezed
    with pytest.raises(InvalidRequestError, match="squeezed_by"):
        store.mark_squeezed(w.id, (w.id,), "self")
    pending = submit(store)
    with pytest.raises(StoreConflict):
        store.mark_squeezed(pending.id, ("x",), "not running")


def test_a_squeezed_workload_stops_being_squeezed_when_preempted_or_finished(
    store: Store,
) -> None:
    w = run(store, submit(store), pid=10, create_time=T0)
    store.mark_squeezed(w.id, ("crit-1",), "squeezed by crit-1")
    store.mark_stopping(w.id, "memory needed")
    assert store.mark_preempted(w.id, "memory needed").squeezed_by is None
    v = run(store, submit(store), pid=11, create_time=T0)
    store.mark_squeezed(v.id, ("crit-1",), "squeezed by crit-1")
    assert store.mark_finished(v.id, "succeeded", exit_code=0).squeezed_by is None


def test_preemption_returns_the_workload_to_pending(store: Store) -> None:
    w = run(store, submit(store), pid=10, create_time=T0)
    stopping = store.mark_stopping(w.id, "preempted by w0009 (priority)")
    assert stopping.stop_requested_at is not None
    assert stopping.phase == "running"
    assert to_core(stopping).terminating
    back = store.mark_preempted(w.id, "preempted by w0009 (priority)")
    assert (back.phase, back.restarts) == ("pending", 1)
    assert (back.allocation, back.pid, back.create_time, back.started_at) == (
        None,
        None,
        None,
        None,
    )
    assert back.stop_requested_at is None
    assert kinds(store, w.id) == ["submitted", "started", "stopping", "preempted"]
    again = run(store, back)
    assert again.phase == "running"
    assert store.mark_preempted(again.id, "reclaim by team-b").restarts == 2


@pytest.mark.parametrize(
    ("phase", "exit_code", "reason", "stored_reason"),
    [
        pytest.param("succeeded", 0, "", "exit code 0", id="succeeded"),
        pytest.param("failed", 3, "", "exit code 3", id="failed"),
        pytest.param("failed", None, "over its memory quota", "over its memory quota", id="oom"),
        pytest.param(
            "cancelled",
            -15,
            f"cancelled by {user_text(1000)}",
            f"cancelled by {user_text(1000)}",
            id="cxl",
        ),
    ],
)
def test_mark_finished(
    store: Store, phase: str, exit_code: int | None, reason: str, stored_reason: str
) -> None:
    w = run(store, submit(store))
    done = store.mark_finished(w.id, phase, exit_code=exit_code, reason=reason)
    assert (done.phase, done.exit_code, done.reason) == (phase, exit_code, stored_reason)
    assert done.finished_at is not None
    assert done.allocation == w.allocation  # kept as history
    assert kinds(store, w.id)[-1] == phase
    assert to_core(done).allocation is None


def test_mark_finished_refuses_a_phase_that_is_not_final(store: Store) -> None:
    w = run(store, submit(store))
    with pytest.raises(InvalidRequestError, match="phase"):
        store.mark_finished(w.id, "pending")
    assert store.get(w.id) == w


def test_cancel_pending_is_immediate(store: Store) -> None:
    w = submit(store, owner=1000)
    cancelled = store.cancel(w.id, by_uid=1000)
    assert (cancelled.phase, cancelled.cancelled_by) == ("cancelled", 1000)
    assert cancelled.reason == f"cancelled by {user_text(1000)}"
    assert kinds(store, w.id) == ["submitted", "cancelled"]


def test_cancel_running_asks_the_caller_to_stop_it(store: Store) -> None:
    w = run(store, submit(store, owner=1000), pid=99, create_time=T0)
    asked = store.cancel(w.id, by_uid=1000)
    assert (asked.phase, asked.pid, asked.cancelled_by) == ("running", 99, 1000)
    assert asked.stop_requested_at is not None
    assert store.cancel(w.id, by_uid=1000) == asked  # asking twice changes nothing
    done = store.mark_finished(w.id, "cancelled", exit_code=-15, reason="cancelled by uid 1000")
    assert done.phase == "cancelled"
    assert kinds(store, w.id) == ["submitted", "started", "cancel-requested", "cancelled"]


def test_admin_may_cancel_anyones_workload(store: Store) -> None:
    w = submit(store, owner=1000)
    assert store.cancel(w.id, by_uid=0, admin=True).phase == "cancelled"


def test_cancel_by_another_user_is_refused_and_changes_nothing(store: Store) -> None:
    w = submit(store, owner=1000)
    before = snapshot(store, w.id)
    with pytest.raises(PermissionDenied, match=f"{user_text(1001)} may not cancel"):
        store.cancel(w.id, by_uid=1001)
    assert snapshot(store, w.id) == before


def test_mark_lost(store: Store) -> None:
    w = run(store, submit(store), pid=5, create_time=T0)
    lost = store.mark_lost(w.id)
    assert (lost.phase, lost.reason) == ("failed", LOST_REASON)
    assert store.events(w.id)[-1].reason == LOST_REASON


def test_mark_lost_after_a_cancel_request_ends_cancelled(store: Store) -> None:
    w = run(store, submit(store))
    store.cancel(w.id, by_uid=1000)
    assert store.mark_lost(w.id).phase == "cancelled"


def test_restart_safety_helpers(store: Store) -> None:
    pending = submit(store)
    running = run(store, submit(store), pid=11, create_time=T0)
    paused = run(store, submit(store), pid=12, create_time=T0)
    paused = store.mark_paused(paused.id, "priority")
    finished = run(store, submit(store))
    store.mark_finished(finished.id, "succeeded", exit_code=0)
    assert [r.id for r in store.running_records()] == [running.id, paused.id]
    store.mark_lost(paused.id)
    assert [r.id for r in store.running_records()] == [running.id]
    assert store.get(pending.id).phase == "pending"


def test_unknown_workload(store: Store) -> None:
    with pytest.raises(NotFound, match="no workload 'nope'"):
        store.get("nope")
    with pytest.raises(NotFound):
        store.mark_finished("nope", "failed")
    with pytest.raises(NotFound):
        store.cancel("nope", by_uid=0, admin=True)


# ------------------------------------------------------------------- bad submissions
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        pytest.param({"queue": "nope"}, "queue", id="unknown-queue"),
        pytest.param({"argv": []}, "argv", id="empty-command"),
        pytest.param({"argv": [""]}, "argv", id="blank-command"),
        pytest.param({"argv": "sleep 1"}, "argv", id="argv-string"),
        pytest.param({"argv": ["sleep", 1]}, "argv", id="argv-int"),
        pytest.param({"owner_uid": -1}, "owner_uid", id="negative-uid"),
        pytest.param({"priority": "urgent"}, "priority", id="unknown-priority"),
        pytest.param({"priority": -5}, "priority", id="negative-priority"),
        pytest.param({"grace_s": float("nan")}, "grace_s", id="nan-grace"),
        pytest.param({"grace_s": -1}, "grace_s", id="negative-grace"),
        pytest.param({"env": {"A": 1}}, "env", id="env-value"),
        pytest.param({"env": {"A=B": "1"}}, "env", id="env-name"),
        pytest.param({"name": "x" * 200}, "name", id="long-name"),
        pytest.param({"request": "0.5"}, "request", id="request-string"),
        pytest.param({"preemptible": "yes"}, "preemptible", id="preemptible-string"),
    ],
)
def test_bad_submission_stores_nothing(
    store: Store, changes: dict[str, object], field: str
) -> None:
    fields: dict[str, object] = {
        "owner_uid": 1000,
        "queue": "default",
        "request": half_gpu(),
        "argv": ["sleep", "1"],
    }
    fields.update(changes)
    before = snapshot(store)
    with pytest.raises(InvalidRequestError) as caught:
        store.submit(**fields)  # type: ignore[arg-type]
    assert caught.value.field.startswith(field)
    assert snapshot(store) == before


def test_mark_running_refuses_an_allocation_that_does_not_match(store: Store) -> None:
    w = submit(store)  # one GPU
    two = Allocation(0, "local", (0, 1), (500, 500), (100, 100), 0, 0)
    before = snapshot(store, w.id)
    with pytest.raises(InvalidRequestError, match="2 GPU"):
        store.mark_running(w.id, two)
    with pytest.raises(InvalidRequestError, match="UUID"):
        store.mark_running(w.id, allocation_for(w.request), gpu_uuids=["a", "b"])
    assert snapshot(store, w.id) == before


# --------------------------------------------------------------- wrong transitions
@dataclass(frozen=True)
class Op:
    name: str
    call: Callable[[Store, str], object]


OPS = [
    Op("mark_running", lambda s, i: s.mark_running(i, allocation_for(half_gpu()))),
    Op("attach_process", lambda s, i: s.attach_process(i, 321, T0)),
    Op("mark_paused", lambda s, i: s.mark_paused(i, "busy")),
    Op("mark_resumed", lambda s, i: s.mark_resumed(i, "idle")),
    Op("mark_stopping", lambda s, i: s.mark_stopping(i, "reclaim")),
    Op("mark_preempted", lambda s, i: s.mark_preempted(i, "reclaim")),
    Op("mark_finished", lambda s, i: s.mark_finished(i, "succeeded", exit_code=0)),
    Op("cancel", lambda s, i: s.cancel(i, by_uid=1000)),
    Op("mark_lost", lambda s, i: s.mark_lost(i)),
]


def _pending(s: Store) -> WorkloadRecord:
    return submit(s)


def _running(s: Store) -> WorkloadRecord:
    return run(s, submit(s))


def _with_process(s: Store) -> WorkloadRecord:
    return run(s, submit(s), pid=55, create_time=T0)


def _paused(s: Store) -> WorkloadRecord:
    return s.mark_paused(_running(s).id, "busy")


def _stopping(s: Store) -> WorkloadRecord:
    return s.mark_stopping(_running(s).id, "reclaim")


def _cancel_requested(s: Store) -> WorkloadRecord:
    return s.cancel(_running(s).id, by_uid=1000)


def _finished(phase: str) -> Callable[[Store], WorkloadRecord]:
    def make(s: Store) -> WorkloadRecord:
        if phase == "cancelled":
            return s.cancel(submit(s).id, by_uid=1000)
        return s.mark_finished(_running(s).id, phase)

    return make


STATES: dict[str, Callable[[Store], WorkloadRecord]] = {
    "pending": _pending,
    "running": _running,
    "running+process": _with_process,
    "paused": _paused,
    "stopping": _stopping,
    "cancel-requested": _cancel_requested,
    "succeeded": _finished("succeeded"),
    "failed": _finished("failed"),
    "cancelled": _finished("cancelled"),
}

HOLDING = {"running", "running+process", "paused", "stopping", "cancel-requested"}
ALLOWED: dict[str, set[str]] = {
    "mark_running": {"pending"},
    "attach_process": HOLDING - {"running+process"},
    "mark_paused": HOLDING - {"paused"},
    "mark_resumed": {"paused"},
    "mark_stopping": {"running", "running+process", "paused"},
    "mark_preempted": HOLDING - {"cancel-requested"},
    "mark_finished": HOLDING,
    "cancel": {"pending", *HOLDING},
    "mark_lost": HOLDING,
}

WRONG = [
    pytest.param(state, op, id=f"{op.name}-from-{state}")
    for op in OPS
    for state in STATES
    if state not in ALLOWED[op.name]
]
RIGHT = [
    pytest.param(state, op, id=f"{op.name}-from-{state}")
    for op in OPS
    for state in STATES
    if state in ALLOWED[op.name]
]


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    path = tmp_path_factory.mktemp("transitions") / "fgpu.db"
    with with_default_queue(open_store(path)) as opened:
        yield opened


@pytest.mark.parametrize(("state", "op"), WRONG)
def test_wrong_transition_raises_and_changes_nothing(
    shared_store: Store, state: str, op: Op
) -> None:
    record = STATES[state](shared_store)
    before = snapshot(shared_store, record.id)
    with pytest.raises(StoreConflict, match=record.id):
        op.call(shared_store, record.id)
    assert snapshot(shared_store, record.id) == before


@pytest.mark.parametrize(("state", "op"), RIGHT)
def test_allowed_transition_succeeds(shared_store: Store, state: str, op: Op) -> None:
    record = STATES[state](shared_store)
    op.call(shared_store, record.id)


# --------------------------------------------------------------------- listing, events
def test_list_filters_and_order(store: Store) -> None:
    a = submit(store, owner=1)
    b = run(store, submit(store, owner=2))
    c = submit(store, owner=1)
    assert [r.id for r in store.list()] == [a.id, b.id, c.id]
    assert [r.id for r in store.list(["pending"])] == [a.id, c.id]
    assert [r.id for r in store.list_workloads(owner_uid=2)] == [b.id]
    assert [r.id for r in store.list_workloads(queue="other")] == []


def test_events_filters(store: Store) -> None:
    a = submit(store)
    b = submit(store)
    run(store, a)
    everything = store.events()
    assert [e.kind for e in everything] == ["queue-created", "submitted", "submitted", "started"]
    assert [e.id for e in everything] == sorted(e.id for e in everything)
    assert [e.kind for e in store.events(b.id)] == ["submitted"]
    third = everything[2]
    assert store.events(since=third.time) == everything[2:]
    assert store.events(after_id=third.id) == everything[3:]
    assert store.events(limit=2) == everything[:2]
    assert store.events(a.id, after_id=everything[1].id) == [everything[3]]


# ---------------------------------------------------------------------------- holds
def test_holds_survive_a_reopen_and_are_replaced_as_a_whole(tmp_path: Path) -> None:
    path = tmp_path / "fgpu.db"
    with with_default_queue(open_store(path)) as store:
        a, b, victim = submit(store), submit(store), run(store, submit(store))
        holds = {
            a.id: Hold(a.id, "local", (0, 1), (victim.id,), T0 + 5),
            b.id: Hold(b.id, "local", (), (), T0 + 6),
        }
        store.save_holds(holds)
    with Store.open(path) as reopened:
        assert reopened.load_holds() == holds
        reopened.save_holds({b.id: holds[b.id]})
        assert reopened.load_holds() == {b.id: holds[b.id]}
        reopened.save_holds({})
        assert reopened.load_holds() == {}


def test_a_hold_ends_when_its_workload_starts_or_is_cancelled(store: Store) -> None:
    a, b = submit(store), submit(store)
    store.save_holds({w.id: Hold(w.id, "local", (0,), (), T0) for w in (a, b)})
    run(store, a)
    store.cancel(b.id, by_uid=1000)
    assert store.load_holds() == {}


def test_bad_holds_store_nothing(store: Store) -> None:
    a = submit(store)
    store.save_holds({a.id: Hold(a.id, "local", (0,), (), T0)})
    before = store.load_holds()
    with pytest.raises(NotFound, match="ghost"):
        store.save_holds({"ghost": Hold("ghost", "local", (0,), (), T0)})
    with pytest.raises(InvalidRequestError, match="holds"):
        store.save_holds({a.id: Hold("other", "local", (0,), (), T0)})
    assert store.load_holds() == before


# ------------------------------------------------------------------------- to_core
def test_to_core_round_trip(store: Store) -> None:
    request = Request(
        cpu_milli=500,
        memory_mib=1024,
        gpu_count=1,
        gpu_memory_mib=5120,
        gpu_models=frozenset({"A100-40GB"}),
    )
    pending = submit(store, request=request, priority="low")
    assert to_core(pending) == Workload(
        id=pending.id,
        queue="default",
        request=request,
        priority=40,
        submitted_at=pending.submitted_at,
        preemptible=None,
        user=str(pending.owner_uid),  # whose allocation the queue order weighs
    )
    placed = Allocation(2, "box", (3,), (125,), (5120,), 500, 1024)
    running = store.mark_running(pending.id, placed)
    core = store.to_core(running)
    assert core == Workload(
        id=pending.id,
        queue="default",
        request=request,
        priority=40,
        submitted_at=pending.submitted_at,
        allocation=placed,
        started_at=running.started_at,
        user=str(pending.owner_uid),
    )
    assert core.is_preemptible
    assert core.is_running
    assert to_core(running, {"box": 7}).allocation == Allocation(
        7, "box", (3,), (125,), (5120,), 500, 1024
    )
    assert [w.id for w in store.core_workloads()] == [pending.id]
    store.mark_finished(pending.id, "succeeded", exit_code=0)
    assert store.core_workloads() == []


def test_record_event_stores_a_note_without_a_state_change(store: Store) -> None:
    w = submit(store)
    store.record_event(w.id, "guard", "memory", "used 900 MiB of 1024 MiB")
    last = store.events(w.id)[-1]
    assert (last.kind, last.reason, last.message) == ("guard", "memory", "used 900 MiB of 1024 MiB")
    assert store.get(w.id) == w  # nothing else changed


@pytest.mark.parametrize(
    ("workload_id", "kind", "reason", "error"),
    [
        ("nope", "guard", "memory", StoreConflict),
        (None, "", "memory", InvalidRequestError),
        (None, "k" * 33, "memory", InvalidRequestError),
        (None, "guard", "", InvalidRequestError),
    ],
    ids=["unknown-workload", "empty-kind", "long-kind", "empty-reason"],
)
def test_record_event_refuses_bad_input(
    store: Store, workload_id: str | None, kind: str, reason: str, error: type[Exception]
) -> None:
    before = store.events()
    with pytest.raises(error):
        store.record_event(workload_id, kind, reason, "message")
    assert store.events() == before


# ------------------------------------------------------------------------ MIG workloads
MIG_ONE = Request(gpu_count=1, gpu_milli=428, gpu_memory_mib=40192)
MIG_ALLOCATION = Allocation(-1, "vm/mig", (1,), (428,), (40192,), 0, 0)
MIG_INSTANCE = StoredMigInstance(1, "GPU-b", "3g.40gb", 4, "MIG-x")


def test_a_mig_workload_keeps_its_request_and_its_instance(tmp_path: Path) -> None:
    with with_default_queue(open_store(tmp_path / "fgpu.db")) as store:
        asked = StoredMigRequest(profile="3g.40gb")
        record = store.submit(
            owner_uid=1, queue="default", request=MIG_ONE, argv=["x"], mig_request=asked
        )
        by_memory = store.submit(
            owner_uid=1,
            queue="default",
            request=Request(gpu_count=1, gpu_memory_mib=18432),
            argv=["x"],
            mig_request=StoredMigRequest(memory_mib=18432),
        )
        assert record.mig_request == asked
        running = store.mark_running(
            record.id, MIG_ALLOCATION, gpu_uuids=["GPU-b"], mig=MIG_INSTANCE
        )
        assert running.allocation is not None
        assert running.allocation.mig == MIG_INSTANCE
        assert running.allocation.gpu_milli == (428,)
        (started,) = [e for e in store.events(record.id) if e.kind == "started"]
        assert started.message.endswith("on MIG 3g.40gb@4 of GPU 1 (MIG-x)")
    with open_store(tmp_path / "fgpu.db") as again:  # read back from the database
        assert again.get(record.id) == running
        assert again.get(by_memory.id).mig_request == StoredMigRequest(memory_mib=18432)
        plain = again.get(record.id).allocation
        assert plain is not None
        assert plain.to_json()["mig"] == MIG_INSTANCE.to_json()


def test_a_mig_instance_goes_only_with_a_mig_workload(store: Store) -> None:
    share = submit(store)
    mig = store.submit(
        owner_uid=1,
        queue="default",
        request=MIG_ONE,
        argv=["x"],
        mig_request=StoredMigRequest(profile="3g.40gb"),
    )
    with pytest.raises(InvalidRequestError, match="needs MIG instance"):
        store.mark_running(mig.id, MIG_ALLOCATION, gpu_uuids=["GPU-b"])
    with pytest.raises(InvalidRequestError, match="is not a MIG workload"):
        run(store, share, mig=MIG_INSTANCE)
    assert [store.get(w.id).phase for w in (share, mig)] == ["pending", "pending"]


@pytest.mark.parametrize(
    ("asked", "wanted", "field"),
    [
        (StoredMigRequest(), MIG_ONE, "mig_request"),
        (StoredMigRequest("3g.40gb", 1024), MIG_ONE, "mig_request"),
        (StoredMigRequest(" "), MIG_ONE, "mig_request.profile"),
        (StoredMigRequest(memory_mib=0), MIG_ONE, "mig_request.memory_mib"),
        (
            StoredMigRequest("3g.40gb"),
            Request(gpu_count=2, gpu_milli=500),
            "request.gpu_count",
        ),
    ],
    ids=["neither", "both", "blank-profile", "no-memory", "two-gpus"],
)
def test_a_bad_mig_request_stores_nothing(
    store: Store, asked: StoredMigRequest, wanted: Request, field: str
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        store.submit(owner_uid=1, queue="default", request=wanted, argv=["x"], mig_request=asked)
    assert caught.value.field == field
    assert store.list_workloads() == []
