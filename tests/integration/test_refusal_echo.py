"""Every refusal of a request's value names the field, echoes the value (shortened when
long) and says why, over real HTTP on a real ``fgpu serve`` (issue 27, point 5 of the
attacker's trial): the query's ``limit`` and ``cursor``, the ``Idempotency-Key`` header and
the ``workload_id`` path parameter, which pydantic refused without the value. And
``fgpu cancel --all`` over work that finished before its cancel came says so in one line,
not one error per workload."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import httpx
import pytest

from tests.serverproc import CLI_TIMEOUT_S, ServerProcess, started_server, wait_for


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with started_server("fgpu-echo-", "1xA100-40GB") as s:
        yield s


def http(server: ServerProcess) -> httpx.Client:
    transport = httpx.HTTPTransport(uds=str(server.socket))
    return httpx.Client(transport=transport, base_url="http://fgpu", timeout=CLI_TIMEOUT_S)


@pytest.mark.parametrize(
    ("method", "path", "params", "headers", "field", "says"),
    [
        (
            "GET",
            "/v1/workloads",
            {"limit": "10001"},
            {},
            "limit",
            "'10001': Input should be less than or equal to 10000",
        ),
        (
            "GET",
            "/v1/workloads",
            {"limit": "many"},
            {},
            "limit",
            "'many': Input should be a valid integer, unable to parse string as an integer",
        ),
        (
            "GET",
            "/v1/workloads",
            {"cursor": "c" * 5000},
            {},
            "cursor",
            f"{'c' * 40!r}… (5000 characters): String should have at most 200 characters",
        ),
        (
            "POST",
            "/v1/workloads",
            {},
            {"Idempotency-Key": "k" * 256},
            "Idempotency-Key",
            f"{'k' * 40!r}… (256 characters): String should have at most 255 characters",
        ),
        (
            "GET",
            "/v1/workloads/" + "w" * 300,
            {},
            {},
            "workload_id",
            f"{'w' * 40!r}… (300 characters): String should have at most 128 characters",
        ),
        (
            "GET",
            "/v1/events",
            {"limit": "0"},
            {},
            "limit",
            "'0': Input should be greater than or equal to 1",
        ),
    ],
    ids=["limit-too-big", "limit-not-a-number", "cursor", "idempotency-key", "path-id", "events"],
)
def test_a_refused_value_is_echoed_with_its_field_and_why(
    server: ServerProcess,
    method: str,
    path: str,
    params: dict[str, str],
    headers: dict[str, str],
    field: str,
    says: str,
) -> None:
    body = {"command": ["true"], "gpu": "0.1"} if method == "POST" else None
    with http(server) as client:
        before = len(client.get("/v1/workloads", params={"all": "true"}).json())
        answer = client.request(method, path, params=params, headers=headers, json=body)
        after = len(client.get("/v1/workloads", params={"all": "true"}).json())
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail["field"].lower() == field.lower(), detail
    assert detail["reason"] == says, detail
    assert after == before  # nothing half-written


def test_a_missing_field_is_named_without_echoing_the_whole_body(server: ServerProcess) -> None:
    with http(server) as client:
        answer = client.post("/v1/workloads", json={"gpu": "0.1"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == {"field": "command", "reason": "Field required"}


_STALE_CANCEL = textwrap.dedent(
    """
    # fgpu cancel --all with the listing it made before the workloads ended: the race of a
    # cancel --all over an array whose tasks finish meanwhile, made certain. The listing is
    # the real server's answer; the test lets the tasks end, then the cancels go out.
    import pathlib, sys
    from fgpu.cli import main
    from fgpu.client.client import Client

    listed = Client.list_workloads_plain
    go, ended = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

    def stale(self, *args, **kwargs):
        views = listed(self, *args, **kwargs)
        go.touch()  # the tasks may end now
        while not ended.exists():  # the test says when they have
            import time; time.sleep(0.02)
        return views

    Client.list_workloads_plain = stale
    sys.argv = ["fgpu", "cancel", "--all"]
    main()
    """
)


def test_cancel_all_over_work_that_finished_meanwhile_says_so_once(
    server: ServerProcess,
) -> None:
    go = server.root / "tasks-may-end"
    ended = server.root / "tasks-ended"
    waiter = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)"
    server.submit(
        "-g", "0.01", "--array", "0-29", "--name", "short", command=[sys.executable, "-c", waiter]
    )
    # a pending sleeper of the same user stays cancellable
    keeper = server.submit("-g", "0.01", "--name", "keeper", command=["sleep", "600"])

    def tasks() -> list[dict[str, object]]:
        return [
            w
            for w in server.workloads().values()
            if isinstance(w.get("array"), dict) and w["array"]["name"] == "short"
        ]

    wait_for(lambda: len(tasks()) == 30, "the array's 30 tasks")
    cancel = subprocess.Popen(
        [sys.executable, "-c", _STALE_CANCEL, str(go), str(ended)],
        env=server.env,
        cwd=server.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: all(t["phase"] == "succeeded" for t in tasks()), "the tasks to end")
        ended.touch()
        out, err = cancel.communicate(timeout=CLI_TIMEOUT_S * 4)
    finally:
        if cancel.poll() is None:
            cancel.kill()
    assert cancel.returncode == 0, err
    assert "error" not in err, err
    assert err.count("\n") == 1, err
    assert "30 of the 31 workloads listed had finished before their cancel came" in err, err
    assert f"{keeper}: cancelled" in out, out
    assert server.phase(keeper) == "cancelled"
    assert json.dumps(sorted({t["phase"] for t in tasks()})) == '["succeeded"]'
