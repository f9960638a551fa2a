"""What can never start is refused at submit, a refusal suggests only fixes that work, and
the habits ``--gpu-model A100``, ``--gpu-memory 5GB`` and ``fgpu ui`` on a shared install
work (issue 25, point 7).

The real ``fgpu serve`` (as root, the admin) on a simulated A100-40GB and A100-80GB, driven
through the command line by root and by two real local users, alice and bob
(``setpriv --reuid``). Every suggestion a refusal makes is then tried as written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fgpu.addresses import SYSTEM_SOCKET
from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import FGPU, ServerProcess, started_server

TRUE = ("--", "/bin/true")
SLEEP = ("--", "/bin/sleep", "300")


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    gpus = "1xA100-40GB,1xA100-80GB"
    with started_server("fgpu-refuse-", gpus, for_local_users=True) as proc:
        yield proc


def refused(server: ServerProcess, user: str | None, *args: str) -> str:
    """``fgpu ARGS`` (as ``user``, None: root) fails and stores nothing; its stderr."""
    before = len(server.workloads())
    prefix = as_user(user) if user else ()
    result = server.cli(*args, user=prefix, check=False)
    assert result.returncode != 0, (args, result.stdout, result.stderr)
    assert len(server.workloads()) == before
    return " ".join(result.stderr.split())  # one line: the terminal folds long messages


def accepted(server: ServerProcess, user: str | None, *args: str) -> dict[str, object]:
    prefix = as_user(user) if user else ()
    out = server.cli("submit", "--json", *args, user=prefix).stdout
    return dict(json.loads(out))


def test_non_preemptible_work_beyond_its_queues_quota_is_refused_even_for_admins(
    server: ServerProcess,
) -> None:
    server.cli("queue", "create", "team", "--quota", "0", "--member", ALICE)
    server.cli("queue", "create", "half", "--quota", "0.5", "--member", ALICE)
    # root is an admin: priority and grants are no question, the quota still is
    why = refused(server, None, "submit", "-q", "team", "-p", "high", "-g", "0.5", *SLEEP)
    assert "non-preemptible work (priority high (100) is non-preemptible by default)" in why
    assert "can never start in queue team: its GPU quota is 0.0" in why, why
    assert "'fgpu queue set team --quota 0.5'" in why, why
    assert "submit it --preemptible" in why
    why = refused(server, None, "submit", "-q", "half", "--non-preemptible", "-g", "1", *SLEEP)
    assert "(preemptible is false)" in why, why
    assert "its GPU quota is 0.5" in why, why
    # the two fixes it names work
    fixed = accepted(server, None, "-q", "team", "-p", "high", "--preemptible", "-g", "0.5", *TRUE)
    assert fixed["preemptible"] is True
    server.cli("queue", "set", "team", "--quota", "0.5")
    within = accepted(server, None, "-q", "team", "-p", "high", "-g", "0.5", *SLEEP)
    assert within["preemptible"] is False
    server.wait_phase(str(within["id"]), "running")  # it does start
    # and a member with the queue's grant meets the same rule
    server.cli("queue", "set", "half", "--max-priority", "high", "--nonpreemptible")
    why = refused(server, ALICE, "submit", "-q", "half", "-p", "high", "-g", "1", *SLEEP)
    assert "its GPU quota is 0.5" in why, why
    ok = accepted(server, ALICE, "-q", "half", "-p", "high", "-g", "0.5", *TRUE)
    assert ok["preemptible"] is False


def suggested_priority(why: str) -> list[str]:
    """The ``-p NAME [--preemptible]`` a refusal suggests ("or submit it with ...")."""
    found = re.search(r"or submit it with (-p \S+(?: --preemptible)?)", why)
    assert found, why
    return found.group(1).split()


def test_a_refusal_for_a_users_high_priority_suggests_only_fixes_that_work(
    server: ServerProcess,
) -> None:
    why = refused(server, BOB, "submit", "-p", "high", "-g", "0.5", *SLEEP)
    assert "priority high (100) is above what queue default allows" in why, why
    # --preemptible alone does not lower the priority: it is refused again, and not offered
    assert "or submit it --preemptible" not in why
    assert "--preemptible alone keeps the priority too high" in why
    again = refused(server, BOB, "submit", "-p", "high", "--preemptible", "-g", "0.5", *SLEEP)
    assert "priority high (100) is above what queue default allows" in again
    # what it suggests a user may do works as written
    assert suggested_priority(why) == ["-p", "normal"]
    ok = accepted(server, BOB, *suggested_priority(why), "-g", "0.5", *TRUE)
    assert ok["priority"] == 50
    # what it suggests an admin may do works as written too
    grant = re.search(r"'fgpu queue set (default [^']+)'", why)
    assert grant, why
    assert grant.group(1) == "default --max-priority high --nonpreemptible"
    server.cli("queue", "set", *grant.group(1).split())
    granted = accepted(server, BOB, "-p", "high", "-g", "0.5", *TRUE)
    assert (granted["priority"], granted["preemptible"]) == (100, False)


def test_a_queue_whose_top_is_high_without_the_grant_suggests_high_preemptible(
    server: ServerProcess,
) -> None:
    server.cli("queue", "set", "default", "--max-priority", "high")
    why = refused(server, ALICE, "submit", "-p", "critical", "-g", "0.5", *SLEEP)
    assert suggested_priority(why) == ["-p", "high", "--preemptible"]
    ok = accepted(server, ALICE, *suggested_priority(why), "-g", "0.5", *TRUE)
    assert (ok["priority"], ok["preemptible"]) == (100, True)
    # non-preemptible at an allowed priority: --preemptible is the fix, and it works
    why = refused(server, ALICE, "submit", "--non-preemptible", "-g", "0.5", *SLEEP)
    assert why.endswith("or submit it --preemptible"), why
    accepted(server, ALICE, "--preemptible", "-g", "0.5", *TRUE)


def test_the_grant_a_refusal_suggests_for_a_zero_quota_queue_raises_its_quota_too(
    server: ServerProcess,
) -> None:
    """A grant alone would be refused next (non-preemptible work runs only within its
    queue's quota), so the admin's fix named raises the quota as well, and works as written."""
    server.cli("queue", "create", "team", "--quota", "0", "--member", ALICE)
    why = refused(server, ALICE, "submit", "-q", "team", "-p", "high", "-g", "0.5", *SLEEP)
    grant = re.search(r"'fgpu queue set (team [^']+)'", why)
    assert grant, why
    assert grant.group(1) == "team --max-priority high --nonpreemptible --quota 0.5", why
    server.cli("queue", "set", *grant.group(1).split())
    granted = accepted(server, ALICE, "-q", "team", "-p", "high", "-g", "0.5", *SLEEP)
    assert (granted["priority"], granted["preemptible"]) == (100, False)
    server.wait_phase(str(granted["id"]), "running")
    # the same at an allowed priority: the grant named carries the quota
    server.cli("queue", "create", "team2", "--quota", "0", "--member", ALICE)
    why = refused(server, ALICE, "submit", "-q", "team2", "--non-preemptible", "-g", "0.5", *SLEEP)
    assert "'fgpu queue set team2 --nonpreemptible --quota 0.5'" in why, why


def test_a_model_family_matches_each_of_its_models_and_gb_means_gib(
    server: ServerProcess,
) -> None:
    first = accepted(server, ALICE, "-g", "1", "--gpu-model", "A100", *SLEEP)
    second = accepted(server, ALICE, "-g", "1", "--gpu-model", "a100", *SLEEP)
    for w in (first, second):
        request = w["request"]
        assert isinstance(request, dict)
        assert request["gpu_models"] == ["A100-40GB", "A100-80GB"]
        server.wait_phase(str(w["id"]), "running")
    listing = server.workloads()
    nodes = {listing[str(w["id"])]["gpus"][0]["node"] for w in (first, second)}
    assert len(nodes) == 2, nodes  # one on each model: both count as A100
    exact = refused(server, ALICE, "submit", "-g", "0.5", "--gpu-model", "H100", *SLEEP)
    assert "no H100-80GB GPU on this machine" in exact, exact
    for cmd in first, second:
        server.cli("cancel", str(cmd["id"]))

    gb = accepted(server, ALICE, "-g", "0.5", "--gpu-memory", "5GB", "--memory", "512MB", *TRUE)
    request = gb["request"]
    assert isinstance(request, dict)
    assert (request["gpu_memory_mib"], request["memory_mib"]) == (5120, 512)
    bad = refused(server, ALICE, "submit", "--gpu-memory", "5XB", *TRUE)
    assert "unknown unit 'XB'" in bad, bad
    assert "G/GB" in bad, bad
    help_text = " ".join(
        server.cli("submit", "--help", env_extra={"COLUMNS": "200"}).stdout.split()
    )
    assert "a family name means each of its models (A100: A100-40GB and A100-80GB)" in help_text
    assert "G and GB mean GiB, M and MB mean MiB" in help_text


def test_fgpu_ui_finds_the_server_as_every_other_command_does(server: ServerProcess) -> None:
    """As alice: with ``$FGPU_SOCKET`` it serves the dashboard of that server; without it,
    where her own default socket is not hers, ``fgpu ui`` falls back to the system socket
    exactly as ``fgpu ls`` does (before, it insisted on her own default)."""
    alice = as_user(ALICE)
    env = {k: v for k, v in os.environ.items() if k not in ("FGPU_SOCKET", "FGPU_URL")}
    env["HOME"] = "/"
    ui = subprocess.Popen(
        [*alice, *FGPU, "ui"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "FGPU_SOCKET": str(server.socket)},
        cwd="/",
    )
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        assert re.search(r"http://127\.0\.0\.1:\d+/ui\?key=\S+", line), line
    finally:
        ui.terminate()
        ui.wait(30)

    if SYSTEM_SOCKET.exists():
        pytest.skip(f"{SYSTEM_SOCKET} exists here: a system server may answer")
    runtime = Path(tempfile.mkdtemp(prefix="fgpu-ui-rt-", dir="/tmp"))
    try:
        runtime.chmod(0o755)
        taken = runtime / "fgpu"
        taken.mkdir()
        os.chown(taken, uid_of(BOB), -1)  # bob made alice's default folder first
        env["XDG_RUNTIME_DIR"] = str(runtime)
        answers = {}
        for command in (("ui",), ("ls",)):
            result = subprocess.run(
                [*alice, *FGPU, *command],
                capture_output=True,
                text=True,
                env=env,
                cwd="/",
                timeout=60,
                check=False,
            )
            assert result.returncode != 0, result
            answers[command[0]] = " ".join(result.stderr.split())
        for name, text in answers.items():
            assert str(SYSTEM_SOCKET) in text, (name, text)
            assert str(taken / "fgpu.sock") not in text, (name, text)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_memory_only_share_is_counted_on_the_gpus_it_may_run_on(server: ServerProcess) -> None:
    # 5 GiB is 0.063 of the A100-80GB but 0.125 of the A100-40GB (the trial's case): limited
    # to the 40 GB model it could never start within a quota of 0.063, so it is refused
    server.cli("queue", "create", "slim", "--quota", "0.063", "--member", ALICE)
    five = ("-q", "slim", "-p", "high", "--gpu-memory", "5GiB")
    why = refused(server, None, "submit", *five, "--gpu-model", "A100-40GB", *SLEEP)
    assert "can never start in queue slim: its GPU quota is 0.063" in why, why
    # on either model it is accepted, and runs on the GPU where it fits the quota
    ok = accepted(server, None, *five, *SLEEP)
    server.wait_phase(str(ok["id"]), "running")
    running = server.workloads()[str(ok["id"])]
    assert [g["compute_milli"] for g in running["gpus"]] == [63], running
