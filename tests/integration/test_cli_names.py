"""Defects of a fresh-user trial of issue 18 ("Everyday use"), end to end: the real
``fgpu serve`` as root and two real local users, alice and bob, driving it through the ``fgpu``
command line as themselves. A name never silently wins over another workload's id prefix,
names that could never be used are refused at submit, numeric options and a bad server URL
get the project's error, and another user cannot shadow the system server with a socket at
alice's default path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.localusers import ALICE, BOB, as_user, ensure_users, uid_of
from tests.serverproc import CLI_TIMEOUT_S, FGPU, ServerProcess, started_server, wait_for

SLEEP = ("--", "/bin/sleep", "300")


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    ensure_users()
    with started_server("fgpu-names-", "1xA100-40GB", for_local_users=True) as proc:
        yield proc


def bare_cli(*args: str, user: Sequence[str] = (), **env: str) -> subprocess.CompletedProcess[str]:
    """``fgpu ARGS`` with no socket or URL of a test server: the user's defaults."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FGPU_", "XDG_"))}
    environ.update(env)
    if user:
        environ["HOME"] = "/"
    return subprocess.run(
        [*user, *FGPU, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=environ,
        cwd="/",
    )


def test_a_name_that_is_also_an_id_prefix_is_refused_with_both_listed(
    server: ServerProcess,
) -> None:
    alice, bob = as_user(ALICE), as_user(BOB)
    out = server.cli("submit", "-g", "0.25", "--json", *SLEEP, user=alice).stdout
    hers = json.loads(out)["id"]
    prefix = hers[:4]
    out = server.cli("submit", "-g", "0.1", "--name", prefix, "--json", *SLEEP, user=bob).stdout
    his = json.loads(out)["id"]
    assert not his.startswith(prefix)

    # root (an admin, who may cancel either) is refused, both listed, nothing cancelled
    refused = server.cli("cancel", prefix, check=False)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert f"'{prefix}' fits 2 workloads" in refused.stderr, refused.stderr
    assert f"{hers} (sleep, {ALICE}, " in refused.stderr, refused.stderr
    assert f"{his} ({prefix}, {BOB}, " in refused.stderr, refused.stderr
    assert "; by id prefix)" in refused.stderr
    assert "; by name)" in refused.stderr
    assert "give the full id" in refused.stderr
    listing = server.workloads()
    assert listing[hers]["phase"] in ("pending", "running")
    assert listing[his]["phase"] in ("pending", "running")

    # alice does not see bob's job under her id's prefix, nor bob hers under his name
    for user in (alice, bob):
        result = server.cli("describe", prefix, user=user, check=False)
        assert result.returncode == 2, (result.stdout, result.stderr)
        assert hers in result.stderr
        assert his in result.stderr
    # the full ids, and a prefix that is no name, still work
    assert server.json("describe", his)["name"] == prefix
    assert server.json("describe", hers[:6])["id"] == hers
    server.cli("cancel", his, user=bob)
    # a finished workload's name still names it: the reference still fits both
    assert server.phase(his) == "cancelled"
    for user in (alice, bob):
        assert server.cli("describe", prefix, user=user, check=False).returncode == 2


@pytest.mark.parametrize("name", ["a/b", "/", "x/", ".", ".."])
def test_names_that_no_url_path_can_carry_are_refused_at_submit(
    server: ServerProcess, name: str
) -> None:
    result = server.cli("submit", "-g", "0.1", "--name", name, *SLEEP, check=False)
    assert result.returncode == 2, (result.stdout, result.stderr)
    why = "contains '/'" if "/" in name else "is a path step"
    assert result.stderr.startswith(f"error: --name: {name!r} {why}"), result.stderr
    assert server.workloads() == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("submit", "--grace", "abc", "--", "true"), "--grace 'abc': not a number"),
        (("submit", "--grace=", "--", "true"), "--grace '': not a number"),
        (("ls", "--watch", "--interval", "0.1"), "--interval '0.1': must be between 0.2 and 3600"),
        (("top", "--interval", "soon"), "--interval 'soon': not a number"),
        (("queue", "create", "q", "--quota", "lots"), "--quota 'lots': not a number"),
        (("queue", "create", "q", "--priority", "1.5"), "--priority '1.5': not a whole number"),
        (("ui", "--port", "70000"), "--port '70000': must be between 0 and 65535"),
        (("sim", "replay", "--hours", "x"), "--hours 'x': not a number"),
        (("k8s", "scheduler", "--lease-s", "long"), "--lease-s 'long': not a number"),
    ],
)
def test_a_numeric_option_that_is_no_number_gets_the_projects_error(
    args: tuple[str, ...], message: str
) -> None:
    result = bare_cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr == f"error: {message}\n"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://[::1", "not a valid URL"),
        ("localhost:8000", "must start with http:// or https://"),
        ("http://", "names no host"),
    ],
)
def test_a_bad_server_url_names_the_flag_or_variable_and_echoes_it(url: str, reason: str) -> None:
    result = bare_cli("ls", FGPU_URL=url, FGPU_TOKEN="x")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"error: $FGPU_URL {url!r}: {reason}"), result.stderr
    assert "Traceback" not in result.stderr
    result = bare_cli("ls", "--url", url, FGPU_TOKEN="x")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith(f"error: --url {url!r}: {reason}"), result.stderr


def test_another_users_socket_at_alices_default_path_does_not_shadow_the_system_server(
    tmp_path: Path,
) -> None:
    ensure_users()
    alice, bob = as_user(ALICE), as_user(BOB)
    planted = Path(f"/tmp/fgpu-{uid_of(ALICE)}")
    if planted.exists():
        pytest.skip(f"{planted} exists already (a real default socket folder of {ALICE})")
    state = Path(tempfile.mkdtemp(prefix="fgpu-bob-state-", dir="/tmp"))
    shutil.chown(state, BOB)
    socket = planted / "fgpu.sock"
    serve = [*FGPU, "serve", "--socket", str(socket), "--state-dir", str(state / "s")]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FGPU_", "XDG_"))}
    subprocess.run([*bob, "mkdir", "-m", "0755", str(planted)], check=True)
    log = (tmp_path / "bob-serve.log").open("wb")
    process = subprocess.Popen(
        [*bob, *serve, "--simulate-gpus", "1xA100-40GB"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**environ, "HOME": "/"},
        cwd="/",
    )
    try:
        wait_for(lambda: socket.exists() or process.poll() is not None, "bob's server")
        assert process.poll() is None, (tmp_path / "bob-serve.log").read_text()
        # open to alice, as a fake server would be
        subprocess.run([*bob, "chmod", "0666", str(socket)], check=True)
        fake = bare_cli("submit", "--name", "bait", *SLEEP, user=bob, FGPU_SOCKET=str(socket))
        assert fake.returncode == 0, fake.stderr

        # alice, with no socket named, does not talk to bob's server
        result = bare_cli("ls", "--all", "--json", user=alice)
        reached_bob = f"this server runs as uid {uid_of(BOB)}"
        assert "bait" not in result.stdout
        assert reached_bob not in result.stderr, result.stderr
        if result.returncode != 0:  # no system server answers here
            assert "skipped the default socket" in result.stderr, result.stderr
            assert f"{planted} belongs to uid {uid_of(BOB)}" in result.stderr, result.stderr
        # named explicitly, the socket is used as given, and a submission to it refused
        named = bare_cli("ls", "--all", "--socket", str(socket), user=alice)
        assert reached_bob in named.stderr, (named.stdout, named.stderr)
        refused = bare_cli("submit", "--socket", str(socket), *SLEEP, user=alice)
        assert refused.returncode != 0
        assert "refusing to send the command" in refused.stderr, refused.stderr
    finally:
        process.terminate()
        process.wait(60)
        log.close()
        shutil.rmtree(planted, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
