"""Everyday use through the command line, with Run:ai habits (issue "Everyday use"): names
and id prefixes where ids go, ``list``/``delete``, filters, ``cancel --all``, ``--watch``,
errors that name the flag typed, shell exit codes, the last placement of finished work, and
JSON and table agreeing. ``fgpu serve`` runs as a real process with one simulated A100."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from fgpu.cli import app, render
from tests.builders import workload_view
from tests.integration.test_cli_service import (
    TIMEOUT_S,
    Server,
    start_server,
    stop_server,
    wait_for,
)

SLEEP = [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("everyday"))
    yield running
    with running.client() as client:
        for view in client.list_workloads():
            client.cancel(view.id)
        wait_for(lambda: not client.list_workloads(), "the workloads to end")
    assert stop_server(running) == 0


@pytest.fixture
def fgpu(server: Server) -> Iterator[Callable[..., Result]]:
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(app, list(args), env={"FGPU_SOCKET": str(server.socket)})

    yield run
    with server.client() as client:  # what a test left: cancelled, and gone
        for view in client.list_workloads():
            client.cancel(view.id)
        wait_for(lambda: not client.list_workloads(), "the GPU to be free")


def submit(fgpu: Callable[..., Result], *args: str, seconds: str = "600") -> dict[str, object]:
    result = fgpu("submit", "--json", "--grace", "0", *args, "--", *SLEEP, seconds)
    assert result.exit_code == 0, result.output
    view: dict[str, object] = json.loads(result.stdout)
    return view


def test_names_and_prefixes_work_where_ids_do_with_list_and_delete(
    fgpu: Callable[..., Result], server: Server
) -> None:
    first = submit(fgpu, "-g", "0.2")
    second = submit(fgpu, "-g", "0.2")
    program = Path(sys.executable).name  # `python3 -c ...`: no script to name it after
    assert (first["name"], second["name"]) == (program, f"{program}-2")  # unique by default
    named = submit(fgpu, "-g", "0.2", "--name", "train-a")
    described = fgpu("describe", "--json", "train-a")
    assert described.exit_code == 0, described.output
    assert json.loads(described.stdout)["id"] == named["id"]
    prefix = str(second["id"])[:6]
    assert json.loads(fgpu("describe", "--json", prefix).stdout)["id"] == second["id"]
    # a clash with an active workload's name: refused (409, exit 1) naming the one that has it
    clash = fgpu("submit", "--name", "train-a", "--", *SLEEP, "1")
    assert clash.exit_code == 1
    assert f"already have an active workload named 'train-a' ({named['id']}" in clash.stderr
    # `list` is `ls`; `delete` is `cancel`; `logs` takes the name
    listed = fgpu("list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [w["id"] for w in json.loads(listed.stdout)] == [
        first["id"],
        second["id"],
        named["id"],
    ]
    assert fgpu("logs", "train-a").exit_code == 0
    deleted = fgpu("delete", "train-a")
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout.startswith(f"{named['id']}: ")
    server.wait_phase(str(named["id"]), "cancelled")
    unknown = fgpu("describe", "no-such-name")
    assert unknown.exit_code == 1
    assert "no workload with the id, id prefix or name 'no-such-name'" in unknown.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-g", "1.5.2"), "-g '1.5.2': not a plain decimal number"),
        (("--gpu", "1.5.2"), "--gpu '1.5.2': not a plain decimal number"),
        (("-g", "100"), "-g: 100 is above the largest supported value"),
        (("--grace", "7200"), "--grace '7200': must be between 0 and 3600"),
        (("--grace", "-1"), "--grace '-1': must be between 0 and 3600"),
        (("-g", ""), "-g '': "),
        (("--gpu-memory", "5 parsecs"), "--gpu-memory '5 parsecs': "),
        (("-p", "urgent"), "-p: unknown priority 'urgent'"),
        (("--name", ""), "--name '': empty"),
        (("--cpu", "1000000"), "--cpu '1000000': can never fit this machine"),
        (("--name", "   "), "--name: '   ' is only white space"),
        (("--name", "a\u202eb"), "--name 'a\\u202eb': contains the format character U+202E"),
        (("--name", "--all"), "--name: '--all' starts with '-'"),
        (("--name", "x" * 5000), f"--name '{'x' * 40}'… (5000 characters): 5000 characters;"),
    ],
)
def test_errors_name_the_flag_typed_and_echo_the_value(
    fgpu: Callable[..., Result],
    args: tuple[str, ...],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the spelling typed (-g or --gpu) is read from the command line, as a shell passes it
    monkeypatch.setattr(sys, "argv", ["fgpu", "submit", *args, "--", "true"])
    result = fgpu("submit", *args, "--", "true")
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr) < 300  # a long value is echoed shortened
    for internal in ("grace_s", "gpu_count", "gpu_memory_mib"):
        assert internal not in result.stderr


def test_ls_filters_cancel_all_exit_codes_and_the_last_placement(
    fgpu: Callable[..., Result], server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = submit(fgpu, "-g", "0.5")
    waiting = submit(fgpu, "-g", "0.8")  # does not fit beside it: pending
    server.wait_phase(str(running["id"]), "running")

    def ids(*args: str) -> list[str]:
        result = fgpu("ls", "--json", *args)
        assert result.exit_code == 0, result.output
        return [w["id"] for w in json.loads(result.stdout)]

    assert ids("--phase", "running") == [running["id"]]
    assert ids("--phase", "pending,running") == [running["id"], waiting["id"]]
    assert ids("--user", str(os.geteuid()), "--queue", "default") == [
        running["id"],
        waiting["id"],
    ]
    # an unknown queue or an empty value is refused, as an unknown user or phase is
    for args, message in (
        (("--queue", "elsewhere"), "--queue 'elsewhere': no such queue"),
        (("--queue", ""), "--queue '': an empty queue name"),
        (("--phase", "running,"), "--phase 'running,': an empty phase"),
    ):
        monkeypatch.setattr(sys, "argv", ["fgpu", "ls", *args])
        refused = fgpu("ls", *args)
        assert refused.exit_code == 2, refused.output
        assert message in refused.stderr
    bad = fgpu("ls", "--phase", "sleeping")
    assert bad.exit_code == 2
    assert "--phase 'sleeping': not a phase" in bad.stderr
    assert fgpu("ls", "--user", "no-such-user-here").exit_code == 2
    # JSON and table agree on the phase; a running workload shows what the governor does
    table = fgpu("ls").stdout
    [row] = [line for line in table.splitlines() if line.startswith(str(running["id"]))]
    assert row.split()[3] == "running"

    # the governor's state comes with its first plan after the start: wait for it
    def governed() -> bool:
        listed = json.loads(fgpu("ls", "--json").stdout)
        assert listed[0]["phase"] == "running"
        return listed[0]["gpu_state"] is not None

    wait_for(governed, "the running workload's governor state in ls --json")
    # cancel --all: every active workload of the caller
    assert fgpu("cancel", "--all", "--user", "nobody", "x").exit_code == 2
    cancelled = fgpu("cancel", "--all")
    assert cancelled.exit_code == 0, cancelled.output
    assert {line.split(":")[0] for line in cancelled.stdout.splitlines()} == {
        running["id"],
        waiting["id"],
    }
    server.wait_phase(str(running["id"]), "cancelled")
    done = {w["id"]: w for w in json.loads(fgpu("ls", "-a", "--json").stdout)}
    # killed by SIGTERM: 143 as shells say, not -15; where it ran is kept
    assert done[running["id"]]["exit_code"] == 128 + signal.SIGTERM
    assert done[running["id"]]["gpus"][0]["compute_milli"] == 500
    assert done[waiting["id"]]["gpus"] == []  # never ran
    assert "ran on " in fgpu("ls", "-a").stdout
    assert "ran on " in fgpu("describe", str(running["id"])).stdout
    assert fgpu("ls", "--watch", "--json").exit_code == 2


def test_ls_watch_refreshes_in_place_until_ctrl_c(
    fgpu: Callable[..., Result], server: Server
) -> None:
    view = submit(fgpu, "-g", "0.2")
    main, child = pty.openpty()  # a terminal: the table is redrawn where it stands
    process = subprocess.Popen(
        [sys.executable, "-m", "fgpu", "ls", "--watch", "--interval", "0.2"],
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "FGPU_SOCKET": str(server.socket), "COLUMNS": "200"},
    )
    os.close(child)
    shown = bytearray()

    def three_frames() -> bool:
        ready, _, _ = select.select([main], [], [], 0.1)
        if ready:
            with contextlib.suppress(OSError):
                shown.extend(os.read(main, 65536))
        return bytes(shown).count(str(view["id"]).encode()) >= 3

    try:
        wait_for(three_frames, "three frames of the table", TIMEOUT_S * 2)
        assert b"\x1b[" in shown  # cursor movement: drawn over, not appended
        process.send_signal(signal.SIGINT)
        assert process.wait(TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
        os.close(main)


def test_the_table_words_the_governor_states_beyond_the_phase() -> None:
    view = workload_view

    # one vocabulary (fgpu.states): the words of the API are the words of the table
    assert render.state_text(view(gpu_state="paused-by-priority")).plain == "paused-by-priority"
    assert render.state_text(view(gpu_state="waiting-for-share")).plain == "waiting-for-share"
    assert render.state_text(view(gpu_state="running")).plain == ""
    assert render.state_text(view(squeezed=True)).plain == "squeezed"
    assert render.state_text(view(stopping=True, gpu_state="running")).plain == "stopping"
    assert render.phase_text(view(stopping=True).phase).plain == "running"


def test_shell_completion_scripts_and_completions() -> None:
    # what `fgpu --install-completion` installs, and what it answers to a half-typed word
    fgpu = str(Path(sys.executable).parent / "fgpu")
    # Typer finds the shell among the parent processes: run it from bash (not as bash's
    # last command, which bash would replace by it)
    script = subprocess.run(
        ["bash", "-c", '"$0" --show-completion; exit $?', fgpu],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert script.returncode == 0, script.stderr
    assert "_fgpu_completion" in script.stdout
    answer = subprocess.run(
        [fgpu],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "_FGPU_COMPLETE": "complete_bash",
            "COMP_WORDS": "fgpu li",
            "COMP_CWORD": "1",
        },
    )
    assert answer.stdout.split() == ["list"]


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("queue", "create", "q-neg", "--quota", "-1"), "--quota '-1': must be", 2),
        (
            ("queue", "create", "q-lim", "--limit", "0.5", "--quota", "1"),
            "--limit 0.5 is below --quota 1",
            2,
        ),
        (
            ("queue", "create", "q-max", "--max-priority", "bogus"),
            "--max-priority: unknown priority 'bogus'",
            2,
        ),
        (("queue", "set", "nosuch", "--quota", "1"), "NAME 'nosuch': no such queue", 1),
        (("describe", "x" * 3000), f"ID '{'x' * 40}'… (3000 characters): ", 2),
        (("describe", "no-such"), "ID: no workload with the id, id prefix or name 'no-such'", 1),
        (("cancel", "no-such"), "ID: no workload with the id, id prefix or name 'no-such'", 1),
    ],
)
def test_queue_and_argument_errors_name_what_was_typed(
    fgpu: Callable[..., Result],
    args: tuple[str, ...],
    message: str,
    code: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["fgpu", *args])
    result = fgpu(*args)
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert len(result.stderr) < 300
    for internal in ("gpu_milli", "max_priority", "workload_id", "id:", "name:"):
        assert internal not in result.stderr


def test_piped_tables_have_no_trailing_spaces_and_version_prints(
    fgpu: Callable[..., Result],
) -> None:
    view = submit(fgpu, "-g", "0.2", "--name", "piped")
    for args in (("describe", "piped"), ("ls",), ("top",)):
        shown = fgpu(*args)
        assert shown.exit_code == 0, shown.output
        lines = shown.stdout.splitlines()
        assert lines, args
        assert all(line == line.rstrip() for line in lines), (args, lines)
    assert str(view["id"]) in fgpu("ls").stdout
    from fgpu import __version__

    version = CliRunner().invoke(app, ["--version"])
    assert (version.exit_code, version.stdout) == (0, f"fgpu {__version__}\n")
