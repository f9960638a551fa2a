"""The launch wrapper on its own: exit records and the recorded outcome of a command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fgpu.agent import runner
from fgpu.agent.runner import ExitRecord, read_exit_record, write_exit_record
from tests.localusers import BOB, ensure_users, uid_of


def test_exit_record_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    write_exit_record(path, ExitRecord(-9, "ended by SIGKILL", 1234))
    assert read_exit_record(path) == ExitRecord(-9, "ended by SIGKILL", 1234)
    write_exit_record(path, ExitRecord(0))
    assert read_exit_record(path) == ExitRecord(0)
    assert [p.name for p in tmp_path.iterdir()] == ["exit.json"]  # no temporary left


@pytest.mark.parametrize(
    "content",
    ["", "{", "[]", '{"code": "3"}', '{"reason": "x"}'],
    ids=["empty", "truncated", "not-object", "code-not-int", "no-code"],
)
def test_unreadable_exit_records_count_as_none(tmp_path: Path, content: str) -> None:
    path = tmp_path / "exit.json"
    path.write_text(content)
    assert read_exit_record(path) is None


def test_missing_exit_record_is_none(tmp_path: Path) -> None:
    assert read_exit_record(tmp_path / "exit.json") is None


def run_wrapper(tmp_path: Path, *command: str, stdin: str | None = None) -> tuple[int, str]:
    exit_file = tmp_path / "exit.json"
    flags = ["--spec-stdin"] if stdin is not None else []
    wrapper = [sys.executable, "-m", "fgpu.agent.runner", "--exit-file", str(exit_file)]
    done = subprocess.run(
        [*wrapper, *flags, "--", *command],
        input=(stdin or "").encode(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode, done.stderr.decode()


@pytest.mark.parametrize(
    ("command", "record", "status"),
    [
        (["sh", "-c", "exit 0"], ExitRecord(0), 0),
        (["sh", "-c", "exit 3"], ExitRecord(3), 3),
        (["sh", "-c", "kill -TERM $$"], ExitRecord(-15, "ended by SIGTERM"), 128 + 15),
        (
            ["no-such-command-fgpu"],
            ExitRecord(127, "command not found: 'no-such-command-fgpu'"),
            127,
        ),
    ],
    ids=["zero", "three", "sigterm", "not-found"],
)
def test_wrapper_records_and_mirrors_the_outcome(
    tmp_path: Path,
    command: list[str],
    record: ExitRecord,
    status: int,
) -> None:
    code, _ = run_wrapper(tmp_path, *command)
    found = read_exit_record(tmp_path / "exit.json")
    assert found is not None
    assert (found.code, found.reason) == (record.code, record.reason)
    assert code == status


def test_what_the_command_leaves_in_its_group_ends_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "background.pid"
    code, _ = run_wrapper(
        tmp_path, "sh", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! > {pid_file}; exit 4"
    )
    assert code == 4
    background = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while alive(background) and time.monotonic() < deadline:
        time.sleep(0.02)  # SIGKILL is delivered at once; reaping by init may take a moment
    assert not alive(background)


def alive(pid: int) -> bool:
    """A live process (not a zombie) with this pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def test_settings_from_stdin(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    settings = {"cwd": str(tmp_path), "env": {"ONLY": "this", "PATH": "/usr/bin:/bin"}}
    code, _ = run_wrapper(
        tmp_path,
        "sh",
        "-c",
        'echo "$ONLY $(pwd) ${HOME:-nohome}" > out.txt',
        stdin=json.dumps(settings),
    )
    assert code == 0
    assert out.read_text() == f"this {tmp_path} nohome\n"


def test_bad_settings_are_a_wrapper_failure(tmp_path: Path) -> None:
    code, stderr = run_wrapper(tmp_path, "true", stdin="[1]")
    assert code == 125
    assert "launch settings are not a JSON object" in stderr
    assert read_exit_record(tmp_path / "exit.json") == ExitRecord(
        125, "launch settings are not a JSON object"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a command as another user")
def test_the_working_directory_is_entered_as_the_user_not_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check that the user may enter ``cwd`` and the entering itself are apart in time; a
    user who swaps a symbolic link between them must not get a directory only root may enter.
    Here the check is made to pass (as in the race's window): entered as the user, the private
    directory is still refused, and the command never runs."""
    ensure_users()
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("root's\n")
    monkeypatch.setattr(runner, "_accessible_as", lambda *_: True)
    exit_file = tmp_path / "exit.json"
    wrapper = runner._Wrapper(exit_file, None)
    code = wrapper.run(
        ["/bin/cat", "secret"],
        {"cwd": str(private), "uid": uid_of(BOB), "gid": None, "groups": []},
    )
    assert code == runner.EXIT_CANNOT_RUN
    record = read_exit_record(exit_file)
    assert record is not None
    assert (
        record.reason
        == f"working directory {str(private)!r} is not accessible to uid {uid_of(BOB)}"
    )


def test_the_output_log_keeps_both_streams_in_order_and_each_plain_log(tmp_path: Path) -> None:
    from fgpu.wire_logs import FrameReader

    log = tmp_path / "output.log"
    # each write waits until the wrapper has recorded the one before: the order is the writes'
    job = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "log = Path(sys.argv[1])\n"
        "for stream, text in ((sys.stdout, 'a\\n'), (sys.stderr, 'b\\n'), (sys.stdout, 'c\\n')):\n"
        "    stream.write(text); stream.flush()\n"
        "    deadline = time.monotonic() + 30\n"
        "    while text.encode() not in log.read_bytes():\n"
        "        assert time.monotonic() < deadline\n"
        "        time.sleep(0.01)\n"
    )
    wrapper = [sys.executable, "-m", "fgpu.agent.runner", "--exit-file", str(tmp_path / "x")]
    started = time.time_ns()
    done = subprocess.run(
        [*wrapper, "--output-log", str(log), "--", sys.executable, "-c", job, str(log)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"a\nc\n"
    assert done.stderr == b"b\n"
    chunks = FrameReader().feed(log.read_bytes())
    assert [(c.stream, c.data) for c in chunks] == [
        ("stdout", b"a\n"),
        ("stderr", b"b\n"),
        ("stdout", b"c\n"),
    ]
    times = [c.time_ns for c in chunks]
    assert started <= times[0] <= times[1] <= times[2] <= time.time_ns()


def test_a_command_that_cannot_start_says_why_in_the_output_log_too(tmp_path: Path) -> None:
    from fgpu.wire_logs import FrameReader

    log = tmp_path / "output.log"
    wrapper = [sys.executable, "-m", "fgpu.agent.runner", "--exit-file", str(tmp_path / "x")]
    done = subprocess.run(
        [*wrapper, "--output-log", str(log), "--", "no-such-command-fgpu"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 127
    chunks = FrameReader().feed(log.read_bytes())
    assert [(c.stream, c.data) for c in chunks] == [
        ("stderr", b"fgpu: command not found: 'no-such-command-fgpu'\n")
    ]
