"""Slurm's habits (issue 25, point 4) against ``fgpu serve`` as a real process with one
simulated A100 and real workload processes, driven through the command line: ``--time``
(with a queue's default and maximum), ``--dependency afterok/afterany/afternotok``, and
``--array 0-N%M`` (its environment, its throttle, ``ls`` folding it, ``cancel NAME``).

Nothing here sleeps for a set time: each test waits for a condition (a phase, a file, the
server's own clock past a point) with a generous deadline. Time limits are 2 s, so that a
limit that is not enforced shows as a wait that times out."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users
from tests.serverproc import FGPU, ServerProcess, sleeper, started_server, wait_for

LONG_S = 90.0
"""Deadline of a wait in these tests (a limit of 2 s must have acted long before)."""

ON_TERM = r"""
import signal, sys, time
from pathlib import Path
def term(signum, frame):
    Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(1)
"""
"""Runs until SIGTERM, then writes "SIGTERM" to the file argv[1] and exits 0."""

DEAF = r"""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(1)
"""
"""Ignores SIGTERM: only SIGKILL after the grace period ends it."""

GATED = r"""
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
index = os.environ.get("FGPU_ARRAY_INDEX", "-")
slurm = os.environ.get("SLURM_ARRAY_TASK_ID", "-")
(out / f"started-{index}").write_text(f"{index} {slurm} {os.environ.get('FGPU_ARRAY_ID', '-')}")
deadline = time.monotonic() + 120
while not (out / "gate").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""
"""Writes ``started-INDEX`` (its array index, Slurm's name for it, the array id) in the
folder argv[1], waits for ``gate`` there, exits argv[2] (default 0)."""


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-slurm-", "1xA100-40GB", for_local_users=True) as running:
        yield running


@pytest.fixture(autouse=True)
def _clean(server: ServerProcess) -> Iterator[None]:
    yield
    for workload_id in server.workloads(all_=False):
        server.cli("cancel", workload_id, check=False)
    wait_for(lambda: not server.workloads(all_=False), "the workloads of the test to end", LONG_S)


def _gated(folder: Path, code: int = 0) -> list[str]:
    return [sys.executable, "-c", GATED, str(folder), str(code)]


def _events(server: ServerProcess, workload_id: str) -> list[dict[str, Any]]:
    return list(server.describe(workload_id)["events"])


# ------------------------------------------------------------------------- --time
def test_at_its_time_limit_a_run_is_cancelled_with_sigterm_first(
    server: ServerProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "term"
    job = server.submit(
        "-g", "0.25", "--time", "0:02", "--grace", "30",
        command=[sys.executable, "-c", ON_TERM, str(marker)],
    )  # fmt: skip
    assert server.describe(job)["time_limit_s"] == 2.0
    seen = server.wait_phase(job, "cancelled", timeout_s=LONG_S)
    assert seen["reason"] == "time limit"
    assert marker.read_text() == "SIGTERM"  # asked to stop first, as any cancel
    assert seen["finished_at"] - seen["started_at"] >= 2.0
    kinds = [(e["kind"], e["reason"]) for e in seen["events"]]
    assert ("cancel-requested", "time limit") in kinds
    assert ("cancelled", "time limit") in kinds
    shown = server.cli("describe", job).stdout
    assert "Time limit" in shown
    assert "00:00:02 of running time" in shown


def test_pending_time_does_not_count_and_sigkill_follows_the_grace(
    server: ServerProcess,
) -> None:
    blocker = server.submit("-g", "1", command=sleeper(600))
    server.wait_phase(blocker, "running")
    job = server.submit(
        "-g", "1", "--time", "0:02", "--grace", "1", command=[sys.executable, "-c", DEAF]
    )
    submitted = server.describe(job)["submitted_at"]
    # pending longer than its limit, on the server's clock (a condition, not a set sleep)
    wait_for(lambda: time.time() - submitted > 3.0, "3 s of pending", LONG_S)
    assert server.phase(job) == "pending"
    server.cli("cancel", blocker)
    seen = server.wait_phase(job, "cancelled", timeout_s=LONG_S)
    assert seen["reason"] == "time limit"
    assert seen["started_at"] - seen["submitted_at"] > 3.0
    assert seen["finished_at"] - seen["started_at"] >= 3.0  # 2 s limit, then 1 s of grace
    assert seen["exit_code"] == 137  # SIGTERM ignored: SIGKILL after the grace


def test_queue_default_and_maximum_time(server: ServerProcess) -> None:
    server.cli("queue", "create", "short", "--quota", "0", "--member", "*",
               "--default-time", "0:05", "--max-time", "1:00")  # fmt: skip
    try:
        queue = next(q for q in server.json("queue", "ls") if q["name"] == "short")
        assert (queue["default_time_s"], queue["max_time_s"]) == (5.0, 60.0)
        table = server.cli("queue", "ls").stdout  # (a wide table folds its cells)
        for words in ("TIME LIMIT", "00:00:05", "00:01:00"):
            assert words in table, table
        plain = server.submit("-q", "short", "-g", "0.1", command=sleeper(600))
        assert server.describe(plain)["time_limit_s"] == 5.0
        given = server.submit("-q", "short", "-g", "0.1", "-t", "0:30", command=sleeper(600))
        assert server.describe(given)["time_limit_s"] == 30.0
        over = server.cli("submit", "-q", "short", "-t", "2", "--", "true", check=False)
        assert over.returncode != 0
        assert "-t: '2' (00:02:00) is above queue short's maximum 00:01:00" in over.stderr
        none = server.cli("submit", "-q", "short", "--time", "UNLIMITED", "--", "true", check=False)
        assert none.returncode != 0
        assert "asks for no limit; queue short allows at most 00:01:00" in none.stderr
        # set keeps what it is not told to change, and 0 removes a limit
        server.cli("queue", "set", "short", "--max-time", "0")
        queue = next(q for q in server.json("queue", "ls") if q["name"] == "short")
        assert (queue["default_time_s"], queue["max_time_s"]) == (5.0, None)
        bad = server.cli("queue", "set", "short", "--default-time", "5 min", check=False)
        assert bad.returncode != 0
        assert "--default-time" in bad.stderr
        assert "'5 min'" in bad.stderr
    finally:
        for workload_id in server.workloads(all_=False):
            server.cli("cancel", workload_id, check=False)
        wait_for(lambda: not server.workloads(all_=False), "short's work to end", LONG_S)
        server.cli("queue", "rm", "short")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1:2:3:4", "--time: '1:2:3:4' is not a time limit; the forms: minutes (90)"),
        ("1h", "--time: '1h' is not a time limit"),
        ("366-0", "above the longest, 365-00:00:00"),
    ],
)
def test_a_bad_time_is_refused_naming_the_flag(
    server: ServerProcess, value: str, words: str
) -> None:
    before = len(server.workloads())
    result = server.cli("submit", "--time", value, "--", "true", check=False)
    assert result.returncode != 0
    assert words in result.stderr
    assert len(server.workloads()) == before  # nothing stored


def test_run_in_the_foreground_ends_at_its_time_limit(server: ServerProcess) -> None:
    result = subprocess.run(
        [*FGPU, "run", "-g", "0.1", "--time", "0:02", "--", *sleeper(600)],
        capture_output=True, text=True, timeout=LONG_S, env=server.env, cwd=server.root,
    )  # fmt: skip
    assert result.returncode == 143, result.stderr  # SIGTERM ended it, as the limit sends
    assert "cancelled: time limit" in result.stderr
    refused = subprocess.run(
        [*FGPU, "run", "--array", "0-3", "--", "true"],
        capture_output=True, text=True, timeout=LONG_S, env=server.env, cwd=server.root,
    )  # fmt: skip
    assert refused.returncode == 2  # no such option: run is one job in the foreground
    assert "--array" in refused.stderr


# -------------------------------------------------------------------- --dependency
def test_afterok_waits_then_runs_and_afternotok_ends_when_it_cannot_hold(
    server: ServerProcess, tmp_path: Path
) -> None:
    first = server.submit("-g", "0.1", "--name", "prep", command=_gated(tmp_path))
    server.wait_phase(first, "running")
    after_ok = server.submit("-g", "0.1", "--dependency", "afterok:prep", command=["true"])
    after_any = server.submit("-g", "0.1", "-d", f"afterany:{first[:6]}", command=["true"])
    not_ok = server.submit("-g", "0.1", "-d", f"afternotok:{first}", command=["true"])
    assert server.describe(after_ok)["dependency"] == [f"afterok:{first}"]
    seen = server.wait_phase(after_ok, "pending")
    wait_for(
        lambda: server.describe(after_ok)["reason"] == f"waits for afterok:{first} (prep, running)",
        "the dependency named as the pending reason",
        LONG_S,
    )
    listed = server.cli("ls").stdout
    assert "waits for afterok" in listed
    (tmp_path / "gate").write_text("")
    server.wait_phase(first, "succeeded", timeout_s=LONG_S)
    assert server.wait_phase(after_ok, "succeeded", timeout_s=LONG_S)["exit_code"] == 0
    server.wait_phase(after_any, "succeeded", timeout_s=LONG_S)
    seen = server.wait_phase(not_ok, "cancelled", timeout_s=LONG_S)
    assert seen["reason"] == (
        f"dependency never satisfied: afternotok:{first} (prep) ended succeeded"
    )
    assert seen["started_at"] is None  # it never ran


def test_afternotok_runs_after_a_failure_and_afterok_on_it_ends(
    server: ServerProcess, tmp_path: Path
) -> None:
    first = server.submit("-g", "0.1", command=_gated(tmp_path, 3))
    ok = server.submit("-g", "0.1", "-d", f"afterok:{first}", command=["true"])
    not_ok = server.submit("-g", "0.1", "-d", f"afternotok:{first}", command=["true"])
    (tmp_path / "gate").write_text("")  # the first job fails (exit 3)
    server.wait_phase(first, "failed", timeout_s=LONG_S)
    server.wait_phase(not_ok, "succeeded", timeout_s=LONG_S)
    seen = server.wait_phase(ok, "cancelled", timeout_s=LONG_S)
    assert seen["reason"].startswith(f"dependency never satisfied: afterok:{first}")
    assert "ended failed" in seen["reason"]
    # now that it failed, afterok on it is refused at submission: it could never hold
    late = server.cli("submit", "-d", f"afterok:{first}", "--", "true", check=False)
    assert late.returncode != 0
    shown = server.describe(first)["name"]  # named after the interpreter that ran it
    assert f"-d: afterok:{first}: {first} ({shown}) already ended failed" in late.stderr
    assert "the condition can never hold" in late.stderr


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (
            "afterok:nosuchjob",
            "--dependency 'afterok:nosuchjob': no workload with the id, id prefix or name "
            "'nosuchjob'",
        ),
        ("after:abc", "'after' is not a dependency type; types: afterok, afterany, afternotok"),
        ("afterok:a?afterany:b", "'?' (any one of several) is not supported"),
        ("afterok", "afterok needs workload ids or names"),
    ],
)
def test_bad_dependencies_are_refused_naming_the_flag(
    server: ServerProcess, value: str, words: str
) -> None:
    before = len(server.workloads())
    result = server.cli("submit", "--dependency", value, "--", "true", check=False)
    assert result.returncode != 0
    assert words in result.stderr
    assert "--dependency" in result.stderr
    assert len(server.workloads()) == before


# ------------------------------------------------------------------------ --array
def test_an_array_runs_each_index_with_its_env_and_at_most_n_at_once(
    server: ServerProcess, tmp_path: Path
) -> None:
    submitted = server.cli(
        "submit", "--array", "0-5%2", "--name", "sweep", "-g", "0.1", "--", *_gated(tmp_path)
    )
    array_id = submitted.stdout.strip()
    assert "submitted array sweep" in submitted.stderr
    assert "6 tasks" in submitted.stderr
    tasks = {
        w["name"]: w
        for w in server.workloads().values()
        if (w["array"] or {}).get("id") == array_id
    }
    assert sorted(tasks) == [f"sweep_{i}" for i in range(6)]
    assert array_id not in {t["id"] for t in tasks.values()}
    # a dependency on the array's name waits for every task of it
    after = server.submit("-g", "0.1", "-d", "afterok:sweep", command=["true"])
    assert sorted(server.describe(after)["dependency"]) == sorted(
        f"afterok:{t['id']}" for t in tasks.values()
    )
    # two start; the others wait, saying why
    wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2, "two tasks to start", LONG_S)
    listing = server.workloads(all_=False)
    assert sum(w["phase"] == "running" for w in listing.values()) == 2
    waiting = [w for w in listing.values() if w["phase"] == "pending" and w["array"]]
    assert len(waiting) == 4
    wait_for(
        lambda: all(
            "at most 2 at once (%2)" in server.describe(w["id"])["reason"] for w in waiting
        ),
        "the throttle named as the pending reason",
        LONG_S,
    )
    # ls folds the array into one row with counts; --expand shows each task
    folded = server.cli("ls").stdout
    assert array_id in folded
    assert "sweep[6]" in folded
    assert "2 running, 4 pending" in folded
    assert "sweep_3" not in folded
    expanded = server.cli("ls", "--expand").stdout
    assert all(f"sweep_{i}" in expanded for i in range(6))
    # describe takes one workload: the array's name or id says what to name instead
    for ref in ("sweep", array_id):
        told = server.cli("describe", ref, check=False)
        assert told.returncode != 0
        assert f"'{ref}' is an array ({array_id}, 6 tasks named sweep_INDEX)" in told.stderr
    (tmp_path / "gate").write_text("")
    final = server.wait_listing(
        lambda ws: all(ws[t["id"]]["phase"] == "succeeded" for t in tasks.values()),
        "every task to succeed",
        LONG_S,
    )
    runs = sorted(
        (final[t["id"]]["started_at"], final[t["id"]]["finished_at"]) for t in tasks.values()
    )
    for start, _ in runs:  # at no task's start did more than 2 run
        assert sum(s <= start < f for s, f in runs) <= 2
    for index in range(6):
        assert (tmp_path / f"started-{index}").read_text() == f"{index} {index} {array_id}"
    done = server.cli("ls", "--all").stdout
    assert "6 succeeded" in done
    assert server.wait_phase(after, "succeeded", timeout_s=LONG_S)["exit_code"] == 0


def test_cancel_by_the_arrays_name_cancels_every_task_and_a_task_alone(
    server: ServerProcess,
) -> None:
    array_id = server.cli(
        "submit", "-a", "0-9", "--name", "grid", "-g", "0.05", "--", *sleeper(600)
    ).stdout.strip()

    def tasks(listing: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        return [w for w in listing.values() if (w["array"] or {}).get("id") == array_id]

    server.wait_listing(
        lambda ws: sum(w["phase"] == "running" for w in tasks(ws)) == 10,
        "ten tasks running",
        LONG_S,
    )
    one = server.cli("cancel", "grid_3")
    assert "stopping" in one.stdout
    server.wait_listing(
        lambda ws: [w["name"] for w in tasks(ws) if w["phase"] == "cancelled"] == ["grid_3"],
        "grid_3 alone cancelled",
        LONG_S,
    )
    everything = server.cli("cancel", "grid")
    assert f"array grid ({array_id}): 9 tasks cancelled" in everything.stdout
    final = server.wait_listing(
        lambda ws: all(w["phase"] == "cancelled" for w in tasks(ws)),
        "every task cancelled",
        LONG_S,
    )
    assert len(tasks(final)) == 10
    again = server.cli("cancel", "grid", check=False)
    assert again.returncode != 0


def test_an_arrays_tasks_each_count_against_the_active_limit() -> None:
    with started_server("fgpu-slurm-limit-", "1xA100-40GB",
                        extra=["--max-active-per-user", "5"]) as limited:  # fmt: skip
        refused = limited.cli("submit", "--array", "0-5", "--", "true", check=False)
        assert refused.returncode != 0
        assert "this array has 6 tasks" in refused.stderr
        assert "--max-active-per-user 5" in refused.stderr
        assert not limited.workloads()  # nothing half-written
        limited.cli("submit", "--array", "0-4", "-g", "0.1", "--", *sleeper(600))
        one_more = limited.cli("submit", "--", "true", check=False)
        assert one_more.returncode != 0
        assert "you have 5 active workloads" in one_more.stderr


def test_bad_arrays_and_taken_names_are_refused(server: ServerProcess) -> None:
    bad = server.cli("submit", "--array", "5-2", "--", "true", check=False)
    assert bad.returncode != 0
    assert "--array: '5-2': the range 5-2 ends below its start" in bad.stderr
    throttle = server.cli("submit", "-a", "0-3%0", "--", "true", check=False)
    assert "%N needs N of at least 1" in throttle.stderr
    server.cli("submit", "-a", "0-1", "--name", "sw", "-g", "0.1", "--", *sleeper(600))
    clash = server.cli("submit", "--name", "sw", "--", "true", check=False)
    assert clash.returncode != 0
    assert "already have an active workload named 'sw'" in clash.stderr
    task_clash = server.cli("submit", "--name", "sw_1", "--", "true", check=False)
    assert task_clash.returncode != 0
    assert "'sw_1'" in task_clash.stderr


# ---------------------------------------------------------------------- two users
def test_users_depend_on_others_work_but_cancel_only_their_own_arrays(
    server: ServerProcess, tmp_path: Path
) -> None:
    ensure_users()
    alice, bob = as_user(ALICE), as_user(BOB)
    # the GPU is taken, so that alice's tasks stay pending for the whole test
    blocker = server.submit("-g", "1", command=sleeper(600))
    server.wait_phase(blocker, "running")
    made = server.cli(
        "submit", "-a", "0-1", "--name", "hers", "-g", "0.1", "--json", "--", *sleeper(600),
        user=alice,
    )  # fmt: skip
    array_id = json.loads(made.stdout)["array"]["id"]
    first = json.loads(made.stdout)["id"]
    # bob may wait for alice's work: users see all work (DESIGN.md section 5)
    waits = server.cli(
        "submit", "-g", "0.1", "-d", f"afterany:{first}", "--json", "--", "true", user=bob
    )
    assert json.loads(waits.stdout)["dependency"] == [f"afterany:{first}"]
    # but not cancel her array, by its id; by the name he finds none of his own
    by_id = server.cli("cancel", array_id, user=bob, check=False)
    assert by_id.returncode != 0
    assert "may not cancel it" in by_id.stderr
    by_name = server.cli("cancel", "hers", user=bob, check=False)
    assert by_name.returncode != 0
    assert "'hers' is an array of " in by_name.stderr, by_name.stderr
    assert "(only they or an admin may cancel it)" in by_name.stderr
    hers = [w for w in server.workloads().values() if (w["array"] or {}).get("id") == array_id]
    assert len(hers) == 2
    assert all(w["phase"] == "pending" for w in hers), [w["reason"] for w in hers]
    mine = server.cli("cancel", "hers", user=alice)
    assert "2 tasks cancelled" in mine.stdout
