"""End to end, as a user would: the real ``fgpu serve`` as a subprocess on a temporary socket
with simulated GPUs, driven only through the real command line (``python -m fgpu submit``,
``ls --json``, ``describe --json``, ``top --json``, ``cancel``, ``queue create``) with
``FGPU_SOCKET`` set, and real processes as workloads. Outside the CLI the tests only look at
the node (the launcher's ``handle.json`` and ``/proc``, to tell that a process is the same or
gone), send raw bodies with curl, and the harness probes readiness and cleans up over the API.

The situations of issue "Single-machine GPU sharing service", "Done when": priority
preemption and return, five 3 GiB workloads on one 16 GiB GPU, tenants borrowing and
reclaiming without ping-pong, restart after SIGKILL (re-adoption, nothing duplicated, a
process that died while the service was down is lost), and bad input refused with nothing
stored. Every server is stopped and every workload process killed by the fixtures, also
when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from fgpu.agent.process import ProcessHandle, group_alive, is_same_process
from tests.serverproc import AS_NOBODY, FGPU, ServerProcess, sleeper, wait_for

GRACE = ("--grace", "1")
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the CLI as another user (nobody)",
)

Serve = Callable[[str], ServerProcess]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start servers (one folder each); all are cleaned up at the end of the test."""
    started: list[ServerProcess] = []
    folders: list[Path] = []

    def start(gpus: str) -> ServerProcess:
        root = Path(tempfile.mkdtemp(prefix="fgpu-e2e-", dir="/tmp"))
        root.chmod(0o755)  # another user (the identity test) must reach the socket
        folders.append(root)
        server = ServerProcess(root, gpus)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.cleanup()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ServerProcess]:
    """One server (1xA100-40GB) for the bad-input tests and the identity test (which submits
    one workload; the bad-input checks compare listings taken around their own requests)."""
    root = Path(tempfile.mkdtemp(prefix="fgpu-e2e-bad-", dir="/tmp"))
    root.chmod(0o755)
    server = ServerProcess(root, "1xA100-40GB")
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def held_milli(listing: dict[str, dict[str, Any]], queue: str) -> int:
    """Milli-GPU the running workloads of ``queue`` hold, from ``fgpu ls --json``."""
    return sum(
        g["compute_milli"]
        for w in listing.values()
        if w["queue"] == queue and w["phase"] == "running"
        for g in w["gpus"]
    )


def process_pids(detail: dict[str, Any]) -> list[int]:
    """The pids of the ``process`` events of ``fgpu describe --json`` (one per launch)."""
    pids = []
    for event in detail["events"]:
        if event["kind"] == "process":
            # "process 1234 started"
            pids.append(int(event["message"].split()[1]))
    return pids


def alive(handle: dict[str, Any]) -> bool:
    """Whether the workload process a ``handle.json`` names (wrapper or its group) lives."""
    h = ProcessHandle.from_dict(handle)
    return is_same_process(h) or group_alive(h)


# ------------------------------------------------------------------------ 1. priority
def test_critical_inference_preempts_low_batch_which_runs_again_after_it(serve: Serve) -> None:
    server = serve("1xA100-40GB")
    announce = [sys.executable, "-c", "print('batch up', flush=True); import time; time.sleep(120)"]
    batch = server.submit("-p", "low", "-g", "0.7", "--name", "batch", *GRACE, command=announce)
    server.wait_phase(batch, "running")
    first_run = server.handle(batch)
    assert alive(first_run)

    # the inference workload runs until the test lets it end (a fixed run time would end
    # it before a loaded machine gets to look)
    release = server.root / "infer-may-end"
    until_released = [
        sys.executable,
        "-c",
        "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.02)",
        str(release),
    ]
    infer = server.submit(
        "-p", "critical", "-g", "0.5", "--name", "infer", *GRACE, command=until_released
    )
    server.wait_phase(infer, "running")

    # the batch workload was stopped (its real process is gone) and waits again
    detail = server.describe(batch)
    assert detail["phase"] == "pending", detail
    assert detail["restarts"] == 1
    kinds = [e["kind"] for e in detail["events"]]
    assert kinds[:3] == ["submitted", "started", "process"], kinds
    assert "stopping" in kinds
    assert "preempted" in kinds
    assert detail["gpus"] == []
    assert not alive(first_run), "the preempted batch process still runs"
    (gpu,) = server.json("top")
    assert [(h["workload_id"], h["compute_milli"]) for h in gpu["holders"]] == [(infer, 500)]
    listed = server.workloads(all_=False)
    assert listed[batch]["phase"] == "pending"
    assert listed[batch]["reason"]

    # the inference workload ends by itself; the batch one runs again, from the same command
    release.touch()
    done = server.wait_phase(infer, "succeeded")
    again = server.wait_phase(batch, "running")
    assert again["restarts"] == 1
    assert again["started_at"] >= done["finished_at"]
    assert done["exit_code"] == 0
    assert done["restarts"] == 0
    assert [e["kind"] for e in again["events"]].count("started") == 2
    wait_for(
        lambda: server.cli("logs", "--stdout", batch).stdout == "batch up\nbatch up\n",
        "the batch command's second start in its log",
    )
    second_run = server.handle(batch)
    assert second_run["pid"] != first_run["pid"]
    assert alive(second_run)
    # the process is recorded just after the start (its own transaction): wait for it
    wait_for(
        lambda: len(process_pids(server.describe(batch))) == 2,
        "the second start's process event",
    )
    (gpu,) = server.json("top")
    assert [(h["workload_id"], h["compute_milli"]) for h in gpu["holders"]] == [(batch, 700)]


# --------------------------------------------------------------- 2. many on one GPU
def test_five_3gib_workloads_share_a_16gib_t4_and_a_sixth_waits_for_memory(
    serve: Serve,
) -> None:
    server = serve("1xT4")
    ids = server.submit_many(6, "--gpu-memory", "3GiB", *GRACE, command=sleeper(120))
    assert len(set(ids)) == 6

    server.wait_listing(
        lambda ls: sum(w["phase"] == "running" for w in ls.values()) == 5,
        "five workloads running",
    )
    # a round that has looked at the sixth says why it waits (the memory it needs), and
    # has not started it
    server.wait_listing(
        lambda ls: any(
            w["phase"] == "pending" and "3072 MiB" in (w["reason"] or "") for w in ls.values()
        ),
        "the sixth's reason naming the memory it needs",
    )
    listing = server.workloads(all_=False)
    assert sorted(w["phase"] for w in listing.values()) == ["pending"] + ["running"] * 5
    (waiting,) = [i for i, w in listing.items() if w["phase"] == "pending"]
    for wid, view in listing.items():
        if wid != waiting:
            (grant,) = view["gpus"]
            assert (grant["index"], grant["memory_mib"]) == (0, 3072), view
            assert alive(server.handle(wid))

    (gpu,) = server.json("top")
    assert gpu["model"] == "T4"
    assert gpu["memory_mib"] == 16384
    assert len(gpu["holders"]) == 5
    assert {h["workload_id"] for h in gpu["holders"]} == set(ids) - {waiting}
    assert all(h["memory_mib"] == 3072 for h in gpu["holders"])
    assert gpu["allocated_memory_mib"] == 5 * 3072

    # the reason names the memory it needs ("... 3072 MiB free")
    reason = listing[waiting]["reason"]
    assert "3072 MiB" in reason, reason
    detail = server.describe(waiting)
    assert detail["phase"] == "pending"
    assert "3072 MiB" in detail["reason"], detail["reason"]
    text = " ".join(server.cli("describe", waiting).stdout.split())  # wrapped lines joined
    assert "3072 MiB" in text, text

    # one ends: the sixth gets its memory
    cancelled = server.cli("cancel", next(i for i in ids if i != waiting))
    assert cancelled.returncode == 0
    server.wait_phase(waiting, "running")


# ---------------------------------------------------------------------- 3. tenants
def test_tenants_borrow_idle_quota_and_reclaim_exactly_what_is_needed_without_ping_pong(
    serve: Serve,
) -> None:
    server = serve("4xA100-40GB")
    for team in ("team-a", "team-b"):
        created = server.json("queue", "create", team, "--quota", "2")
        assert (created["name"], created["quota_milli"]) == (team, 2000)

    a = server.submit_many(10, "-g", "0.5", "-q", "team-a", *GRACE, command=sleeper(300))
    # team-b is idle: team-a borrows all four GPUs
    listing = server.wait_listing(lambda ls: held_milli(ls, "team-a") == 4000, "team-a on 4 GPUs")
    assert sum(w["phase"] == "running" for w in listing.values()) == 8
    assert all(w["restarts"] == 0 for w in listing.values())
    assert [g["allocated_milli"] for g in server.json("top")] == [1000] * 4

    b = server.submit_many(10, "-g", "0.5", "-q", "team-b", *GRACE, command=sleeper(300))

    settled = server.wait_listing(
        lambda ls: held_milli(ls, "team-a") == 2000 and held_milli(ls, "team-b") == 2000,
        "team-a and team-b at 2 GPUs each",
    )
    restarts_a = sorted(settled[i]["restarts"] for i in a)
    restarts_b = sorted(settled[i]["restarts"] for i in b)
    assert restarts_a == [0] * 6 + [1] * 4, "exactly 4 team-a workloads preempted, once each"
    assert restarts_b == [0] * 10, "no team-b workload preempted"
    queues = {q["name"]: q for q in server.json("queue", "ls")}
    assert queues["team-a"]["allocated_milli"] == 2000
    assert queues["team-b"]["allocated_milli"] == 2000
    assert queues["team-a"]["running"] == 4
    assert queues["team-b"]["running"] == 4
    assert queues["team-a"]["fair_share_milli"] == 2000
    assert queues["team-b"]["fair_share_milli"] == 2000
    preempted = [i for i in a if settled[i]["restarts"] == 1]
    detail = server.describe(preempted[0])
    assert "preempted" in [e["kind"] for e in detail["events"]]

    # nothing moves any more: the default rules have no time-based part (min_runtime 0, no
    # aging, no reservation), so every round decides on the same state; force a few rounds
    # (a queue change wakes the loop) and let them run
    for team in ("team-a", "team-b"):
        server.cli("queue", "set", team, "--quota", "2")
        time.sleep(0.5)
    later = server.workloads()

    def placement(view: dict[str, Any]) -> tuple[Any, ...]:
        return (
            view["phase"],
            view["restarts"],
            tuple((g["index"], g["compute_milli"]) for g in view["gpus"]),
        )

    moved = {i: (placement(settled[i]), placement(later[i])) for i in a + b}
    moved = {i: pair for i, pair in moved.items() if pair[0] != pair[1]}
    assert not moved, f"workloads moved after the reclaim settled: {moved}"
    assert held_milli(later, "team-a") == 2000
    assert held_milli(later, "team-b") == 2000
    top = server.json("top")
    assert [g["allocated_milli"] for g in top] == [1000] * 4


# ----------------------------------------------------------------------- 4. restart
def test_sigkilled_server_restarts_and_accounts_for_every_workload_once(serve: Serve) -> None:
    server = serve("1xA100-40GB")
    running = server.submit_many(2, "-g", "0.5", *GRACE, command=sleeper(300))
    server.wait_listing(
        lambda ls: all(ls[r]["phase"] == "running" for r in running), "two workloads running"
    )
    pending = server.submit_many(2, "-g", "0.5", *GRACE, command=sleeper(300))
    before = server.wait_listing(
        lambda ls: all(ls[p]["reason"] != "submitted" for p in pending),
        "a wait reason for the pending workloads",
    )
    assert [before[i]["phase"] for i in running + pending] == ["running"] * 2 + ["pending"] * 2
    handles = {wid: server.handle(wid) for wid in running}

    server.kill()
    assert all(alive(h) for h in handles.values()), "workloads must survive the server"
    server.start()

    after = server.workloads()  # fails on a duplicated id
    assert sorted(after) == sorted(running + pending), "a workload was lost or added"
    for wid in running:
        view = after[wid]
        assert view["phase"] == "running", view
        assert view["restarts"] == 0
        assert view["gpus"] == before[wid]["gpus"]
        detail = server.describe(wid)
        # re-adopted, not launched again: the same process, still one launch
        assert process_pids(detail) == [handles[wid]["pid"]], detail["events"]
        assert [e["kind"] for e in detail["events"]].count("started") == 1
        assert server.handle(wid) == handles[wid]
        assert alive(handles[wid])
    for wid in pending:
        assert after[wid]["phase"] == "pending"
        assert not (server.state_dir / "logs" / wid / "handle.json").exists()
    (gpu,) = server.json("top")
    assert sorted(h["workload_id"] for h in gpu["holders"]) == sorted(running)

    # the re-adopted processes are under control: cancel stops them, the pending ones start
    for wid in running:
        assert server.cli("cancel", wid).returncode == 0
    final = server.wait_listing(
        lambda ls: all(ls[p]["phase"] == "running" for p in pending),
        "the pending workloads to start",
    )
    assert sorted(final) == sorted(running + pending)
    assert [final[w]["phase"] for w in running] == ["cancelled"] * 2
    assert all(final[w]["restarts"] == 0 for w in pending)
    for wid in running:
        assert not alive(handles[wid]), f"cancelled {wid} still runs"


def test_a_workload_killed_while_the_server_is_down_is_failed_as_lost(serve: Serve) -> None:
    server = serve("1xA100-40GB")
    victim, other = server.submit_many(2, "-g", "0.5", *GRACE, command=sleeper(300))
    server.wait_listing(
        lambda ls: all(w["phase"] == "running" for w in ls.values()), "two workloads running"
    )
    doomed = server.handle(victim)
    kept = server.handle(other)

    server.kill()
    # the wrapper first (so it cannot record an exit code), then the workload's group
    os.kill(doomed["pid"], signal.SIGKILL)
    os.killpg(doomed["pgid"], signal.SIGKILL)
    wait_for(lambda: not alive(doomed), "the victim's processes to be gone")
    server.start()

    detail = server.describe(victim)
    assert detail["phase"] == "failed", detail
    assert detail["reason"] == "lost while the service was down"
    assert [g["compute_milli"] for g in detail["gpus"]] == [500]  # where it ran, kept
    listing = server.workloads()
    assert sorted(listing) == sorted([victim, other])
    assert listing[other]["phase"] == "running"
    assert server.handle(other) == kept
    assert alive(kept)
    (gpu,) = server.json("top")
    assert [h["workload_id"] for h in gpu["holders"]] == [other]
    # the freed half is usable again
    newcomer = server.submit("-g", "0.5", *GRACE, command=sleeper(300))
    server.wait_phase(newcomer, "running")


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes whose command line holds ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if marker in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_a_launched_process_is_always_tracked_even_when_saving_its_handle_fails(
    serve: Serve,
) -> None:
    server = serve("1xA100-40GB")
    marker = f"fgpu-e2e-untracked-{server.root.name}"
    blocker = server.submit("-g", "1", *GRACE, command=sleeper(300))
    server.wait_phase(blocker, "running")
    untracked = [sys.executable, "-c", f"import time; time.sleep(300)  # {marker}"]
    victim = server.submit("-g", "1", *GRACE, command=untracked)
    # a fault on the node: the victim's process record cannot be written
    (server.state_dir / "logs" / victim / "handle.tmp").mkdir(parents=True)
    try:
        server.cli("cancel", blocker)
        detail: dict[str, Any] = {}

        def settled() -> bool:  # failed, or running with its process recorded
            detail.update(server.describe(victim))
            return detail["phase"] not in ("pending", "running") or bool(process_pids(detail))

        wait_for(settled, "the victim to be launched and recorded, or to fail")
        if detail["phase"] == "running":  # then its process must be the workload's, under control
            pids = [p.pid for p in marked_processes(marker)]
            assert process_pids(detail), f"the victim runs as {pids} but no process is recorded"
            assert server.cli("cancel", victim).returncode == 0
            server.wait_phase(victim, "cancelled", timeout_s=5)
        else:  # or the launch failed cleanly
            assert detail["phase"] == "failed", detail
        assert not marked_processes(marker), "a workload process runs untracked"
    finally:
        server.kill()  # the stuck workload would hold up a clean stop
        for proc in marked_processes(marker):
            with contextlib.suppress(psutil.Error):
                proc.kill()


# --------------------------------------------------------------------- 5. bad input
BAD_SUBMISSIONS: dict[str, tuple[list[str], list[str], str]] = {
    "fraction-0": (["-g", "0"], ["true"], "-g '0': a GPU request must be positive"),
    "negative": (["-g", "-1"], ["true"], "-g '-1': a GPU request must be positive"),
    "nan": (["-g", "nan"], ["true"], "-g 'nan': not a plain decimal number"),
    "fraction-1.5": (["-g", "1.5"], ["true"], "-g '1.5': above 1 a GPU request is a whole number"),
    "g-with-mig": (
        ["-g", "0.5", "--mig-profile", "3g.20gb"],
        ["true"],
        "--mig-profile '3g.20gb': ",
    ),
    "memory-above-every-gpu": (
        ["--gpu-memory", "1TiB"],
        ["true"],
        "--gpu-memory '1TiB': 1048576 MiB is more than any GPU here has (the largest has 40960 "
        "MiB)",
    ),
    "unknown-model": (["--gpu-model", "X100"], ["true"], "--gpu-model: unknown GPU model 'X100'"),
    "unknown-queue": (["-q", "nope"], ["true"], "-q: unknown queue 'nope'"),
    "empty-command": (["-g", "0.5"], [""], "the command after --: give a command"),
    # a non-finite float crashed the CLI with a traceback before 8e9e486
    "grace-nan": (["-g", "0.5", "--grace", "nan"], ["true"], "--grace: must be a finite number"),
}
BAD_QUEUE_COMMANDS: dict[str, tuple[list[str], str]] = {
    "quota-negative": (["queue", "create", "bad-q1", "--quota", "-1"], "--quota '-1': must be"),
    "quota-inf": (
        ["queue", "create", "bad-q2", "--quota", "inf"],
        "--quota: must be a finite number (got inf)",
    ),
    "quota-below-a-milli": (
        ["queue", "create", "bad-q3", "--quota", "0.0001"],
        "--quota: 0.0001 GPUs is below the smallest amount, 0.001",
    ),
}
BAD_BODIES: dict[str, tuple[bytes, str, str]] = {
    "truncated-json": (b'{"command": ["true"], "gpu": "0.5"', "body", "malformed JSON"),
    "not-json": (b"not json at all", "body", "malformed JSON"),
    "command-a-string": (b'{"command": "true", "gpu": "0.5"}', "command", "valid list"),
    "grace-a-word": (b'{"command": ["true"], "grace_s": "soon"}', "grace_s", "valid number"),
    "models-a-string": (b'{"command": ["true"], "gpu_model": "A100"}', "gpu_model", "valid list"),
    "unknown-field": (b'{"command": ["true"], "gpu": "0.5", "gpus": 2}', "gpus", "not permitted"),
    "array-body": (b"[1, 2]", "body", "valid dictionary"),
}


def post_workloads(socket: Path, body: bytes) -> tuple[int, Any]:
    """POST raw bytes to ``/v1/workloads`` over the Unix socket (curl, else httpx)."""
    if shutil.which("curl"):
        curl = ["curl", "-sS", "--unix-socket", str(socket), "-X", "POST"]
        curl += ["-H", "content-type: application/json", "--data-binary", "@-"]
        curl += ["-w", "\n%{http_code}", "http://fgpu/v1/workloads"]
        done = subprocess.run(
            curl,
            input=body,
            capture_output=True,
            timeout=30,
            check=True,
        )
        text, _, code = done.stdout.decode().rpartition("\n")
        return int(code), json.loads(text)
    import httpx

    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket))) as http:
        answer = http.post(
            "http://fgpu/v1/workloads",
            content=body,
            headers={"content-type": "application/json"},
        )
        return answer.status_code, answer.json()


@dataclass
class BadRun:
    """Every bad input sent once (the CLI commands concurrently), with ``fgpu ls --json
    --all`` and ``fgpu queue ls --json`` before and after."""

    before: dict[str, dict[str, Any]]
    after: dict[str, dict[str, Any]]
    queues_before: list[dict[str, Any]]
    queues_after: list[dict[str, Any]]
    cli: dict[str, subprocess.CompletedProcess[str]]
    api: dict[str, tuple[int, Any]]


@pytest.fixture(scope="module")
def bad_run(shared_server: ServerProcess) -> BadRun:
    before = shared_server.workloads()
    queues_before = shared_server.json("queue", "ls")
    commands = {
        case: ["submit", *options, "--name", f"bad-{case}", "--json", "--", *command]
        for case, (options, command, _) in BAD_SUBMISSIONS.items()
    }
    commands.update({case: argv for case, (argv, _) in BAD_QUEUE_COMMANDS.items()})
    started = {
        case: subprocess.Popen(
            [*FGPU, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=shared_server.env,
            cwd=shared_server.root,
        )
        for case, argv in commands.items()
    }
    api = {
        case: post_workloads(shared_server.socket, body)
        for case, (body, _, _) in BAD_BODIES.items()
    }
    cli = {}
    for case, proc in started.items():
        out, err = proc.communicate(timeout=60)
        cli[case] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    after = shared_server.workloads()
    return BadRun(before, after, queues_before, shared_server.json("queue", "ls"), cli, api)


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit code 2, one ``error: field: reason`` line on stderr, nothing on stdout."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("case", list(BAD_SUBMISSIONS))
def test_bad_submission_through_the_cli_is_refused_and_nothing_is_stored(
    bad_run: BadRun, case: str
) -> None:
    assert_refused(bad_run.cli[case], BAD_SUBMISSIONS[case][2])
    assert not [w for w in bad_run.after.values() if w["name"] == f"bad-{case}"]
    assert bad_run.after == bad_run.before, "fgpu ls --json --all changed"


@pytest.mark.parametrize("case", list(BAD_QUEUE_COMMANDS))
def test_bad_queue_settings_through_the_cli_are_refused_and_nothing_changes(
    bad_run: BadRun, case: str
) -> None:
    assert_refused(bad_run.cli[case], BAD_QUEUE_COMMANDS[case][1])
    assert bad_run.queues_after == bad_run.queues_before, "fgpu queue ls --json changed"


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_malformed_or_wrong_typed_json_is_422_with_field_and_reason(
    bad_run: BadRun, case: str
) -> None:
    _, field, reason = BAD_BODIES[case]
    status, answer = bad_run.api[case]
    assert status == 422, answer
    assert answer["detail"]["field"] == field, answer
    assert reason in answer["detail"]["reason"], answer
    assert bad_run.after == bad_run.before, "fgpu ls --json --all changed"


@needs_root
def test_another_user_may_not_cancel_a_workload(shared_server: ServerProcess) -> None:
    job = shared_server.submit("-g", "0.1", "--name", "mine", *GRACE, command=sleeper(300))
    shared_server.wait_phase(job, "running")
    before = shared_server.workloads()
    refused = shared_server.cli("cancel", job, user=AS_NOBODY, check=False)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert refused.stderr.startswith("error: ID: "), refused.stderr
    assert "may not cancel" in refused.stderr, refused.stderr
    assert shared_server.workloads() == before
    assert alive(shared_server.handle(job))
    # its owner (root) may
    assert shared_server.cli("cancel", job).returncode == 0
