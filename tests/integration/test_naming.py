"""Names and id prefixes where an id goes (issue "Everyday use", point 1): the service
in-process on a real SQLite store, its loop not started (nothing is launched)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.rules.errors import BadRequest, Conflict, Forbidden, NotFoundError
from fgpu.server.naming import base_name, unique_name
from fgpu.server.service import Caller, Service
from fgpu.wire import SubmitRequest

ME = Caller(os.getuid(), admin=False)
OTHER = Caller(os.getuid() + 4242, admin=False)


def job(*command: str, name: str | None = None) -> SubmitRequest:
    return SubmitRequest(command=list(command), gpu="0.1", name=name, cwd="/")


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    service = Service.create(
        simulate_gpus="1xA100-40GB", state_dir=tmp_path, db=str(tmp_path / "fgpu.db")
    )
    try:
        yield service
    finally:
        service.store.close()
        if service._db_claim is not None:
            service._db_claim.release()
        if service._state_lock is not None:
            service._state_lock.close()


@pytest.mark.parametrize(
    ("argv", "shell", "expected"),
    [
        (["sleep", "30"], False, "sleep"),
        (["/usr/bin/python3", "train.py", "--epochs", "3"], False, "train"),
        (["python3.11", "-u", "scripts/serve_model.py"], False, "serve_model"),
        (["python", "-m", "pkg.trainer", "--x"], False, "trainer"),
        (["python", "-c", "print(1)"], False, "python"),
        (["bash", "run.sh"], False, "run"),
        (["./my job!"], False, "my-job"),
        (["torchrun --nproc 2 train.py"], True, "torchrun"),
        (["!!!"], False, "workload"),
    ],
)
def test_the_default_name_comes_from_the_command(
    argv: list[str], shell: bool, expected: str
) -> None:
    assert base_name(argv, shell) == expected


def test_unique_name_adds_the_first_free_number_within_the_limit() -> None:
    assert unique_name("train", [], 128) == "train"
    assert unique_name("train", ["train", "train-2"], 128) == "train-3"
    assert unique_name("abcdef", ["abcdef"], 6) == "abcd-2"


def test_default_names_are_unique_among_the_owners_active_workloads(svc: Service) -> None:
    names = [svc.submit(ME, job("sleep", "30")).name for _ in range(3)]
    assert names == ["sleep", "sleep-2", "sleep-3"]
    # another user's workloads do not take a user's names
    assert svc.submit(OTHER, job("sleep", "30")).name == "sleep"
    # a finished workload's name is free again: given by hand, or as the base name
    svc.cancel(ME, "sleep-2")
    assert svc.submit(ME, job("sleep", "30", name="sleep-2")).name == "sleep-2"
    svc.cancel(ME, "sleep")
    assert svc.submit(ME, job("sleep", "30")).name == "sleep"
    # a default name goes on after the last one given (an index lookup, not a read of
    # every active workload of the owner: issue 27), and never takes one in use
    assert svc.submit(ME, job("sleep", "30")).name == "sleep-4"
    active = [
        w.name
        for w in svc.list_workloads()
        if w.owner_uid == ME.uid and w.phase in ("pending", "running")
    ]
    assert len(active) == len(set(active))


def test_a_default_name_after_a_restart_is_the_first_free_one(svc: Service) -> None:
    names = [svc.submit(ME, job("sleep", "30")).name for _ in range(4)]
    svc.cancel(ME, "sleep-2")
    svc._name_picker = None  # what a restart forgets
    assert names == ["sleep", "sleep-2", "sleep-3", "sleep-4"]
    assert svc.submit(ME, job("sleep", "30")).name == "sleep-2"
    assert svc.submit(ME, job("sleep", "30")).name == "sleep-5"


def test_a_given_name_that_an_active_workload_has_is_refused_with_its_id(
    svc: Service,
) -> None:
    first = svc.submit(ME, job("sleep", "30", name="train-a"))
    with pytest.raises(Conflict) as refused:
        svc.submit(ME, job("sleep", "30", name="train-a"))
    assert refused.value.field == "name"
    assert first.id in refused.value.reason
    assert "train-a" in refused.value.reason
    assert len(svc.list_workloads()) == 1  # nothing half-written
    assert svc.submit(OTHER, job("sleep", "30", name="train-a")).name == "train-a"


def test_a_name_or_a_unique_id_prefix_works_wherever_an_id_does(svc: Service) -> None:
    view = svc.submit(ME, job("python3", "train.py", name="train-a"))
    assert svc.get_workload("train-a", ME).id == view.id
    assert svc.get_workload(view.id[:5], ME).id == view.id
    assert svc.log_path(ME, "train-a", "stdout") == svc.log_dir / view.id / "stdout.log"
    assert svc.cancel(ME, "train-a").id == view.id
    # a finished workload is still found by its name (its logs, its description)
    assert svc.get_workload("train-a", ME).phase == "cancelled"


def test_the_callers_own_name_comes_before_another_users(svc: Service) -> None:
    theirs = svc.submit(OTHER, job("sleep", "30", name="shared"))
    mine = svc.submit(ME, job("sleep", "30", name="shared"))
    assert svc.get_workload("shared", ME).id == mine.id
    assert svc.get_workload("shared", OTHER).id == theirs.id
    # a third user sees two of that name: refused, both listed
    third = Caller(os.getuid() + 999, admin=False)
    with pytest.raises(BadRequest) as refused:
        svc.get_workload("shared", third)
    assert mine.id in refused.value.reason
    assert theirs.id in refused.value.reason
    # a name never lets one user act on another's work
    with pytest.raises(Forbidden):
        svc.cancel(third, theirs.id)


def test_an_ambiguous_prefix_is_refused_with_the_candidates_and_nothing_happens(
    svc: Service,
) -> None:
    views = [svc.submit(ME, job("sleep", "30")) for _ in range(40)]
    # 40 ids of 8 hex digits: some first digit is shared
    first_digits = [v.id[0] for v in views]
    shared = next(d for d in first_digits if first_digits.count(d) > 1)
    candidates = [v.id for v in views if v.id.startswith(shared)]
    with pytest.raises(BadRequest) as refused:
        svc.cancel(ME, shared)
    assert refused.value.field == "id"
    assert "give the full id" in refused.value.reason
    for candidate in candidates[:10]:
        assert candidate in refused.value.reason
    assert all(w.phase == "pending" for w in svc.list_workloads())
    with pytest.raises(NotFoundError) as missing:
        svc.get_workload("no-such-thing", ME)
    assert "no-such-thing" in missing.value.reason


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("   ", "'   ' is only white space"),
        ("evil\u202etxt.exe", "the format character U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("a\u200bb", "the format character U+200B ZERO WIDTH SPACE"),
        ("two\u2028lines", "the separator character U+2028 LINE SEPARATOR"),
        ("par\u2029a", "the separator character U+2029 PARAGRAPH SEPARATOR"),
        ("bell\x07", "the control character '\\x07'"),
        ("c1\x9b31m", "the control character '\\x9b'"),
        ("--all", "'--all' starts with '-'"),
        ("x" * 129, "129 characters; the limit is 128"),
        ("a/b", "'a/b' contains '/'"),
        (".", "'.' is a path step"),
        ("..", "'..' is a path step"),
    ],
)
def test_names_that_could_not_be_listed_or_typed_back_are_refused(
    svc: Service, name: str, reason: str
) -> None:
    # the rules layer (shared with the webhook) refuses them for any API client, not only
    # the CLI; nothing is stored
    with pytest.raises(BadRequest) as refused:
        svc.submit(ME, job("sleep", "30", name=name))
    assert refused.value.field == "name"
    assert reason in refused.value.reason
    assert len(refused.value.reason) < 100  # a long value is never echoed whole
    assert svc.list_workloads() == []


def test_a_name_with_inner_spaces_and_other_scripts_is_kept(svc: Service) -> None:
    assert svc.submit(ME, job("sleep", "30", name="résumé a-1 训练")).name == "résumé a-1 训练"


def test_a_submissions_name_check_reads_the_index_not_the_owners_backlog(
    svc: Service,
) -> None:
    """Issue 27: each submission read every active workload of its owner to check the name
    (766 ms at 9,900 queued). Now each query of a submission on ``workloads`` is a search of
    an index (the ``(owner_uid, phase, name)`` one for the owner's workloads) returning at
    most a row per name asked about (the name, or a default name and its next suffix),
    whatever the backlog."""
    from sqlalchemy import event

    for _ in range(300):
        svc.submit(ME, job("sleep", "30"))
    engine = svc.store.engine
    seen: list[tuple[str, object]] = []

    def capture(*args: object) -> None:
        statement, parameters = str(args[2]), args[3]
        if statement.lstrip().upper().startswith("SELECT") and "FROM workloads" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        svc.submit(ME, job("sleep", "30", name="train-a"))  # a given name
        svc.submit(ME, job("sleep", "30"))  # a default name, sleep-301
        with pytest.raises(Conflict, match="train-a"):
            svc.submit(ME, job("sleep", "30", name="train-a"))
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert seen, "no query on workloads seen"
    with engine.connect() as connection:
        for statement, parameters in seen:
            plan = " ".join(
                str(row[-1])
                for row in connection.exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + statement,
                    parameters,  # type: ignore[arg-type]
                )
            )
            assert "SCAN" not in plan, (statement, plan)
            if "owner_uid" in statement:  # one of the owner's indexes (arrays: issue 25)
                owner_indexes = ("ix_workloads_owner_phase_name", "ix_workloads_owner_array_name")
                assert any(index in plan for index in owner_indexes), (statement, plan)
            rows = connection.exec_driver_sql(statement, parameters).fetchall()  # type: ignore[arg-type]
            assert len(rows) <= 2, (statement, len(rows))  # the names asked about, at most
