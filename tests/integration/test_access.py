"""Who may submit what to which queue (issue 14, points 1 and 2; DESIGN.md section 5), on the
service in-process with two real local users (``fgpu-test-alice``, ``fgpu-test-bob``, and
the group ``fgpu-test-team`` that only alice is in). The end-to-end trial through the CLI as
those users is in ``test_multiuser.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.rules.errors import BadRequest, Forbidden, NotFoundError
from fgpu.server.service import Caller, Service
from fgpu.store import QueueConfig, Store
from fgpu.wire import QueueBody, SubmitRequest
from tests.localusers import ALICE, BOB, TEAM, ensure_users, uid_of

ROOT = Caller(0, admin=True)
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture(scope="module")
def users() -> tuple[Caller, Caller]:
    """(alice, bob) as callers who are not admins."""
    ensure_users()
    return Caller(uid_of(ALICE), admin=False), Caller(uid_of(BOB), admin=False)


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    service = Service.create(
        simulate_gpus="2xA100-40GB", state_dir=tmp_path, db=str(tmp_path / "fgpu.db")
    )
    yield service
    service.store.close()


def job(**kw: object) -> SubmitRequest:
    return SubmitRequest(command=SLEEP, gpu="0.5", **kw)  # type: ignore[arg-type]


def refused(svc: Service, caller: Caller, body: SubmitRequest) -> Forbidden:
    """The submission is refused with 403 and nothing is stored."""
    before = svc.list_workloads(include_done=True)
    with pytest.raises(Forbidden) as caught:
        svc.submit(caller, body)
    assert svc.list_workloads(include_done=True) == before
    return caught.value


# ------------------------------------------------------------------ 1. priority rules
@pytest.mark.parametrize(
    ("ask", "field", "words"),
    [
        pytest.param({"priority": "critical"}, "priority", "critical (125)", id="critical"),
        pytest.param({"priority": "high"}, "priority", "high (100)", id="high"),
        pytest.param({"priority": "1000"}, "priority", "1000", id="numeric-1000"),
        pytest.param({"priority": "51"}, "priority", "51", id="just-above-normal"),
        pytest.param(
            {"priority": "high", "preemptible": True}, "priority", "high (100)", id="high-prmt"
        ),
        pytest.param(
            {"preemptible": False}, "preemptible", "preemptible is false", id="non-preemptible"
        ),
    ],
)
def test_users_who_are_not_admins_submit_up_to_normal_and_preemptible_only(
    svc: Service, users: tuple[Caller, Caller], ask: dict[str, object], field: str, words: str
) -> None:
    _, bob = users
    error = refused(svc, bob, job(**ask))
    assert error.field == field
    assert words in error.reason
    assert "rule:" in error.reason
    assert "fgpu queue set default" in error.reason


def test_a_priority_that_breaks_both_rules_is_refused_once_naming_both(
    svc: Service, users: tuple[Caller, Caller]
) -> None:
    _, bob = users
    error = refused(svc, bob, job(priority="critical"))
    assert error.field == "priority"
    assert "users who are not admins submit up to the queue's max_priority" in error.reason
    assert "non-preemptible work" in error.reason
    assert "'fgpu queue set default --max-priority critical --nonpreemptible'" in error.reason
    assert "--max-priority 125" not in error.reason
    # after the admin does what it says, the same submission is taken
    default = next(q for q in svc.list_queues() if q.name == "default")
    body = QueueBody(
        name="default",
        quota=default.quota_milli / 1000,
        members=default.members,
        max_priority="critical",
        nonpreemptible=True,
    )
    svc.update_queue(ROOT, "default", body)
    assert svc.submit(bob, job(priority="critical")).priority == 125


@pytest.mark.parametrize("priority", ["very-low", "low", "normal", "50"])
def test_priorities_up_to_normal_are_anyones(
    svc: Service, users: tuple[Caller, Caller], priority: str
) -> None:
    _, bob = users
    view = svc.submit(bob, job(priority=priority))
    assert view.owner_uid == bob.uid
    assert view.preemptible


def test_admins_may_use_every_priority(svc: Service) -> None:
    critical = svc.submit(ROOT, job(priority="critical"))
    assert critical.priority == 125
    assert not critical.preemptible
    pinned = svc.submit(ROOT, job(preemptible=False))
    assert not pinned.preemptible


def test_a_queue_grants_its_members_more_priority_and_non_preemptible_work(
    svc: Service, users: tuple[Caller, Caller]
) -> None:
    alice, bob = users
    svc.create_queue(
        ROOT,
        QueueBody(
            name="serving", members=[BOB], max_priority="critical", nonpreemptible=True, quota=1
        ),
    )  # a quota: non-preemptible work starts only within it (never-fitting work is refused)
    view = svc.submit(bob, job(queue="serving", priority="critical"))
    assert (view.priority, view.preemptible) == (125, False)
    # the grant is the queue's: on the default queue bob is still held to normal
    assert refused(svc, bob, job(priority="critical")).field == "priority"
    # and a queue may allow a higher priority without non-preemptible work
    svc.create_queue(ROOT, QueueBody(name="urgent", members=[ALICE], max_priority="high"))
    error = refused(svc, alice, job(queue="urgent", priority="high"))
    assert error.field == "preemptible"
    assert "non-preemptible by default" in error.reason
    assert svc.submit(alice, job(queue="urgent", priority="high", preemptible=True)).priority == 100


# ------------------------------------------------------------------ 2. queue members
def test_a_queue_takes_work_only_from_its_members_and_admins(
    svc: Service, users: tuple[Caller, Caller]
) -> None:
    alice, bob = users
    created = svc.create_queue(ROOT, QueueBody(name="team-a", quota=1, members=[ALICE]))
    assert created.members == [ALICE]
    assert svc.submit(alice, job(queue="team-a")).queue == "team-a"
    assert svc.submit(ROOT, job(queue="team-a")).queue == "team-a"
    error = refused(svc, bob, job(queue="team-a"))
    assert error.field == "queue"
    assert f"uid {bob.uid} ({BOB}) is not a member of queue team-a" in error.reason
    assert f"--add-member {BOB}" in error.reason


def test_a_queue_without_members_takes_work_from_admins_only(
    svc: Service, users: tuple[Caller, Caller]
) -> None:
    alice, _ = users
    svc.create_queue(ROOT, QueueBody(name="closed"))
    error = refused(svc, alice, job(queue="closed"))
    assert "admins only" in error.reason
    assert svc.submit(ROOT, job(queue="closed")).queue == "closed"


def test_members_by_group_name_gid_and_uid(svc: Service, users: tuple[Caller, Caller]) -> None:
    import grp

    alice, bob = users
    svc.create_queue(ROOT, QueueBody(name="by-group", members=[f"@{TEAM}"]))
    assert svc.submit(alice, job(queue="by-group")).queue == "by-group"
    assert refused(svc, bob, job(queue="by-group")).field == "queue"
    gid = grp.getgrnam(TEAM).gr_gid
    svc.create_queue(ROOT, QueueBody(name="by-gid", members=[f"@{gid}"]))
    assert svc.submit(alice, job(queue="by-gid")).queue == "by-gid"
    assert refused(svc, bob, job(queue="by-gid")).field == "queue"
    svc.create_queue(ROOT, QueueBody(name="by-uid", members=[str(bob.uid)]))
    assert svc.submit(bob, job(queue="by-uid")).queue == "by-uid"
    assert refused(svc, alice, job(queue="by-uid")).field == "queue"


def test_the_default_queue_takes_everyone_until_an_admin_narrows_it(
    svc: Service, users: tuple[Caller, Caller]
) -> None:
    alice, bob = users
    (default,) = svc.list_queues()
    assert default.members == ["*"]
    assert svc.submit(bob, job()).queue == "default"
    body = QueueBody(name="default", quota=default.quota_milli / 1000, members=[ALICE])
    svc.update_queue(ROOT, "default", body)
    assert svc.submit(alice, job()).queue == "default"
    assert refused(svc, bob, job()).field == "queue"


def test_only_admins_manage_queues_and_their_members(
    svc: Service, users: tuple[Caller, Caller]
) -> None:
    alice, bob = users
    svc.create_queue(ROOT, QueueBody(name="team-a", members=[ALICE]))
    for attempt in (
        lambda: svc.update_queue(alice, "team-a", QueueBody(name="team-a", members=[ALICE, BOB])),
        lambda: svc.update_queue(bob, "team-a", QueueBody(name="team-a", members=["*"])),
        lambda: svc.create_queue(bob, QueueBody(name="mine", members=[BOB], max_priority=1000)),
    ):
        with pytest.raises(Forbidden, match="may not manage queues"):
            attempt()
    assert {q.name: q.members for q in svc.list_queues()}["team-a"] == [ALICE]


@pytest.mark.parametrize(
    ("members", "words"),
    [
        pytest.param(["no-such-user-here"], "no user or group no-such-user-here", id="user"),
        pytest.param(["@no-such-group-here"], "no user or group @no-such-group-here", id="group"),
        pytest.param(["al ice"], "is not a member", id="malformed"),
        pytest.param([ALICE, ALICE], "listed twice", id="twice"),
    ],
)
def test_member_lists_that_name_nobody_are_refused(
    svc: Service, users: tuple[Caller, Caller], members: list[str], words: str
) -> None:
    with pytest.raises(BadRequest, match=words) as caught:
        svc.create_queue(ROOT, QueueBody(name="typo", members=members))
    assert caught.value.field == "members"
    assert [q.name for q in svc.list_queues()] == ["default"]


def test_max_priority_is_checked(svc: Service) -> None:
    with pytest.raises(BadRequest) as caught:
        svc.create_queue(ROOT, QueueBody(name="q", max_priority="urgent"))
    assert caught.value.field == "max_priority"
    with pytest.raises(BadRequest, match="above 1000"):
        svc.create_queue(ROOT, QueueBody(name="q", max_priority=1001))


def test_queues_stored_before_members_existed_keep_admitting_everyone_at_normal(
    tmp_path: Path,
) -> None:
    """The migration that adds members fills ``*``, ``normal`` and no grant."""
    from fgpu.store.engine import make_engine, upgrade

    engine = make_engine(tmp_path / "old.db")
    upgrade(engine, "r0002")
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO queues VALUES ('old', NULL, 1000, 0, 0, NULL, NULL, NULL, 1.0, 0, 1, 1)"
        )
    engine.dispose()
    with Store.open(tmp_path / "old.db") as store:
        (old,) = store.list_queues()
        assert old.config == QueueConfig(
            "old",
            quota=old.config.quota,
            members=("*",),
            max_priority=50,
            nonpreemptible=False,
        )


def test_an_admin_cancels_another_users_array_by_its_name(
    svc: Service, users: tuple[Caller, Caller]
) -> None:
    """The name of bob's array means it for an admin too (trial finding: root was told to
    name its tasks); for alice it means nothing of hers, and bob's tasks stay."""
    alice, bob = users
    first = svc.submit(bob, job(array="0-2", name="sweep"))
    assert first.array is not None
    with pytest.raises(NotFoundError):
        svc.cancel(alice, "sweep")
    assert all(w.phase == "pending" for w in svc.list_workloads(include_done=True))
    done = svc.cancel(Caller(0, admin=True), "sweep")
    assert len(done.cancelled_tasks or []) == 3
    assert {w.phase for w in svc.list_workloads(include_done=True)} == {"cancelled"}


def test_a_group_change_counts_at_the_next_submission() -> None:
    """What the user database says of a caller is kept between submissions only while
    ``/etc/group`` and ``/etc/passwd`` are unchanged: a user added to a group is a member
    of queues listing it at once."""
    import secrets
    import subprocess

    from fgpu.server.access import identity_of

    ensure_users()
    alice = uid_of(ALICE)
    group = f"fgpu-t-{secrets.token_hex(3)}"
    assert group not in identity_of(alice).groups  # read, and kept while nothing changes
    subprocess.run(["groupadd", group], check=True)
    try:
        subprocess.run(["usermod", "-a", "-G", group, ALICE], check=True)
        assert group in identity_of(alice).groups
    finally:
        subprocess.run(["groupdel", group], check=True)
    assert group not in identity_of(alice).groups
